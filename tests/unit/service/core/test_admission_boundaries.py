"""Edges of the admission core and controller that a mutation run of service/core/admission.py found untested
(`make mutate`, issue 26): each test here fails with one of the bugs it planted. Explicit times for the core; for
the controller, a fake clock or the real one and, where a waiter must be caught between two steps, a waker lock
that parks it (a hook on its own thread, no sleeps)."""

from __future__ import annotations

import threading
import types

import pytest

import service.core.admission as admission_module
from service.core.admission import AdmissionController, AdmissionCore, BatchRule, Refusal, TicketKind, TicketState
from service.core.errors import AdmissionTimeout, RequestCancelled
from tests.contract.harness import FakeClock
from tests.unit.service.core._callers import WAIT, Caller, wait_queued, wait_until

REQUEST, MANAGER = TicketKind.REQUEST, TicketKind.MANAGER


# ---- the core: validation and counters -------------------------------------------------------------------


def test_a_capacity_below_one_is_refused_naming_it():
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        AdmissionCore(0)
    core = AdmissionCore(1)
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        core.set_capacity(0, 0.0)
    assert core.capacity == 1


def test_a_fresh_core_counts_nothing_and_every_refusal_counts_once():
    core = AdmissionCore(1)
    stats = core.statistics()
    assert (stats.granted_total, stats.expired_total, stats.cancelled_total, stats.refused_total) == (0, 0, 0, 0)
    assert (stats.queued, stats.queued_requests, stats.queued_managers, stats.active_slots) == (0, 0, 0, 0)
    core.arrive(REQUEST, 0.0, None)
    core.arrive(REQUEST, 0.0, None)
    core.arrive(REQUEST, 0.0, None, max_queue=1)  # refused: the queue is full
    core.close()  # refuses the queued one
    core.arrive(REQUEST, 0.0, None)  # refused: closed
    assert core.statistics().refused_total == 3


def test_release_refuses_what_holds_no_lease_naming_why():
    core = AdmissionCore(1, BatchRule(max_rows=8))
    holder = core.arrive(REQUEST, 0.0, None)
    members = [core.arrive(REQUEST, 0.0, None, key="k") for _ in range(2)]
    waiting_manager = core.arrive(MANAGER, 0.0, None)
    with pytest.raises(RuntimeError, match="which holds no lease"):
        core.release(waiting_manager, 0.5)  # queued, not granted
    core.release(holder, 1.0)  # the two members go as one batch
    with pytest.raises(RuntimeError, match="a batch member: its leader releases the batch"):
        core.release(members[1], 1.5)
    core.release(members[0], 2.0)  # the leader ends the batch; the manager is granted
    with pytest.raises(RuntimeError, match="which holds no lease"):
        core.release(members[0], 2.5)  # already released
    assert core.manager is waiting_manager and core.held_request_tickets() == []
    stray = AdmissionCore(1).try_exclusive(0.0)  # another core's manager
    with pytest.raises(RuntimeError, match="which is not the active manager"):
        core.release(stray, 3.0)
    core.release(waiting_manager, 3.0)
    assert core.manager is None and core.idle


def test_withdraw_takes_only_expired_or_cancelled_and_leaves_a_final_ticket_alone():
    core = AdmissionCore(1)
    holder = core.arrive(REQUEST, 0.0, None)
    waiter = core.arrive(REQUEST, 0.0, None)
    with pytest.raises(ValueError, match="withdraw outcome must be EXPIRED or CANCELLED"):
        core.withdraw(waiter, TicketState.RELEASED, 0.5)
    assert waiter.state is TicketState.QUEUED
    core.release(holder, 1.0)
    core.release(waiter, 2.0)
    assert core.withdraw(waiter, TicketState.CANCELLED, 3.0) == []  # final already: nothing changes
    assert waiter.state is TicketState.RELEASED and core.statistics().cancelled_total == 0


def test_the_held_tickets_and_the_manager_are_what_holds_the_model():
    core = AdmissionCore(2)
    first, second = core.arrive(REQUEST, 0.0, None), core.arrive(REQUEST, 0.0, None)
    assert core.held_request_tickets() == [first, second] and core.manager is None
    core.release(first, 1.0)
    core.release(second, 1.0)
    manager = core.arrive(MANAGER, 2.0, None)
    assert core.manager is manager and core.held_request_tickets() == []


# ---- the core: the overdue rule --------------------------------------------------------------------------


def test_the_overdue_rule_applies_to_thresholds_under_a_second_and_is_strict():
    core = AdmissionCore(1)
    core.arrive(REQUEST, 0.0, None)
    assert core.arrive(REQUEST, 0.5, None, overdue_after=0.5).state is TicketState.QUEUED  # exactly 0.5: not over
    refused = core.arrive(REQUEST, 0.75, None, overdue_after=0.5)
    assert refused.state is TicketState.REFUSED and refused.refusal is Refusal.OVERDUE


def test_a_model_held_by_a_manager_has_no_overdue_request_slot():
    core = AdmissionCore(1)
    core.arrive(MANAGER, 0.0, None)  # a load or unload holds the model; no request slot is busy
    assert core.arrive(REQUEST, 100.0, None, overdue_after=1.0).state is TicketState.QUEUED


# ---- the core: when a batch goes --------------------------------------------------------------------------


def test_without_a_delay_a_request_on_a_free_slot_is_granted_on_arrival():
    core = AdmissionCore(1, BatchRule(max_rows=8))
    assert not core.delays_batches
    ticket = core.arrive(REQUEST, 0.0, None, key="k")
    assert ticket.state is TicketState.GRANTED and ticket.members == [ticket]


def test_with_a_delay_a_request_of_max_rows_is_granted_on_arrival():
    core = AdmissionCore(1, BatchRule(max_rows=4, delay=1.0))
    ticket = core.arrive(REQUEST, 0.0, None, rows=4, key="k")  # complete: nothing could join it
    assert ticket.state is TicketState.GRANTED


def test_a_batch_between_two_preferred_sizes_waits_for_the_larger():
    core = AdmissionCore(1, BatchRule(max_rows=8, delay=1.0, preferred=frozenset({2, 4})))
    head = core.arrive(REQUEST, 0.0, None, key="k")
    core.arrive(REQUEST, 0.1, None, rows=2, key="k")  # 3 rows: past 2, short of 4
    assert core.dispatch(0.1) == []
    core.arrive(REQUEST, 0.2, None, key="k")  # 4 rows: the largest preferred size
    assert core.dispatch(0.2) == [head] and len(head.members) == 3


def test_a_batch_that_can_no_longer_grow_goes_at_once_without_waiting_out_the_delay():
    core = AdmissionCore(1, BatchRule(max_rows=8, delay=1.0))
    head = core.arrive(REQUEST, 0.0, None, key="a")
    assert core.dispatch(0.0) == []  # it may still grow
    other = core.arrive(REQUEST, 0.1, None, key="b")  # does not stack: the batch behind it can never grow
    assert core.dispatch(0.1) == [head] and head.members == [head]
    assert other.state is TicketState.QUEUED  # the slot is taken; `other` forms the next batch


def test_rows_add_up_and_a_batch_stops_before_it_would_pass_max_rows():
    core = AdmissionCore(1, BatchRule(max_rows=4))
    holder = core.arrive(REQUEST, 0.0, None)
    twos = [core.arrive(REQUEST, 0.0, None, rows=2, key="k") for _ in range(3)]
    assert core.release(holder, 1.0) == [twos[0]]
    assert twos[0].members == twos[:2]  # 2 + 2 = 4; a third 2 would make 6
    assert core.release(twos[0], 2.0) == [twos[2]] and twos[2].members == [twos[2]]


def test_a_request_without_a_key_queued_before_batching_was_enabled_goes_alone_at_once():
    core = AdmissionCore(1)
    holder = core.arrive(REQUEST, 0.0, None)
    plain = core.arrive(REQUEST, 0.0, None)  # no key: arrived before the model batched
    core.set_batching(BatchRule(max_rows=8, delay=1.0), 0.5)
    assert core.wake_at(plain) is None  # the slot is busy: only a change wakes it
    assert core.release(holder, 0.6) == [plain]  # it can never grow: no wait for the delay (due at 1.0)
    assert plain.members == [plain]


def test_only_the_head_of_a_batch_waiting_on_a_free_slot_has_a_time_to_wake():
    core = AdmissionCore(1, BatchRule(max_rows=8, delay=1.0))
    holder = core.arrive(REQUEST, 0.0, None)  # no key: runs alone, the slot is busy
    head = core.arrive(REQUEST, 0.0, None, key="k")
    second = core.arrive(REQUEST, 0.2, None, key="k")
    assert core.wake_at(head) is None  # no free slot: it waits for a release, not for a time
    assert core.release(holder, 0.5) == []  # free now, not due yet
    assert core.wake_at(head) == 1.0 and core.wake_at(second) is None  # only the head looks at the clock
    assert core.dispatch(1.0) == [head] and head.members == [head, second]
    assert core.wake_at(head) is None  # granted: nothing to wait for
    assert AdmissionCore(1, BatchRule(max_rows=8)).wake_at(head) is None  # no delay, no wake time


# ---- the controller ------------------------------------------------------------------------------------------


def test_set_capacity_grows_the_slots_and_grants_the_waiters():
    controller = AdmissionController("m", 1)
    holder = controller.acquire(REQUEST, None)
    waiter = Caller(controller, name="waiter")
    wait_queued(controller, 1)
    controller.set_capacity(2)
    assert controller.statistics().capacity == 2
    ticket = waiter.result("the waiter was not granted the added slot")
    for lease in (holder, ticket):
        controller.release(lease)
    assert controller.core.idle


def test_a_waiter_behind_the_head_of_a_delayed_batch_keeps_its_own_deadline():
    """On a model with a batching delay a waiter that is not the head has no wake time of its own: it waits
    towards its deadline, and expires there."""
    clock = FakeClock()
    controller = AdmissionController("m", 1, clock=clock, batching=BatchRule(max_rows=8, delay=0.05))
    holder = controller.acquire(REQUEST, None)  # no key: alone at once
    head = Caller(controller, key="a", name="head")
    wait_queued(controller, 1)
    behind = Caller(controller, deadline=clock.now + 0.05, key="b", name="behind")  # another key, with a deadline
    wait_queued(controller, 2)
    clock.now += 0.05
    assert isinstance(behind.wait("the waiter never re-read its deadline"), AdmissionTimeout)
    controller.release(holder)
    clock.now += 0.05
    head_ticket = head.result("the head never went")
    assert head_ticket.members == [head_ticket]


def test_poke_makes_every_waiter_look_at_a_moved_clock_at_once():
    clock = FakeClock()
    controller = AdmissionController("m", 1, clock=clock)
    holder = controller.acquire(REQUEST, None)
    waiter = Caller(controller, deadline=clock.now + 1000.0, name="waiter")  # it sleeps up to 1000 real seconds
    wait_queued(controller, 1)
    clock.now += 1000.0
    controller.poke()
    assert isinstance(waiter.wait("poke() did not wake the waiter to its passed deadline"), AdmissionTimeout)
    controller.release(holder)


# ---- the controller: cancelled as the slot arrives ------------------------------------------------------------


def _parking_threading(victim: str, parked: threading.Event, resume: threading.Event):
    """The admission module's `threading` for one thread: its waker, once released (granted), parks the waiter
    before it reads its ticket, so the test can cancel it in between."""

    class ParkingLock:
        def __init__(self) -> None:
            self._lock = threading.Lock()

        def locked(self) -> bool:
            return self._lock.locked()

        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            if self._lock.acquire(blocking=False):
                return True  # the constructor's own acquire
            got = self._lock.acquire(True, timeout)
            parked.set()
            assert resume.wait(WAIT), "the test never resumed the parked waiter"
            return got

        def release(self) -> None:
            self._lock.release()

    def lock():
        return ParkingLock() if threading.current_thread().name == victim else threading.Lock()

    return types.SimpleNamespace(Lock=lock, TIMEOUT_MAX=threading.TIMEOUT_MAX)


@pytest.mark.parametrize(
    "batching, batch",
    [(False, False), (True, False), (True, True)],
    ids=["alone", "alone-on-a-batching-model", "leading-a-batch"],
)
def test_a_caller_cancelled_as_its_slot_arrives(monkeypatch, batching, batch):
    """Alone (a batch of one on a batching model too), it passes the slot on and raises RequestCancelled: no
    work starts that nobody awaits. Leading a batch, it keeps the slot: its thread runs the batch for the other
    members."""
    controller = AdmissionController("m", 1, batching=BatchRule(max_rows=8) if batching else None)
    holder = controller.acquire(REQUEST, None)
    parked, resume = threading.Event(), threading.Event()
    monkeypatch.setattr(admission_module, "threading", _parking_threading("victim", parked, resume))
    victim = Caller(controller, key="k" if batching else None, name="victim")
    wait_queued(controller, 1)
    monkeypatch.undo()
    member = Caller(controller, key="k", name="member") if batch else None
    if batch:
        wait_queued(controller, 2)
    controller.release(holder)  # granted (with the member: one batch) ...
    assert parked.wait(WAIT)
    victim.token.cancel("client")  # ... and cancelled before its thread has read the grant
    resume.set()
    outcome = victim.wait("the cancelled caller never returned")
    if not batch:
        assert isinstance(outcome, RequestCancelled), outcome
        wait_until(lambda: controller.statistics().active_slots == 0, "the slot passed on")
    else:
        assert outcome.state is TicketState.GRANTED and len(outcome.members) == 2, outcome
        assert controller.statistics().active_slots == 1  # it runs the batch
        controller.release(outcome)
        assert member.wait("the member was not woken by its leader's release").state is TicketState.RELEASED
    assert controller.core.idle
