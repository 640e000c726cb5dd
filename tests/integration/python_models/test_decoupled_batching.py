"""A decoupled python model with `dynamic_batching` is served as Triton 2.51 serves it (tests/differential/
test_python_overlap.py asks Triton the same): requests that queue while the instance is busy reach one `execute`
together, and each request's stream gets exactly its own responses through its own sender, its own final flag and
its own error; the batch holds its slot until every member's last answer, a member whose client leaves has the rest
of its answers dropped without holding the others.

Model: tests/python_models/overlap/batch_stream (KEY = k: k responses 100 * k + i with REQUESTS = the requests of
its execute call, then the final flag alone; a request with "hold" waits in execute for its gate).
"""

from __future__ import annotations

import pytest

from service.testing import serve
from tests.integration._python_overlap import (
    REPOSITORY,
    StreamedRequest,
    entered,
    open_gate,
    pending_requests,
    request,
    wait_until,
)


@pytest.fixture(scope="module")
def server():
    with serve(REPOSITORY, parallel_jobs=1, metrics_port=0) as running:
        yield running


def pending(running) -> int:
    return pending_requests(f"http://127.0.0.1:{running.server.metrics_port}/metrics", "batch_stream")


def send(running, key: int, gates, **parameters) -> StreamedRequest:
    return StreamedRequest(running.address, request("batch_stream", key, gates, rows=True, **parameters))


def answers(stream: StreamedRequest) -> list[tuple[str, dict[str, list[int]], bool]]:
    return [(answer.error, answer.outputs, answer.final) for answer in stream.all_answers()]


def expected(key: int, requests: int) -> list[tuple[str, dict[str, list[int]], bool]]:
    """What Triton answers KEY = key in an execute call of `requests` requests (the final flag alone is the empty
    final answer the request asked for)."""
    responses = [("", {"OUT": [100 * key + index], "REQUESTS": [requests]}, False) for index in range(key)]
    return [*responses, ("", {}, True)]


def held_then(running, gates, hold_key: int, *keys: int, **held) -> tuple[StreamedRequest, dict[int, StreamedRequest]]:
    """A request that holds the one instance, then `keys` queued behind it (all of them waiting); a key in `held`
    (by its name, "k3") holds its own execute call too."""
    first = send(running, hold_key, gates, hold=1)
    wait_until(lambda: entered(gates, hold_key), "the first request holds the instance")
    queued = {key: send(running, key, gates, **({"hold": 1} if held.get(f"k{key}") else {})) for key in keys}
    wait_until(lambda: pending(running) == len(keys), f"{len(keys)} requests queued behind it")
    return first, queued


def close(*streams: StreamedRequest) -> None:
    for stream in streams:
        stream.close()


def test_queued_requests_reach_one_execute_and_each_stream_gets_exactly_its_own_answers(server, tmp_path):
    first, queued = held_then(server, tmp_path, 1, 2, 3, 0)
    try:
        open_gate(tmp_path, 1)
        assert answers(first) == expected(1, 1)
        for key, stream in queued.items():
            assert answers(stream) == expected(key, 3), key
    finally:
        close(first, *queued.values())


def test_an_error_response_ends_its_own_request_only(server, tmp_path):
    first, queued = held_then(server, tmp_path, 4, 2, -1, 1)
    try:
        open_gate(tmp_path, 4)
        assert answers(first) == expected(4, 1)
        assert answers(queued[2]) == expected(2, 3)
        assert answers(queued[1]) == expected(1, 3)
        ((error, outputs, final),) = answers(queued[-1])
        assert "key -1 is refused" in error and outputs == {} and final
    finally:
        close(first, *queued.values())


def test_a_member_whose_client_leaves_is_dropped_and_the_batch_frees_its_slot(server, tmp_path):
    first, queued = held_then(server, tmp_path, 1, 2, 5, 3, k3=True)
    try:
        open_gate(tmp_path, 1)
        assert answers(first) == expected(1, 1)
        wait_until(lambda: entered(tmp_path, 3), "the batch [2, 5, 3] in execute, waiting for gate 3")
        queued[5].cancel()  # its client leaves while the batch runs: what the model sends it is dropped
        assert queued[5].ended.wait(60) and queued[5].failure == "CANCELLED"
        open_gate(tmp_path, 3)
        assert answers(queued[2]) == expected(2, 3)
        assert answers(queued[3]) == expected(3, 3)
        after = send(server, 2, tmp_path)  # the slot is free again: every member's stream has ended
        assert answers(after) == expected(2, 1)
        close(after)
    finally:
        close(first, *queued.values())
