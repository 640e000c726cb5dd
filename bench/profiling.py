"""py-spy profiles of the servers during a concurrency-16 `simple` run (`bench/run.py --profile`)."""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
from pathlib import Path

from .common import BENCH, RESULTS, ROOT, log
from .perf_analyzer import PerfAnalyzer
from .servers import ServerProcess
from .table import fmt


def find_py_spy(explicit: str | None) -> str | None:
    for candidate in (explicit, str(BENCH / ".venv-pa" / "bin" / "py-spy"), shutil.which("py-spy")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


PROFILE_RATE = 200  # samples per second


def profile_servers(args, servers: dict[str, ServerProcess], pa: PerfAnalyzer) -> dict:
    """py-spy on each server during its own concurrency-16 `simple` run: samples of the thread holding the GIL
    (on a thread-pooled Python server the GIL is the shared resource); slotserve also with native frames. The
    share of samples taken over the samples asked for approximates how busy the GIL was."""
    py_spy = find_py_spy(args.py_spy)
    if py_spy is None:
        log("--profile: py-spy not found (bench/setup.sh --with-py-spy installs it); skipped")
        return {"error": "py-spy not found"}
    profiles = {}
    duration = max(3, int(pa.trials * pa.interval_ms / 1000))
    plan = [
        ("slotserve", "gil", ["--gil"]),
        ("slotserve", "gil-native", ["--gil", "--native"]),
        ("bare", "gil", ["--gil"]),
    ]
    for name, mode, flags in plan:
        label = f"{name} {mode}"
        server = servers[name]
        out = RESULTS / f"profile-simple-c16-{name}-{mode}.raw"
        command = [
            py_spy,
            "record",
            "-p",
            str(server.pid),
            "-d",
            str(duration),
            "-r",
            str(PROFILE_RATE),
            "-f",
            "raw",
            "-o",
            str(out),
            *flags,
        ]
        recorder = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        point = pa.run(server.address, "simple", 16)
        try:
            output, _ = recorder.communicate(timeout=duration + 60)
        except subprocess.TimeoutExpired:
            recorder.kill()
            output, _ = recorder.communicate()
        if not out.exists():
            profiles[label] = {"error": output.strip()[-300:]}
            continue
        summary = summarize_profile(out)
        summary["gil_busy"] = summary["samples"] / (PROFILE_RATE * duration)
        summary["perf_analyzer_while_profiling"] = point
        (RESULTS / f"profile-simple-c16-{name}-{mode}.txt").write_text(render_profile(label, summary))
        profiles[label] = summary
        log(f"profile ({label}) written to {out} and {out.with_suffix('.txt')}")
    return profiles


_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _frame_key(frame: str) -> str:
    if frame.startswith("0x") and frame.endswith(")"):
        return "[" + frame[frame.find("(") + 1 : -1] + "]"  # an unsymbolized native frame: keep the library
    match = _FRAME.match(frame)
    if not match:
        return frame
    path = match.group("file")
    for marker in ("site-packages/", str(ROOT) + "/", "/lib/python3"):
        index = path.find(marker)
        if index >= 0:
            path = path[index + len(marker) :] if marker != "/lib/python3" else "stdlib:" + path.rsplit("/", 1)[-1]
            break
    return f"{match.group('function')} ({path})"


def summarize_profile(path: Path, top: int = 25) -> dict:
    own: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame_key(f) for f in stack.split(";") if f]
        if not frames:
            continue
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    return {
        "samples": total,
        "self": [(f, n, 100 * n / total) for f, n in own.most_common(top)] if total else [],
        "inclusive": [(f, n, 100 * n / total) for f, n in inclusive.most_common(top)] if total else [],
    }


def render_profile(label: str, summary: dict) -> str:
    point = summary.get("perf_analyzer_while_profiling") or {}
    lines = [
        f"py-spy on {label}, simple c=16: {summary['samples']} samples with the GIL held "
        f"(~{100 * summary.get('gil_busy', float('nan')):.0f} % of the time); "
        f"{fmt(point.get('infer_per_s', float('nan')))} infer/s while profiled"
    ]
    for kind in ("self", "inclusive"):
        lines.append(f"\ntop {kind}:")
        lines += [f"  {pct:5.1f} %  {frame}" for frame, _n, pct in summary[kind]]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------- main
