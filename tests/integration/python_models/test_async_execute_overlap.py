"""`async def execute` overlaps on one instance of a decoupled python model, as on Triton 2.51 (whose stub runs such a
coroutine in the background and takes the instance's next request at once; tests/differential/
test_python_overlap.py asks Triton the same): several requests are in execute at once on one worker, the one whose
gate opens first answers first, one coroutine's exception fails its own request only, a cancelled request frees its
place, and BLS `async_exec` calls of overlapping requests overlap too. A model that is not decoupled runs its
coroutine to its end (no overlap), as Triton does. The contract's accounting (docs/python-models.md): a slot is an
instance; admission lets `async_requests_per_instance` requests (4 for async_gate) hold one at once.

Models: tests/python_models/overlap (each request waits in execute for a gate file the test creates).
"""

from __future__ import annotations

import shutil

import pytest

from service.testing import serve
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


@pytest.fixture(scope="module")
def server():
    with serve(REPOSITORY, parallel_jobs=1, metrics_port=0) as running:
        yield running


def metrics_url(running) -> str:
    return f"http://127.0.0.1:{running.server.metrics_port}/metrics"


def send(running, model: str, keys, gates) -> dict[int, StreamedRequest]:
    return {key: StreamedRequest(running.address, request(model, key, gates)) for key in keys}


def close(streams: dict[int, StreamedRequest]) -> None:
    for stream in streams.values():
        stream.close()


def test_four_requests_are_in_execute_at_once_on_one_instance_and_each_answers_when_its_gate_opens(server, tmp_path):
    streams = send(server, "async_gate", (1, 2, 3, 4), tmp_path)
    try:
        wait_until(lambda: all(entered(tmp_path, key) for key in streams), "all four in execute at once")
        status = server.management.get("async_gate")
        assert (status.slots, status.active_slots) == (1, 4)  # one instance, four requests on it
        for key in (3, 1, 4, 2):  # each answers when its own gate opens, whatever the order they came in
            open_gate(tmp_path, key)
            answer = streams[key].next_answer()
            assert (answer.error, answer.outputs["OUT"], answer.final) == ("", [key], True)
            assert all(streams[other].answers.empty() for other in streams if other != key)
        peers = sorted(stream.seen[0].outputs["PEERS"][0] for stream in streams.values())
        assert peers == [0, 1, 2, 3]  # each came in while the earlier ones were still inside execute
        for stream in streams.values():
            assert [answer.final for answer in stream.all_answers()] == [True]
    finally:
        close(streams)


def test_four_requests_on_one_stream_are_in_execute_at_once_and_answer_out_of_order(server, tmp_path):
    """A stream runs as many of its requests at once as the model runs (NVIDIA's QA sends them on one stream)."""
    stream = SharedStream(server.address)
    try:
        for key in (51, 52, 53, 54):
            stream.send(request("async_gate", key, tmp_path))
        wait_until(lambda: all(entered(tmp_path, key) for key in (51, 52, 53, 54)), "all four in execute at once")
        for key in (54, 52, 51, 53):  # a decoupled model's answers go out as they come, not in the stream's order
            open_gate(tmp_path, key)
            answer = stream.next_answer(key)
            assert (answer.error, answer.outputs["OUT"], answer.final) == ("", [key], True)
            assert all(stream.waiting(other) for other in (51, 52, 53, 54) if other != key)
    finally:
        stream.close()


def test_an_exception_in_one_coroutine_fails_its_own_request_only(server, tmp_path):
    streams = send(server, "async_gate", (5, -5, 6), tmp_path)
    try:
        wait_until(lambda: all(entered(tmp_path, key) for key in streams), "all three in execute")
        open_gate(tmp_path, -5)
        (failed,) = streams[-5].all_answers()
        assert "message: ValueError: key -5 is refused" in failed.error, failed
        for key in (5, 6):  # still in execute, and answered as usual
            assert streams[key].answers.empty()
            open_gate(tmp_path, key)
            (answer,) = streams[key].all_answers()
            assert (answer.error, answer.outputs["OUT"]) == ("", [key])
    finally:
        close(streams)


def test_a_fifth_request_waits_for_a_place_and_cancelling_one_of_the_four_frees_it(server, tmp_path):
    streams = send(server, "async_gate", (11, 12, 13, 14), tmp_path)
    try:
        wait_until(lambda: all(entered(tmp_path, key) for key in streams), "four in execute")
        streams.update(send(server, "async_gate", (15,), tmp_path))
        wait_until(lambda: pending_requests(metrics_url(server), "async_gate") == 1, "the fifth queued")
        assert not entered(tmp_path, 15)  # async_requests_per_instance is 4: it waits for a place
        streams[12].cancel()
        wait_until(lambda: entered(tmp_path, 15), "the fifth in execute once the cancelled one left")
        assert (tmp_path / "cancelled-12").exists()  # the model saw its request cancelled (and sent its final flag)
        assert streams[12].ended.wait(60) and streams[12].failure == "CANCELLED"
        for key in (11, 13, 14, 15):
            open_gate(tmp_path, key)
            (answer,) = streams[key].all_answers()
            assert (answer.error, answer.outputs["OUT"]) == ("", [key])
    finally:
        close(streams)


def test_bls_async_exec_calls_of_overlapping_requests_overlap(server, tmp_path):
    streams = send(server, "async_gate_bls", (21, 22, 23, 24), tmp_path)
    try:
        # each request's BLS call to async_gate is in execute there: the four requests and their calls overlap
        wait_until(lambda: all(entered(tmp_path, key) for key in streams), "the four BLS calls in execute")
        for key in (23, 21, 24, 22):
            open_gate(tmp_path, key)
            answer = streams[key].next_answer()
            assert (answer.error, answer.outputs["OUT"], answer.final) == ("", [key], False)
        for stream in streams.values():
            assert stream.all_answers()[-1].final
    finally:
        close(streams)


def test_a_model_that_is_not_decoupled_runs_its_coroutine_to_its_end_one_call_at_a_time(server, tmp_path):
    streams = send(server, "async_gate_default", (31,), tmp_path)
    try:
        wait_until(lambda: entered(tmp_path, 31), "the first in execute")
        streams.update(send(server, "async_gate_default", (32,), tmp_path))
        wait_until(lambda: pending_requests(metrics_url(server), "async_gate_default") == 1, "the second queued")
        assert not entered(tmp_path, 32)
        open_gate(tmp_path, 31)
        assert streams[31].next_answer().outputs == {"OUT": [31], "PEERS": [0]}
        wait_until(lambda: entered(tmp_path, 32), "the second in execute once the first answered")
        open_gate(tmp_path, 32)
        assert streams[32].next_answer().outputs == {"OUT": [32], "PEERS": [0]}
    finally:
        close(streams)


def test_a_cancelled_coroutine_that_never_ends_gets_its_worker_killed_failing_the_others_on_it_by_name(tmp_path):
    """The cancel-kill clock runs per request; past it the worker is killed (nothing less stops a coroutine that
    ignores its cancellation), which ends the other requests on that worker with an error saying why, and the next
    request gets a new worker."""
    repository = tmp_path / "repository"
    shutil.copytree(REPOSITORY / "async_gate", repository / "async_gate")
    config = repository / "async_gate" / "config.pbtxt"
    config.write_text(config.read_text() + 'parameters { key: "cancel_kill_seconds" value: { string_value: "0.5" } }\n')
    gates = tmp_path / "gates"
    gates.mkdir()
    with serve(repository, parallel_jobs=1) as running:
        streams = send(running, "async_gate", (1001, 7), gates)  # 1001 ignores its cancellation
        try:
            wait_until(lambda: entered(gates, 1001) and entered(gates, 7), "both in execute")
            streams[1001].cancel()
            (other,) = streams[7].all_answers()
            assert "killed: a request on it was cancelled and had not ended 0.5 s later" in other.error, other
            assert streams[1001].ended.wait(60) and streams[1001].failure == "CANCELLED"
            after = send(running, "async_gate", (8,), gates)
            streams.update(after)
            wait_until(lambda: entered(gates, 8), "a new request in execute on a new worker")
            open_gate(gates, 8)
            (answer,) = after[8].all_answers()
            assert (answer.error, answer.outputs) == ("", {"OUT": [8], "PEERS": [0]})
            assert running.management.get("async_gate").loaded  # a kill is no reason to take it out of service
        finally:
            close(streams)


def test_a_worker_that_dies_under_four_requests_fails_them_all_and_counts_one_death(tmp_path):
    """Its requests in flight fail naming how it ended; the death is counted once (three deaths within a minute take a
    model out of service: four here would), and the next request gets a new worker."""
    repository = tmp_path / "repository"
    shutil.copytree(REPOSITORY / "async_gate", repository / "async_gate")
    model = repository / "async_gate" / "1" / "model.py"
    source = model.read_text()
    model.write_text(
        source.replace(
            "            if key < 0:\n",
            "            if key == -99:\n                os._exit(7)\n            if key < 0:\n",
            1,
        )
    )
    gates = tmp_path / "gates"
    gates.mkdir()
    with serve(repository, parallel_jobs=1) as running:
        streams = send(running, "async_gate", (1, 2, 3, -99), gates)
        try:
            wait_until(lambda: all(entered(gates, key) for key in streams), "all four in execute")
            open_gate(gates, -99)
            for stream in streams.values():
                (answer,) = stream.all_answers()
                assert "exited with code 7" in answer.error, answer
            assert running.management.get("async_gate").loaded  # one death, not four
            after = send(running, "async_gate", (4,), gates)
            streams.update(after)
            wait_until(lambda: entered(gates, 4), "a new request in execute on a new worker")
            open_gate(gates, 4)
            (answer,) = after[4].all_answers()
            assert (answer.error, answer.outputs) == ("", {"OUT": [4], "PEERS": [0]})
        finally:
            close(streams)
