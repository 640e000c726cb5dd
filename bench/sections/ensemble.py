"""Ensembles (issue 23 part 5): a chain of three light python steps (X -> +1 -> *2 -> -3 -> Y, FP32 [16]) called as
one ensemble against the same three models called by the client one after another (each answer fed to the next
call), on slotserve (--parallel-jobs 2) and on real Triton 2.51 (python backend, bench/.venv-pytriton, started as
tests/differential/reference.py starts it), in the same run, alternating point by point.

The client is this process: CLIENTS threads, each with its own channel, each running pipelines back to back for
the window (the ensemble: one ModelInfer; the three calls: three ModelInfer, the raw output of one the input of
the next). Figures: pipelines per second and the median pipeline latency; ratios are medians of per-round
ratios. perf_analyzer is not used: it cannot chain three calls, and one tool measures all four points.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import numpy as np

from ..common import channel, log
from ..table import Table, column_median, first_error, fmt, fmt_ms, fmt_x, met_if, paired_ratio
from .python import _triton

STEPS = (("plus1", "x + 1"), ("times2", "x * 2"), ("minus3", "x - 3"))
ENSEMBLE = "chain"
CLIENTS = (1, 4)
SHAPE = (16,)

STEP_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", ({expression}).astype(np.float32))]))
        return out
"""

IO = """input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def write_repository(root: Path) -> Path:
    """The three python steps and the ensemble chaining them; servable by slotserve and by Triton alike."""
    for name, expression in STEPS:
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{IO}')
        (root / name / "1" / "model.py").write_text(STEP_MODEL.replace("{expression}", expression))
    tensors = ["X", "a", "b", "Y"]
    steps = ", ".join(
        f'{{ model_name: "{name}" model_version: -1 input_map {{ key: "X" value: "{tensors[i]}" }} '
        f'output_map {{ key: "Y" value: "{tensors[i + 1]}" }} }}'
        for i, (name, _) in enumerate(STEPS)
    )
    (root / ENSEMBLE / "1").mkdir(parents=True)
    (root / ENSEMBLE / "config.pbtxt").write_text(
        f'name: "{ENSEMBLE}"\nplatform: "ensemble"\nmax_batch_size: 0\n{IO}ensemble_scheduling {{ step [ {steps} ] }}\n'
    )
    return root


def _request(model: str, x: np.ndarray):
    from generated import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="X", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.tobytes())
    return request


def _pipeline(stub, x: np.ndarray, chained: bool) -> np.ndarray:
    """One pipeline: the ensemble, or the three steps one after another. Returns Y."""
    if not chained:
        response = stub.ModelInfer(_request(ENSEMBLE, x), timeout=60)
        return np.frombuffer(response.raw_output_contents[0], dtype=np.float32)
    value = x
    for name, _ in STEPS:
        response = stub.ModelInfer(_request(name, value), timeout=60)
        value = np.frombuffer(response.raw_output_contents[0], dtype=np.float32)
    return value


def measure(address: str, chained: bool, clients: int, seconds: float) -> dict:
    """`clients` threads running pipelines back to back for `seconds`: {per_s, p50_ms} or {error}. Every answer
    is checked against numpy (a wrong one is an error)."""
    from generated import grpc_service_pb2_grpc as pb_grpc

    x = np.arange(SHAPE[0], dtype=np.float32)
    expected = (x + 1) * 2 - 3
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    start = threading.Barrier(clients + 1)

    def run(index: int) -> None:
        with channel(address) as open_channel:
            stub = pb_grpc.GRPCInferenceServiceStub(open_channel)
            _pipeline(stub, x, chained)  # warm: the channel is connected before the window
            start.wait()
            deadline = time.perf_counter() + seconds
            try:
                while (now := time.perf_counter()) < deadline:
                    answer = _pipeline(stub, x, chained)
                    latencies[index].append(time.perf_counter() - now)
                    if not np.array_equal(answer, expected):
                        raise AssertionError(f"wrong answer {answer[:4]}...")
            except Exception as error:  # noqa: BLE001 (reported as the point's error)
                errors.append(str(error)[:200])

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    for thread in threads:
        thread.join(seconds + 120)
    if errors:
        return {"error": errors[0]}
    every = sorted(t for per_client in latencies for t in per_client)
    if not every:
        return {"error": "no pipeline finished in the window"}
    return {"per_s": len(every) / seconds, "p50_ms": every[len(every) // 2] * 1e3, "pipelines": len(every)}


def describe(point: dict) -> str:
    if "error" in point:
        return f"error: {point['error']}"
    return f"{point['per_s']:.0f}/s p50 {point['p50_ms']:.2f} ms"


POINTS = tuple((server, chained, c) for c in CLIENTS for server in ("slotserve", "triton") for chained in (False, True))


def section_ensemble(args, launcher, table: Table, raw: dict, scratch: Path) -> None:
    ours = write_repository(scratch / "ensemble-slotserve")
    theirs = write_repository(scratch / "ensemble-triton")
    seconds = max(1.0, args.interval_ms / 1000 * args.trials)
    points: dict[tuple[str, bool, int], list[dict]] = {}
    with contextlib.ExitStack() as stack:
        servers = {
            "slotserve": stack.enter_context(
                launcher.slotserve("slotserve-ensemble", ours, ["--parallel-jobs", "2"], default_args=False)
            ),
            "triton": stack.enter_context(_triton(theirs, scratch)),
        }
        for round_index in range(args.rounds):
            for server, chained, c in POINTS[::-1] if round_index % 2 else POINTS:
                point = measure(servers[server].address, chained, c, seconds)
                points.setdefault((server, chained, c), []).append(point)
                kind = "3 calls" if chained else "ensemble"
                log(f"ensemble round {round_index + 1}/{args.rounds} {server} {kind} c={c}: " + describe(point))
    raw["ensemble"] = {
        f"{server} {'3 calls' if chained else 'ensemble'} c={c}": runs for (server, chained, c), runs in points.items()
    }
    _rows(table, points)


def _rate_and_p50(runs: list[dict]) -> str:
    return f"{fmt(column_median(runs, 'per_s'))} ({fmt_ms(column_median(runs, 'p50_ms'))})"


def _rows(table: Table, points: dict) -> None:
    errors = [first_error(runs) for runs in points.values() if first_error(runs)]
    note = f" [{str(errors[0])[:100]}]" if errors else ""
    for c in CLIENTS:
        order = [(s, chained) for s in ("slotserve", "triton") for chained in (False, True)]
        table.add(
            "ensemble",
            f"3-step python chain c={c}: pipelines/s (p50 ms) slotserve ensemble, 3 calls; Triton ensemble, 3 calls",
            ", ".join(_rate_and_p50(points[(s, ch, c)]) for s, ch in order) + note,
        )
        ours = paired_ratio(points[("slotserve", False, c)], points[("slotserve", True, c)], "per_s")
        theirs = paired_ratio(points[("triton", False, c)], points[("triton", True, c)], "per_s")
        table.add(
            "ensemble",
            f"3-step python chain c={c}: ensemble / 3 client calls, slotserve; Triton",
            f"{fmt_x(ours)}; {fmt_x(theirs)}",
            "> 1x (first)",
            met_if(ours, lambda v: v > 1.0),
            ratio=ours,
            triton_ratio=theirs,
        )
        versus = paired_ratio(points[("slotserve", False, c)], points[("triton", False, c)], "per_s")
        table.add(
            "ensemble",
            f"3-step python chain c={c}: ensemble pipelines/s slotserve / Triton",
            fmt_x(versus),
            ratio=versus,
        )
