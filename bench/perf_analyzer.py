"""perf_analyzer (the C++ client of tritonclient 2.51.0, set up by bench/setup.sh): one measured point per call."""

from __future__ import annotations

import csv
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .common import CACHE, LOGS, ROOT
from .servers import ServerProcess
from .table import ok

PERF_ANALYZER = CACHE / "perf_analyzer"


def perf_analyzer_version() -> str:
    try:
        result = subprocess.run([str(PERF_ANALYZER), "--version"], capture_output=True, text=True, timeout=30)
    except OSError as error:
        return f"unavailable ({error})"
    return (result.stdout or result.stderr).strip().splitlines()[0] if result.returncode == 0 else "unavailable"


class PerfAnalyzer:
    def __init__(self, interval_ms: int, trials: int, workdir: Path) -> None:
        self.interval_ms = interval_ms
        self.trials = trials
        self.workdir = workdir
        self._runs = 0

    def run(
        self,
        address: str,
        model: str,
        concurrency: int,
        shape: str | None = None,
        extra: Sequence[str] = (),
        interval_ms: int | None = None,
    ) -> dict:
        """One perf_analyzer point (`extra`: more of its flags; `interval_ms`: a longer window for this point).
        Returns the CSV row's figures, or {"error": ...}."""
        interval_ms = interval_ms or self.interval_ms
        self._runs += 1
        out = self.workdir / f"pa-{self._runs}.csv"
        command = [
            str(PERF_ANALYZER),
            "-i",
            "grpc",
            "-u",
            address,
            "-m",
            model,
            "--concurrency-range",
            f"{concurrency}:{concurrency}",
            "--measurement-interval",
            str(interval_ms),
            "--stability-percentage",
            "1000",
            "--max-trials",
            str(self.trials),
            "-f",
            str(out),
        ]
        if shape:
            command += ["--shape", shape]
        command += list(extra)
        timeout = 60 + 4 * self.trials * interval_ms / 1000
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"perf_analyzer ran past {timeout:.0f} s"}
        if result.returncode != 0 or not out.exists():
            LOGS.mkdir(parents=True, exist_ok=True)
            saved = LOGS / f"perf_analyzer-failed-{self._runs}.txt"
            saved.write_text(" ".join(command) + "\n\n" + result.stdout + "\n" + result.stderr)
            lines = [line.strip() for line in (result.stdout + result.stderr).splitlines() if line.strip()]
            errors = [line for line in lines if re.search(r"error|fail|unable|abort", line, re.I)] or lines[-3:]
            return {
                "error": f"perf_analyzer exit {result.returncode}: "
                + " | ".join(errors[:3])[:400]
                + f" (output: {saved.relative_to(ROOT)})"
            }
        with open(out, newline="") as handle:
            rows = list(csv.DictReader(handle))
        if not rows:
            return {"error": "perf_analyzer wrote no CSV row"}
        row = rows[0]

        def us(column: str) -> float:
            return float(row[column]) if row.get(column) not in (None, "") else float("nan")

        return {
            "infer_per_s": float(row["Inferences/Second"]),
            "p50_ms": us("p50 latency") / 1000,
            "p90_ms": us("p90 latency") / 1000,
            "p99_ms": us("p99 latency") / 1000,
            "client_send_us": us("Client Send"),
            "network_server_us": us("Network+Server Send/Recv"),
            "server_queue_us": us("Server Queue"),
            "server_compute_input_us": us("Server Compute Input"),
            "server_compute_infer_us": us("Server Compute Infer"),
            "server_compute_output_us": us("Server Compute Output"),
            "client_recv_us": us("Client Recv"),
        }


# ----------------------------------------------------------------------------------------------- helpers


def measure(
    pa: PerfAnalyzer,
    server: ServerProcess,
    model: str,
    concurrency: int,
    shape: str | None = None,
    extra: Sequence[str] = (),
    interval_ms: int | None = None,
):
    point = pa.run(server.address, model, concurrency, shape, extra, interval_ms)
    if not ok(point):
        point["error"] = server.explain(point["error"])
    return point


def measure_fp32_bytes(
    pa: PerfAnalyzer,
    server: ServerProcess,
    model: str,
    concurrency: int,
    elements: int,
    extra: Sequence[str] = (),
    interval_ms: int | None = None,
) -> dict:
    """`measure` with an FP32 input of `elements` values, adding `mb_per_s` (request payload bytes per second)."""
    point = measure(pa, server, model, concurrency, f"INPUT0:{elements}", extra, interval_ms)
    if ok(point):
        point["mb_per_s"] = point["infer_per_s"] * elements * 4 / 1e6
    return point


def describe(point: dict) -> str:
    if not ok(point):
        return "ERROR " + point["error"]
    return (
        f"{point['infer_per_s']:.1f} infer/s, p50 {point['p50_ms']:.2f} ms, p99 {point['p99_ms']:.2f} ms "
        f"(server queue {point['server_queue_us']:.0f} us, infer {point['server_compute_infer_us']:.0f} us)"
    )
