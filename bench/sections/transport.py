"""`transport` (issue 24): `simple` at 1, 4 and 16 clients on front-end designs that all run slotserve's real
decode, admission, engine call and encode, beside the bare server and real Triton's python backend.

Designs (bench/transport/ has the prototypes, bench/README.md the details):
  today       `python -m service` (grpcio sync server; since issue 22's fourth session on --handler-runners
              runner threads: the sync-watchdog design, refined, in the product)
  per-call    `python -m service --handler-runners 0`: a handler thread per call at once (today's rule before)
  aio-inline  grpc.aio; fast models inline on the event loop, others on slot threads, hand-back batched
  sync-lean   today's server with a fixed pool of --cores handler threads (fewer thread switches)
  sync-watchdog
              today's server on bench/transport/watchdog_pool.py: --cores runner threads, and one more thread
              for each waiting call after 20 ms without progress (stalled calls cannot silence it)
  multiproc   --cores grpc.aio front-end processes on one port (SO_REUSEPORT) forwarding bytes over Unix
              sockets to one model process that schedules as aio-inline
  bare        bench/bare_server.py (no admission, statistics or checks: the ceiling of a thread-pooled server)
  triton      tritonserver 2.51 (PyTriton's wheel), the same add/sub as a python-backend model

`--cores N` (bench/cores.py; run.py pins this process, so every server and perf_analyzer it starts, to the first
N CPUs it may use) sizes the prototypes' process and thread counts from N. Each point also records the server
tree's CPU time and thread switches per request (over the whole perf_analyzer run, divided by the model's
ModelStatistics count).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..common import RESULTS, ROOT, log
from ..perf_analyzer import PerfAnalyzer, describe, measure
from ..profiling import PROFILE_RATE, _frame_key, find_py_spy, render_profile, summarize_profile
from ..servers import Launcher, ServerProcess
from ..table import Table, column_median, first_error, fmt, fmt_ms, fmt_x, ok, paired_ratio
from ..transport.accounting import (
    TritonServer,
    counters,
    inference_count,
    ipc_round_trip_us,
    probe_behind_stalled_calls,
)

CONCURRENCY = (1, 4, 16)
DESIGNS = ("today", "per-call", "aio-inline", "sync-lean", "sync-watchdog", "multiproc", "bare", "triton")
WATCHDOG_MS = 20  # sync-watchdog: after this many ms without a finished call, a thread for each waiting call
STALLED_CALLS = 32  # the stall probe: ModelInfer calls that send headers and never their message
ANCHORS = ("today", "bare", "triton")  # every design's ratio is given to these
INLINE_THRESHOLD_US = 200  # aio-inline / multiproc: mean run time under which a model's calls run inline


def section_transport(args, launcher: Launcher, pa: PerfAnalyzer, table: Table, raw: dict) -> None:
    cpus = sorted(os.sched_getaffinity(0))  # run.py pinned this process (so every server started here) for --cores
    with tempfile.TemporaryDirectory(prefix="slotserve-transport-") as scratch:
        _run(args, launcher, pa, table, raw, len(cpus), cpus, Path(scratch))


def _servers(launcher: Launcher, cores: int, repository: Path, scratch: Path) -> dict:
    """The designs' servers (not started). The slotserve-based ones serve a repository holding only `simple`."""
    flags = ["--model-repository", str(repository), "--port", "0"]
    python = sys.executable
    return {
        "today": launcher.slotserve("transport-today", repository),
        # the product's rule before the runners: every call a thread at once
        "per-call": launcher.slotserve("transport-per-call", repository, ["--handler-runners", "0"]),
        "aio-inline": ServerProcess(
            "transport-aio-inline",
            [python, "-m", "bench.transport.aio_inline", "--threshold-us", str(INLINE_THRESHOLD_US),
             "--threads", str(max(2, cores)), "--", *flags],
            ROOT,
        ),
        "sync-lean": ServerProcess(
            "transport-sync-lean",
            [python, "-m", "bench.transport.sync_lean", "--workers", str(cores), "--", *flags],
            ROOT,
        ),
        "sync-watchdog": ServerProcess(
            "transport-sync-watchdog",
            [python, "-m", "bench.transport.sync_lean", "--workers", str(cores), "--watchdog-ms", str(WATCHDOG_MS),
             "--", *flags],
            ROOT,
        ),
        "multiproc": ServerProcess(
            "transport-multiproc",
            [python, "-m", "bench.transport.multiproc", "--front-ends", str(cores), "--threshold-us",
             str(INLINE_THRESHOLD_US), "--threads", str(max(2, cores)), "--", *flags],
            ROOT,
        ),
        "bare": launcher.bare("transport-bare"),
        "triton": TritonServer("transport-triton", scratch / "triton"),
    }  # fmt: skip


def _point(pa: PerfAnalyzer, server, c: int) -> dict:
    """One perf_analyzer point with the server tree's CPU µs and thread switches per request."""
    before, requests_before = counters(server.pid), inference_count(server.address, "simple")
    point = measure(pa, server, "simple", c)
    delta, requests = counters(server.pid) - before, inference_count(server.address, "simple") - requests_before
    if ok(point) and requests > 0 and requests_before >= 0:
        point["cpu_us_per_request"] = delta.cpu_s * 1e6 / requests
        point["switches_per_request"] = delta.switches / requests
    return point


def _run(args, launcher, pa, table, raw, cores: int, cpus: list[int], scratch: Path) -> None:
    from tests.differential.repositories import write_add_sub_repositories

    repository = write_add_sub_repositories(scratch / "simple-only", ("simple",)).slotserve
    points = {(d, c): [] for d in DESIGNS for c in CONCURRENCY}
    raw["transport_setup"] = {"cores": cores, "cpus": cpus, "inline_threshold_us": INLINE_THRESHOLD_US}
    with contextlib.ExitStack() as stack:
        servers = {}
        for name, server in _servers(launcher, cores, repository, scratch).items():
            try:
                servers[name] = stack.enter_context(server)
            except Exception as error:  # one design that cannot start is reported; the others are measured
                log(f"transport: {name} did not start: {error}")
                table.add("transport", f"transport {name}", f"FAILED to start: {str(error)[:160]}")
        if "triton" in servers:
            raw["transport_setup"]["triton_instances"] = servers["triton"].instances
        raw["transport_ipc"] = ipc_round_trip_us(repeats=2000 if args.quick else 10000)
        names = [d for d in DESIGNS if d in servers]
        for round_index in range(args.rounds):
            order = names if round_index % 2 == 0 else names[::-1]
            for c in CONCURRENCY:
                for name in order:
                    point = _point(pa, servers[name], c)
                    points[(name, c)].append(point)
                    log(f"transport round {round_index + 1}/{args.rounds} c={c} {name}: {describe(point)}")
        raw["transport_load"] = os.getloadavg()
        raw["transport_stall_probe_s"] = {}
        for name in names:  # last: a server whose threads the stalled calls took needs them back first
            answered = probe_behind_stalled_calls(servers[name].address, STALLED_CALLS)
            raw["transport_stall_probe_s"][name] = answered
            log(f"transport stall probe {name}: " + ("no answer" if answered is None else f"{answered * 1000:.0f} ms"))
        if args.profile:
            raw["transport_profile"] = _profiles(args, servers, pa)
    raw["transport"] = {f"{d} c={c}": runs for (d, c), runs in points.items()}
    _rows(table, raw, points, [d for d in DESIGNS if points[(d, CONCURRENCY[0])]], cores)


def _rows(table: Table, raw: dict, points: dict, names: list[str], cores: int) -> None:
    ipc = raw["transport_ipc"]
    setup = raw["transport_setup"]
    table.add(
        "transport",
        f"transport: {cores} core(s) {setup['cpus']}, triton instances {setup.get('triton_instances', 'n/a')}",
        f"IPC round trip (Unix socketpair, 200 B, blocking): p50 {ipc['p50_us']:.1f} us, mean {ipc['mean_us']:.1f} us",
    )
    probes = raw.get("transport_stall_probe_s", {})
    table.add(
        "transport",
        f"transport: ServerReady behind {STALLED_CALLS} stalled ModelInfer calls (3 s limit)",
        ", ".join(
            f"{name} " + ("no answer" if probes[name] is None else f"{probes[name] * 1000:.0f} ms") for name in probes
        ),
    )
    for c in CONCURRENCY:
        for name in names:
            runs = points[(name, c)]
            good = [p["infer_per_s"] for p in runs if ok(p)]
            ratios = ", ".join(
                f"{fmt_x(paired_ratio(runs, points[(anchor, c)], 'infer_per_s'))} {anchor}"
                for anchor in ANCHORS
                if anchor != name and anchor in names
            )
            error = first_error(runs)
            table.add(
                "transport",
                f"transport simple c={c} {name}: infer/s (range), p50/p99 ms, CPU us & switches per request",
                f"{fmt(column_median(runs, 'infer_per_s'))} ({fmt(min(good) if good else float('nan'))}-"
                f"{fmt(max(good) if good else float('nan'))}) {ratios}; "
                f"{fmt_ms(column_median(runs, 'p50_ms'))}/{fmt_ms(column_median(runs, 'p99_ms'))}; "
                f"{fmt(column_median(runs, 'cpu_us_per_request'))} us, "
                f"{fmt(column_median(runs, 'switches_per_request'), 1)} sw" + (f" [{error[:100]}]" if error else ""),
                infer_per_s=column_median(runs, "infer_per_s"),
                **{
                    f"ratio_{anchor}": paired_ratio(runs, points[(anchor, c)], "infer_per_s")
                    for anchor in ANCHORS
                    if anchor in names
                },
            )


def _profiles(args, servers: dict, pa: PerfAnalyzer) -> dict:
    """py-spy (samples of each process's GIL-holding thread, native frames included; the multi-process design with
    its front ends) on
    each Python design during its own c=16 run; summaries in bench/results/profile-transport-*.txt."""
    py_spy = find_py_spy(args.py_spy)
    if py_spy is None:
        log("--profile: py-spy not found (bench/setup.sh --with-py-spy installs it); skipped")
        return {"error": "py-spy not found"}
    duration = max(3, int(pa.trials * pa.interval_ms / 1000))
    profiles = {}
    for name in ("today", "per-call", "aio-inline", "sync-lean", "sync-watchdog", "multiproc", "bare"):
        if name not in servers:
            continue
        server = servers[name]
        out = RESULTS / f"profile-transport-{name}.raw"
        # --native: grpc.aio's Cython layer and the system calls it makes on the loop show only as native frames.
        flags = ["--gil", "--native"] + (["--subprocesses"] if name == "multiproc" else [])
        command = [py_spy, "record", "-p", str(server.pid), "-d", str(duration), "-r", str(PROFILE_RATE),
                   "-f", "raw", "-o", str(out), *flags]  # fmt: skip
        recorder = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        point = pa.run(server.address, "simple", 16)
        try:
            output, _ = recorder.communicate(timeout=duration + 60)
        except subprocess.TimeoutExpired:
            recorder.kill()
            output, _ = recorder.communicate()
        if not out.exists():
            profiles[name] = {"error": output.strip()[-300:]}
            continue
        summary = summarize_profile(out)
        summary["gil_busy"] = summary["samples"] / (PROFILE_RATE * duration)
        summary["perf_analyzer_while_profiling"] = point
        parts = {"all": None} if name != "multiproc" else {"model process": "--front-ends", "front ends": "front-end "}
        summary["parts"] = {}
        for part, process in parts.items():
            buckets, samples = profile_buckets(out, process)
            summary["parts"][part] = {"gil_busy": samples / (PROFILE_RATE * duration), "buckets": buckets}
        text = render_profile(f"transport {name}", summary)
        for part, found in summary["parts"].items():
            buckets = found["buckets"]
            text += f"\nby kind of leaf frame ({part}, GIL held {100 * found['gil_busy']:.0f} % of the time):\n"
            text += "".join(f"  {pct:5.1f} %  {bucket}\n" for bucket, pct in buckets.items())
        (RESULTS / f"profile-transport-{name}.txt").write_text(text)
        profiles[name] = summary
        log(f"profile (transport {name}) written to {out.with_suffix('.txt')}")
    return profiles


# Leaf frames by kind, first match wins: where a GIL-holding thread's time goes. wake-ups: sem_post, futex and
# condition calls (waking or waiting for another thread); sockets: sendmsg, recvmsg, read, write, epoll, eventfd;
# grpcio: its Python and Cython code; handler pool: service/process/handler_threads.py or
# bench/transport/watchdog_pool.py; slotserve: service/, engine/, the prototypes' adapter (and the bare server's
# handler); threading: threading.py, queue.py, concurrent.futures.
_BUCKETS = (
    ("wake-ups", ("sem_post", "sem_wait", "sem_trywait", "syscall (", "pthread_cond")),
    ("sockets", ("sendmsg", "recvmsg", "write (libc", "read (libc", "epoll", "eventfd")),
    ("grpcio", ("grpc/", "grpc_")),
    ("asyncio", ("asyncio", "selectors", "_asynciomodule", "events.py", "base_events")),
    ("handler pool", ("handler_threads", "watchdog_pool")),
    ("slotserve", ("service/", "engine/", "bench/transport/", "bare_server")),
    ("onnxruntime", ("onnxruntime",)),
    ("protobuf, numpy", ("protobuf", "_message", "upb", "numpy", "PyArray")),
    ("threading", ("threading.py", "queue.py", "concurrent", "_thread")),
)


def profile_buckets(path: Path, process: str | None = None) -> tuple[dict[str, float], int]:
    """Share of samples per kind of leaf frame (see _BUCKETS; "other": the interpreter, libc, the rest); with
    `process`, only the stacks of processes whose command line contains it (py-spy --subprocesses). Also returns
    the samples counted."""
    counts: dict[str, int] = {}
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        owner = next((frame for frame in reversed(frames) if frame.startswith("process ")), "")
        if process is not None and process not in owner:  # a child's stacks sit under its parent's frame
            continue
        leaf = _frame_key(frames[-1])
        bucket = next((name for name, marks in _BUCKETS if any(mark in leaf for mark in marks)), "other")
        counts[bucket] = counts.get(bucket, 0) + int(count)
        total += int(count)
    shares = {name: 100 * n / total for name, n in sorted(counts.items(), key=lambda item: -item[1])} if total else {}
    return shares, total
