"""Admission across the process boundary (issue 39; cells ORDER.01, TIME.04, tests/contract/cells.tsv): FIFO per
model in the order requests reach the one admission process, whichever front end carried them; a client's
cancellation and deadline reach admission from a front end, and such a request never takes a slot.

Order comes from the fixture's gates and admission's own counts (`queued_requests`), never from sleeps. Grants are
read where they happen: each run's first input value, logged as it starts (model `m` has one slot, so the next
grant waits for this run's release)."""

from __future__ import annotations

import time

import pytest

from tests.shutdown.harness import WAIT, assert_ok, outcome

from ._support import stub
from .conftest import request, values

cell = pytest.mark.cell

PROMPT = 1.0  # seconds: "at once" for a waiter leaving, with room for a loaded machine


def _hold_the_slot(server, channel, first: float = 100.0):
    """A request on `channel` running on m's one slot, held at its execute gate: (gate, call)."""
    execute = server.lab.gate("m", "execute").hold()
    holder = stub(channel).ModelInfer.future(request("m", first), timeout=WAIT)
    execute.wait_blocked(1)
    return execute, holder


def _queue(server, channel, first: float, queued: int, timeout: float = WAIT):
    """Send a request on `channel` and wait until admission counts `queued` waiters (it is one of them)."""
    call = stub(channel).ModelInfer.future(request("m", first), timeout=timeout)
    server.lab.wait_core("m", lambda s: s.queued_requests == queued, f"{queued} queued")
    return call


@cell("ORDER.01")
def test_requests_are_granted_in_the_order_they_reached_admission_through_each_front_end_and_across_them(served):
    """Requests sent one after another through each front end, alternating front ends (each sent once the one
    before it is queued): the slot goes to them in exactly that order, so each front end's requests keep their
    order, and two front ends' requests interleave as they reached admission."""
    server = served({"m": {}}, parallel_jobs=1)
    channels = server.ends.every()
    execute, holder = _hold_the_slot(server, channels[0])
    sent: list[float] = []
    calls = []
    for round_ in range(3):
        for index, channel in enumerate(channels):
            first = float(10 * (index + 1) + round_)
            calls.append(_queue(server, channel, first, len(sent) + 1))
            sent.append(first)
    execute.release()
    assert_ok(holder, values(100.0))
    for first, call in zip(sent, calls, strict=True):
        assert_ok(call, values(first))
    assert server.runs("m") == [100.0, *sent]
    for index in range(len(channels)):  # per front end: its own requests in the order it sent them
        own = [first for first in server.runs("m") if 10 * (index + 1) <= first < 10 * (index + 2)]
        assert own == sorted(own) and len(own) == 3


@cell("TIME.04")
def test_a_request_cancelled_in_its_front_end_while_queued_never_takes_a_slot(served):
    """The slot is held through the first front end; a waiter sent through the last front end, then one through
    the first. The client cancels the first waiter: it leaves the queue at once while the slot is still busy,
    never runs, and the other waiter takes the slot after the holder."""
    server = served({"m": {}}, parallel_jobs=1)
    channels = server.ends.every()
    execute, holder = _hold_the_slot(server, channels[0])
    cancelled = _queue(server, channels[-1], 1.0, 1)
    behind = _queue(server, channels[0], 2.0, 2)

    cancelled.cancel()
    took = server.lab.wait_core("m", lambda s: s.queued_requests == 1, "the cancelled waiter gone", timeout=5)
    assert took < PROMPT
    assert outcome(cancelled)[0] == "CANCELLED"
    status = server.lab.core_status("m")
    assert status.active_slots == 1 and not holder.done()  # it left the queue; it was not served
    admission = server.admission("m")
    assert admission.cancelled_total == 1 and admission.queued_requests == 1

    execute.release()
    assert_ok(holder, values(100.0))
    assert_ok(behind, values(2.0))
    assert server.runs("m") == [100.0, 2.0]  # the cancelled request never took the slot
    statistics = stub(channels[-1]).ModelStatistics(_statistics_request("m"), timeout=WAIT).model_stats[0]
    assert statistics.execution_count == 2 and statistics.inference_stats.success.count == 2
    _wait_no_tensors_held(server)


@cell("TIME.04")
def test_a_client_deadline_crosses_the_process_boundary_and_its_request_leaves_the_queue(served):
    """A waiter sent through the last front end with a 2 s deadline, the model allowing 30 s of admission wait:
    the client gets DEADLINE_EXCEEDED (or the server's server_busy, whichever notices first) by its deadline, and
    the admission process's queue place is gone then too, while the slot is still busy; it never runs."""
    server = served({"m": {}}, parallel_jobs=1, admission_timeout=30.0)
    channels = server.ends.every()
    execute, holder = _hold_the_slot(server, channels[0])
    deadline = 2.0  # long enough to reach the admission queue through a front end on a loaded machine
    started = time.monotonic()
    waiter = _queue(server, channels[-1], 1.0, 1, timeout=deadline)
    code, error = outcome(waiter)
    assert code == "DEADLINE_EXCEEDED" or (code, error.reason) == ("UNAVAILABLE", "server_busy"), error
    server.lab.wait_core("m", lambda s: s.queued_requests == 0, "the waiter gone", timeout=5)
    assert time.monotonic() - started < deadline + PROMPT  # the deadline ended the admission wait too
    assert server.lab.core_status("m").active_slots == 1 and not holder.done()
    admission = server.admission("m")
    assert admission.expired_total + admission.cancelled_total == 1

    execute.release()
    assert_ok(holder, values(100.0))
    assert server.runs("m") == [100.0]
    _wait_no_tensors_held(server)


def _statistics_request(model: str):
    from generated import grpc_service_pb2 as pb

    return pb.ModelStatisticsRequest(name=model)


def _wait_no_tensors_held(server) -> None:
    """Every request's tensor reservation in the admission process was given back."""
    from tests.shutdown.harness import wait_until

    account = server.lab.server.dataplane.tensor_memory
    wait_until(lambda: account.statistics().requests == 0, "every tensor reservation released", timeout=5)
    assert account.statistics().in_flight_bytes == 0
