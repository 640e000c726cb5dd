"""The batching delay and the wake-ups of a batch's head (issue 26: bugs a mutation run planted and no test saw).

* A forming batch is due when its OLDEST member has waited the delay (not its youngest: arrivals would keep
  pushing it back), and the delay is read in microseconds.
* The head of a batch waiting out its delay on a free slot wakes by itself when the batch is due, also when it
  has a (later) deadline of its own.
* The head is woken when a slot frees before its batch is due (it must then start its timed wait).
* Nothing takes the model exclusively (eviction, idle retirement) while a batch waits out its delay.

The core is driven with explicit times. The controller's wake-ups are tested without `poke()` (which wakes every
waiter and so hides a missing wake-up): once with a fake clock that the test moves (deterministic), once with
the real clock. A missing wake-up shows as an AssertionError after WAIT seconds naming it.
"""

from __future__ import annotations

import threading
import time

from engine.config.specs import BatchingSpec
from service.core.admission import AdmissionController, AdmissionCore, BatchRule, TicketKind, TicketState
from service.core.batching import batch_rule
from tests.contract.harness import FakeClock
from tests.unit.service.core._callers import Caller, wait_queued

REQUEST = TicketKind.REQUEST


# ---- the due time, the unit, try_exclusive (the core, explicit times) ------------------------------------------


def test_a_forming_batch_is_due_when_its_oldest_member_has_waited_the_delay():
    core = AdmissionCore(1, BatchRule(max_rows=8, delay=1.0))
    head = core.arrive(REQUEST, 0.0, None, key="k")
    assert head.state is TicketState.QUEUED  # a free slot, but it waits up to 1 s for members
    for now in (0.4, 0.8):  # members keep arriving
        core.arrive(REQUEST, now, None, key="k")
        assert core.dispatch(now) == []
    assert core.wake_at(head) == 1.0  # the head's arrival + the delay, whatever arrived since
    assert core.dispatch(0.999) == []
    assert core.dispatch(1.0) == [head]
    assert [member.arrived_at for member in head.members] == [0.0, 0.4, 0.8]


def test_the_batching_delay_is_read_in_microseconds():
    spec = BatchingSpec(max_queue_delay_us=2500, preferred_batch_sizes=(2, 4))
    assert batch_rule(spec, 8) == BatchRule(max_rows=8, delay=0.0025, preferred=frozenset({2, 4}))
    assert batch_rule(spec, 0) is None  # no batch dimension: no batching


def test_nothing_takes_the_model_exclusively_while_a_batch_waits_out_its_delay_on_a_free_slot():
    core = AdmissionCore(1, BatchRule(max_rows=8, delay=1.0))
    head = core.arrive(REQUEST, 0.0, None, key="k")
    assert head.state is TicketState.QUEUED and core.statistics().active_slots == 0
    assert core.try_exclusive(0.5) is None  # eviction and idle retirement must leave it alone
    assert core.statistics().manager_active is False
    assert core.dispatch(1.0) == [head]  # and the batch goes when due


def test_granted_total_counts_each_member_of_a_batch_once():
    core = AdmissionCore(1, BatchRule(max_rows=8))
    holder = core.arrive(REQUEST, 0.0, None)  # no key: runs alone at once
    waiting = [core.arrive(REQUEST, 0.0, None, key="k") for _ in range(3)]
    assert core.statistics().granted_total == 1
    granted = core.release(holder, 1.0)
    assert granted == [waiting[0]] and waiting[0].members == waiting
    assert core.statistics().granted_total == 4  # the holder and the three members, the leader once


# ---- the controller's wake-ups, without poke() -------------------------------------------------------------


def _controller(clock, delay: float) -> AdmissionController:
    return AdmissionController("m", 1, clock=clock, batching=BatchRule(max_rows=8, delay=delay))


def _granted_alone(outcome) -> None:
    assert outcome.state is TicketState.GRANTED and outcome.members == [outcome], outcome


def test_a_head_with_a_later_deadline_wakes_when_its_batch_is_due_fake_clock():
    """The head's timed wait ends at the batch's due time, not at its (much later) deadline: after the fake clock
    passes the due time, the head re-reads it within its short wait (the delay, in real seconds) and goes."""
    clock = FakeClock()
    controller = _controller(clock, delay=0.05)
    head = Caller(controller, deadline=clock.now + 1000.0, key="k", name="head")
    wait_queued(controller, 1)
    clock.now += 0.05
    _granted_alone(head.result("the head slept towards its deadline instead of its batch's due time"))


def test_a_head_with_a_later_deadline_wakes_when_its_batch_is_due_real_clock():
    controller = _controller(time.monotonic, delay=0.2)
    head = Caller(controller, deadline=time.monotonic() + 60.0, key="k", name="head")
    _granted_alone(head.result("the head slept towards its 60 s deadline instead of its batch's 0.2 s delay"))


def test_a_head_without_a_deadline_wakes_when_its_batch_is_due_real_clock():
    controller = _controller(time.monotonic, delay=0.2)
    head = Caller(controller, key="k", name="head")
    _granted_alone(head.result("the head of a batch waiting for members never woke at its due time"))


def test_the_head_is_woken_when_a_slot_frees_before_its_batch_is_due_fake_clock():
    """The head queued behind a busy slot waits without a time limit (no deadline, nothing it could be granted).
    The slot frees before its batch is due: it must wake to start its timed wait for the due time."""
    clock = FakeClock()
    controller = _controller(clock, delay=0.05)
    holder = controller.acquire(REQUEST, None)  # no key: never batched, granted at once
    head = Caller(controller, key="k", name="head")
    wait_queued(controller, 1)
    controller.release(holder)  # at the same fake time: the head's batch is not due yet
    assert controller.statistics().queued == 1
    clock.now += 0.05
    _granted_alone(head.result("the head was not woken when the slot freed before its batch was due"))


def test_the_head_is_woken_when_a_slot_frees_before_its_batch_is_due_real_clock():
    controller = _controller(time.monotonic, delay=1.0)
    holder = controller.acquire(REQUEST, None)
    head = Caller(controller, key="k", name="head")
    wait_queued(controller, 1)
    controller.release(holder)  # well within the head's 1 s delay
    _granted_alone(head.result("the head was not woken when the slot freed before its batch was due"))


def test_a_deadline_beyond_the_lock_wait_limit_waits_and_is_granted():
    """A deadline further than threading.TIMEOUT_MAX (a lock wait's limit) is waited in capped steps; it must not
    raise OverflowError."""
    controller = AdmissionController("m", 1)
    holder = controller.acquire(REQUEST, None)
    far = Caller(controller, deadline=time.monotonic() + 4 * threading.TIMEOUT_MAX, name="far")
    wait_queued(controller, 1)
    assert not far.done.is_set()  # still waiting (an OverflowError would have ended it at once)
    controller.release(holder)
    ticket = far.result("the waiter with a far deadline was not granted")
    assert ticket.state is TicketState.GRANTED
    controller.release(ticket)
    assert controller.statistics().active_slots == 0
