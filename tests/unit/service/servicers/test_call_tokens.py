"""No handler holds a token nobody will cancel (issue 12, item 5): service/servicers/common.py's CallTracker
cancels a call that ended before its handler began, and one that begins after cancel_all."""

from __future__ import annotations

from service.servicers.common import SHUTDOWN, CallKind, CallTracker


class _Context:
    """The part of grpc.ServicerContext that CallTracker uses."""

    def __init__(self, active: bool) -> None:
        self.active = active
        self.callbacks: list = []

    def add_callback(self, callback) -> bool:
        if self.active:
            self.callbacks.append(callback)
        return self.active  # gRPC answers False once the RPC has ended


def test_a_call_that_ended_before_its_handler_began_gets_a_cancelled_token():
    calls = CallTracker(inference_limit=4)
    token = calls.begin(_Context(active=False), CallKind.INFERENCE)
    assert token.cancelled


def test_a_call_that_begins_after_cancel_all_is_cancelled_with_the_same_reason():
    calls = CallTracker(inference_limit=4)
    running = calls.begin(_Context(active=True))
    calls.cancel_all(SHUTDOWN)
    late = calls.begin(_Context(active=True))
    assert running.cancelled and running.reason == SHUTDOWN
    assert late.cancelled and late.reason == SHUTDOWN
    calls.end(running)
    calls.end(late)
    assert calls.active == 0
