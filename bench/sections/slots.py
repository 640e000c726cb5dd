"""matmul_chain with 1, 2 and 4 slots at a fixed concurrency: how throughput scales with slots."""

from __future__ import annotations

import threading
import time

import numpy as np

from ..common import DEMO_REPOSITORY, log
from ..perf_analyzer import PerfAnalyzer, describe, measure
from ..servers import Launcher
from ..table import Table, column_median, first_error, fmt, fmt_ms, fmt_x, median, met_if, paired_ratio

SLOT_COUNTS = (1, 2, 4)
SLOTS_CONCURRENCY = 8


def section_slots(args, launcher: Launcher, pa: PerfAnalyzer, table: Table, raw: dict) -> None:
    points: dict[int, list] = {n: [] for n in SLOT_COUNTS}
    servers = {}
    try:
        for n in SLOT_COUNTS:
            servers[n] = launcher.slotserve(
                f"slotserve-slots{n}", DEMO_REPOSITORY, ["--parallel-jobs", str(n)], default_args=False
            ).start()
        calibration: dict[int, list[float]] = {1: [], 2: []}
        for round_index in range(args.rounds):
            for threads, values in matmul_chain_in_process().items():
                calibration[threads] += values
            log(
                f"slots round {round_index + 1}/{args.rounds} in-process calls/s, 1 thread "
                f"{calibration[1][-1]:.1f}, 2 threads {calibration[2][-1]:.1f}"
            )
            order = SLOT_COUNTS if round_index % 2 == 0 else tuple(reversed(SLOT_COUNTS))
            for n in order:
                point = measure(pa, servers[n], "matmul_chain", SLOTS_CONCURRENCY)
                points[n].append(point)
                log(
                    f"slots round {round_index + 1}/{args.rounds} {n} slot(s) c={SLOTS_CONCURRENCY}: " + describe(point)
                )
    finally:
        for server in servers.values():
            server.stop()
    raw["slots"] = {f"{n} slots": runs for n, runs in points.items()}
    raw["slots_in_process"] = calibration
    one, two = median(calibration[1]), median(calibration[2])
    table.add(
        "slots",
        "matmul_chain in-process onnxruntime (no server): /s with 1 thread, 2 threads",
        f"{fmt(one, 1)}, {fmt(two, 1)} ({fmt_x(two / one)}: what this machine gives 2 slots now)",
        one_thread=one,
        two_threads=two,
    )
    for n in SLOT_COUNTS:
        value = column_median(points[n], "infer_per_s")
        scaling = paired_ratio(points[n], points[1], "infer_per_s")
        error = first_error(points[n])
        target = "2 slots >= 1.8x 1 slot" if n == 2 else ""
        table.add(
            "slots",
            f"matmul_chain {n} slot(s), c={SLOTS_CONCURRENCY}: infer/s (x 1 slot)",
            f"{fmt(value, 1)} ({fmt_x(scaling)}, p50 {fmt_ms(column_median(points[n], 'p50_ms'))} ms)"
            + (f" [{error[:100]}]" if error else ""),
            target,
            met_if(scaling, lambda v: v >= 1.8) if n == 2 else None,
            infer_per_s=value,
            scaling=scaling,
        )


def matmul_chain_in_process(rounds: int = 1, calls: int = 30) -> dict[int, list[float]]:
    """matmul_chain calls/s in this process, one onnxruntime thread per run, with 1 and with 2 Python threads
    calling one shared session at once (alternating, `rounds` times each): how far the cores scale right now,
    without any server, the client or gRPC."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(
        str(DEMO_REPOSITORY / "matmul_chain" / "1" / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
    feed = {"INPUT0": np.random.default_rng(0).standard_normal((384, 64), dtype=np.float32)}
    for _ in range(3):
        session.run(None, feed)

    def loop() -> None:
        for _ in range(calls):
            session.run(None, feed)

    result: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(rounds):
        for threads in (1, 2):
            workers = [threading.Thread(target=loop) for _ in range(threads)]
            started = time.perf_counter()
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            result[threads].append(threads * calls / (time.perf_counter() - started))
    return result
