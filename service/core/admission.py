"""Per-model admission: slots, one strict FIFO queue (a queue per priority level), and exclusive management leases.

Two layers, so the rules can be tested without threads:

* `AdmissionCore` is the state machine. It has no lock, no clock and no threads: every method takes the time it
  needs and returns the tickets whose state it changed, so the caller can wake them. The caller must hold the
  model's lock around every call.
* `AdmissionController` is the thread-safe shell over it. One lock (shared with the model's lifecycle, see
  lifecycle.py) guards the core; a queued caller blocks on its own binary lock (its "waker") until it is
  granted, expires, is cancelled or is refused.

Rules (contract ORDER.01-03, TIME.01-03):

* A request holds one slot; a manager holds the whole model, and is granted only once every earlier lease has
  drained.
* Grants follow arrival order. A queued manager stops every later request, even while slots are free.
* A newcomer takes a free slot at once only if nobody is queued (no barging). A freed slot is *handed* to the
  oldest waiter under the lock, at the moment it frees, so nobody can take it in between.
* A request that would have to wait is refused at once when the queue is full (`max_queue`), or when every
  occupied inference slot has been busy longer than the overdue threshold (the model's admission timeout): then
  the wait could not end in time however short it was.
* A waiter expires at its deadline, whatever the slots are doing.

Dynamic batching (a model with a `BatchRule`): a slot is handed not to the oldest waiter alone but to the oldest
waiters that fit together. From the head of the queue, in arrival order, it takes each request whose `key`
equals the head's (same datatypes, same shapes after the batch dimension, same requested outputs) while their
`rows` add up to at most `max_rows`. It stops at the first request that does not fit, and at a queued manager:
no request is ever served before an older one it could have joined, and no batch crosses a management barrier.
The batch holds one slot; its first ticket (the leader) is granted and woken, its thread runs the batch; the
other members are granted with it but stay asleep until the leader posts their results (one wake-up each).
Without a delay a request that finds a free slot runs at once, alone, and batches form only from requests
that had to queue. With `delay` > 0 a batch at the head of the queue waits for more members while a slot is
free, until it reaches a preferred size (or `max_rows`), can no longer grow (the next waiter does not fit),
or its oldest member has waited `delay`, and never past the earliest deadline of its members. A running batch
is, to managers, eviction and shutdown, the leases of all its members: they end together.

Priorities (a batching model whose `BatchRule.priorities` is set: Triton's priority_levels and queue policies;
contract PRIO.01-):

* A request's `priority` parameter picks its level: 1..levels as sent, 0 or above `levels` the default level.
  Levels are served from level 1, FIFO within a level; a batch takes the compatible requests in that order (the
  head, then the rest of its level, then the next level), stopping at the first that does not fit.
* Each level's queue policy (its own, else the default one) bounds the level's queue (`max_queue_size`, delayed
  requests included) and sets its queue timeout (`default_timeout_microseconds`, which the request's `timeout`
  may only shorten, and only with `allow_timeout_override`). REJECT: the timeout is the ticket's deadline (it
  expires then). DELAY: at its timeout the request moves behind the requests of its level that are still
  within theirs, ahead of the lower levels (the move is made when the queue is next served, `dispatch`), and
  it is never refused for it.
* Managers stay barriers across levels: only requests older than the oldest queued manager go before it (the
  higher levels first among them), and no request of any level that arrived after it passes it.
* Strict priority, as Triton: a low level waits as long as higher levels keep the slots busy (it starves under
  a constant load of them); its level's timeout or the caller's deadline bounds that wait.

Ticket states:

    QUEUED  -> GRANTED -> RELEASED
    QUEUED  -> EXPIRED | CANCELLED | REFUSED        (never held anything)
    arrival -> GRANTED | REFUSED                    (without queueing)

A batch member that gives up after its grant keeps its state (its batch still holds the slot) and is marked
`left`; it becomes RELEASED with the rest when the leader releases the batch.
"""

from __future__ import annotations

import enum
import itertools
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from engine.config.specs import PrioritySpec, QueuePolicySpec
from engine.interface import CancelToken

from .blocking import STEP_ASIDE_SECONDS, StepAsideLater
from .errors import AdmissionTimeout, OverdueBlockers, QueueFull, RequestCancelled, ShuttingDown

P = TypeVar("P")  # what a request's ticket carries for its batch's runner (service/core/batching.py BatchItem)


class TicketKind(enum.Enum):
    REQUEST = "request"  # an inference call: one slot, shared model
    MANAGER = "manager"  # a management operation: exclusive, after every earlier lease


class TicketState(enum.Enum):
    QUEUED = "queued"
    GRANTED = "granted"
    RELEASED = "released"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    REFUSED = "refused"


class Refusal(enum.Enum):
    QUEUE_FULL = "queue_full"
    LEVEL_FULL = "level_full"  # the queue of the request's priority level is full (its queue policy's max_queue_size)
    OVERDUE = "overdue"  # every occupied inference slot is past the admission timeout
    CLOSED = "closed"  # the controller was closed (shutdown)


_FINAL = frozenset({TicketState.RELEASED, TicketState.EXPIRED, TicketState.CANCELLED, TicketState.REFUSED})


class Ticket(Generic[P]):
    """One caller's place: first a waiter in the queue, then (if granted) a lease until released.

    `waker` is a locked binary lock the waiting thread blocks on; whoever changes a QUEUED ticket releases it.
    `on_change`, when set, is called (under the model lock, must not block) instead, for callers that wait on
    several tickets at once (bulk unload).
    """

    __slots__ = (
        "kind",
        "state",
        "deadline",
        "arrived_at",
        "granted_at",
        "refusal",
        "waker",
        "on_change",
        "seq",
        "rows",
        "key",
        "payload",
        "leader",
        "members",
        "left",
        "posted",
        "level",
        "delay_at",
    )

    def __init__(
        self,
        kind: TicketKind,
        arrived_at: float,
        deadline: float | None,
        seq: int,
        rows: int,
        key: Hashable | None,
        payload: P,  # a batching request's (its BatchItem); None for every other ticket
    ) -> None:
        self.kind = kind
        self.state = TicketState.QUEUED
        self.deadline = deadline
        self.arrived_at = arrived_at
        self.granted_at: float | None = None
        self.refusal: Refusal | None = None
        self.waker: threading.Lock | None = None
        self.on_change: Callable[[Ticket[P]], None] | None = None
        self.seq = seq
        # Batching: the request's rows, what it can be stacked with (None: never batched with others), and what
        # the caller attached for the batch's runner (service/core/batching.py).
        self.rows = rows
        self.key = key
        self.payload = payload
        self.leader: Ticket[P] | None = None  # once granted in a batch: its first ticket (itself for the leader)
        self.members: list[Ticket[P]] | None = None  # on a leader: the batch, in arrival order, leader first
        self.left = False  # a member whose caller gave up after the grant
        self.posted = False  # a member whose leader posted its outcome before the batch ended (a stream to read)
        # Priorities: the request's level (lower is served first; 0 on a model without levels), and when its
        # level's queue timeout moves it behind the level's others (timeout_action DELAY; None: never, or done).
        self.level = 0
        self.delay_at: float | None = None

    def __repr__(self) -> str:
        return f"Ticket(#{self.seq} {self.kind.value} {self.state.value})"

    @property
    def is_member(self) -> bool:
        """Granted as a non-leading member of a batch: its leader's thread runs the batch for it."""
        return self.leader is not None and self.leader is not self

    def notify(self) -> None:
        """Tell whoever waits on this ticket that its state changed. Caller holds the model lock."""
        if self.on_change is not None:
            self.on_change(self)
        else:
            self.nudge()

    def nudge(self) -> None:
        """Wake a thread blocked on this ticket to look at it again (its state may be unchanged). Caller holds
        the model lock (or is the only one that can still release this waker: see AdmissionController.release).
        A waker already released (its waiter has not run yet) stays released: the waiter wakes once and reads the
        latest state. `on_change` callers are never nudged: they act on changes only."""
        if self.waker is not None and self.waker.locked():
            self.waker.release()


@dataclass(frozen=True)
class BatchRule:
    """How one model batches (see the module docstring). Times in seconds."""

    max_rows: int
    delay: float = 0.0
    preferred: frozenset[int] = frozenset()
    priorities: PrioritySpec | None = None  # levels and per-level queue policies (see "Priorities" above)

    @property
    def largest_preferred(self) -> int:
        return max(self.preferred, default=0)

    def complete(self, rows: int) -> bool:
        """A batch of `rows` goes without waiting longer: it reached a preferred size, or cannot grow."""
        return (
            rows >= self.max_rows or rows in self.preferred or (bool(self.preferred) and rows >= self.largest_preferred)
        )


@dataclass(frozen=True)
class AdmissionStatistics:
    capacity: int
    active_slots: int  # request leases held
    manager_active: bool
    queued: int  # tickets waiting, requests and managers
    queued_requests: int
    queued_managers: int
    closed: bool
    granted_total: int
    expired_total: int
    cancelled_total: int
    refused_total: int
    # When the oldest queued request arrived (the controller's clock: monotonic seconds), None while no request
    # waits; managers are not counted. An autoscaler reads its age (service/process/metrics.py).
    oldest_request_arrival: float | None = None


class _LevelQueue:
    """The queued requests of one priority level: those waiting in arrival order, then those its DELAY policy
    moved behind them, in the order they were moved. Dicts: insertion-ordered sets with O(1) removal."""

    __slots__ = ("waiting", "delayed")

    def __init__(self) -> None:
        self.waiting: dict[Ticket[Any], None] = {}
        self.delayed: dict[Ticket[Any], None] = {}

    def __len__(self) -> int:
        return len(self.waiting) + len(self.delayed)


class AdmissionCore:
    """The admission state machine of one model. Not thread-safe: the caller holds the model lock."""

    def __init__(self, capacity: int, batching: BatchRule | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.batching = batching
        # The queue: requests by level (`_order`: the levels that have some, served from the first), and the
        # queued managers in arrival order. A manager is a barrier across levels: only requests older than the
        # oldest queued manager (a smaller `seq`) may go before it.
        self._levels: dict[int, _LevelQueue] = {}
        self._order: list[int] = []
        self._managers: dict[Ticket[Any], None] = {}
        self._delaying = 0  # queued requests whose DELAY time is still ahead (none: nothing to move)
        self._slots: dict[Ticket[Any], None] = {}  # granted request tickets, in grant order
        self._manager: Ticket[Any] | None = None
        self._queued_requests = 0
        self._closed = False
        self._seq = 0
        self._granted_total = 0
        self._expired_total = 0
        self._cancelled_total = 0
        self._refused_total = 0

    # ---- arrivals -------------------------------------------------------------------------------------------

    def arrive(
        self,
        kind: TicketKind,
        now: float,
        deadline: float | None,
        *,
        overdue_after: float = 0.0,
        max_queue: int = 0,
        rows: int = 1,
        key: Hashable | None = None,
        payload: Any = None,
        priority: int = 0,
        timeout_us: int = 0,
    ) -> Ticket[Any]:
        """Admit, queue or refuse a new caller. Returns its ticket (GRANTED, QUEUED or REFUSED).

        `overdue_after` > 0 enables the overdue-blocker rule; `max_queue` > 0 bounds queued requests. `rows`,
        `key` and `payload` describe a request of a batching model. With a batching delay an arrival can
        complete (or stop the growth of) the batch forming at the head of the queue: call `dispatch(now)`
        after it then (`delays_batches`). On a model with priorities (`BatchRule.priorities`) `priority` (the
        request's parameter) picks the request's level, whose queue policy bounds its level's queue and sets its
        queue timeout (`timeout_us`, the request's `timeout` parameter, shortens it where the policy allows).
        """
        self._seq += 1
        ticket: Ticket[Any] = Ticket(kind, now, deadline, self._seq, rows, key, payload)
        if self._closed:
            return self._refuse(ticket, Refusal.CLOSED)
        # (_place has nothing to place without batching; queued_count and _can_grant's request case inline: a
        # request arriving at an idle model is granted here without a helper call)
        batching = self.batching
        policy = (
            self._place(ticket, priority, timeout_us, now)
            if kind is TicketKind.REQUEST and batching is not None
            else None
        )
        if (
            kind is TicketKind.REQUEST
            and batching is None
            and not self._queued_requests
            and not self._managers
            and self._manager is None
            and len(self._slots) < self.capacity
        ):
            self._grant(ticket, now)
            return ticket
        if not self.queued_count and self._can_grant(ticket):
            if kind is TicketKind.MANAGER or self.batching is None:
                self._grant(ticket, now)
                return ticket
            if not self.delays_batches or key is None or self.batching.complete(rows):
                self._grant_batch([ticket], now)
                return ticket
            self._enqueue(ticket)  # the head of a forming batch: it waits up to the delay for more members
            return ticket
        if overdue_after > 0 and self._all_slots_overdue(now, overdue_after):
            return self._refuse(ticket, Refusal.OVERDUE)
        if kind is TicketKind.REQUEST and max_queue > 0 and self._queued_requests >= max_queue:
            return self._refuse(ticket, Refusal.QUEUE_FULL)
        if policy is not None and 0 < policy.max_queue_size <= self._level_size(ticket.level):
            return self._refuse(ticket, Refusal.LEVEL_FULL)  # Triton bounds each level's queue
        self._enqueue(ticket)
        return ticket

    def _place(self, ticket: Ticket[Any], priority: int, timeout_us: int, now: float) -> QueuePolicySpec | None:
        """Set a request's level and queue timeout from its model's priorities; returns its level's policy (None:
        the model has no priorities, and its plain settings came with the call)."""
        rule = self.batching.priorities if self.batching is not None else None
        if rule is None:
            return None
        ticket.level = rule.level_of(priority)
        policy = rule.policy_of(ticket.level)
        wait_us = policy.default_timeout_us
        if policy.allow_timeout_override and timeout_us > 0 and (wait_us == 0 or timeout_us < wait_us):
            wait_us = timeout_us  # a request's own timeout may only shorten its level's
        if wait_us > 0:
            due = now + wait_us / 1e6
            if policy.delay:
                ticket.delay_at = due
            elif ticket.deadline is None or due < ticket.deadline:
                ticket.deadline = due
        return policy

    def _level_size(self, level: int) -> int:
        queue = self._levels.get(level)
        return len(queue) if queue is not None else 0

    @property
    def queued_count(self) -> int:
        """Tickets queued, requests and managers."""
        return self._queued_requests + len(self._managers)

    def _enqueue(self, ticket: Ticket[Any]) -> None:
        if ticket.kind is TicketKind.MANAGER:
            self._managers[ticket] = None
            return
        queue = self._levels.get(ticket.level)
        if queue is None:
            queue = self._levels[ticket.level] = _LevelQueue()
            self._order = sorted(self._levels)
        queue.waiting[ticket] = None
        self._queued_requests += 1
        if ticket.delay_at is not None:
            self._delaying += 1

    @property
    def prioritized(self) -> bool:
        """Whether requests queue by priority level (the model has priority levels)."""
        return self.batching is not None and self.batching.priorities is not None

    @property
    def delays_batches(self) -> bool:
        """Whether a batch may wait for more members (a batching delay is set)."""
        return self.batching is not None and self.batching.delay > 0

    def _can_grant(self, ticket: Ticket[Any]) -> bool:
        if self._manager is not None:
            return False
        if ticket.kind is TicketKind.MANAGER:
            return not self._slots
        return len(self._slots) < self.capacity

    def _all_slots_overdue(self, now: float, overdue_after: float) -> bool:
        if not self._slots:
            return False
        return all(now - held.granted_at > overdue_after for held in self._slots)  # type: ignore[operator]

    def _grant(self, ticket: Ticket[Any], now: float) -> None:
        ticket.state = TicketState.GRANTED
        ticket.granted_at = now
        self._granted_total += 1
        if ticket.kind is TicketKind.MANAGER:
            self._manager = ticket
        else:
            self._slots[ticket] = None

    def _grant_batch(self, members: list[Ticket[Any]], now: float) -> None:
        """One slot for `members` (already out of the queue); the first leads."""
        leader = members[0]
        self._grant(leader, now)
        leader.leader, leader.members = leader, members
        for member in members[1:]:
            member.state = TicketState.GRANTED
            member.granted_at = now
            member.leader = leader
        self._granted_total += len(members) - 1

    def _candidate_batch(self, head: Ticket[Any]) -> tuple[list[Ticket[Any]], bool]:
        """The batch the queue's head request would lead now, and whether it can still grow (nothing behind it
        in the queue stops it, and it is below max_rows)."""
        rule = self.batching
        assert rule is not None  # the callers check that the model batches
        members, rows = [head], head.rows
        if head.key is None:
            return members, False
        for ticket in itertools.islice(self._in_order(), 1, None):
            if ticket.key != head.key or rows + ticket.rows > rule.max_rows:
                return members, False  # the first that does not fit ends the batch: nothing before it is skipped
            members.append(ticket)
            rows += ticket.rows
        # A queued manager stops the growth: whoever arrives now comes after it.
        return members, rows < rule.max_rows and not self._managers

    def _barrier(self) -> int | None:
        """The arrival number of the oldest queued manager: no request that came after it may go before it."""
        return next(iter(self._managers)).seq if self._managers else None

    def _in_order(self) -> Iterator[Ticket[Any]]:
        """The queued requests that may go before the oldest queued manager (all of them without one), in the
        order they are served: level by level from the first; in a level, those waiting in arrival order, then
        those its DELAY policy moved behind them."""
        barrier = self._barrier()
        for level in self._order:
            queue = self._levels[level]
            for ticket in queue.waiting:
                if barrier is not None and ticket.seq > barrier:
                    break  # (arrival order: the rest came later too)
                yield ticket
            for ticket in queue.delayed:
                if barrier is None or ticket.seq < barrier:
                    yield ticket

    def head(self) -> Ticket[Any] | None:
        """The queued ticket served next: the first request in service order that arrived before the oldest
        queued manager, else that manager; None when nothing is queued."""
        return next(self._in_order(), None) or next(iter(self._managers), None)

    def _batch_due(self, members: list[Ticket[Any]]) -> float:
        """When a forming batch must go: its oldest member's delay, or its earliest deadline if sooner."""
        due = members[0].arrived_at + self.batching.delay  # type: ignore[union-attr]
        for member in members:
            if member.deadline is not None and member.deadline < due:
                due = member.deadline
        return due

    def _batch_ready(self, members: list[Ticket[Any]], can_grow: bool, now: float) -> bool:
        if not self.delays_batches or not can_grow:
            return True
        rows = sum(member.rows for member in members)
        return self.batching.complete(rows) or now >= self._batch_due(members)  # type: ignore[union-attr]

    def wake_at(self, ticket: Ticket[Any]) -> float | None:
        """When `ticket`'s waiter must look again although nobody changed it: the due time of the batch it heads,
        when a batch waits for more members on a free slot. None: only its own deadline matters."""
        if not self.delays_batches or self.head() is not ticket:
            return None
        if ticket.kind is not TicketKind.REQUEST or not self._can_grant(ticket):
            return None
        members, _ = self._candidate_batch(ticket)
        return self._batch_due(members)

    def _refuse(self, ticket: Ticket[Any], refusal: Refusal) -> Ticket[Any]:
        ticket.state = TicketState.REFUSED
        ticket.refusal = refusal
        self._refused_total += 1
        return ticket

    def try_exclusive(self, now: float) -> Ticket[Any] | None:
        """An exclusive lease granted at once if nothing is held or queued, else None; never queues. Used by
        eviction, idle retirement and the shutdown's engine teardown (it works on a closed controller)."""
        if not self.idle:
            return None
        self._seq += 1
        ticket: Ticket[Any] = Ticket(TicketKind.MANAGER, now, None, self._seq, 1, None, None)
        self._grant(ticket, now)
        return ticket

    # ---- departures -----------------------------------------------------------------------------------------

    def release(self, ticket: Ticket[Any], now: float) -> list[Ticket[Any]]:
        """End a granted lease. Returns the tickets granted in consequence (to be notified).

        Raises RuntimeError for a ticket that holds nothing (double or foreign release).
        """
        if ticket.state is not TicketState.GRANTED:
            raise RuntimeError(f"release of {ticket!r}, which holds no lease")
        if ticket.kind is TicketKind.MANAGER:
            if self._manager is not ticket:
                raise RuntimeError(f"release of {ticket!r}, which is not the active manager")
            self._manager = None
        else:
            if ticket not in self._slots:
                raise RuntimeError(f"release of {ticket!r}, a batch member: its leader releases the batch")
            del self._slots[ticket]
            for member in ticket.members or ():
                member.state = TicketState.RELEASED
        ticket.state = TicketState.RELEASED
        return self.dispatch(now)

    def withdraw(self, ticket: Ticket[Any], outcome: TicketState, now: float) -> list[Ticket[Any]]:
        """A queued caller leaves (EXPIRED or CANCELLED): remove it and let the queue move up.

        A ticket that was granted in the meantime is released instead (a granted-but-abandoned slot is passed
        on); a ticket already final is left alone. Returns the tickets granted in consequence.
        """
        if outcome not in (TicketState.EXPIRED, TicketState.CANCELLED):
            raise ValueError(f"withdraw outcome must be EXPIRED or CANCELLED, got {outcome}")
        if ticket.state is TicketState.GRANTED:
            if ticket.is_member:
                ticket.left = True  # its batch still holds the slot; the leader releases it
                return []
            return self.release(ticket, now)
        if ticket.state is not TicketState.QUEUED:
            return []
        self._remove_queued(ticket)
        ticket.state = outcome
        if outcome is TicketState.EXPIRED:
            self._expired_total += 1
        else:
            self._cancelled_total += 1
        # The departed ticket may have been the head that blocked others (a manager waiting to drain).
        return self.dispatch(now)

    def _remove_queued(self, ticket: Ticket[Any]) -> None:
        if ticket.kind is TicketKind.MANAGER:
            del self._managers[ticket]
            return
        queue = self._levels[ticket.level]
        if ticket in queue.waiting:
            del queue.waiting[ticket]
        else:
            del queue.delayed[ticket]
        self._queued_requests -= 1
        if ticket.delay_at is not None:
            self._delaying -= 1
        if not queue:
            del self._levels[ticket.level]
            self._order.remove(ticket.level)

    def _apply_delays(self, now: float) -> None:
        """Move every waiting request whose DELAY time has come behind the requests of its level that are still
        within their time (Triton's timeout_action DELAY), in the order they are found: each level's arrival
        order."""
        if not self._delaying:
            return
        for level in self._order:
            queue = self._levels[level]
            due = [ticket for ticket in queue.waiting if ticket.delay_at is not None and ticket.delay_at <= now]
            for ticket in due:
                del queue.waiting[ticket]
                queue.delayed[ticket] = None
                ticket.delay_at = None
                self._delaying -= 1

    def dispatch(self, now: float) -> list[Ticket[Any]]:
        """Grant from the head of the queue while the head can be granted: a manager, a request, or (batching)
        the batch the head request leads, once it is ready to go. Returns the granted tickets to wake: batch
        members are not among them (their leader wakes them with their results)."""
        if not self._queued_requests and not self._managers:
            return []  # nothing queued, nothing to grant: a release with an empty queue (the common one) stops here
        self._apply_delays(now)
        granted = []
        while (head := self.head()) is not None:
            if not self._can_grant(head):
                break
            if head.kind is TicketKind.MANAGER or self.batching is None:
                self._remove_queued(head)
                self._grant(head, now)
            else:
                members, can_grow = self._candidate_batch(head)
                if not self._batch_ready(members, can_grow, now):
                    break  # it waits for more members; its waiter looks again at wake_at()
                for member in members:
                    self._remove_queued(member)
                self._grant_batch(members, now)
            granted.append(head)
        return granted

    # ---- capacity and shutdown ------------------------------------------------------------------------------

    def set_capacity(self, capacity: int, now: float) -> list[Ticket[Any]]:
        """Change the slot count. Growing grants waiters at once; shrinking lets current holders finish."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        return self.dispatch(now)

    def set_batching(self, batching: BatchRule | None, now: float) -> list[Ticket[Any]]:
        """Change the batching rule (a reconfiguration in place). Returns the tickets granted in consequence."""
        self.batching = batching
        return self.dispatch(now)

    def close(self) -> list[Ticket[Any]]:
        """Refuse every queued ticket and every later arrival (shutdown). Leases already granted stay valid."""
        self._closed = True
        refused = self.queued_tickets()
        self._levels.clear()
        self._order = []
        self._managers.clear()
        self._queued_requests = 0
        self._delaying = 0
        for ticket in refused:
            self._refuse(ticket, Refusal.CLOSED)
        return refused

    # ---- observation ----------------------------------------------------------------------------------------

    def queued_tickets(self) -> list[Ticket[Any]]:
        """Every queued ticket, in the order it would be served: the requests before the oldest manager in
        service order (see `_in_order`), that manager, the requests between it and the next one, and so on."""
        served: list[Ticket[Any]] = []
        after = 0
        for manager in [*self._managers, None]:
            for level in self._order:
                queue = self._levels[level]
                for ticket in itertools.chain(queue.waiting, queue.delayed):
                    if ticket.seq > after and (manager is None or ticket.seq < manager.seq):
                        served.append(ticket)
            if manager is not None:
                served.append(manager)
                after = manager.seq
        return served

    def queued_per_level(self) -> dict[int, int]:
        """Queued requests by level (0: a model without levels), delayed ones included."""
        return {level: len(self._levels[level]) for level in self._order}

    def held_request_tickets(self) -> list[Ticket[Any]]:
        """The tickets holding slots (a batch's leader stands for its batch)."""
        return list(self._slots)

    @property
    def manager(self) -> Ticket[Any] | None:
        return self._manager

    @property
    def idle(self) -> bool:
        """Nothing held and nothing queued."""
        return not self._slots and self._manager is None and not self.queued_count

    def statistics(self) -> AdmissionStatistics:
        queued = self.queued_count
        return AdmissionStatistics(
            capacity=self.capacity,
            active_slots=len(self._slots),
            manager_active=self._manager is not None,
            queued=queued,
            queued_requests=self._queued_requests,
            queued_managers=queued - self._queued_requests,
            closed=self._closed,
            granted_total=self._granted_total,
            expired_total=self._expired_total,
            cancelled_total=self._cancelled_total,
            refused_total=self._refused_total,
            # The minimum over every queued request, not the head's: right whatever order the queue keeps.
            oldest_request_arrival=min(
                (ticket.arrived_at for ticket in self.queued_tickets() if ticket.kind is TicketKind.REQUEST),
                default=None,
            ),
        )


def refusal_error(ticket: Ticket[Any], model: str) -> Exception:
    """The exception a refused ticket's caller raises."""
    if ticket.refusal is Refusal.QUEUE_FULL:
        return QueueFull(f"server_busy: the queue of model '{model}' is full")
    if ticket.refusal is Refusal.LEVEL_FULL:
        return QueueFull(f"server_busy: the queue of priority level {ticket.level} of model '{model}' is full")
    if ticket.refusal is Refusal.OVERDUE:
        return OverdueBlockers(f"server_busy: every busy slot of model '{model}' has run past the admission timeout")
    return ShuttingDown(f"model '{model}' is not admitting work: the server is shutting down")


class AdmissionController:
    """Thread-safe admission for one model. See the module docstring for the rules.

    `lock` is the model's lock (shared with its lifecycle state); the controller never holds it across a wait.
    `clock` is monotonic seconds; deadlines passed in are on the same clock.
    """

    def __init__(
        self,
        model: str,
        capacity: int,
        lock: threading.Lock | None = None,
        clock: Callable[[], float] = time.monotonic,
        batching: BatchRule | None = None,
    ) -> None:
        self.model = model
        self._lock = lock or threading.Lock()  # guards: _core (and the model state that shares it)
        self._core = AdmissionCore(capacity, batching)
        self._clock = clock

    @property
    def core(self) -> AdmissionCore:
        """The state machine. Caller must hold the model lock."""
        return self._core

    def acquire(
        self,
        kind: TicketKind,
        deadline: float | None,
        *,
        overdue_after: float = 0.0,
        max_queue: int = 0,
        cancel: CancelToken | None = None,
        rows: int = 1,
        key: Hashable | None = None,
        payload: Any = None,
        priority: int = 0,
        timeout_us: int = 0,
    ) -> Ticket[Any]:
        """Wait for a lease of `kind`, in FIFO order (by level first on a model with priorities: `priority` and
        `timeout_us` as `AdmissionCore.arrive` takes them), until `deadline` (None: no limit).

        Blocks without holding the model lock. Returns the GRANTED ticket; the caller must `release` it. On a
        batching model (`rows`, `key`, `payload`: see the module docstring) it returns either the GRANTED leader
        of a batch, whose caller runs the batch and releases it, or a RELEASED member whose leader has run it
        and posted the outcome in its payload (a member waits for that without a time limit: the deadline bounds
        queueing only). Raises AdmissionTimeout at the deadline, RequestCancelled when `cancel` (an
        engine.interface.CancelToken) fires while queued or while waiting as a member, QueueFull /
        OverdueBlockers / ShuttingDown when refused. On any of these the caller holds nothing.
        """
        with self._lock:
            now = self._clock()
            ticket = self._core.arrive(
                kind,
                now,
                deadline,
                overdue_after=overdue_after,
                max_queue=max_queue,
                rows=rows,
                key=key,
                payload=payload,
                priority=priority,
                timeout_us=timeout_us,
            )
            if ticket.state is TicketState.QUEUED:
                ticket.waker = threading.Lock()
                ticket.waker.acquire()
                if self._core.delays_batches:  # the arrival may have completed the batch forming at the head
                    self._changed_locked(self._core.dispatch(now))
            # The first wait is measured from the arrival's own reading of the clock, taken under the lock with
            # it: a clock read again later, once the waiter's thread runs, could have moved (a test's fake clock
            # moved right after it saw the ticket queued) and expire a ticket that never waited.
            if ticket.state is TicketState.GRANTED and ticket.leader is None:
                return ticket  # granted at once, alone (is_member's test: no leader): the common case stops here
            due = self._due_locked(ticket)
            first_wait = None if due is None else due - now
        if ticket.state is TicketState.GRANTED and not ticket.is_member:
            return ticket
        if ticket.state is TicketState.REFUSED:
            raise refusal_error(ticket, self.model)
        return self._wait(ticket, cancel, first_wait)

    def arrive_locked(
        self, kind: TicketKind, deadline: float | None, on_change: Callable[[Ticket[Any]], None] | None = None
    ) -> Ticket[Any]:
        """Enqueue without waiting (for callers that wait on several tickets, such as bulk unload).

        Caller holds the model lock. `on_change` is called under the lock when the ticket is granted, expired,
        cancelled or refused later; it must not block. Returns the ticket, possibly already GRANTED.
        """
        ticket = self._core.arrive(kind, self._clock(), deadline)
        ticket.on_change = on_change
        return ticket

    def _wait(self, ticket: Ticket[Any], cancel: CancelToken | None, first_wait: float | None) -> Ticket[Any]:
        on_cancel = None
        if cancel is not None:

            def on_cancel() -> None:
                self.cancel_queued(ticket)

            cancel.add_callback(on_cancel)
        # A wait past a millisecond gives its thread's runner to other calls. On a model with priority levels at
        # once: a high-priority call must reach this queue while low-priority ones wait in it, not queue for a
        # runner behind them (16 low-priority callers keeping their runners a millisecond each held a trickle of
        # high-priority calls ~20 ms in the handler pool's queue, bench/sections/priorities.py). Read without the
        # lock: only how soon the thread steps aside depends on it.
        aside = StepAsideLater(0.0 if self._core.prioritized else STEP_ASIDE_SECONDS)
        timeout: float | None = first_wait
        try:
            while True:
                timeout = aside.bound(timeout)
                if timeout is None:
                    ticket.waker.acquire()  # type: ignore[union-attr]
                elif timeout > 0:
                    # A far deadline is woken early and re-checked: lock waits cap at TIMEOUT_MAX.
                    ticket.waker.acquire(timeout=min(timeout, threading.TIMEOUT_MAX))  # type: ignore[union-attr]
                else:
                    self._on_time(ticket)
                timeout = self._time_left(ticket)  # for the next wait, if there is one
                # Every change of a ticket happens under the lock, so reading the state decides: a grant that won
                # the race against the deadline stands.
                state = ticket.state
                if state is TicketState.QUEUED:
                    continue
                if state is TicketState.GRANTED and ticket.is_member:
                    if ticket.posted:  # its answers stream while the batch holds the slot: it reads them itself
                        return ticket
                    if cancel is not None and cancel.cancelled:
                        raise RequestCancelled(f"the caller gave up while its batch of model '{self.model}' ran")
                    continue  # its leader runs the batch and wakes it with its result
                if state is TicketState.GRANTED:
                    if cancel is not None and cancel.cancelled and len(ticket.members or ()) <= 1:
                        # Cancelled as the slot arrived: pass the slot on rather than start work nobody awaits.
                        # (A batch's leader runs it anyway for its other members.)
                        self.release(ticket)
                        raise RequestCancelled(f"the caller gave up while queued for model '{self.model}'")
                    return ticket
                if state is TicketState.RELEASED and ticket.is_member:
                    return ticket
                raise self._departure_error(ticket)
        except BaseException:
            # Whatever interrupted this thread's wait, never keep a place or a granted slot nobody will use.
            self.abandon(ticket)
            raise
        finally:
            aside.end()
            if on_cancel is not None:
                assert cancel is not None  # on_cancel is set only with a token
                cancel.remove_callback(on_cancel)

    def _time_left(self, ticket: Ticket[Any]) -> float | None:
        """Seconds until the waiter must look again by itself (its deadline, or the due time of the batch it
        heads); None: only a notification wakes it (no deadline, or granted as a batch member). The clock is read
        outside the model lock."""
        if self._core.delays_batches:  # the batch's due time reads the queue
            with self._lock:
                due = self._due_locked(ticket)
        else:
            due = self._due_locked(ticket)  # the ticket's own fields only: no lock
        return None if due is None else due - self._clock()

    def _due_locked(self, ticket: Ticket[Any]) -> float | None:
        """When the waiter must look again by itself (see `_time_left`). Caller holds the model lock when batches
        are delayed."""
        if ticket.state is TicketState.GRANTED:
            return None
        due = ticket.deadline
        if self._core.delays_batches:
            wake = self._core.wake_at(ticket)
            if wake is not None and (due is None or wake < due):
                due = wake
        return due

    def _on_time(self, ticket: Ticket[Any]) -> None:
        """The waiter's time came: a batch it heads goes now, or it expires at its deadline."""
        with self._lock:
            if ticket.state is not TicketState.QUEUED:
                return
            now = self._clock()
            if self._core.delays_batches:
                self._changed_locked(self._core.dispatch(now))
            if ticket.state is TicketState.QUEUED and ticket.deadline is not None and ticket.deadline <= now:
                self._withdraw_locked(ticket, TicketState.EXPIRED)

    def _departure_error(self, ticket: Ticket[Any]) -> Exception:
        if ticket.state is TicketState.EXPIRED:
            return AdmissionTimeout(f"server_busy: model '{self.model}' had no free slot before the admission deadline")
        if ticket.state is TicketState.CANCELLED:
            return RequestCancelled(f"the caller gave up while queued for model '{self.model}'")
        return refusal_error(ticket, self.model)

    def _changed_locked(self, granted: list[Ticket[Any]]) -> None:
        """After a change of the core: wake the tickets it granted, and the head of the queue when a batch may
        be waiting there (a freed slot or a new head changes when it must go)."""
        for waiter in granted:
            waiter.notify()
        if self._core.delays_batches:
            head = self._core.head()
            if head is not None and head.kind is TicketKind.REQUEST:
                head.nudge()

    def release(self, ticket: Ticket[Any]) -> None:
        """End a granted lease and hand the freed capacity to the oldest waiters. For a batch's leader this
        ends every member's lease; their waiters wake (their results must be posted first). Never blocks.
        Raises RuntimeError if the ticket holds no lease, or is a batch member."""
        with self._lock:
            self._changed_locked(self._core.release(ticket, self._clock()))
        # The members are woken after the lock is let go: each wake-up hands the GIL to a thread that had been
        # asleep, and holding the model lock through those hand-offs (up to a switch interval each) would stall
        # every arrival on this model. It is safe outside the lock: once RELEASED a member is nudged by nobody
        # else, so this is its waker's only releaser.
        for member in (ticket.members or ())[1:]:
            member.nudge()

    def _withdraw_locked(self, ticket: Ticket[Any], outcome: TicketState) -> None:
        was_queued = ticket.state is TicketState.QUEUED
        granted = self._core.withdraw(ticket, outcome, self._clock())
        if was_queued:
            ticket.notify()
        self._changed_locked(granted)

    def cancel_queued(self, ticket: Ticket[Any]) -> None:
        """Take `ticket` out of the queue if it is still queued (safe from any thread, e.g. a cancellation
        callback); a batch member waiting for its leader is woken, to leave. A ticket holding a slot is left to
        its owner, who checks its cancel token."""
        with self._lock:
            if ticket.state is TicketState.QUEUED:
                self._withdraw_locked(ticket, TicketState.CANCELLED)
            elif ticket.state is TicketState.GRANTED and ticket.is_member:
                ticket.nudge()

    def post_to_members(self, leader: Ticket[Any]) -> None:
        """The leader of a batch posted every member its outcome while the batch still holds its slot (a streaming
        model's: each member reads its own answers): wake the members, which return from `acquire` at once."""
        with self._lock:
            for member in (leader.members or [])[1:]:
                member.posted = True
                member.nudge()

    def abandon(self, ticket: Ticket[Any]) -> None:
        """The owner gives up its ticket whatever its state: queued leaves, granted is released (a batch member
        is marked as gone; its batch keeps the slot). Idempotent. Only the owning thread may call this (another
        thread could release a slot that is in use)."""
        with self._lock:
            if ticket.state in (TicketState.QUEUED, TicketState.GRANTED):
                self._withdraw_locked(ticket, TicketState.CANCELLED)

    def set_capacity(self, capacity: int) -> None:
        with self._lock:
            self.set_capacity_locked(capacity)

    def set_capacity_locked(self, capacity: int) -> None:
        """As set_capacity; caller holds the model lock."""
        self._changed_locked(self._core.set_capacity(capacity, self._clock()))

    def set_batching_locked(self, batching: BatchRule | None) -> None:
        """Change the batching rule; caller holds the model lock."""
        self._changed_locked(self._core.set_batching(batching, self._clock()))

    def poke(self) -> None:
        """Look at the clock again now: batches that are due go, and every waiter re-checks its deadline. For an
        injected clock that a test moves by hand; a real clock needs no poke."""
        with self._lock:
            self._changed_locked(self._core.dispatch(self._clock()))
            for waiter in self._core.queued_tickets():
                waiter.nudge()

    def close(self) -> None:
        """Refuse every queued and later caller (shutdown). Granted leases stay valid until released."""
        with self._lock:
            for waiter in self._core.close():
                waiter.notify()

    def statistics(self) -> AdmissionStatistics:
        with self._lock:
            return self._core.statistics()

    def queued_per_level(self) -> dict[int, int]:
        """Queued requests by priority level (AdmissionCore.queued_per_level)."""
        with self._lock:
            return self._core.queued_per_level()

    def statistics_locked(self) -> AdmissionStatistics:
        """As statistics; caller holds the model lock."""
        return self._core.statistics()

    def try_exclusive_locked(self) -> Ticket[Any] | None:
        """A manager's lease granted at once if the model is idle and nothing is queued, else None; never
        queues. Caller holds the model lock."""
        return self._core.try_exclusive(self._clock())
