"""The worker's side of BLS calls (engine/python/worker.py) against a fake server on the other end of a real pipe:
calls from several threads answered out of order reach the right caller, a decoupled call's parts arrive one by
one, a call outside execute is refused, and a server that goes away fails the waiting calls instead of hanging."""

from __future__ import annotations

import os
import socket
import threading
import time
from multiprocessing.connection import Connection

import numpy as np
import pytest

from engine.python import transport
from engine.python import triton_python_backend_utils as pb_utils
from engine.python.error_codes import TritonCode
from engine.python.messages import BlsCall, BlsPart, CallRequest, ErrorResult
from engine.python.worker import Worker, _Lane, _Run

WAIT = 30.0
RUN = 7


@pytest.fixture
def pipe():
    """(worker, server end of its pipe); the calling threads read the pipe themselves (engine/python/pipe.py)."""
    ours, theirs = socket.socketpair()
    server, worker_end = Connection(ours.detach()), Connection(theirs.detach())
    worker = Worker(worker_end)
    worker.track(_Run(RUN, _Lane(0)))  # a call in flight: its BLS calls are allowed (from threads of its own too)
    yield worker, server
    server.close()
    worker_end.close()


def call(model: str, value: int) -> pb_utils.InferenceRequest:
    return pb_utils.InferenceRequest(
        model_name=model, inputs=[pb_utils.Tensor("X", np.array([value], np.int32))], requested_output_names=["Y"]
    )


def receive_call(server: Connection) -> tuple[int, CallRequest, dict]:
    """The next BLS call the worker sent, with its inputs as the server maps them."""
    assert server.poll(WAIT), "the worker sent no call"
    message = transport.receive(server)
    assert isinstance(message, BlsCall) and message.run == RUN  # the call says which request it belongs to
    tag, request = message.tag, message.call
    segment, inputs = transport.read_call(request)
    copied = {name: array.copy() for name, array in inputs.items()}
    del inputs
    if segment is not None:
        segment.close()
    return tag, request, copied


def test_calls_from_two_threads_answered_out_of_order_each_get_their_own_reply(pipe):
    worker, server = pipe
    results: dict[int, pb_utils.InferenceResponse] = {}

    def caller(value: int) -> None:
        results[value] = worker.bls(call("double", value), decoupled=False)[0]

    threads = [threading.Thread(target=caller, args=(value,)) for value in (3, 5)]
    for thread in threads:
        thread.start()
    first, second = receive_call(server), receive_call(server)
    assert first[1].model == "double" and first[1].request.outputs == ("Y",) and first[1].version == ""
    files = [first[1].segment.path, second[1].segment.path]  # type: ignore[union-attr]
    for tag, _request, inputs in (second, first):  # the later call is answered first
        reply = transport.write_reply([{"Y": inputs["X"] * 2}])
        files.append(reply.segment.path)  # type: ignore[union-attr]
        transport.send(server, BlsPart(tag, reply, True))
    for thread in threads:
        thread.join(WAIT)
    assert {value: response.output_tensors()[0].as_numpy().tolist() for value, response in results.items()} == {
        3: [6],
        5: [10],
    }
    assert [path for path in files if os.path.exists(path)] == []  # the inputs' and the replies' files are unlinked


def test_a_decoupled_calls_parts_arrive_one_by_one_and_an_error_is_a_response(pipe):
    worker, server = pipe
    returned = []  # exec(decoupled=True) returns once the first response came, as Triton's does
    thread = threading.Thread(target=lambda: returned.append(worker.bls(call("stream", 1), decoupled=True)))
    thread.start()
    tag, request, _inputs = receive_call(server)
    assert request.decoupled
    assert not returned
    transport.send(server, BlsPart(tag, transport.write_reply([{"Y": np.array([0], np.int32)}]), False))
    thread.join(WAIT)
    (responses,) = returned
    first = next(responses)  # before the callee's final part was sent
    assert first.output_tensors()[0].as_numpy().tolist() == [0]
    transport.send(server, BlsPart(tag, transport.write_reply([ErrorResult(TritonCode.INVALID_ARG, "n is bad")]), True))
    (last,) = list(responses)
    assert last.has_error() and last.error().code() == 3 and last.error().message() == "n is bad"


def test_the_call_carries_its_version_timeout_ids_and_parameters(pipe):
    worker, server = pipe
    request = pb_utils.InferenceRequest(
        model_name="m",
        inputs=[],
        requested_output_names=[],
        request_id="r",
        correlation_id=9,
        flags=1,
        parameters={"k": "v"},
        timeout=2500,
        model_version=3,
    )
    answered = []
    thread = threading.Thread(target=lambda: answered.extend(worker.bls(request, decoupled=False)))
    thread.start()
    tag, sent, inputs = receive_call(server)
    assert inputs == {} and sent.segment is None
    assert (sent.version, sent.timeout_us) == ("3", 2500)
    assert (sent.request.request_id, sent.request.correlation_id, sent.request.flags) == ("r", 9, 1)
    assert sent.request.parameters == {"k": "v"}
    transport.send(server, BlsPart(tag, transport.write_reply([{}]), True))
    thread.join(WAIT)
    assert len(answered) == 1 and answered[0].output_tensors() == []


def test_a_call_outside_execute_is_refused_by_name(pipe):
    _worker, server = pipe
    worker = Worker(server)  # no call in flight on it
    with pytest.raises(pb_utils.TritonModelException, match="a BLS call can only be made while execute runs"):
        worker.bls(call("m", 1), decoupled=False)


def test_a_server_that_goes_away_fails_the_waiting_call(pipe):
    worker, server = pipe
    failures = []

    def caller() -> None:
        try:
            worker.bls(call("m", 1), decoupled=False)
        except pb_utils.TritonModelException as error:
            failures.append(str(error))

    thread = threading.Thread(target=caller)
    thread.start()
    receive_call(server)
    server.close()
    thread.join(WAIT)
    assert not thread.is_alive() and failures == ["the server is gone: the BLS call was not answered"]


# ---- the server's threads for BLS calls (engine/python/backend.py CallThreads) ------------------------------


def test_call_threads_run_calls_at_once_reuse_idle_threads_and_end_idle_ones():
    from engine.python.backend import CallThreads

    threads = CallThreads("python-bls-test")
    threads.IDLE_SECONDS = 0.5
    release = threading.Event()
    started: list[int] = []
    both = threading.Barrier(3, timeout=WAIT)

    def blocking() -> None:
        started.append(threading.get_ident())
        both.wait()  # both calls run at the same time: neither waits for the other to end
        release.wait(WAIT)

    threads.submit(blocking)
    threads.submit(blocking)
    both.wait()
    release.set()
    assert len(set(started)) == 2
    done = threading.Event()
    deadline = time.monotonic() + WAIT
    while len(threads._idle) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # ordering-free: polls an observable state until a deadline
    reused: list[int] = []
    threads.submit(lambda: (reused.append(threading.get_ident()), done.set()))
    assert done.wait(WAIT) and reused[0] in started  # an idle thread took it

    def alive() -> list[int]:
        return [thread.ident for thread in threading.enumerate() if thread.ident in started]  # type: ignore[misc]

    while (threads._idle or alive()) and time.monotonic() < deadline:
        time.sleep(0.05)  # ordering-free: polls an observable state until a deadline
    assert threads._idle == [] and alive() == []  # idle threads ended
