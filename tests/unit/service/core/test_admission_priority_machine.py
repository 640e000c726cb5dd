"""The admission core's batching rule with priorities (service/core/admission.py, "Priorities"), as the batching
state machine of test_admission_batching.py with random levels, per-level queue limits and REJECT timeouts: every
promise of that machine holds with the queue read in service order (`queued_tickets()`: levels from level 1,
managers as barriers), and no request is granted while an older one of its level or a higher one still waits,
nor past a queued manager."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule

from engine.config.specs import PrioritySpec, QueuePolicySpec
from service.core.admission import AdmissionCore, BatchRule, Ticket, TicketKind, TicketState

from .test_admission_batching import BatchingMachine

REQUEST, MANAGER = TicketKind.REQUEST, TicketKind.MANAGER
HELD = (TicketState.GRANTED, TicketState.RELEASED)


class PriorityMachine(BatchingMachine):
    @initialize(
        capacity=st.integers(1, 3),
        max_rows=st.integers(1, 6),
        delay=st.sampled_from([0.0, 2.0]),
        levels=st.integers(1, 3),
        limit=st.integers(0, 3),
        timeout_us=st.sampled_from([0, 1_500_000]),
    )
    def start(self, capacity, max_rows, delay, levels, limit, timeout_us):
        own = QueuePolicySpec(max_queue_size=limit, default_timeout_us=timeout_us, allow_timeout_override=True)
        priorities = PrioritySpec(levels=levels, default_level=levels, policies=((1, own),))
        self.rule = BatchRule(max_rows=max_rows, delay=delay, priorities=priorities)
        self.core = AdmissionCore(capacity, self.rule)
        self.now = 0.0
        self.tickets: list[Ticket] = []
        self.batches: list[list[Ticket]] = []

    @rule(
        kind=st.sampled_from([REQUEST, REQUEST, REQUEST, REQUEST, MANAGER]),
        rows=st.integers(1, 3),
        key=st.sampled_from(["a", "a", "b"]),
        timeout=st.none() | st.floats(0.5, 5.0),
        priority=st.integers(0, 4),
    )
    def arrive(self, kind, rows, key, timeout, priority):
        queue_was_empty = not self.core.queued_tickets()
        deadline = None if timeout is None else self.now + timeout
        ticket = self.core.arrive(
            kind, self.now, deadline, rows=rows, key=key if kind is REQUEST else None, priority=priority
        )
        self.tickets.append(ticket)
        if ticket.state is TicketState.GRANTED:
            self._arrived_granted_alone(ticket, queue_was_empty)
        if self.core.delays_batches:
            self._apply(lambda: self.core.dispatch(self.now))

    @invariant()
    def fifo_holds(self):
        """In priority order: nothing is granted while an older request of its level or a higher one waits, nor
        while an older manager waits; a manager only after every older request."""
        if not hasattr(self, "core"):
            return
        waiting = [t for t in self.tickets if t.state is TicketState.QUEUED]
        for ticket in self.tickets:
            if ticket.state not in HELD:
                continue
            for other in waiting:
                if other.seq > ticket.seq:
                    continue
                assert other.kind is REQUEST, f"{ticket!r} granted past the older manager {other!r}"
                assert ticket.kind is REQUEST, f"{ticket!r} granted before the older {other!r}"
                assert other.level > ticket.level, (
                    f"{ticket!r} granted before the older {other!r} of its level or a higher one"
                )

    @invariant()
    def each_level_stays_within_its_limit(self):
        if not hasattr(self, "core"):
            return
        own = self.rule.priorities.policy_of(1).max_queue_size
        if own:
            assert self.core.queued_per_level().get(1, 0) <= own


TestPriorityMachine = PriorityMachine.TestCase
TestPriorityMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
