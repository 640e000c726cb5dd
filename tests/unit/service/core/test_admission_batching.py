"""The admission core's batching rule (service/core/admission.py), as a hypothesis state machine: requests of a few
shapes and row counts, managers, releases, expiries, cancellations, resizes and a moving clock, with the rule's
promises checked after every step:

* every granted request is in exactly one batch, led by the batch's first (oldest) request;
* a batch never exceeds max_rows, and holds one slot;
* no request is granted before an older one (a batch is a prefix of the queue), and the prefix is the longest
  that fits: it stops only at a request of another shape, at one whose rows would not fit, at a manager, or at
  the end of the queue;
* nothing is granted across a manager, and a manager holds the model alone;
* a batch waiting for members (a delay) goes once it is complete, can no longer grow, or is due; nothing that
  could be granted is left waiting.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from service.core.admission import AdmissionCore, BatchRule, Ticket, TicketKind, TicketState

REQUEST, MANAGER = TicketKind.REQUEST, TicketKind.MANAGER


class BatchingMachine(RuleBasedStateMachine):
    @initialize(
        capacity=st.integers(1, 3),
        max_rows=st.integers(1, 6),
        delay=st.sampled_from([0.0, 2.0]),
        preferred=st.sampled_from([frozenset(), frozenset({2}), frozenset({2, 4})]),
    )
    def start(self, capacity, max_rows, delay, preferred):
        self.rule = BatchRule(
            max_rows=max_rows, delay=delay, preferred=frozenset(p for p in preferred if p <= max_rows)
        )
        self.core = AdmissionCore(capacity, self.rule)
        self.now = 0.0
        self.tickets: list[Ticket] = []
        self.batches: list[list[Ticket]] = []

    # ---- bookkeeping ------------------------------------------------------------------------------------------

    def _apply(self, change):
        """Run one core operation; check every batch it granted against the queue as it was before."""
        queue_before = list(self.core.queued_tickets())
        granted = change()
        # The queue as the grants saw it: without the ticket the operation itself took out (withdrawn).
        queue_before = [t for t in queue_before if t.state in (TicketState.QUEUED, TicketState.GRANTED)]
        for leader in granted:
            if leader.kind is MANAGER:
                assert not queue_before or queue_before[0] is leader
                queue_before = queue_before[1:]
                continue
            members = leader.members
            assert members[0] is leader and all(m.leader is leader for m in members)
            assert queue_before[: len(members)] == members, "a batch is not the head of the queue"
            self._check_longest_prefix(members, queue_before[len(members) :])
            queue_before = queue_before[len(members) :]
            self.batches.append(members)
        return granted

    def _check_longest_prefix(self, members: list[Ticket], rest: list[Ticket]) -> None:
        rows = sum(m.rows for m in members)
        assert rows <= self.rule.max_rows or len(members) == 1
        if not rest or rows >= self.rule.max_rows:
            return
        following = rest[0]
        stopped = (
            following.kind is MANAGER or following.key != members[0].key or rows + following.rows > self.rule.max_rows
        )
        assert stopped, f"batch {members} stopped before {following!r}, which fitted"

    def _arrived_granted_alone(self, ticket: Ticket, queue_was_empty: bool) -> None:
        assert queue_was_empty, "a newcomer barged past queued callers"
        if ticket.kind is REQUEST:
            assert ticket.members == [ticket]
            self.batches.append([ticket])

    # ---- rules -----------------------------------------------------------------------------------------------

    @rule(
        kind=st.sampled_from([REQUEST, REQUEST, REQUEST, REQUEST, MANAGER]),
        rows=st.integers(1, 3),
        key=st.sampled_from(["a", "a", "b"]),
        timeout=st.none() | st.floats(0.5, 5.0),
    )
    def arrive(self, kind, rows, key, timeout):
        queue_was_empty = not self.core.queued_tickets()
        deadline = None if timeout is None else self.now + timeout
        ticket = self.core.arrive(kind, self.now, deadline, rows=rows, key=key if kind is REQUEST else None)
        self.tickets.append(ticket)
        if ticket.state is TicketState.GRANTED:
            self._arrived_granted_alone(ticket, queue_was_empty)
        if self.core.delays_batches:
            self._apply(lambda: self.core.dispatch(self.now))

    @precondition(
        lambda self: any(t.state is TicketState.GRANTED and (t.kind is MANAGER or t.leader is t) for t in self.tickets)
    )
    @rule(data=st.data())
    def release(self, data):
        holders = [t for t in self.tickets if t.state is TicketState.GRANTED and (t.kind is MANAGER or t.leader is t)]
        ticket = data.draw(st.sampled_from(holders))
        self._apply(lambda: self.core.release(ticket, self.now))
        assert ticket.state is TicketState.RELEASED
        assert all(member.state is TicketState.RELEASED for member in ticket.members or ())

    @rule(step=st.floats(0.1, 3.0))
    def advance_time(self, step):
        self.now += step
        self._apply(lambda: self.core.dispatch(self.now))  # batches that are due go
        for ticket in list(self.core.queued_tickets()):
            if ticket.deadline is not None and ticket.deadline <= self.now and ticket.state is TicketState.QUEUED:
                self._apply(lambda t=ticket: self.core.withdraw(t, TicketState.EXPIRED, self.now))

    @precondition(lambda self: any(t.state is TicketState.QUEUED for t in self.tickets))
    @rule(data=st.data())
    def cancel_waiter(self, data):
        queued = [t for t in self.tickets if t.state is TicketState.QUEUED]
        ticket = data.draw(st.sampled_from(queued))
        self._apply(lambda: self.core.withdraw(ticket, TicketState.CANCELLED, self.now))
        assert ticket.state is TicketState.CANCELLED

    @precondition(lambda self: any(t.state is TicketState.GRANTED and t.is_member for t in self.tickets))
    @rule(data=st.data())
    def member_gives_up(self, data):
        members = [t for t in self.tickets if t.state is TicketState.GRANTED and t.is_member]
        ticket = data.draw(st.sampled_from(members))
        assert self.core.withdraw(ticket, TicketState.CANCELLED, self.now) == []
        assert ticket.left and ticket.state is TicketState.GRANTED  # its batch keeps the slot

    @rule(capacity=st.integers(1, 3))
    def resize(self, capacity):
        self._apply(lambda: self.core.set_capacity(capacity, self.now))

    # ---- invariants ------------------------------------------------------------------------------------------

    @invariant()
    def every_granted_request_is_in_exactly_one_batch(self):
        if not hasattr(self, "core"):
            return
        seen: dict[int, int] = {}
        for batch in self.batches:
            for member in batch:
                seen[member.seq] = seen.get(member.seq, 0) + 1
        granted = [
            t for t in self.tickets if t.kind is REQUEST and t.state in (TicketState.GRANTED, TicketState.RELEASED)
        ]
        assert sorted(seen) == sorted(t.seq for t in granted)
        assert set(seen.values()) <= {1}

    @invariant()
    def batches_fit_and_hold_one_slot_each(self):
        if not hasattr(self, "core"):
            return
        for batch in self.batches:
            assert len(batch) == 1 or sum(m.rows for m in batch) <= self.rule.max_rows
            assert len({m.key for m in batch}) == 1 and all(m.kind is REQUEST for m in batch)
        running = [b for b in self.batches if b[0].state is TicketState.GRANTED]
        stats = self.core.statistics()
        assert stats.active_slots == len(running)
        managers = [t for t in self.tickets if t.kind is MANAGER and t.state is TicketState.GRANTED]
        assert len(managers) <= 1 and not (managers and running)

    @invariant()
    def fifo_holds(self):
        if not hasattr(self, "core"):
            return
        for ticket in self.tickets:
            if ticket.state in (TicketState.GRANTED, TicketState.RELEASED):
                assert not any(o.state is TicketState.QUEUED and o.seq < ticket.seq for o in self.tickets), (
                    f"{ticket!r} granted before an older waiter"
                )

    @invariant()
    def nothing_grantable_is_left_waiting(self):
        if hasattr(self, "core"):
            assert self._apply(lambda: self.core.dispatch(self.now)) == [], "a batch could go but did not"

    def teardown(self):
        if not hasattr(self, "core"):
            return
        for _ in range(len(self.tickets) + 1):
            self.now += 10.0  # every delay is over
            for ticket in [
                t for t in self.tickets if t.state is TicketState.GRANTED and (t.kind is MANAGER or t.leader is t)
            ]:
                self._apply(lambda t=ticket: self.core.release(t, self.now))
            self._apply(lambda: self.core.dispatch(self.now))
            for ticket in [t for t in self.tickets if t.state is TicketState.QUEUED][:1]:
                self._apply(lambda t=ticket: self.core.withdraw(t, TicketState.CANCELLED, self.now))
        assert all(t.state not in (TicketState.QUEUED, TicketState.GRANTED) for t in self.tickets)
        assert self.core.idle


TestBatchingMachine = BatchingMachine.TestCase
TestBatchingMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
