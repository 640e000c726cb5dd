"""Priorities under overload (issue 38): a trickle of high-priority requests while low-priority ones overload the
model, on slotserve and on real Triton 2.51 (bench/.venv-pytriton, started as tests/differential/reference.py starts
it), in the same run, alternating point by point.

The model: a python model whose every execution costs EXECUTE_MS (a batch of up to MAX_BATCH requests costs the
same as one), one instance, `dynamic_batching { priority_levels: 2 default_priority_level: 2 }`: level 1 is
served first, level 2 (the default) after it, FIFO within a level (Triton's rule). The same files on both servers.

The servers: slotserve as `make run` starts it, slotserve with `--handler-runners 0` (see SLOTSERVE_FLAGS: why),
and Triton. Per server and round, three points, each a window of the trickle (one request every TRICKLE_MS, this
process's gRPC client, latency per request):

  unloaded   the trickle alone, at priority 1;
  priority   the trickle at priority 1 while LOW_CLIENTS threads send priority-2 requests back to back (the queue
             always holds about LOW_CLIENTS - MAX_BATCH of them: offered load above what the model serves);
  fifo       the same overload with the trickle at the default level: what it waits without priorities.

Figures: the trickle's p50 / p99 per point (medians over rounds) and the goal's ratio, p99 under overload over p99
unloaded (median of per-round ratios; goal: within 2x), and the low-priority throughput beside it. Every answer is
checked. A server that refuses the configuration (slotserve before priorities land: the model does not load) gets
one row, "skipped: priorities not supported by this server", with its reason; without bench/.venv-pytriton the
Triton points are skipped the same way. Neither fails the section. Benchmarks print figures; nothing here is timed
against a limit.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import grpc
import numpy as np

from ..common import RPC_TIMEOUT, channel, log
from ..servers import Launcher
from ..table import Table, column_median, first_error, fmt, fmt_ms, fmt_x, met_if, paired_ratio

MODEL = "prioritized"
EXECUTE_MS = 4.0  # the model's cost per execution, whatever the batch
MAX_BATCH = 4
LOW_CLIENTS = 16
TRICKLE_MS = 20.0  # one high-priority request this often (a trickle: a fifth of one execution's capacity)
HIGH, LOW = 1, 2  # Triton's priority levels: 1 is the highest
# slotserve as `make run` starts it, and with every call on a thread of its own (--handler-runners 0): by default
# a call waits for one of two runner threads in arrival order (service/process/handler_threads.py) before it
# reaches the admission, behind the low-priority calls that arrived first (up to 20 ms, when it gets a thread of
# its own), where the priority cannot reorder it.
SLOTSERVE_FLAGS = {"slotserve": [], "slotserve-runners0": ["--handler-runners", "0"]}
SERVERS = (*SLOTSERVE_FLAGS, "triton")
POINTS = ("unloaded", "priority", "fifo")
SKIPPED = "skipped: priorities not supported by this server"
GOAL = 2.0  # the trickle's p99 under overload within this many times its unloaded p99

MODEL_PY = f"""import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep({EXECUTE_MS / 1000})  # the execution's cost, the same for a batch as for one request
        answers = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", values)]))
        return answers
"""

CONFIG = f"""name: "{MODEL}"
backend: "python"
max_batch_size: {MAX_BATCH}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ priority_levels: 2 default_priority_level: {LOW} }}
"""


def write_repository(root: Path) -> Path:
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "config.pbtxt").write_text(CONFIG)
    (root / MODEL / "1" / "model.py").write_text(MODEL_PY)
    return root


def _request(values: np.ndarray, priority: int | None):
    from generated import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(values.tobytes())
    if priority is not None:
        request.parameters["priority"].uint64_param = priority
    return request


def _check(response, values: np.ndarray) -> None:
    answer = np.frombuffer(response.raw_output_contents[0], dtype=np.float32)
    if not np.array_equal(answer, values.ravel()):
        raise AssertionError(f"wrong answer {answer[:4]}")


def _overload(address: str, stop: threading.Event, served: list[int], errors: list[str]) -> None:
    """One low-priority client: requests back to back until `stop`."""
    from generated import grpc_service_pb2_grpc as pb_grpc

    values = np.full((1, 4), 2.0, dtype=np.float32)
    with channel(address) as open_channel:
        stub = pb_grpc.GRPCInferenceServiceStub(open_channel)
        try:
            while not stop.is_set():
                _check(stub.ModelInfer(_request(values, LOW), timeout=RPC_TIMEOUT), values)
                served.append(1)
        except Exception as error:  # noqa: BLE001 (reported as the point's error)
            errors.append(str(error)[:200])


def measure(address: str, point: str, seconds: float) -> dict:
    """The trickle for `seconds`, with the overload for `priority` and `fifo`: {p50_ms, p99_ms, high, low_per_s}
    or {error}."""
    from generated import grpc_service_pb2_grpc as pb_grpc

    stop = threading.Event()
    served: list[int] = []
    errors: list[str] = []
    load = [
        threading.Thread(target=_overload, args=(address, stop, served, errors), daemon=True)
        for _ in range(LOW_CLIENTS if point != "unloaded" else 0)
    ]
    latencies: list[float] = []
    values = np.full((1, 4), 1.0, dtype=np.float32)
    priority = HIGH if point != "fifo" else None
    with channel(address) as open_channel:
        stub = pb_grpc.GRPCInferenceServiceStub(open_channel)
        _check(stub.ModelInfer(_request(values, priority), timeout=RPC_TIMEOUT), values)  # connected, warm
        for thread in load:
            thread.start()
        if load:
            time.sleep(1.0)  # the overload settles into a full queue before the window
        started = time.perf_counter()
        low_before = len(served)
        try:
            while (now := time.perf_counter()) < started + seconds:
                _check(stub.ModelInfer(_request(values, priority), timeout=RPC_TIMEOUT), values)
                latencies.append(time.perf_counter() - now)
                time.sleep(max(0.0, TRICKLE_MS / 1000 - (time.perf_counter() - now)))
        except Exception as error:  # noqa: BLE001
            errors.append(str(error)[:200])
        elapsed = time.perf_counter() - started
        low = len(served) - low_before
        stop.set()
        for thread in load:
            thread.join(RPC_TIMEOUT)
    if errors:
        return {"error": errors[0]}
    if not latencies:
        return {"error": "no high-priority request finished in the window"}
    ordered = sorted(latencies)
    return {
        "p50_ms": ordered[len(ordered) // 2] * 1e3,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3,
        "high": len(ordered),
        "low_per_s": low / elapsed,
    }


def describe(point: dict) -> str:
    if "error" in point:
        return f"error: {point['error']}"
    return (
        f"high p50 {point['p50_ms']:.2f} ms p99 {point['p99_ms']:.2f} ms ({point['high']} requests), "
        f"low {point['low_per_s']:.0f}/s"
    )


def refusal(address: str) -> str | None:
    """Why the server does not serve the model (its RepositoryIndex reason), or None when it is ready."""
    from generated import grpc_service_pb2 as pb
    from generated import grpc_service_pb2_grpc as pb_grpc

    with channel(address) as open_channel:
        stub = pb_grpc.GRPCInferenceServiceStub(open_channel)
        if stub.ModelReady(pb.ModelReadyRequest(name=MODEL), timeout=RPC_TIMEOUT).ready:
            return None
        index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=RPC_TIMEOUT)
        reasons = {model.name: model.reason or model.state for model in index.models}
        return f"{MODEL}: {reasons.get(MODEL, 'not in the repository index')}"


@contextlib.contextmanager
def _triton(repository: Path, scratch: Path):
    from tests.differential.reference import find_installation, run_triton

    from .python import _TritonServer

    installation, reason = find_installation()
    if installation is None:
        raise RuntimeError(reason)
    folder = scratch / "priorities-triton-run"
    folder.mkdir(exist_ok=True)
    with run_triton(installation, repository, folder) as running:
        yield _TritonServer(running.address)


def _start(stack: contextlib.ExitStack, server: str, launcher: Launcher, repository: Path, scratch: Path):
    """The server object, or the reason it cannot be measured (it did not start, or refuses the model)."""
    try:
        if server in SLOTSERVE_FLAGS:
            flags = ["--parallel-jobs", "1", *SLOTSERVE_FLAGS[server]]
            running = stack.enter_context(
                launcher.slotserve(f"{server}-priorities", repository, flags, default_args=False)
            )
        else:
            running = stack.enter_context(_triton(repository, scratch))
        refused = refusal(running.address)
    except (grpc.RpcError, RuntimeError, OSError) as error:  # a server that cannot run this section is reported
        return None, f"{type(error).__name__}: {error}"
    return (None, refused) if refused else (running, None)


def section_priorities(args, launcher: Launcher, table: Table, raw: dict, scratch: Path) -> None:
    repository = write_repository(scratch / "priorities")
    seconds = max(2.0, args.interval_ms / 1000 * args.trials)
    points: dict[tuple[str, str], list[dict]] = {}
    with contextlib.ExitStack() as stack:
        servers, skipped = {}, {}
        for server in SERVERS:
            servers[server], skipped[server] = _start(stack, server, launcher, repository, scratch)
            if skipped[server]:
                log(f"priorities: {server} {SKIPPED}: {skipped[server]}")
        order = [(point, server) for point in POINTS for server in SERVERS if servers[server]]
        for round_index in range(args.rounds):
            for point, server in order[::-1] if round_index % 2 else order:
                result = measure(servers[server].address, point, seconds)
                points.setdefault((point, server), []).append(result)
                log(f"priorities round {round_index + 1}/{args.rounds} {server} {point}: " + describe(result))
    raw["priorities"] = {
        "points": {f"{point} {server}": runs for (point, server), runs in points.items()},
        "skipped": skipped,
        "settings": {
            "execute_ms": EXECUTE_MS,
            "max_batch": MAX_BATCH,
            "low_clients": LOW_CLIENTS,
            "trickle_ms": TRICKLE_MS,
            "window_s": seconds,
        },
    }
    _rows(table, points, skipped)


def _rows(table: Table, points: dict, skipped: dict) -> None:
    for server in SERVERS:
        if skipped[server]:
            figure = f"{server}: high-priority trickle under overload"
            table.add("priorities", figure, f"{SKIPPED} [{skipped[server][:160]}]")
            continue
        runs = {point: points[(point, server)] for point in POINTS}
        errors = [first_error(r) for r in runs.values() if first_error(r)]
        note = f" [{str(errors[0])[:100]}]" if errors else ""
        table.add(
            "priorities",
            f"{server}: high-priority p50 / p99 ms unloaded; under {LOW_CLIENTS} low-priority clients; no priority",
            "; ".join(
                f"{fmt_ms(column_median(runs[point], 'p50_ms'))} / {fmt_ms(column_median(runs[point], 'p99_ms'))}"
                for point in POINTS
            )
            + note,
        )
        ratio = paired_ratio(runs["priority"], runs["unloaded"], "p99_ms")
        table.add(
            "priorities",
            f"{server}: high-priority p99 under overload / unloaded",
            fmt_x(ratio),
            f"<= {GOAL:g}x" if server in SLOTSERVE_FLAGS else "",
            met_if(ratio, lambda v: v <= GOAL) if server in SLOTSERVE_FLAGS else None,
            ratio=ratio,
        )
        table.add(
            "priorities",
            f"{server}: low-priority requests/s during the overload (priority; no priority)",
            f"{fmt(column_median(runs['priority'], 'low_per_s'))}; {fmt(column_median(runs['fifo'], 'low_per_s'))}",
        )
