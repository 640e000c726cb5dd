"""Asked of real Triton 2.51 and of slotserve on the same repository (tests/python_models/overlap), the same way
(tests/integration/_python_overlap.py: a stream per request, or one for several; gates the test opens):

- a decoupled model's `async def execute` overlaps on one instance: four requests in execute at once (on four
  streams, or on one), each answering when its gate opens, and BLS `async_exec` calls of overlapping requests overlap
  too; a model that is not decoupled runs its coroutine to its end, one call at a time (NVIDIA's
  qa/L0_backend_python/async_execute asks the same);
- a coroutine that raises leaves the other requests alone; Triton leaves its own request open (no answer, only the
  log has the exception) where slotserve fails it with the exception's text, on purpose (docs/python-models.md);
- a decoupled model with dynamic_batching: the requests that queued meanwhile reach one execute together, and each
  stream gets exactly its own responses and final flag (an error response ends its own request only), with the same
  counts in ModelStatistics.

tests/integration/python_models/test_async_execute_overlap.py and test_decoupled_batching.py hold slotserve's side
alone.
Skips, naming the reason, where the reference is not set up (bench/setup.sh builds it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from tests.integration._python_overlap import (
    REPOSITORY,
    SharedStream,
    StreamedRequest,
    entered,
    open_gate,
    pending_requests,
    request,
    wait_until,
)

from .conftest import INSTALLATION, MISSING_REASON
from .reference import run_triton

pytestmark = pytest.mark.interop


@dataclass(frozen=True)
class Server:
    name: str
    address: str
    metrics_url: str


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[tuple[Server, Server]]:
    """(Triton, slotserve), both serving tests/python_models/overlap, started once for the module."""
    if INSTALLATION is None:
        pytest.skip(MISSING_REASON)
    from service.testing import serve

    with run_triton(INSTALLATION, REPOSITORY, tmp_path_factory.mktemp("triton")) as triton:
        with serve(REPOSITORY, parallel_jobs=1, metrics_port=0) as ours:
            yield (
                Server("triton", triton.address, triton.metrics_url),
                Server("slotserve", ours.address, f"http://127.0.0.1:{ours.server.metrics_port}/metrics"),
            )


def gates_of(tmp_path: Path, server: Server) -> Path:
    folder = tmp_path / server.name
    folder.mkdir()
    return folder


def send(server: Server, model: str, keys, gates: Path, **parameters) -> dict[int, StreamedRequest]:
    rows = model == "batch_stream"
    return {key: StreamedRequest(server.address, request(model, key, gates, rows, **parameters)) for key in keys}


def close(*groups: dict[int, StreamedRequest]) -> None:
    for group in groups:
        for stream in group.values():
            stream.close()


def statistics(server: Server, model: str) -> tuple[int, int, int, int]:
    """(successes, failures, inference_count, execution_count) of `model` in ModelStatistics."""
    with grpc.insecure_channel(server.address) as channel:
        reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelStatistics(
            pb.ModelStatisticsRequest(name=model), timeout=60
        )
    (stats,) = reply.model_stats
    counts = stats.inference_stats
    return counts.success.count, counts.fail.count, stats.inference_count, stats.execution_count


# ---- async def execute ----------------------------------------------------------------------------------------


def overlap(server: Server, gates: Path, model: str, keys=(1, 2, 3, 4), order=(3, 1, 4, 2)) -> tuple[list, list]:
    """Send `keys` at once, wait until all are in execute, open their gates in `order`: each request's answer as it
    comes (key, error, OUT, final, whether the gated ones were all still waiting), and the PEERS each saw in execute
    as it entered (sorted: the requests race to the server, so which saw how many varies)."""
    streams = send(server, model, keys, gates)
    try:
        wait_until(lambda: all(entered(gates, key) for key in keys), f"{server.name}: all in execute at once")
        seen, peers = [], []
        for position, key in enumerate(order):
            open_gate(gates, key)
            answer = streams[key].next_answer()
            others_waiting = all(streams[other].answers.empty() for other in order[position + 1 :])
            seen.append((key, answer.error, answer.outputs.get("OUT"), answer.final, others_waiting))
            peers.extend(answer.outputs.get("PEERS", []))
        return seen, sorted(peers)
    finally:
        close(streams)


def test_four_requests_overlap_on_one_instance_of_an_async_decoupled_model_on_both(servers, tmp_path):
    triton, ours = (overlap(server, gates_of(tmp_path, server), "async_gate") for server in servers)
    assert ours == triton
    answers, peers = triton
    assert answers == [(key, "", [key], True, True) for key in (3, 1, 4, 2)]
    assert peers == [0, 1, 2, 3]  # each came in while the earlier ones were still inside execute


def one_stream(server: Server, gates: Path, keys=(5, 6, 7, 8), order=(8, 6, 5, 7)) -> list:
    """`keys` sent on one stream, all in execute at once, answered as their gates open in `order`."""
    stream = SharedStream(server.address)
    try:
        for key in keys:
            stream.send(request("async_gate", key, gates))
        wait_until(lambda: all(entered(gates, key) for key in keys), f"{server.name}: all in execute on one stream")
        seen = []
        for position, key in enumerate(order):
            open_gate(gates, key)
            answer = stream.next_answer(key)
            waiting = all(stream.waiting(other) for other in order[position + 1 :])
            seen.append((key, answer.error, answer.outputs["OUT"], answer.final, waiting))
        return seen
    finally:
        stream.close()


def test_four_requests_on_one_stream_overlap_and_answer_as_they_end_on_both(servers, tmp_path):
    triton, ours = (one_stream(server, gates_of(tmp_path, server)) for server in servers)
    assert ours == triton == [(key, "", [key], True, True) for key in (8, 6, 5, 7)]


def test_bls_async_exec_calls_of_overlapping_requests_overlap_on_both(servers, tmp_path):
    keys, order = (21, 22, 23, 24), (23, 21, 24, 22)
    triton, ours = (overlap(server, gates_of(tmp_path, server), "async_gate_bls", keys, order) for server in servers)
    assert ours == triton
    assert triton == ([(key, "", [key], False, True) for key in order], [0, 1, 2, 3])


def serial(server: Server, gates: Path) -> list:
    """The default-mode model: a second request waits (queued, not in execute) while the first is in execute."""
    first = send(server, "async_gate_default", (11,), gates)
    second: dict[int, StreamedRequest] = {}
    try:
        wait_until(lambda: entered(gates, 11), f"{server.name}: the first in execute")
        second = send(server, "async_gate_default", (12,), gates)
        wait_until(
            lambda: pending_requests(server.metrics_url, "async_gate_default") == 1, f"{server.name}: second queued"
        )
        seen: list = [entered(gates, 12)]
        open_gate(gates, 11)
        seen.append(first[11].next_answer().outputs)
        wait_until(lambda: entered(gates, 12), f"{server.name}: the second in execute once the first answered")
        open_gate(gates, 12)
        seen.append(second[12].next_answer().outputs)
        return seen
    finally:
        close(first, second)


def test_a_default_mode_async_model_runs_one_call_at_a_time_on_both(servers, tmp_path):
    triton, ours = (serial(server, gates_of(tmp_path, server)) for server in servers)
    assert ours == triton == [False, {"OUT": [11], "PEERS": [0]}, {"OUT": [12], "PEERS": [0]}]


def raising(server: Server, gates: Path, wait_for_its_end: bool) -> tuple[list, bool, str]:
    """One of three overlapping requests raises: (the other two's answers, whether the raising one had ended by
    then, or, with `wait_for_its_end`, within a minute, its error). Its end and the others' are not ordered: its
    error goes out as its own execute call fails, while the others' answers come as their gates open."""
    streams = send(server, "async_gate", (41, -41, 42), gates)
    try:
        wait_until(lambda: all(entered(gates, key) for key in streams), f"{server.name}: all three in execute")
        open_gate(gates, -41)
        answers = []
        for key in (41, 42):
            open_gate(gates, key)
            answer = streams[key].next_answer()
            answers.append((answer.error, answer.outputs["OUT"]))
        for key in (41, 42):
            assert streams[key].ended.wait(60)
        failed = streams[-41]
        ended = failed.ended.wait(60) if wait_for_its_end else failed.ended.is_set()
        return answers, ended, failed.all_answers()[0].error if ended else ""
    finally:
        close(streams)


def test_a_raising_coroutine_leaves_the_others_alone_on_both_and_fails_its_own_request_here(servers, tmp_path):
    (triton, triton_ended, _), (ours, ours_ended, error) = (
        raising(server, gates_of(tmp_path, server), wait_for_its_end=server.name == "slotserve") for server in servers
    )
    assert ours == triton == [("", [41]), ("", [42])]
    assert not triton_ended  # Triton: the request stays open (its client waits; the log has the ValueError)
    assert ours_ended and "message: ValueError: key -41 is refused" in error  # slotserve: it fails, on purpose


# ---- decoupled + dynamic_batching -----------------------------------------------------------------------------


def batch(server: Server, gates: Path, keys: tuple[int, ...]) -> tuple[list, dict, tuple[int, ...]]:
    """A request holds the one instance; `keys` queue behind it and run as the next execute call. Returns the held
    request's answers, each queued request's answers (error, outputs, final) and the ModelStatistics counts they
    added."""
    before = statistics(server, "batch_stream")
    first = send(server, "batch_stream", (1,), gates, hold=1)
    queued: dict[int, StreamedRequest] = {}
    try:
        wait_until(lambda: entered(gates, 1), f"{server.name}: the first request holds the instance")
        queued = send(server, "batch_stream", keys, gates)
        wait_until(
            lambda: pending_requests(server.metrics_url, "batch_stream") == len(keys), f"{server.name}: all queued"
        )
        open_gate(gates, 1)
        held = [(a.error, a.outputs, a.final) for a in first[1].all_answers()]
        answers = {key: [(a.error, a.outputs, a.final) for a in stream.all_answers()] for key, stream in queued.items()}
        # A request is counted as its stream ends, which may be just after its client saw its final answer.
        wait_until(lambda: sum(statistics(server, "batch_stream")[:2]) - sum(before[:2]) == len(keys) + 1, "counted")
        after = statistics(server, "batch_stream")
        return held, answers, tuple(now - then for now, then in zip(after, before, strict=True))
    finally:
        close(first, queued)


def test_queued_requests_of_a_decoupled_batching_model_share_one_execute_and_get_their_own_answers_on_both(
    servers, tmp_path
):
    triton, ours = (batch(server, gates_of(tmp_path, server), (2, 3, 0)) for server in servers)
    assert ours == triton
    held, answers, counts = triton
    assert held == [("", {"OUT": [100], "REQUESTS": [1]}, False), ("", {}, True)]
    assert answers[3] == [("", {"OUT": [300 + i], "REQUESTS": [3]}, False) for i in range(3)] + [("", {}, True)]
    assert answers[0] == [("", {}, True)]
    assert counts == (4, 0, 4, 2)  # four requests in two execute calls


def test_an_error_response_in_a_decoupled_batch_ends_its_own_request_only_on_both(servers, tmp_path):
    (triton_held, theirs, _), (ours_held, ours, _) = (
        batch(server, gates_of(tmp_path, server), (2, -1, 1)) for server in servers
    )
    assert ours_held == triton_held and ours[2] == theirs[2] and ours[1] == theirs[1]
    ((error, outputs, final),) = theirs[-1]
    ((our_error, our_outputs, our_final),) = ours[-1]
    assert error == "key -1 is refused" and outputs == {} and final
    assert error in our_error and (our_outputs, our_final) == (outputs, final)  # ours adds "model 'batch_stream': "
