"""The admission core (no threads, explicit time) and the thread-safe controller over it."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.interface import CancelToken
from service.core.admission import AdmissionController, AdmissionCore, Refusal, Ticket, TicketKind, TicketState
from service.core.errors import AdmissionTimeout, OverdueBlockers, QueueFull, RequestCancelled, ShuttingDown

REQUEST, MANAGER = TicketKind.REQUEST, TicketKind.MANAGER


# ---- the core -----------------------------------------------------------------------------------------------


def test_requests_fill_capacity_then_queue():
    core = AdmissionCore(2)
    a, b, c = (core.arrive(REQUEST, 0.0, None) for _ in range(3))
    assert [a.state, b.state, c.state] == [TicketState.GRANTED, TicketState.GRANTED, TicketState.QUEUED]
    assert core.release(a, 1.0) == [c]
    assert c.state is TicketState.GRANTED and c.granted_at == 1.0


def test_newcomer_never_barges_past_a_waiter():
    core = AdmissionCore(1)
    holder = core.arrive(REQUEST, 0.0, None)
    waiter = core.arrive(MANAGER, 0.0, None)
    core.set_capacity(2, 0.0)
    # A slot is free, but the queued manager is older: the newcomer queues behind it.
    late = core.arrive(REQUEST, 0.0, None)
    assert late.state is TicketState.QUEUED
    core.release(holder, 1.0)
    assert waiter.state is TicketState.GRANTED and late.state is TicketState.QUEUED
    assert core.release(waiter, 2.0) == [late]


def test_manager_is_exclusive_and_waits_for_every_earlier_lease():
    core = AdmissionCore(3)
    r1, r2 = core.arrive(REQUEST, 0, None), core.arrive(REQUEST, 0, None)
    manager = core.arrive(MANAGER, 0, None)
    assert manager.state is TicketState.QUEUED
    assert core.release(r1, 1) == []
    assert core.release(r2, 2) == [manager]
    request = core.arrive(REQUEST, 3, None)
    assert request.state is TicketState.QUEUED  # nothing runs beside a manager
    assert core.release(manager, 4) == [request]


def test_withdrawn_head_manager_unblocks_the_requests_behind_it():
    core = AdmissionCore(2)
    holder = core.arrive(REQUEST, 0, None)
    manager = core.arrive(MANAGER, 0, 5.0)
    behind = core.arrive(REQUEST, 0, None)
    assert behind.state is TicketState.QUEUED
    assert core.withdraw(manager, TicketState.EXPIRED, 5.0) == [behind]
    assert manager.state is TicketState.EXPIRED
    assert holder.state is TicketState.GRANTED


def test_queue_limit_refuses_requests_but_not_managers():
    core = AdmissionCore(1)
    core.arrive(REQUEST, 0, None)
    queued = core.arrive(REQUEST, 0, None, max_queue=1)
    refused = core.arrive(REQUEST, 0, None, max_queue=1)
    manager = core.arrive(MANAGER, 0, None, max_queue=1)
    assert queued.state is TicketState.QUEUED
    assert refused.state is TicketState.REFUSED and refused.refusal is Refusal.QUEUE_FULL
    assert manager.state is TicketState.QUEUED


def test_overdue_rule_refuses_only_when_every_occupied_slot_is_overdue():
    core = AdmissionCore(2)
    old = core.arrive(REQUEST, 0.0, None)
    fresh = core.arrive(REQUEST, 9.0, None)
    # one healthy blocker: bounded waiting is allowed
    assert core.arrive(REQUEST, 10.0, None, overdue_after=5.0).state is TicketState.QUEUED
    core.release(fresh, 10.0)  # its slot goes to the queued request (granted at 10.0, healthy)
    assert core.arrive(REQUEST, 14.0, None, overdue_after=5.0).state is TicketState.QUEUED
    # at 20.0 both occupied slots are older than 5 s: refuse at once
    refused = core.arrive(REQUEST, 20.0, None, overdue_after=5.0)
    assert refused.state is TicketState.REFUSED and refused.refusal is Refusal.OVERDUE
    assert old.state is TicketState.GRANTED


def test_overdue_rule_applies_even_with_spare_capacity_behind_a_queued_manager():
    core = AdmissionCore(3)
    core.arrive(REQUEST, 0.0, None)
    manager = core.arrive(MANAGER, 1.0, None)
    assert manager.state is TicketState.QUEUED
    refused = core.arrive(REQUEST, 10.0, None, overdue_after=5.0)
    assert refused.refusal is Refusal.OVERDUE


def test_close_refuses_queued_and_later_callers_but_keeps_granted_leases():
    core = AdmissionCore(1)
    holder = core.arrive(REQUEST, 0, None)
    waiter = core.arrive(REQUEST, 0, None)
    assert core.close() == [waiter]
    assert waiter.refusal is Refusal.CLOSED
    assert core.arrive(REQUEST, 1, None).refusal is Refusal.CLOSED
    assert holder.state is TicketState.GRANTED
    core.release(holder, 2)


def test_double_release_raises():
    core = AdmissionCore(1)
    ticket = core.arrive(REQUEST, 0, None)
    core.release(ticket, 1)
    with pytest.raises(RuntimeError):
        core.release(ticket, 2)


def test_shrinking_capacity_lets_holders_finish():
    core = AdmissionCore(3)
    holders = [core.arrive(REQUEST, 0, None) for _ in range(3)]
    waiter = core.arrive(REQUEST, 0, None)
    core.set_capacity(1, 1)
    assert core.release(holders[0], 2) == []
    assert core.release(holders[1], 3) == []
    assert core.release(holders[2], 4) == [waiter]


# ---- a stateful property test over random interleavings ------------------------------------------------------


class AdmissionMachine(RuleBasedStateMachine):
    """Random interleavings of requests, managers, releases, timeouts, cancellations and resizes. After every
    step: no slot leaked or double-granted, grants in FIFO order, no manager overtaken, every waiter ends once."""

    @initialize(capacity=st.integers(1, 4))
    def setup(self, capacity):
        self.core = AdmissionCore(capacity)
        self.now = 0.0
        self.tickets: list[Ticket] = []
        self.final_seen: dict[int, TicketState] = {}
        self.grant_log: list[int] = []

    def _record(self, changed):
        for ticket in changed:
            assert ticket.state is TicketState.GRANTED
            self._check_fifo(ticket)
            self.grant_log.append(ticket.seq)

    def _check_fifo(self, granted: Ticket):
        for other in self.tickets:
            if other.seq < granted.seq:
                assert other.state is not TicketState.QUEUED, f"{granted!r} granted before older {other!r}"

    @rule(
        kind=st.sampled_from([REQUEST, REQUEST, REQUEST, MANAGER]),
        timeout=st.none() | st.floats(0.5, 5.0),
        overdue=st.sampled_from([0.0, 3.0]),
        max_queue=st.sampled_from([0, 2]),
    )
    def arrive(self, kind, timeout, overdue, max_queue):
        queue_was_empty = not self.core.queued_tickets()
        deadline = None if timeout is None else self.now + timeout
        ticket = self.core.arrive(kind, self.now, deadline, overdue_after=overdue, max_queue=max_queue)
        self.tickets.append(ticket)
        if ticket.state is TicketState.GRANTED:
            assert queue_was_empty, "a newcomer barged past queued callers"
            self._check_fifo(ticket)
            self.grant_log.append(ticket.seq)

    @precondition(lambda self: any(t.state is TicketState.GRANTED for t in self.tickets))
    @rule(data=st.data())
    def release(self, data):
        held = [t for t in self.tickets if t.state is TicketState.GRANTED]
        ticket = data.draw(st.sampled_from(held))
        self._record(self.core.release(ticket, self.now))
        assert ticket.state is TicketState.RELEASED

    @rule(step=st.floats(0.1, 3.0))
    def advance_time_and_expire(self, step):
        self.now += step
        for ticket in list(self.core.queued_tickets()):
            if ticket.deadline is not None and ticket.deadline <= self.now and ticket.state is TicketState.QUEUED:
                self._record(self.core.withdraw(ticket, TicketState.EXPIRED, self.now))

    @precondition(lambda self: any(t.state is TicketState.QUEUED for t in self.tickets))
    @rule(data=st.data())
    def cancel_waiter(self, data):
        queued = [t for t in self.tickets if t.state is TicketState.QUEUED]
        ticket = data.draw(st.sampled_from(queued))
        self._record(self.core.withdraw(ticket, TicketState.CANCELLED, self.now))
        assert ticket.state is TicketState.CANCELLED

    @rule(capacity=st.integers(1, 4))
    def resize(self, capacity):
        self._record(self.core.set_capacity(capacity, self.now))

    @invariant()
    def slots_are_consistent(self):
        if not hasattr(self, "core"):
            return
        held = [t for t in self.tickets if t.state is TicketState.GRANTED]
        requests = [t for t in held if t.kind is REQUEST]
        managers = [t for t in held if t.kind is MANAGER]
        stats = self.core.statistics()
        assert stats.active_slots == len(requests)
        assert len(managers) <= 1
        assert not (managers and requests), "a manager holds the model while requests hold slots"
        assert stats.manager_active == bool(managers)
        queued = [t for t in self.tickets if t.state is TicketState.QUEUED]
        assert self.core.queued_tickets() == queued  # queue holds exactly the waiting tickets, oldest first
        assert stats.queued_requests == sum(t.kind is REQUEST for t in queued)
        assert len(set(self.grant_log)) == len(self.grant_log), "a ticket was granted twice"

    @invariant()
    def no_missed_wakeup(self):
        if hasattr(self, "core"):
            assert self.core.dispatch(self.now) == [], "a waiter could have been granted but was not"

    @invariant()
    def final_states_never_change(self):
        if not hasattr(self, "core"):
            return
        for ticket in self.tickets:
            final = ticket.state in (
                TicketState.RELEASED,
                TicketState.EXPIRED,
                TicketState.CANCELLED,
                TicketState.REFUSED,
            )
            if ticket.seq in self.final_seen:
                assert ticket.state is self.final_seen[ticket.seq]
            elif final:
                self.final_seen[ticket.seq] = ticket.state

    def teardown(self):
        if not hasattr(self, "core"):
            return
        # Drain: release every holder and withdraw every waiter; every ticket must end exactly once.
        for _ in range(len(self.tickets) + 1):
            for ticket in [t for t in self.tickets if t.state is TicketState.GRANTED]:
                self._record(self.core.release(ticket, self.now))
            for ticket in [t for t in self.tickets if t.state is TicketState.QUEUED][:1]:
                self._record(self.core.withdraw(ticket, TicketState.CANCELLED, self.now))
        assert all(t.state not in (TicketState.QUEUED, TicketState.GRANTED) for t in self.tickets)
        assert self.core.idle


TestAdmissionMachine = AdmissionMachine.TestCase
TestAdmissionMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


# ---- the thread-safe controller --------------------------------------------------------------------------------


def _wait_queued(controller: AdmissionController, count: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while controller.statistics().queued != count:
        assert time.monotonic() < deadline, f"never reached {count} queued"
        time.sleep(0.0005)  # ordering-free: re-checks a state predicate


def _start(target) -> tuple[threading.Thread, list]:
    box: list = []

    def run():
        try:
            box.append(target())
        except BaseException as error:  # the test inspects it
            box.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def test_controller_hands_freed_slots_to_waiters_in_fifo_order():
    controller = AdmissionController("m", 1)
    holder = controller.acquire(REQUEST, None)
    order = []
    threads = []
    for index in range(4):
        thread, box = _start(lambda i=index: (controller.acquire(REQUEST, None), order.append(i))[0])
        threads.append((thread, box))
        _wait_queued(controller, index + 1)
    controller.release(holder)
    for thread, box in threads:
        thread.join(5)
        controller.release(box[0])
    # a waiter appends only once it holds the slot, and the next release comes after it finished: the order
    # of the appends is the grant order (a grant out of order would leave thread 0 blocked, failing the join)
    assert order == [0, 1, 2, 3]
    assert controller.statistics().granted_total == 5


def test_controller_times_out_at_the_deadline_while_the_slot_stays_busy():
    controller = AdmissionController("m", 1)
    holder = controller.acquire(REQUEST, None)
    started = time.monotonic()
    with pytest.raises(AdmissionTimeout, match="server_busy"):
        controller.acquire(REQUEST, started + 0.2)
    elapsed = time.monotonic() - started
    assert 0.2 <= elapsed < 1.5
    stats = controller.statistics()
    assert stats.queued == 0 and stats.active_slots == 1 and stats.expired_total == 1
    controller.release(holder)


def test_cancelled_waiter_leaves_the_queue_at_once_and_the_next_moves_up():
    controller = AdmissionController("m", 1)
    holder = controller.acquire(REQUEST, None)
    token = CancelToken()
    first, first_box = _start(lambda: controller.acquire(REQUEST, None, cancel=token))
    _wait_queued(controller, 1)
    second, second_box = _start(lambda: controller.acquire(REQUEST, None))
    _wait_queued(controller, 2)
    token.cancel()
    first.join(5)
    assert isinstance(first_box[0], RequestCancelled)
    assert controller.statistics().queued == 1
    controller.release(holder)
    second.join(5)
    assert second_box[0].state is TicketState.GRANTED
    controller.release(second_box[0])


def test_refusals_raise_their_own_errors():
    controller = AdmissionController("m", 1)
    holder = controller.acquire(REQUEST, None)
    waiter, box = _start(lambda: controller.acquire(REQUEST, None, max_queue=1))
    _wait_queued(controller, 1)
    with pytest.raises(QueueFull):
        controller.acquire(REQUEST, None, max_queue=1)
    controller.close()
    waiter.join(5)
    assert isinstance(box[0], ShuttingDown)
    with pytest.raises(ShuttingDown):
        controller.acquire(REQUEST, None)
    controller.release(holder)


def test_overdue_blockers_refuse_immediately():
    clock = [100.0]
    controller = AdmissionController("m", 1, clock=lambda: clock[0])
    holder = controller.acquire(REQUEST, None)
    clock[0] += 10.0
    with pytest.raises(OverdueBlockers):
        controller.acquire(REQUEST, clock[0] + 5.0, overdue_after=5.0)
    controller.release(holder)


def test_uncontended_acquire_takes_the_fast_path_without_queueing():
    controller = AdmissionController("m", 4)
    for _ in range(100):
        ticket = controller.acquire(REQUEST, None)
        assert ticket.waker is None  # granted on arrival: no waiter was created
        controller.release(ticket)
    stats = controller.statistics()
    assert stats.granted_total == 100 and stats.queued == 0 and stats.active_slots == 0
