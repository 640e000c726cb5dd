"""Bulk unload never hangs, and no handler holds a token nobody will cancel (issue 12, item 5)."""

from __future__ import annotations

import pytest

from service.core.errors import ShuttingDown
from service.servicers.common import SHUTDOWN, CallKind, CallTracker
from tests.contract.harness import Lab


@pytest.fixture
def lab(tmp_path):
    lab = Lab(tmp_path, {"a": {}, "b": {}})
    yield lab
    lab.close()


def test_a_bulk_unload_over_closed_admission_is_refused_instead_of_waiting_for_ever(lab):
    """At the end of the shutdown grace every model's admission closes; a bulk unload that starts then has its
    barriers refused on arrival. It must end with shutting_down (no token: nothing else could end it)."""
    for entry in lab.registry.entries():
        entry.admission.close()
    bulk = lab.unload_many(["a", "b"])
    error = bulk.error(timeout=5.0)
    assert isinstance(error, ShuttingDown), error
    assert all(lab.status(model).loaded for model in "ab")
    assert all(not entry.admission.statistics().manager_active for entry in lab.registry.entries())


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
