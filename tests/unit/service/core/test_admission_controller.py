"""A stateful property test of the threaded AdmissionController: real waiter threads, a fake clock, and steps
that race a grant against a deadline or a cancellation.

Every waiter is a real thread blocked in `acquire`. Each rule changes one thing (an arrival, a release, the clock,
a cancellation, close, try_exclusive, a resize) and then *settles*: it waits, bounded, until every waiter thread
has either returned or is blocked for good (its ticket QUEUED, its deadline ahead, its token not cancelled), read
under the model lock, which the test owns and passes to the controller. Order comes from that state, never from
time; the fake clock moves only when a rule moves it (a waiter with a deadline re-checks it every few
milliseconds, which is what lets a moved clock expire it). The two races are forced, not hoped for: the fake
clock can park a waiter inside the call it makes to re-check its deadline, outside the lock, while the rule grants
its ticket and lets the deadline pass or cancels it; the examples after the machine force each race once.

After every step, the invariants of the core (test_admission.py) hold for the controller too: one
manager at most and never beside requests, statistics that match the leases held and the tickets queued, grants in
arrival order, no waiter that could be granted left waiting; plus the controller's own: no slot leaked (every
grant reaches its caller or is passed on) and no waiter left blocked (every thread whose ticket changed returns,
with the error that matches its ticket). The teardown closes the controller, releases every lease and requires
every thread to end with the core idle.

To extend (for example with batching), add a rule: a small method that changes one thing through the controller's
public surface, then calls `self._settle()`; outcomes are checked by `_adopt` and the invariants.
"""

from __future__ import annotations

import threading
import time

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.interface import CancelToken
from service.core.admission import AdmissionController, Refusal, Ticket, TicketKind, TicketState
from service.core.errors import AdmissionTimeout, QueueFull, RequestCancelled, ShuttingDown

REQUEST, MANAGER = TicketKind.REQUEST, TicketKind.MANAGER
SETTLE = 5.0  # real seconds a step may take to settle before the test reports a waiter left blocked
# Fake seconds. A waiter with a deadline blocks at most `remaining` real seconds before it re-reads the fake clock,
# so deadlines this short keep that re-check prompt.
TIMEOUTS = st.none() | st.sampled_from([0.004, 0.008, 0.016])
STEPS = st.sampled_from([0.001, 0.002, 0.005])


class FakeClock:
    """A clock the machine moves by hand, with one hook: `park(thread)` makes that thread's next call block until
    `resume()`. A waiter calls the clock outside the model lock when it wakes to re-check its deadline, so parking
    it there forces an interleaving: its deadline passes, or its ticket is granted or cancelled, before it reads
    the time."""

    def __init__(self) -> None:
        self.now = 100.0
        self.parked = threading.Event()  # set once the parked thread is inside the clock
        self._resume = threading.Event()
        self._park: threading.Thread | None = None

    def park(self, thread: threading.Thread) -> None:
        self.parked.clear()
        self._resume.clear()
        self._park = thread

    def resume(self) -> None:
        self._resume.set()

    def __call__(self) -> float:
        if self._park is not None and threading.current_thread() is self._park:
            self._park = None
            self.parked.set()
            assert self._resume.wait(SETTLE), "the machine never resumed a parked waiter"
        return self.now


class Waiter:
    """One caller blocked in `acquire` on its own thread. `outcome` is the granted Ticket or the exception."""

    def __init__(
        self, controller: AdmissionController, number: int, kind: TicketKind, deadline: float | None, max_queue: int
    ) -> None:
        self.number, self.kind, self.deadline, self.max_queue = number, kind, deadline, max_queue
        self.token = CancelToken()
        self.ticket: Ticket | None = None  # its queued ticket, once seen in the queue
        self.outcome: Ticket | BaseException | None = None
        self.adopted = False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(controller,), name=f"waiter-{number}", daemon=True)

    def _run(self, controller: AdmissionController) -> None:
        try:
            self.outcome = controller.acquire(self.kind, self.deadline, cancel=self.token, max_queue=self.max_queue)
        except Exception as error:  # the machine checks it against the ticket
            self.outcome = error
        finally:
            self.done.set()

    def __repr__(self) -> str:
        return f"Waiter({self.number} {self.kind.value} deadline={self.deadline} ticket={self.ticket})"


def start(controller: AdmissionController, lock: threading.Lock, waiter: Waiter) -> Waiter:
    """Start `waiter`'s thread; return once it has returned (granted or refused at once) or is queued, its ticket
    then recorded. No other arrival may be in flight."""
    with lock:
        before = set(controller.core.queued_tickets())
    waiter.thread.start()
    limit = time.monotonic() + SETTLE
    while not waiter.done.is_set():
        with lock:
            new = [ticket for ticket in controller.core.queued_tickets() if ticket not in before]
        if new:
            waiter.ticket = new[-1]
            break
        assert time.monotonic() < limit, f"{waiter} neither queued nor returned"
        time.sleep(0.0002)  # ordering-free: re-checks the queue
    return waiter


class ControllerMachine(RuleBasedStateMachine):
    @initialize(capacity=st.integers(1, 3))
    def setup(self, capacity):
        self.lock = threading.Lock()  # the model lock: the test may read the core under it
        self.clock = FakeClock()
        self.controller = AdmissionController("m", capacity, lock=self.lock, clock=self.clock)
        self.waiters: list[Waiter] = []
        self.held: list[Ticket] = []  # leases granted and handed to the machine, not yet released
        self.watched: dict[Ticket, list[TicketState]] = {}  # on_change tickets -> states they were notified in
        self.watched_queued: set[Ticket] = set()  # those that queued on arrival (the others have no one to tell)
        self.closed = False
        self.granted_log: list[Ticket] = []

    # ---- helpers --------------------------------------------------------------------------------------------

    def _queued(self) -> list[Ticket]:
        with self.lock:
            return self.controller.core.queued_tickets()

    def _queued_waiters(self) -> list[Waiter]:
        return [
            w
            for w in self.waiters
            if not w.done.is_set() and w.ticket is not None and w.ticket.state is TicketState.QUEUED
        ]

    def _blocked_for_good(self, waiter: Waiter) -> bool:
        """Caller holds the lock. The waiter's thread has nothing left to react to."""
        ticket = waiter.ticket
        return (
            ticket is not None
            and ticket.state is TicketState.QUEUED
            and not waiter.token.cancelled
            and (waiter.deadline is None or waiter.deadline > self.clock.now)
        )

    def _settle(self, parked: Waiter | None = None) -> None:
        """Wait until every waiter returned or is blocked for good (or is `parked` in the clock); then take over
        what they returned."""
        limit = time.monotonic() + SETTLE
        while True:
            with self.lock:
                moving = [
                    w for w in self.waiters if not w.done.is_set() and not self._blocked_for_good(w) and w is not parked
                ]
            if not moving:
                break
            assert time.monotonic() < limit, f"waiters left blocked: {moving}"
            time.sleep(0.0002)  # ordering-free: re-checks the waiters' state
        self._adopt()

    def _adopt(self) -> None:
        """Check each newly finished waiter's outcome against its ticket; granted leases pass to the machine."""
        newly_granted = []
        for waiter in self.waiters:
            if not waiter.done.is_set() or waiter.adopted:
                continue
            waiter.adopted = True
            outcome = waiter.outcome
            if isinstance(outcome, Ticket):
                assert outcome.state is TicketState.GRANTED and outcome.kind is waiter.kind, (waiter, outcome)
                assert waiter.ticket in (None, outcome)
                newly_granted.append(outcome)
            else:
                self._check_error(waiter, outcome)
        for ticket in self.watched:
            if ticket.state is TicketState.GRANTED and ticket not in self.granted_log:
                newly_granted.append(ticket)
        for ticket in newly_granted:
            self._check_fifo(ticket)
            self.held.append(ticket)
            self.granted_log.append(ticket)

    def _check_error(self, waiter: Waiter, error: BaseException | None) -> None:
        ticket = waiter.ticket
        if isinstance(error, AdmissionTimeout):
            assert waiter.deadline is not None and waiter.deadline <= self.clock.now, waiter
            assert ticket is not None and ticket.state is TicketState.EXPIRED, waiter
        elif isinstance(error, RequestCancelled):
            assert waiter.token.cancelled, waiter
            # cancelled while queued, or granted as the cancellation arrived and passed on at once
            assert ticket is not None and ticket.state in (TicketState.CANCELLED, TicketState.RELEASED), waiter
        elif isinstance(error, ShuttingDown):
            assert self.closed, waiter
            assert ticket is None or (ticket.state is TicketState.REFUSED and ticket.refusal is Refusal.CLOSED)
        elif isinstance(error, QueueFull):
            assert ticket is None and waiter.kind is REQUEST and waiter.max_queue > 0, waiter
        else:
            raise AssertionError(f"{waiter} ended with {error!r}")

    def _check_fifo(self, granted: Ticket) -> None:
        for ticket in self._queued():
            assert ticket.seq > granted.seq, f"{granted!r} was granted while the older {ticket!r} still waits"

    def _start(self, kind: TicketKind, timeout: float | None, max_queue: int = 0) -> Waiter:
        """A new waiter; returns once it is queued or has returned (granted or refused at once)."""
        queue_was_empty = not self._queued()
        deadline = None if timeout is None else self.clock.now + timeout
        waiter = Waiter(self.controller, len(self.waiters), kind, deadline, max_queue)
        self.waiters.append(waiter)
        start(self.controller, self.lock, waiter)
        if isinstance(waiter.outcome, Ticket):
            assert queue_was_empty, "a newcomer was granted past queued callers"
        self._settle()
        return waiter

    def _timed_waiters(self) -> list[Waiter]:
        """Queued waiters with a deadline, oldest first."""
        return sorted((w for w in self._queued_waiters() if w.deadline is not None), key=lambda w: w.ticket.seq)  # type: ignore[union-attr]  # queued: has a ticket

    def _park(self, waiter: Waiter) -> None:
        """Park `waiter` inside its next clock call (it makes one within its timeout, when it re-checks)."""
        self.clock.park(waiter.thread)
        assert self.clock.parked.wait(SETTLE), f"{waiter} never re-checked its deadline"

    def _grant_to(self, waiter: Waiter, data) -> bool:
        """Release leases, and those the releases grant to the waiters ahead, until the parked `waiter`'s ticket
        is granted (or nothing is left to release); whether it was granted."""
        assert waiter.ticket is not None  # parked in the queue
        while self.held and waiter.ticket.state is TicketState.QUEUED:
            self._release_one(data)
            self._settle(parked=waiter)
        return waiter.ticket.state is TicketState.GRANTED

    def _release_one(self, data) -> None:
        ticket = data.draw(st.sampled_from(self.held))
        self.held.remove(ticket)
        self.controller.release(ticket)
        assert ticket.state is TicketState.RELEASED

    # ---- rules: each changes one thing, then settles ---------------------------------------------------------

    @rule(timeout=TIMEOUTS, max_queue=st.sampled_from([0, 0, 2]))
    def request_arrives(self, timeout, max_queue):
        self._start(REQUEST, timeout, max_queue)

    @rule(timeout=TIMEOUTS)
    def manager_arrives(self, timeout):
        self._start(MANAGER, timeout)

    @rule()
    def watcher_arrives(self):
        """A manager ticket that waits through on_change (as a bulk unload does), without a thread."""
        with self.lock:
            ticket = self.controller.arrive_locked(
                MANAGER, None, on_change=lambda changed: self.watched[changed].append(changed.state)
            )
            self.watched[ticket] = []
            if ticket.state is TicketState.QUEUED:
                self.watched_queued.add(ticket)
        if ticket.state is TicketState.REFUSED:
            assert self.closed and ticket.refusal is Refusal.CLOSED
        self._settle()

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data):
        self._release_one(data)
        self._settle()

    @rule(step=STEPS)
    def advance_clock(self, step):
        self.clock.now += step
        self._settle()

    @precondition(lambda self: self._queued_waiters())
    @rule(data=st.data())
    def cancel_waiter(self, data):
        waiter = data.draw(st.sampled_from(self._queued_waiters()))
        waiter.token.cancel()
        self._settle()
        assert isinstance(waiter.outcome, RequestCancelled), waiter

    @precondition(lambda self: any(t.state is TicketState.QUEUED for t in self.watched))
    @rule(data=st.data())
    def cancel_watcher(self, data):
        ticket = data.draw(st.sampled_from([t for t in self.watched if t.state is TicketState.QUEUED]))
        self.controller.cancel_queued(ticket)
        assert ticket.state is TicketState.CANCELLED
        self._settle()

    @precondition(lambda self: self._timed_waiters())
    @rule(data=st.data())
    def grant_races_a_deadline(self, data):
        """Forced interleaving: a waiter has woken to re-check its deadline, the deadline passes, and a release
        grants it before it reads the clock. The grant stands: the waiter returns it."""
        waiter = data.draw(st.sampled_from(self._timed_waiters()))
        self._park(waiter)
        self.clock.now = waiter.deadline
        granted = self._grant_to(waiter, data)
        self.clock.resume()
        self._settle()
        assert granted, f"{waiter} was not granted once everything ahead of it was released"
        assert waiter.outcome is waiter.ticket, waiter

    @precondition(lambda self: self._timed_waiters())
    @rule(data=st.data())
    def cancel_races_a_grant(self, data):
        """Forced interleaving: a release grants a waiter while it is away from its wait (re-checking its
        deadline), then its caller cancels. It sees both at once: it passes the slot on and reports the
        cancellation."""
        waiter = data.draw(st.sampled_from(self._timed_waiters()))
        self._park(waiter)
        granted = self._grant_to(waiter, data)
        waiter.token.cancel()
        self.clock.resume()
        self._settle()
        assert granted, f"{waiter} was not granted once everything ahead of it was released"
        assert isinstance(waiter.outcome, RequestCancelled), waiter
        assert waiter.ticket.state is TicketState.RELEASED, waiter  # the slot was passed on

    @rule()
    def close(self):
        self.controller.close()
        self.closed = True
        self._settle()
        assert not self._queued(), "close left tickets queued"

    @rule()
    def try_exclusive(self):
        with self.lock:
            idle = self.controller.core.idle
            ticket = self.controller.core.try_exclusive(self.clock())
        if ticket is None:
            assert not idle
        else:
            assert idle and ticket.state is TicketState.GRANTED and ticket.kind is MANAGER
            self.held.append(ticket)
            self.granted_log.append(ticket)

    @rule(capacity=st.integers(1, 3))
    def resize(self, capacity):
        self.controller.set_capacity(capacity)
        self._settle()

    # ---- invariants -----------------------------------------------------------------------------------------

    @invariant()
    def leases_match_the_statistics(self):
        if not hasattr(self, "controller"):
            return
        stats = self.controller.statistics()
        requests = [t for t in self.held if t.kind is REQUEST]
        managers = [t for t in self.held if t.kind is MANAGER]
        assert all(t.state is TicketState.GRANTED for t in self.held)
        assert len(managers) <= 1 and not (managers and requests), self.held
        assert stats.active_slots == len(requests) and stats.manager_active == bool(managers)
        assert stats.closed == self.closed

    @invariant()
    def the_queue_is_exactly_the_blocked_callers_in_arrival_order(self):
        if not hasattr(self, "controller"):
            return
        queued = self._queued()
        expected = sorted(
            [w.ticket for w in self._queued_waiters()] + [t for t in self.watched if t.state is TicketState.QUEUED],
            key=lambda t: t.seq,
        )
        assert queued == expected
        stats = self.controller.statistics()
        assert stats.queued_requests == sum(t.kind is REQUEST for t in queued)
        assert stats.queued_managers == sum(t.kind is MANAGER for t in queued)

    @invariant()
    def no_waiter_that_could_be_granted_is_left_waiting(self):
        if hasattr(self, "controller"):
            with self.lock:
                assert self.controller.core.dispatch(self.clock()) == [], "a missed wake-up"

    @invariant()
    def each_watched_ticket_was_notified_once_per_change(self):
        if not hasattr(self, "controller"):
            return
        for ticket, notes in self.watched.items():
            if ticket.state is TicketState.QUEUED or ticket not in self.watched_queued:
                assert notes == [], (ticket, notes)  # granted or refused on arrival: the caller saw it
            else:
                assert len(notes) == 1 and notes[0] in (
                    TicketState.GRANTED,
                    TicketState.CANCELLED,
                    TicketState.REFUSED,
                ), (ticket, notes)

    def teardown(self):
        if not hasattr(self, "controller"):
            return
        self.controller.close()
        self.closed = True
        self._settle()
        while self.held:
            ticket = self.held.pop()
            self.controller.release(ticket)
        self._settle()
        assert all(w.done.is_set() for w in self.waiters), "a waiter thread never returned"
        for waiter in self.waiters:
            waiter.thread.join(SETTLE)
        with self.lock:
            assert self.controller.core.idle, "a slot or a place in the queue leaked"
        assert self.controller.statistics().active_slots == 0


TestControllerMachine = ControllerMachine.TestCase
TestControllerMachine.settings = settings(max_examples=150, stateful_step_count=25, deadline=None)


# ---- the forced interleavings, one by one -------------------------------------------------------------------


def _queued(
    controller: AdmissionController, lock: threading.Lock, number: int, kind: TicketKind, deadline: float | None = None
) -> Waiter:
    waiter = start(controller, lock, Waiter(controller, number, kind, deadline, max_queue=0))
    assert waiter.ticket is not None and waiter.ticket.state is TicketState.QUEUED, waiter
    return waiter


def _finished(waiter: Waiter):
    assert waiter.done.wait(SETTLE), f"{waiter} left blocked"
    return waiter.outcome


def test_a_grant_that_wins_the_race_against_the_deadline_stands():
    lock, clock = threading.Lock(), FakeClock()
    controller = AdmissionController("m", 1, lock=lock, clock=clock)
    holder = controller.acquire(REQUEST, None)
    waiter = _queued(controller, lock, 0, REQUEST, deadline=clock.now + 0.004)
    clock.park(waiter.thread)  # it re-checks its deadline within 4 ms and stops in the clock
    assert clock.parked.wait(SETTLE)
    clock.now = waiter.deadline  # the deadline passes...
    controller.release(holder)  # ...and the slot is granted before the waiter reads the time
    assert waiter.ticket.state is TicketState.GRANTED
    clock.resume()
    assert _finished(waiter) is waiter.ticket
    stats = controller.statistics()
    assert (stats.active_slots, stats.expired_total, stats.queued) == (1, 0, 0)
    controller.release(waiter.ticket)


def test_a_cancellation_that_arrives_with_the_grant_passes_the_slot_to_the_next_waiter():
    lock, clock = threading.Lock(), FakeClock()
    controller = AdmissionController("m", 1, lock=lock, clock=clock)
    holder = controller.acquire(REQUEST, None)
    first = _queued(controller, lock, 0, REQUEST, deadline=clock.now + 0.004)
    second = _queued(controller, lock, 1, REQUEST)
    clock.park(first.thread)
    assert clock.parked.wait(SETTLE)
    controller.release(holder)
    assert first.ticket.state is TicketState.GRANTED
    first.token.cancel()  # too late to leave the queue: the grant is already made
    clock.resume()
    assert isinstance(_finished(first), RequestCancelled)
    assert first.ticket.state is TicketState.RELEASED
    assert _finished(second) is second.ticket and second.ticket.state is TicketState.GRANTED
    controller.release(second.ticket)
    assert controller.statistics().active_slots == 0


def test_a_head_manager_that_gives_up_wakes_the_requests_behind_it():
    lock, clock = threading.Lock(), FakeClock()
    controller = AdmissionController("m", 3, lock=lock, clock=clock)
    holder = controller.acquire(REQUEST, None)
    manager = _queued(controller, lock, 0, MANAGER, deadline=clock.now + 0.004)
    behind = [_queued(controller, lock, 1 + index, REQUEST) for index in range(2)]
    clock.now = manager.deadline  # the manager expires; both requests fit beside the holder
    assert isinstance(_finished(manager), AdmissionTimeout)
    for waiter in behind:
        assert _finished(waiter) is waiter.ticket
    assert controller.statistics().active_slots == 3
    for ticket in (holder, *(waiter.ticket for waiter in behind)):
        controller.release(ticket)


class _MovesAfterTheArrival:
    """A clock that reads `now` for everyone, except that the waiter's thread reads `later` from its second
    reading on: the first is its arrival's, the second whatever it reads next."""

    def __init__(self, now: float, later: float) -> None:
        self.now, self.later = now, later
        self.waiter: threading.Thread | None = None
        self._readings = 0

    def __call__(self) -> float:
        if threading.current_thread() is self.waiter:
            self._readings += 1
            if self._readings > 1:
                return self.later
        return self.now


def test_the_first_wait_is_measured_from_the_arrival_so_a_clock_that_moves_right_after_it_expires_nothing():
    """make stress (TIME.02): a test's fake clock moved right after the test saw a ticket queued, and the
    waiter's thread, not run since its arrival, read the moved clock before it had waited at all and expired.
    The first wait is now measured from the arrival's own reading, taken under the lock with it."""
    lock = threading.Lock()
    clock = _MovesAfterTheArrival(100.0, 200.0)  # far past the waiter's deadline (101) once it reads again
    controller = AdmissionController("m", 1, lock=lock, clock=clock)
    holder = controller.acquire(REQUEST, None)
    waiter = Waiter(controller, 0, REQUEST, deadline=101.0, max_queue=0)
    clock.waiter = waiter.thread
    start(controller, lock, waiter)
    assert waiter.ticket is not None  # queued, its first wait one (real) second long
    controller.release(holder)  # granted within that wait
    assert _finished(waiter) is waiter.ticket and waiter.ticket.state is TicketState.GRANTED
    assert controller.statistics().expired_total == 0
    controller.release(waiter.ticket)
