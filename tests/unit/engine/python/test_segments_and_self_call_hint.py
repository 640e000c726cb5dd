"""Python workers' transport and BLS path, unit level (issue 33): the self-call hint only where a self-call waited
for a slot, the startup sweep of segments left by dead processes, segments whose memory is reserved."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np

from engine.errors import OutOfSharedMemoryError
from engine.interface import CancelToken
from engine.python import backend, transport
from engine.python.error_codes import TritonCode
from engine.python.messages import CallRequest, ErrorResult, Request
from service.core.errors import AdmissionTimeout, ShuttingDown
from service.request_path.model_calls import DataplaneModelCalls


class _Calls:
    """ModelCalls whose every call raises `error`, described as the server describes it."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def infer(self, *args, **kwargs):
        raise self.error

    infer_stream = infer
    describe = staticmethod(DataplaneModelCalls.describe)


class _Model:
    def __init__(self, name: str, error: BaseException) -> None:
        self.name = name
        self.calls = _Calls(error)


def bls_error(model: str, callee: str, error: BaseException) -> ErrorResult:
    replies: list = []
    call = CallRequest(model=callee, version="", request=Request((), (), "", 0, 0, {}), segment=None)
    backend.run_bls(_Model(model, error), call, CancelToken(), None, lambda reply, final: replies.append(reply))  # type: ignore[arg-type]
    ((reply,),) = [r.responses for r in replies]
    assert isinstance(reply, ErrorResult)
    return reply


def test_the_self_call_hint_is_added_only_when_a_self_call_waited_for_a_slot():
    waited = AdmissionTimeout("server_busy: model 'm' had no free slot before the admission deadline")
    code, message = bls_error("m", "m", waited)
    assert code == TritonCode.UNAVAILABLE
    assert message.endswith(backend.SELF_CALL_HINT)

    stopping = ShuttingDown("shutting_down: the server is shutting down")
    code, message = bls_error("m", "m", stopping)
    assert code == TritonCode.UNAVAILABLE and "shutting down" in message
    assert backend.SELF_CALL_HINT not in message  # a shutdown is no self-call's wait

    _code, message = bls_error("m", "other", waited)
    assert backend.SELF_CALL_HINT not in message  # another model's busy slots: no self-call


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_the_sweep_removes_segments_of_dead_processes_and_of_older_holders_of_a_live_pid(tmp_path):
    dead = tmp_path / f"slotserve-py-{_dead_pid()}-aaaaaaaaaaaa"
    live = tmp_path / f"slotserve-py-{os.getpid()}-bbbbbbbbbbbb"
    older = tmp_path / f"slotserve-py-{os.getpid()}-cccccccccccc"  # this pid's, but from before this process began
    other = tmp_path / "slotserve-py-notapid-dddddddddddd"
    unrelated = tmp_path / f"someone-else-{_dead_pid()}"
    for path in (dead, live, older, other, unrelated):
        path.write_bytes(b"x")
    long_ago = time.time() - 10 * 365 * 86400
    os.utime(older, (long_ago, long_ago))
    removed = transport.remove_leftovers(str(tmp_path))
    assert sorted(removed) == sorted([str(dead), str(older)])
    assert not dead.exists() and not older.exists()
    assert live.exists() and other.exists() and unrelated.exists()


def test_a_segment_is_reserved_when_it_is_made(tmp_path):
    segment = transport.Segment.create(3 << 20)
    try:
        blocks = os.stat(segment.path).st_blocks * 512
        assert blocks >= segment.size >= 3 << 20  # allocated, not a sparse file a write could fault on
        segment.view[segment.size - 1] = 7  # the last byte is there
    finally:
        segment.unlink()
        segment.close()


def test_large_segments_are_sized_to_fit_small_ones_to_a_power_of_two():
    assert transport.segment_size(0) == transport.MIN_SEGMENT
    assert transport.segment_size(100_000) == 1 << 17
    big = transport.KEEP_SEGMENT_BYTES + 12345
    assert big <= transport.segment_size(big) < big + (1 << 20)  # not the next power of two: it is used once


def test_a_reply_segment_too_big_for_the_shared_memory_is_an_error_response_not_a_crash(monkeypatch):
    def full(size: int):
        raise OutOfSharedMemoryError("/dev/shm has no room (1 MiB free of 64 MiB)")

    monkeypatch.setattr(transport.Segment, "create", staticmethod(full))
    reply = backend._reply([{"OUT": np.ones(4, np.float32)}], "callee")
    (error,) = reply.responses
    assert isinstance(error, ErrorResult) and error.code == TritonCode.UNAVAILABLE  # RESOURCE_EXHAUSTED's code
    assert "/dev/shm" in error.message
    assert reply.segment is None
