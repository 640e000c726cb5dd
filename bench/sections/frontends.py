"""`frontends` (issue 39, "the one-GIL part, measured"): slotserve with one front end (`python -m service`, N = 1)
and with N front-end processes (`--frontends N`, N = 2 by default, more with `--cores`), beside real Triton 2.51,
all three running, measured point by point in turn with perf_analyzer (the order flips every round).

Points (slotserve serves one repository with all of them, `--parallel-jobs 2`; Triton the python models):
  simple     the demo's ONNX `simple` (INT32 [1,16] add/sub) at 1, 4 and 16 clients; Triton's wheel has no ONNX
             Runtime, so its row beside `simple` is its python-backend add_sub (the same shapes and answer)
  add_sub    tests/python_models' add/sub model.py (one slot; Triton: one instance) at 1, 4 and 16 clients
  gil_1/2    bench/sections/python.py's GIL-holding model.py (a pure-Python loop of about 3 ms) on 1 and 2 slots
             (Triton: instances) at 4 clients

Each point also reads /proc over the perf_analyzer run and divides by the rise of the model's ModelStatistics
success count: the CPU per request of the **admission process** (the `python -m service` process itself: utime +
stime of /proc/PID/stat, all its threads; with N = 1 it is also the only front end), of the **whole tree** (it and
every descendant: front ends, python workers), and the front ends' share of the tree (descendants whose command
line names `frontend`; python workers name `engine.python.worker`). For Triton the same split: the tritonserver
process, and its tree with the python stubs.

Printed beside them:
  N / 1          N front ends over one, per model and client count (median of per-round ratios); the goal:
                 `simple` at 16 clients >= 0.95x (N must not lose to one front end on 2 cores shared with the client)
  GIL scaling    gil_2 / gil_1 with N front ends (goal >= 1.5x), with one, and on Triton (2 instances / 1)
  ceiling        a PROJECTION, not a measurement: from `simple`'s and add_sub's per-request CPU at 16 clients,

                     ceiling(cores) = min(1e6 / admission_us, cores * 1e6 / tree_us)   requests/s

                 for 4, 8, 16 and 32 cores: the admission process is one GIL (one core at most), whatever front
                 ends and workers run beside it; the tree's CPU per request spread over every core bounds the rest.
                 It assumes the per-request CPU measured here holds at that scale (no lock or cache contention
                 grows with cores) and that the clients run elsewhere; it is an upper bound. The goal: the
                 admission process's CPU per small request (`simple`, N front ends) <= 120 us (8,300 requests/s).

Duration: 21 points a round (15 without --frontends); about 1.5 minutes with --quick (1 round, 1 s windows; 56 s
with N = 1 only), 7-8 minutes by default (3 rounds, 2 s windows): not in the default set.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..common import DEMO_REPOSITORY, log
from ..cores import frontends_for
from ..perf_analyzer import PerfAnalyzer, describe, measure
from ..servers import Launcher
from ..table import Table, first_error, fmt, fmt_ms, fmt_x, median, met_if, ok, paired_ratio
from ..transport.accounting import TritonServer, inference_count, tree_cpu_s
from .python import GIL_CONCURRENCY, write_repositories

CONCURRENCY = (1, 4, 16)
PROJECTED_CORES = (4, 8, 16, 32)
ADMISSION_GOAL_US = 120.0  # the goal for a small request: about 8,300 requests/s from one admission process
N_OVER_ONE_GOAL = 0.95  # `simple` at 16 clients, N front ends over one
GIL_SCALING_GOAL = 1.5  # gil_2 / gil_1 with N front ends
ROLES = ("admission", "front ends", "python workers", "other")


# ------------------------------------------------------------------------------------------ accounting


def role_of(pid: int, root: int, command_line: str) -> str:
    """Which part of a server's tree a process is: the root itself ("admission": slotserve's `python -m service`
    process, or tritonserver), a python worker (slotserve's `engine.python.worker`, Triton's
    `triton_python_backend_stub`), a front end (any other command line naming `frontend`), or "other". Workers are
    told first: a stub's command line holds its model's path, which may name anything (the section's own scratch
    folders avoid the word)."""
    if pid == root:
        return "admission"
    if "engine.python.worker" in command_line or "triton_python_backend_stub" in command_line:
        return "python workers"
    if "frontend" in command_line:
        return "front ends"
    return "other"


def cpu_by_role(root: int, before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict:
    """CPU seconds per role between two tree_cpu_s() snapshots of `root`'s tree. A process that started in
    between counts from zero; one that ended in between is lost (its time is not in /proc any more)."""
    spent = dict.fromkeys(ROLES, 0.0)
    for pid, (command_line, cpu_s) in after.items():
        spent[role_of(pid, root, command_line)] += cpu_s - before.get(pid, (command_line, 0.0))[1]
    return spent


def per_request_us(spent: dict, requests: int) -> dict:
    """µs of CPU per request: the admission process's, the whole tree's, and the front ends' share of the tree;
    {} when no request was counted."""
    if requests <= 0:
        return {}
    tree_s = sum(spent.values())
    return {
        "admission_us": spent["admission"] * 1e6 / requests,
        "tree_us": tree_s * 1e6 / requests,
        "front_ends_us": spent["front ends"] * 1e6 / requests,
        "workers_us": spent["python workers"] * 1e6 / requests,
        "other_us": spent["other"] * 1e6 / requests,
        "front_end_share": spent["front ends"] / tree_s if tree_s > 0 else float("nan"),
    }


def projected_ceiling(admission_us: float, tree_us: float, cores: int) -> float:
    """A projection, not a measurement: requests/s that `cores` CPUs could serve if each request costs the
    admission process `admission_us` (one GIL: one core at most) and the whole tree `tree_us` (spread over every
    core): min(1e6 / admission_us, cores * 1e6 / tree_us). NaN when either figure is missing or not positive."""
    if not (admission_us > 0 and tree_us > 0) or math.isinf(admission_us) or math.isinf(tree_us):
        return float("nan")
    return min(1e6 / admission_us, cores * 1e6 / tree_us)


# ------------------------------------------------------------------------------------------------ servers


@dataclass(frozen=True)
class Point:
    model: str
    server: str  # "N=1", "N=<n>" or "triton"
    clients: int


def supports_frontends(root: Path) -> bool:
    """Whether the checkout's `python -m service --help` lists --frontends."""
    result = subprocess.run(
        [sys.executable, "-m", "service", "--help"], cwd=root, capture_output=True, text=True, timeout=120
    )
    return "--frontends" in result.stdout


def _points(servers: Iterable[str]) -> list[Point]:
    names = list(servers)
    slotserve = [name for name in names if name != "triton"]
    found = []
    for c in CONCURRENCY:
        found += [Point("simple", name, c) for name in slotserve]
        found += [Point("add_sub", name, c) for name in names]
    for model in ("gil_1", "gil_2"):
        found += [Point(model, name, GIL_CONCURRENCY) for name in names]
    return found


def _measure(pa: PerfAnalyzer, server, point: Point) -> dict:
    """One perf_analyzer point with the server tree's CPU per request split by role."""
    requests_before = inference_count(server.address, point.model)
    before = tree_cpu_s(server.pid)
    result = measure(pa, server, point.model, point.clients)
    after = tree_cpu_s(server.pid)
    requests = inference_count(server.address, point.model) - requests_before
    if ok(result) and requests_before >= 0:
        result["requests_counted"] = requests
        result.update(per_request_us(cpu_by_role(server.pid, before, after), requests))
        result["front_end_processes"] = sum(
            1 for pid, (line, _) in after.items() if role_of(pid, server.pid, line) == "front ends"
        )
    return result


def _git_commit(root: Path) -> str:
    """The checkout's short commit, "+dirty" when tracked files differ from it (a worktree being edited)."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
    )
    return (commit.stdout.strip() or "unknown") + ("+dirty" if dirty.stdout.strip() else "")


def section_frontends(args, launcher: Launcher, pa: PerfAnalyzer, table: Table, raw: dict, scratch: Path) -> None:
    cores = len(os.sched_getaffinity(0))  # run.py pinned this process for --cores
    frontends = frontends_for(cores)
    root = launcher.slotserve_root
    setup = {
        "cores": cores,
        "cpus": sorted(os.sched_getaffinity(0)),
        "frontends": frontends,
        "slotserve_root": str(root),
        "slotserve_commit": _git_commit(root),
        "load_start": list(os.getloadavg()),
    }
    raw["frontends_setup"] = setup
    ours, theirs = write_repositories(scratch / "one-gil")  # no "frontend" in a path: see role_of
    flags = ["--parallel-jobs", "2", "--allow-model-root", str(DEMO_REPOSITORY)]
    candidates = {"N=1": launcher.slotserve("frontends-n1", ours, flags, default_args=False)}
    if supports_frontends(root):
        candidates[f"N={frontends}"] = launcher.slotserve(
            f"frontends-n{frontends}", ours, [*flags, "--frontends", str(frontends)], default_args=False
        )
    else:
        setup["n_missing"] = f"{root} (commit {setup['slotserve_commit']}) has no --frontends: N=1 only"
        log(f"frontends: {setup['n_missing']}")
    candidates["triton"] = TritonServer("one-gil-triton", scratch / "one-gil-triton-run", theirs, "gil_2")
    points: dict[Point, list[dict]] = {}
    with contextlib.ExitStack() as stack:
        servers = {}
        for name, server in candidates.items():
            try:
                servers[name] = stack.enter_context(server)
            except Exception as error:  # one server that cannot start is reported; the others are measured
                log(f"frontends: {name} did not start: {error}")
                table.add("frontends", f"frontends {name}", f"FAILED to start: {str(error)[:160]}")
        order = _points(servers)
        for round_index in range(args.rounds):
            for point in order[::-1] if round_index % 2 else order:
                result = _measure(pa, servers[point.server], point)
                points.setdefault(point, []).append(result)
                log(
                    f"frontends round {round_index + 1}/{args.rounds} {point.model} {point.server} "
                    f"c={point.clients}: {describe(result)}"
                    + (f"; admission {result['admission_us']:.0f} us, tree {result['tree_us']:.0f} us"
                       if "admission_us" in result else "")
                )  # fmt: skip
    setup["load_end"] = list(os.getloadavg())
    raw["frontends"] = {f"{p.model} {p.server} c={p.clients}": runs for p, runs in points.items()}
    _rows(table, setup, points, [name for name in candidates if name in servers], f"N={frontends}")


# --------------------------------------------------------------------------------------------------- rows


def _median(runs: list[dict], key: str) -> float:
    """The median of `key` over the runs that have it (a point whose statistics could not be read has no CPU
    figures); NaN when none has."""
    return median([run[key] for run in runs if ok(run) and key in run])


def _range(runs: list[dict], key: str) -> str:
    values = [run[key] for run in runs if ok(run) and key in run]
    if not values:
        return "n/a"
    return f"{fmt(_median(runs, key))} ({fmt(min(values))}-{fmt(max(values))})"


def _cpu_text(runs: list[dict], triton: bool) -> str:
    admission, tree = _median(runs, "admission_us"), _median(runs, "tree_us")
    share = _median(runs, "front_end_share")
    workers = _median(runs, "workers_us")
    parts = [f"{'server process' if triton else 'admission'} {fmt(admission)} us, tree {fmt(tree)} us"]
    if not triton and share == share and share > 0:
        parts.append(f"front ends {100 * share:.0f} %")
    if workers == workers and workers > 0:
        parts.append(f"{'stubs' if triton else 'workers'} {fmt(workers)} us")
    other = _median(runs, "other_us")
    if other == other and other > 0:  # a child neither a front end nor a worker: its command line was not recognised
        parts.append(f"other processes {fmt(other)} us")
    processes = _median(runs, "front_end_processes")
    if not triton and processes == processes and processes > 0:
        parts.append(f"{processes:.0f} front-end processes")
    return ", ".join(parts)


def _rows(table: Table, setup: dict, points: dict[Point, list[dict]], names: list[str], many: str) -> None:
    load = f"load average {setup['load_start'][0]:.2f} -> {setup['load_end'][0]:.2f}"
    table.add(
        "frontends",
        f"frontends: slotserve {setup['slotserve_commit']} ({setup['slotserve_root']}), {setup['cores']} core(s)",
        ", ".join(names) + f"; {load}" + (f"; {setup['n_missing']}" if "n_missing" in setup else ""),
    )
    for c in CONCURRENCY:
        for model in ("simple", "add_sub"):
            for name in names:
                runs = points.get(Point("add_sub" if name == "triton" else model, name, c), [])
                if not runs or (name == "triton" and model == "simple"):
                    continue  # Triton's add_sub is printed once, under add_sub
                ratios = []
                if name != "N=1" and "N=1" in names:
                    ratios.append(f"{fmt_x(paired_ratio(runs, points[Point(model, 'N=1', c)], 'infer_per_s'))} N=1")
                if name != "triton" and "triton" in names:
                    theirs = points[Point("add_sub", "triton", c)]
                    ratios.append(f"{fmt_x(paired_ratio(runs, theirs, 'infer_per_s'))} triton")
                error = first_error(runs)
                table.add(
                    "frontends",
                    f"frontends {model} c={c} {name}: infer/s (range), p50/p99 ms; CPU per request",
                    f"{_range(runs, 'infer_per_s')}" + (f" {', '.join(ratios)}" if ratios else "")
                    + f"; {fmt_ms(_median(runs, 'p50_ms'))}/{fmt_ms(_median(runs, 'p99_ms'))}; "
                    + _cpu_text(runs, name == "triton") + (f" [{error[:100]}]" if error else ""),
                    infer_per_s=_median(runs, "infer_per_s"),
                    admission_us=_median(runs, "admission_us"),
                    tree_us=_median(runs, "tree_us"),
                    front_end_share=_median(runs, "front_end_share"),
                )  # fmt: skip
    _goal_rows(table, points, names, many)
    _gil_rows(table, points, names, many)
    _projection_rows(table, points, names)


def _goal_rows(table: Table, points: dict[Point, list[dict]], names: list[str], many: str) -> None:
    if many not in names:
        table.add("frontends", f"frontends simple c=16: {many} / N=1", "not measured (no --frontends)", ">= 0.95x")
    else:
        for model in ("simple", "add_sub"):
            ratio = paired_ratio(points[Point(model, many, 16)], points[Point(model, "N=1", 16)], "infer_per_s")
            goal = model == "simple"
            verdict = "" if ratio != ratio else ("wins" if ratio > 1.02 else "ties" if ratio >= 0.98 else "loses")
            table.add(
                "frontends",
                f"frontends {model} c=16: {many} / N=1 infer/s (median of per-round ratios)",
                f"{fmt_x(ratio)} ({verdict} by {abs(ratio - 1) * 100:.0f} %)" if verdict else fmt_x(ratio),
                f">= {N_OVER_ONE_GOAL}x" if goal else "",
                met_if(ratio, lambda v: v >= N_OVER_ONE_GOAL) if goal else None,
                ratio=ratio,
            )
    best = many if many in names else "N=1"
    admission = _median(points.get(Point("simple", best, 16), []), "admission_us")
    table.add(
        "frontends",
        f"frontends simple c=16 {best}: the admission process's CPU per request",
        f"{fmt(admission)} us",
        f"<= {ADMISSION_GOAL_US:.0f} us",
        met_if(admission, lambda v: v <= ADMISSION_GOAL_US),
        admission_us=admission,
    )


def _gil_rows(table: Table, points: dict[Point, list[dict]], names: list[str], many: str) -> None:
    c = GIL_CONCURRENCY
    for name in [n for n in (many, "N=1", "triton") if n in names]:
        one, two = points[Point("gil_1", name, c)], points[Point("gil_2", name, c)]
        scaling = paired_ratio(two, one, "infer_per_s")
        goal = name == many
        table.add(
            "frontends",
            f"frontends GIL-holding model.py c={c} {name}: 2 slots / 1 slot"
            + (" (Triton: instances)" if name == "triton" else ""),
            f"{fmt_x(scaling)} ({fmt(_median(two, 'infer_per_s'))} / {fmt(_median(one, 'infer_per_s'))}"
            f" infer/s); CPU per request 2 slots: {_cpu_text(two, name == 'triton')}",
            f">= {GIL_SCALING_GOAL}x" if goal else "",
            met_if(scaling, lambda v: v >= GIL_SCALING_GOAL) if goal else None,
            ratio=scaling,
        )


def _projection_rows(table: Table, points: dict[Point, list[dict]], names: list[str]) -> None:
    for model in ("simple", "add_sub"):
        for name in [n for n in names if n != "triton"]:
            runs = points[Point(model, name, 16)]
            admission, tree = _median(runs, "admission_us"), _median(runs, "tree_us")
            ceilings = {cores: projected_ceiling(admission, tree, cores) for cores in PROJECTED_CORES}
            table.add(
                "frontends",
                f"frontends PROJECTED ceiling {model} {name} (from c=16: admission {fmt(admission)} us, "
                f"tree {fmt(tree)} us)",
                ", ".join(f"{cores} cores {fmt(value)}/s" for cores, value in ceilings.items()),
                projected={str(cores): value for cores, value in ceilings.items()},
            )
