"""Dynamic batching (issue 13): the weight-bound `mlp` batched against unbatched on slotserve, against PyTriton
(Triton's dynamic batcher), and `simple` with the block against the bare server.

One row per request (perf_analyzer's default batch size 1), perf_analyzer at concurrency 16 and 1, every server
running at once and measured point by point in alternating order. slotserve serves `mlp` (the demo's config:
`dynamic_batching { }`, no delay) and `mlp_unbatched` (the same weights, without the block) from one process with
`--parallel-jobs 2` (and `mlp_delayed`: the same with a 10 ms delay and a preferred batch size of 8, to show
what a delay buys under load); PyTriton serves the same ONNX file on one onnxruntime session with the same settings, two
instances, Triton's dynamic batcher (bench/pytriton/serve.py, its own venv). A second slotserve serves `simple`
with `dynamic_batching { }` added, against the bare grpcio server.

Each round also runs the `mlp` in this process (no server, no client): two Python threads calling one session with
slotserve's default settings (one onnxruntime thread a run), first with 1-row inputs, then 16-row ones. That is what
the two cores give the unbatched and the fully batched model at that moment: a 1-row run reads all 101 MB of weights
for one row, so its rate follows the memory bandwidth the machine has then (other jobs on the host move it), while a
16-row run is bound by arithmetic. The served figures are read against these (issue 39: docs/speed.md).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc

from ..common import BENCH, DEMO_REPOSITORY, RPC_TIMEOUT, channel, log
from ..perf_analyzer import PerfAnalyzer, describe, measure
from ..servers import Launcher, ServerProcess
from ..table import Table, column_median, first_error, fmt, fmt_ms, fmt_x, median, met_if, paired_ratio

PYTRITON_PYTHON = BENCH / ".venv-pytriton" / "bin" / "python"
MLP_POINTS = (
    ("batched", "slotserve", "mlp"),
    ("unbatched", "slotserve", "mlp_unbatched"),
    ("pytriton", "pytriton", "mlp"),
    ("delayed", "slotserve", "mlp_delayed"),
)
# What a delay buys: the same weights with a 10 ms delay and a preferred size of half the concurrency.
DELAYED_BLOCK = "dynamic_batching { max_queue_delay_microseconds: 10000 preferred_batch_size: 8 }\n"
# The repositories below link to the demo's weights: the server must allow that folder.
ALLOW_DEMO = ["--allow-model-root", str(DEMO_REPOSITORY)]
# The in-process reference: rows per run, and how long each is measured (two threads at once).
IN_PROCESS_ROWS = (1, 16)
IN_PROCESS_SECONDS = 1.0


def section_batching(args, launcher: Launcher, pa: PerfAnalyzer, table: Table, raw: dict, scratch: Path) -> None:
    mlp_repository, simple_repository = _repositories(scratch)
    points: dict[tuple[str, int], list[dict]] = {}
    with contextlib.ExitStack() as stack:
        servers = {
            "slotserve": stack.enter_context(
                launcher.slotserve(
                    "slotserve-mlp", mlp_repository, ["--parallel-jobs", "2", *ALLOW_DEMO], default_args=False
                )
            ),
            "pytriton": stack.enter_context(_pytriton(scratch)),
            "simple+block": stack.enter_context(
                launcher.slotserve("slotserve-simple-block", simple_repository, ALLOW_DEMO)
            ),
            "bare": stack.enter_context(launcher.bare()),
        }
        in_process: dict[int, list[float]] = {rows: [] for rows in IN_PROCESS_ROWS}
        for round_index in range(args.rounds):
            flip = round_index % 2 == 1
            for rows, rate in mlp_in_process().items():
                in_process[rows].append(rate)
            log(
                f"batching round {round_index + 1}/{args.rounds} mlp in-process rows/s, 2 runs at once: "
                + ", ".join(f"{rows}-row runs {values[-1]:.0f}" for rows, values in in_process.items())
            )
            for c in (16, 1):
                for label, server, model in MLP_POINTS[::-1] if flip else MLP_POINTS:
                    point = measure(pa, servers[server], model, c)
                    points.setdefault((label, c), []).append(point)
                    log(f"batching round {round_index + 1}/{args.rounds} c={c} {label}: " + describe(point))
            for name in ("bare", "simple+block") if flip else ("simple+block", "bare"):
                point = measure(pa, servers[name], "simple", 16)
                points.setdefault((name, 16), []).append(point)
                log(f"batching round {round_index + 1}/{args.rounds} simple c=16 {name}: " + describe(point))
        batch_sizes = {model: _batch_sizes(servers["slotserve"], model) for model in ("mlp", "mlp_delayed")}
    raw["batching"] = {f"{label} c={c}": runs for (label, c), runs in points.items()}
    raw["batching_batch_sizes"] = batch_sizes
    raw["batching_in_process_rows_per_s"] = in_process
    _rows(table, points, batch_sizes, in_process)


def mlp_in_process() -> dict[int, float]:
    """Rows/s of the demo `mlp` in this process for each of IN_PROCESS_ROWS: two Python threads calling one shared
    session at once, with slotserve's default session settings (one intra-op thread a run, sequential). Blocks
    about len(IN_PROCESS_ROWS) * IN_PROCESS_SECONDS plus the session's load."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(
        str(DEMO_REPOSITORY / "mlp" / "1" / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
    return {rows: _rows_per_second(session, rows) for rows in IN_PROCESS_ROWS}


def _rows_per_second(session: Any, rows: int) -> float:
    """Rows/s of `rows`-row runs of `session` (an onnxruntime InferenceSession), two threads calling it at once
    for IN_PROCESS_SECONDS after one warm-up run."""
    feed = {"INPUT0": np.random.default_rng(0).standard_normal((rows, 1024), dtype=np.float32)}
    session.run(None, feed)
    counts = [0, 0]
    started = time.perf_counter()
    deadline = started + IN_PROCESS_SECONDS

    def loop(index: int) -> None:
        while time.perf_counter() < deadline:
            session.run(None, feed)
            counts[index] += 1

    workers = [threading.Thread(target=loop, args=(index,)) for index in range(len(counts))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return rows * sum(counts) / (time.perf_counter() - started)


def _repositories(scratch: Path) -> tuple[Path, Path]:
    """`mlp` and `mlp_unbatched` (same weights, no block) in one repository; `simple` with the block in another.
    The weights are symlinked, not copied."""
    mlp_repository, simple_repository = scratch / "batching-mlp", scratch / "batching-simple"
    demo_config = (DEMO_REPOSITORY / "mlp" / "config.pbtxt").read_text()
    variants = (
        ("mlp", demo_config),
        ("mlp_unbatched", demo_config.replace("dynamic_batching { }\n", "")),
        ("mlp_delayed", demo_config.replace("dynamic_batching { }\n", DELAYED_BLOCK)),
    )
    for name, config in variants:
        config = config.replace('name: "mlp"', f'name: "{name}"')
        (mlp_repository / name).mkdir(parents=True)
        (mlp_repository / name / "1").symlink_to(DEMO_REPOSITORY / "mlp" / "1", target_is_directory=True)
        (mlp_repository / name / "config.pbtxt").write_text(config)
    (simple_repository / "simple").mkdir(parents=True)
    (simple_repository / "simple" / "1").symlink_to(DEMO_REPOSITORY / "simple" / "1", target_is_directory=True)
    (simple_repository / "simple" / "config.pbtxt").write_text(
        (DEMO_REPOSITORY / "simple" / "config.pbtxt").read_text() + "dynamic_batching { }\n"
    )
    return mlp_repository, simple_repository


def _pytriton(scratch: Path) -> ServerProcess:
    if not os.access(PYTRITON_PYTHON, os.X_OK):
        raise RuntimeError(f"{PYTRITON_PYTHON} is missing: run bench/setup.sh")
    with socket.socket() as probe:  # Triton takes a fixed port: pick a free one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [
        str(PYTRITON_PYTHON),
        str(BENCH / "pytriton" / "serve.py"),
        "--model",
        str(DEMO_REPOSITORY / "mlp" / "1" / "model.onnx"),
        "--grpc-port",
        str(port),
        "--instances",
        "2",
        "--max-batch-size",
        "16",
    ]
    server = ServerProcess("pytriton-mlp", argv, scratch)
    # Triton's python backend stub links libpython: it must find the interpreter's own, not the system's.
    server.environment = {"LD_LIBRARY_PATH": _libdir()}
    return server


def _libdir() -> str:
    import sysconfig

    return sysconfig.get_config_var("LIBDIR") or str(Path(sys.base_prefix) / "lib")


def _batch_sizes(server: ServerProcess, model: str) -> dict[int, int]:
    """Executions per batch size, from the server's ModelStatistics (as Triton reports them)."""
    with channel(server.address) as connection:
        stats = (
            pb_grpc.GRPCInferenceServiceStub(connection)
            .ModelStatistics(pb.ModelStatisticsRequest(name=model), timeout=RPC_TIMEOUT)
            .model_stats[0]
        )
    return {int(entry.batch_size): int(entry.compute_infer.count) for entry in stats.batch_stats}


def _rows(
    table: Table, points: dict, batch_sizes: dict[str, dict[int, int]], in_process: dict[int, list[float]]
) -> None:
    def value(label: str, c: int, key: str) -> float:
        return column_median(points[(label, c)], key)

    errors = [first_error(runs) for runs in points.values() if first_error(runs)]
    note = f" [{str(errors[0])[:100]}]" if errors else ""
    labels = ("batched", "unbatched", "pytriton", "delayed")
    for c in (16, 1):
        table.add(
            "batching",
            f"mlp c={c}: infer/s batched, unbatched, PyTriton, batched with a 10 ms delay",
            ", ".join(fmt(value(label, c, "infer_per_s")) for label in labels) + note,
        )
        table.add(
            "batching",
            f"mlp c={c}: p50 / p99 ms, same order",
            ", ".join(f"{fmt_ms(value(label, c, 'p50_ms'))} / {fmt_ms(value(label, c, 'p99_ms'))}" for label in labels),
        )
    one_row, full = median(in_process[1]), median(in_process[16])
    table.add(
        "batching",
        "mlp in-process, 2 runs at once (no server): rows/s of 1-row runs, of 16-row runs",
        f"{fmt(one_row)}, {fmt(full)} ({fmt_x(full / one_row)}: the most batching can give on these cores now)",
        one_row=one_row,
        sixteen_rows=full,
    )
    unbatched = column_median(points[("unbatched", 16)], "infer_per_s")
    table.add(
        "batching",
        "mlp c=16 unbatched infer/s / in-process 1-row rows/s",
        fmt_x(unbatched / one_row),
        ratio=unbatched / one_row,
    )
    speedup = paired_ratio(points[("batched", 16)], points[("unbatched", 16)], "infer_per_s")
    table.add(
        "batching",
        "mlp c=16, 2 slots: batched / unbatched infer/s",
        fmt_x(speedup),
        ">= 3.5x",
        met_if(speedup, lambda v: v >= 3.5),
        ratio=speedup,
    )
    versus = paired_ratio(points[("batched", 16)], points[("pytriton", 16)], "infer_per_s")
    table.add(
        "batching",
        "mlp c=16: slotserve batched / PyTriton infer/s",
        fmt_x(versus),
        ">= 1.3x",
        met_if(versus, lambda v: v >= 1.3),
        ratio=versus,
    )
    ahead = paired_ratio(points[("batched", 1)], points[("pytriton", 1)], "infer_per_s")
    table.add(
        "batching",
        "mlp c=1: slotserve batched / PyTriton infer/s",
        fmt_x(ahead),
        "> 1.0x",
        met_if(ahead, lambda v: v > 1.0),
        ratio=ahead,
    )
    p99 = paired_ratio(points[("batched", 1)], points[("unbatched", 1)], "p99_ms")
    table.add(
        "batching",
        "mlp c=1: p99 batched / unbatched",
        fmt_x(p99),
        "<= 1.1x",
        met_if(p99, lambda v: v <= 1.1),
        ratio=p99,
    )
    simple = paired_ratio(points[("simple+block", 16)], points[("bare", 16)], "infer_per_s")
    table.add(
        "batching",
        "simple c=16 with dynamic_batching { }: infer/s slotserve / bare",
        f"{fmt(value('simple+block', 16, 'infer_per_s'))} / {fmt(value('bare', 16, 'infer_per_s'))} = {fmt_x(simple)}",
        ">= 0.90",
        met_if(simple, lambda v: v >= 0.90),
        ratio=simple,
    )
    delayed = paired_ratio(points[("delayed", 16)], points[("unbatched", 16)], "infer_per_s")
    table.add(
        "batching", "mlp c=16, 2 slots: batched with a 10 ms delay / unbatched infer/s", fmt_x(delayed), ratio=delayed
    )
    for model, sizes in batch_sizes.items():
        executions = sum(sizes.values())
        rows = sum(size * count for size, count in sizes.items())
        table.add(
            "batching",
            f"{model} batch sizes seen, c=16 and c=1 (size: executions)",
            ", ".join(f"{size}: {count}" for size, count in sorted(sizes.items()))
            + (f"; mean {rows / executions:.1f} rows per execution" if executions else ""),
        )
