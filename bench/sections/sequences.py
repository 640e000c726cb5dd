"""Sequence batching (issue 23): SEQUENCES concurrent sequences on a python accumulator (tests/sequence_models.py:
a running sum per correlation id in the worker, one instance, max_batch_size SEQUENCES, a fixed EXECUTE_SECONDS
sleep per execute call however many requests it holds), configured `direct` and `oldest`, on slotserve and on
real Triton 2.51 (its python backend supports sequence batching; bench/.venv-pytriton), measured point by point
in alternating order with perf_analyzer at concurrency SEQUENCES: each of its contexts runs one sequence of about
SEQUENCE_LENGTH requests at a time, one request in flight, and ends it.

Figures: infer/s and p50 / p99 per server and strategy side by side, oldest / direct per server (median of the
per-round ratios), and the mean requests per execution (ModelStatistics: inference_count / execution_count).

A server that refuses the config (slotserve before sequence batching lands: the model does not load) gets one row
"skipped: sequence batching not supported by this server", with its reason; without bench/.venv-pytriton the
Triton points are skipped the same way. Neither fails the section.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import grpc

from ..common import RPC_TIMEOUT, channel, log
from ..perf_analyzer import PerfAnalyzer, describe, measure
from ..servers import Launcher
from ..table import Table, column_median, first_error, fmt, fmt_ms, fmt_x, paired_ratio

SEQUENCES = 16
SEQUENCE_LENGTH = 20
EXECUTE_SECONDS = 0.002  # the fixed cost of one execute call
IDLE_MICROSECONDS = 10_000_000  # a sequence perf_analyzer leaves open is released after this
MODELS = {"direct": "seq_direct", "oldest": "seq_oldest"}
SERVERS = ("slotserve", "triton")
SKIPPED = "skipped: sequence batching not supported by this server"


def write_repository(root: Path) -> Path:
    """The two accumulators (direct, oldest) in one repository, servable by slotserve and by Triton alike."""
    from tests import sequence_models as models

    for strategy, name in MODELS.items():
        options = models.SequenceOptions(
            strategy=strategy,
            max_batch_size=SEQUENCES,
            max_candidate_sequences=SEQUENCES,
            preferred_batch_size=(SEQUENCES,) if strategy == models.OLDEST else (),
            max_queue_delay_microseconds=0,
            max_sequence_idle_microseconds=IDLE_MICROSECONDS,
        )
        models.write_python_accumulate(root, name, options, execute_seconds=EXECUTE_SECONDS)
    return root


def refusal(address: str) -> str | None:
    """None when both models are ready on the server at `address`; otherwise what it says of the first one that
    is not (RepositoryIndex's reason, or that it is not ready)."""
    from generated import grpc_service_pb2 as pb
    from generated import grpc_service_pb2_grpc as pb_grpc

    with channel(address) as open_channel:
        stub = pb_grpc.GRPCInferenceServiceStub(open_channel)
        index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=RPC_TIMEOUT)
        reasons = {model.name: model.reason or model.state for model in index.models}
        for name in MODELS.values():
            ready = stub.ModelReady(pb.ModelReadyRequest(name=name), timeout=RPC_TIMEOUT).ready
            if not ready:
                return f"{name}: {reasons.get(name, 'not in the repository index')}"
    return None


def mean_batch(address: str, model: str) -> float:
    """Requests per execution of `model` so far (ModelStatistics), NaN before its first execution."""
    from generated import grpc_service_pb2 as pb
    from generated import grpc_service_pb2_grpc as pb_grpc

    with channel(address) as open_channel:
        stub = pb_grpc.GRPCInferenceServiceStub(open_channel)
        try:
            (stats,) = stub.ModelStatistics(pb.ModelStatisticsRequest(name=model), timeout=RPC_TIMEOUT).model_stats
        except (grpc.RpcError, ValueError) as error:  # a figure missing, not a section failed
            log(f"sequences: no statistics of {model} at {address}: {error}")
            return float("nan")
    return stats.inference_count / stats.execution_count if stats.execution_count else float("nan")


@contextlib.contextmanager
def _triton(repository: Path, scratch: Path):
    from tests.differential.reference import find_installation, run_triton

    from .python import _TritonServer

    installation, reason = find_installation()
    if installation is None:
        raise RuntimeError(reason)
    folder = scratch / "sequences-triton-run"
    folder.mkdir(exist_ok=True)
    with run_triton(installation, repository, folder) as running:
        yield _TritonServer(running.address)


def _start(stack: contextlib.ExitStack, server: str, launcher: Launcher, repository: Path, scratch: Path):
    """The server object, or the reason it cannot be measured (it did not start, or refuses the models)."""
    try:
        if server == "slotserve":
            running = stack.enter_context(launcher.slotserve("slotserve-sequences", repository))
        else:
            running = stack.enter_context(_triton(repository, scratch))
        refused = refusal(running.address)
    except Exception as error:  # a server that cannot run this section is reported, not fatal
        return None, f"{type(error).__name__}: {error}"
    return (None, refused) if refused else (running, None)


def section_sequences(args, launcher: Launcher, pa: PerfAnalyzer, table: Table, raw: dict, scratch: Path) -> None:
    repository = write_repository(scratch / "sequences")
    points: dict[tuple[str, str], list[dict]] = {}
    batches: dict[tuple[str, str], float] = {}
    with contextlib.ExitStack() as stack:
        servers, skipped = {}, {}
        for server in SERVERS:
            servers[server], skipped[server] = _start(stack, server, launcher, repository, scratch)
            if skipped[server]:
                log(f"sequences: {server} {SKIPPED}: {skipped[server]}")
        order = [(strategy, server) for strategy in MODELS for server in SERVERS if servers[server]]
        runs = 0
        for round_index in range(args.rounds):
            for strategy, server in order[::-1] if round_index % 2 else order:
                runs += 1
                # Fresh ids per run: a sequence a run leaves open never meets the next run's.
                first = runs * 100_000
                extra = ["--sequence-length", str(SEQUENCE_LENGTH), "--sequence-id-range", f"{first}:{first + 99_999}"]
                point = measure(pa, servers[server], MODELS[strategy], SEQUENCES, extra=extra)
                points.setdefault((strategy, server), []).append(point)
                log(f"sequences round {round_index + 1}/{args.rounds} {strategy} {server}: " + describe(point))
        for strategy, server in order:
            batches[(strategy, server)] = mean_batch(servers[server].address, MODELS[strategy])
    raw["sequences"] = {
        "points": {f"{strategy} {server}": runs for (strategy, server), runs in points.items()},
        "mean_batch": {f"{strategy} {server}": value for (strategy, server), value in batches.items()},
        "skipped": skipped,
    }
    _rows(table, points, batches, skipped)


def _rows(table: Table, points: dict, batches: dict, skipped: dict) -> None:
    for server in SERVERS:
        if skipped[server]:
            table.add(
                "sequences",
                f"{server}: {SEQUENCES} sequences, direct and oldest",
                f"{SKIPPED} [{skipped[server][:160]}]",
            )
            continue
        runs = {strategy: points[(strategy, server)] for strategy in MODELS}
        errors = [first_error(r) for r in runs.values() if first_error(r)]
        note = f" [{str(errors[0])[:100]}]" if errors else ""
        table.add(
            "sequences",
            f"{server}: {SEQUENCES} sequences, infer/s direct, oldest",
            ", ".join(fmt(column_median(runs[strategy], "infer_per_s")) for strategy in MODELS) + note,
        )
        table.add(
            "sequences",
            f"{server}: p50 / p99 direct; oldest",
            "; ".join(
                f"{fmt_ms(column_median(runs[strategy], 'p50_ms'))} / {fmt_ms(column_median(runs[strategy], 'p99_ms'))}"
                for strategy in MODELS
            ),
        )
        ratio = paired_ratio(runs["oldest"], runs["direct"], "infer_per_s")
        table.add("sequences", f"{server}: oldest / direct (infer/s)", fmt_x(ratio), ratio=ratio)
        table.add(
            "sequences",
            f"{server}: requests per execution direct, oldest",
            ", ".join(f"{batches[(strategy, server)]:.1f}" for strategy in MODELS),
        )
