"""The admission core's priority rules (service/core/admission.py, "Priorities"), without threads or a clock:
levels served from level 1, FIFO within a level, batches taken in that order, per-level queue limits and
timeouts, timeout_action DELAY, managers as barriers across levels, and the starvation of a low level under a
constant load of a higher one (as Triton: a documented choice, docs/lifecycle.md)."""

from __future__ import annotations

import pytest

from engine.config.specs import PrioritySpec, QueuePolicySpec
from service.core.admission import AdmissionCore, BatchRule, Refusal, Ticket, TicketKind, TicketState

REQUEST, MANAGER = TicketKind.REQUEST, TicketKind.MANAGER
NO_POLICY = QueuePolicySpec()


def _core(levels=3, default=2, policies=(), default_policy=NO_POLICY, max_rows=1, capacity=1) -> AdmissionCore:
    spec = PrioritySpec(levels=levels, default_level=default, default_policy=default_policy, policies=policies)
    return AdmissionCore(capacity, BatchRule(max_rows=max_rows, priorities=spec))


def _request(core: AdmissionCore, priority: int, now: float = 0.0, rows: int = 1, key="k", **kwargs) -> Ticket:
    return core.arrive(REQUEST, now, kwargs.pop("deadline", None), priority=priority, rows=rows, key=key, **kwargs)


def _serve_all(core: AdmissionCore, holder: Ticket, now: float = 1.0) -> list[Ticket]:
    """Release the running batch again and again until the queue is empty or a manager is granted (left holding
    the model); the requests' leaders granted, in order."""
    order: list[Ticket] = []
    while True:
        granted = core.release(holder, now)
        if not granted or granted[0].kind is MANAGER:
            return order
        (holder,) = granted
        order.append(holder)


def test_levels_are_served_from_level_1_and_fifo_within_a_level():
    core = _core()
    busy = _request(core, 1)
    assert busy.state is TicketState.GRANTED
    low_a, high_a, mid_a, high_b, low_b, mid_b = (_request(core, p) for p in (3, 1, 2, 1, 3, 2))
    assert core.queued_tickets() == [high_a, high_b, mid_a, mid_b, low_a, low_b]
    assert _serve_all(core, busy) == [high_a, high_b, mid_a, mid_b, low_a, low_b]


@pytest.mark.parametrize("priority", [0, 4, 10**18])
def test_priority_0_or_above_the_levels_takes_the_default_level(priority):
    core = _core(levels=3, default=2)
    busy = _request(core, 1)
    first_default = _request(core, 2)
    odd = _request(core, priority)
    low = _request(core, 3)
    high = _request(core, 1)
    assert odd.level == 2
    assert _serve_all(core, busy) == [high, first_default, odd, low]


def test_a_model_without_priorities_ignores_the_parameter():
    core = AdmissionCore(1, BatchRule(max_rows=1))
    busy = core.arrive(REQUEST, 0.0, None, key="k", priority=3)
    tickets = [core.arrive(REQUEST, 0.0, None, key="k", priority=p) for p in (3, 1, 2)]
    assert _serve_all(core, busy) == tickets


def test_a_batch_takes_compatible_requests_in_priority_order():
    # Triton's test_priority_levels: two default-level requests (2 rows, 1 row), then one of level 1 (2 rows): the
    # batch is the level-1 request with the first default one (4 rows), the 1-row request goes next.
    core = _core(levels=2, default=2, max_rows=4)
    busy = _request(core, 1)
    two = _request(core, 0, rows=2)
    one = _request(core, 0, rows=1)
    urgent = _request(core, 1, rows=2)
    (leader,) = core.release(busy, 1.0)
    assert leader is urgent and leader.members == [urgent, two]
    assert core.queued_tickets() == [one]


def test_a_batch_stops_at_the_first_request_in_priority_order_that_does_not_fit():
    core = _core(levels=2, default=2, max_rows=8)
    busy = _request(core, 1)
    low_same = _request(core, 2, key="a")
    high_other = _request(core, 1, key="b")
    high_same = _request(core, 1, key="a")
    (leader,) = core.release(busy, 1.0)
    # high_other heads level 1; it stacks with nothing, and nothing behind it is taken in its place.
    assert leader is high_other and leader.members == [high_other]
    (leader,) = core.release(high_other, 1.0)
    assert leader.members == [high_same, low_same]


def test_each_level_has_its_own_queue_limit():
    core = _core(levels=2, default=2, policies=((1, QueuePolicySpec(max_queue_size=1)),))
    busy = _request(core, 1)
    first = _request(core, 1)
    refused = _request(core, 1)
    assert first.state is TicketState.QUEUED
    assert refused.state is TicketState.REFUSED and refused.refusal is Refusal.LEVEL_FULL
    # The other level has no limit of its own (the default policy's 0).
    assert all(_request(core, 2).state is TicketState.QUEUED for _ in range(5))
    assert core.queued_per_level() == {1: 1, 2: 5}
    # A freed place of level 1 takes the next one.
    core.release(busy, 1.0)
    assert _request(core, 1).state is TicketState.QUEUED


def test_the_default_policy_limits_every_level_without_its_own():
    core = _core(levels=3, default=2, default_policy=QueuePolicySpec(max_queue_size=2))
    busy = _request(core, 1)
    for level in (1, 2, 3):
        assert [_request(core, level).state for _ in range(3)] == [
            TicketState.QUEUED,
            TicketState.QUEUED,
            TicketState.REFUSED,
        ]
    assert busy.state is TicketState.GRANTED


def test_a_reject_level_timeout_becomes_the_deadline_and_the_request_timeout_only_shortens_it():
    policies = (
        (1, QueuePolicySpec(default_timeout_us=2_000_000, allow_timeout_override=True)),
        (2, QueuePolicySpec(default_timeout_us=2_000_000, allow_timeout_override=False)),
    )
    core = _core(levels=3, default=3, policies=policies)
    _request(core, 1, now=10.0)
    assert _request(core, 1, now=10.0).deadline == pytest.approx(12.0)
    assert _request(core, 1, now=10.0, timeout_us=500_000).deadline == pytest.approx(10.5)
    assert _request(core, 1, now=10.0, timeout_us=5_000_000).deadline == pytest.approx(12.0)  # never lengthened
    assert _request(core, 2, now=10.0, timeout_us=500_000).deadline == pytest.approx(12.0)  # not allowed
    assert _request(core, 1, now=10.0, deadline=11.0).deadline == pytest.approx(11.0)  # the caller's is earlier
    # Level 3 has the default policy: no timeout, the caller's deadline alone.
    assert _request(core, 3, now=10.0).deadline is None


def test_delay_moves_a_timed_out_request_behind_its_level_but_ahead_of_lower_levels():
    # Triton's test_priority_with_policy, as a state machine: level 1 delays, level 2 rejects.
    delay = QueuePolicySpec(default_timeout_us=1_000_000, allow_timeout_override=True, delay=True)
    core = _core(levels=2, default=2, default_policy=delay)
    busy = _request(core, 1)
    early = _request(core, 1, now=0.0, timeout_us=100_000)  # moved at 0.1
    patient = _request(core, 1, now=0.0)  # moved at 1.0
    later = _request(core, 1, now=0.5)  # moved at 1.5
    low = _request(core, 2, now=0.5)
    assert early.deadline is None and early.delay_at == pytest.approx(0.1)
    (granted,) = core.release(busy, 0.6)  # only `early` is past its time: behind patient and later
    assert granted is patient
    assert core.queued_tickets() == [later, early, low]
    (granted,) = core.release(patient, 2.0)  # later's time passed too: it follows early, still ahead of level 2
    assert granted is early
    assert core.queued_tickets() == [later, low]
    assert _serve_all(core, early, now=2.0) == [later, low]


def test_a_delayed_request_is_never_refused_for_its_timeout_and_leaves_when_withdrawn():
    delay = QueuePolicySpec(default_timeout_us=1_000, delay=True)
    core = _core(levels=1, default=1, default_policy=delay)
    busy = _request(core, 1)
    delayed = _request(core, 1, now=0.0)
    waiting = _request(core, 1, now=5.0)
    assert core.dispatch(10.0) == []  # the slot is busy: nothing granted, but `delayed` moved
    assert core.queued_tickets() == [delayed, waiting]  # both past their time now: moved in arrival order
    assert delayed.state is TicketState.QUEUED
    core.withdraw(delayed, TicketState.CANCELLED, 10.0)
    assert core.queued_tickets() == [waiting] and core.queued_per_level() == {1: 1}
    assert core.release(busy, 10.0) == [waiting]
    assert core.idle is False and core.queued_count == 0


def test_delay_without_levels_is_one_level():
    delay = QueuePolicySpec(default_timeout_us=1_000_000, delay=True)
    core = _core(levels=0, default=0, default_policy=delay)
    busy = _request(core, 7)
    first = _request(core, 0, now=0.0)
    second = _request(core, 5, now=1.5)
    assert first.level == second.level == 0
    assert core.release(busy, 2.0) == [second]  # first timed out (at 1.0): behind second, which has not
    assert core.queued_tickets() == [first]


def test_delayed_requests_count_against_their_level_queue_limit():
    delay = QueuePolicySpec(default_timeout_us=1_000, delay=True, max_queue_size=1)
    core = _core(levels=1, default=1, default_policy=delay)
    _request(core, 1)
    _request(core, 1, now=0.0)
    core.dispatch(5.0)  # moved to the delayed part
    assert _request(core, 1, now=5.0).refusal is Refusal.LEVEL_FULL


def test_a_queued_manager_waits_for_older_requests_of_every_level_and_stops_newer_ones_of_any_level():
    core = _core(levels=3, default=2)
    busy = _request(core, 1)
    old_low = _request(core, 3)
    old_mid = _request(core, 2)
    manager = core.arrive(MANAGER, 0.0, None)
    new_high = _request(core, 1)
    old_is_not_passed = _request(core, 3)
    # Before the manager, the older requests in level order; then the manager; then what came after it.
    assert core.queued_tickets() == [old_mid, old_low, manager, new_high, old_is_not_passed]
    assert core.head() is old_mid
    assert _serve_all(core, busy) == [old_mid, old_low]
    assert manager.state is TicketState.GRANTED
    assert new_high.state is TicketState.QUEUED  # the manager holds the model
    assert core.release(manager, 2.0) == [new_high]


def test_a_higher_level_that_arrived_before_the_manager_still_goes_first_among_those_before_it():
    core = _core(levels=2, default=2, capacity=1)
    busy = _request(core, 1)
    low = _request(core, 2)
    high = _request(core, 1)
    manager = core.arrive(MANAGER, 0.0, None)
    late_high = _request(core, 1)
    assert _serve_all(core, busy) == [high, low]
    assert manager.state is TicketState.GRANTED and late_high.state is TicketState.QUEUED


def test_a_batch_never_takes_a_request_that_came_after_a_queued_manager():
    core = _core(levels=2, default=2, max_rows=8)
    busy = _request(core, 1)
    low = _request(core, 2)
    manager = core.arrive(MANAGER, 0.0, None)
    high = _request(core, 1)
    (leader,) = core.release(busy, 1.0)
    assert leader.members == [low]
    assert manager.state is TicketState.QUEUED and high.state is TicketState.QUEUED


def test_a_delayed_request_older_than_a_manager_still_goes_before_it():
    delay = QueuePolicySpec(default_timeout_us=1_000, delay=True)
    core = _core(levels=1, default=1, default_policy=delay)
    busy = _request(core, 1)
    delayed = _request(core, 1, now=0.0)
    manager = core.arrive(MANAGER, 1.0, None)
    after = _request(core, 1, now=1.0)
    assert core.release(busy, 5.0) == [delayed]
    assert core.queued_tickets() == [manager, after]


def test_a_low_level_starves_under_a_constant_load_of_a_higher_one():
    # The documented choice (as Triton): strict priority. A low request waits as long as higher ones keep coming;
    # its level's timeout (or the caller's deadline) is what bounds its wait.
    core = _core(levels=2, default=2)
    holder = _request(core, 1)
    low = _request(core, 2)
    for step in range(200):
        _request(core, 1, now=float(step))
        (holder,) = core.release(holder, float(step))
        assert holder.level == 1
    assert low.state is TicketState.QUEUED


def test_close_refuses_every_level_and_the_managers():
    delay = QueuePolicySpec(default_timeout_us=1_000, delay=True)
    core = _core(levels=2, default=2, default_policy=delay)
    busy = _request(core, 1)
    queued = [_request(core, 2), core.arrive(MANAGER, 0.0, None), _request(core, 1)]
    core.dispatch(5.0)
    refused = core.close()
    assert set(refused) == set(queued) and all(t.refusal is Refusal.CLOSED for t in queued)
    assert core.queued_count == 0 and core.queued_per_level() == {}
    assert core.release(busy, 6.0) == [] and core.idle


def test_statistics_count_every_level():
    core = _core(levels=3, default=2)
    _request(core, 1)
    for priority in (1, 2, 3, 3):
        _request(core, priority)
    core.arrive(MANAGER, 0.0, None)
    stats = core.statistics()
    assert (stats.queued, stats.queued_requests, stats.queued_managers) == (5, 4, 1)
    assert core.queued_per_level() == {1: 1, 2: 1, 3: 2}


def test_the_smallest_timeouts_count_and_an_override_applies_where_the_level_has_no_timeout():
    policies = (
        (1, QueuePolicySpec(default_timeout_us=1)),  # one microsecond is a timeout, not "none"
        (2, QueuePolicySpec(allow_timeout_override=True)),  # no timeout of its own: the request's own applies
    )
    core = _core(levels=2, default=2, policies=policies)
    _request(core, 1, now=10.0)
    assert _request(core, 1, now=10.0).deadline == pytest.approx(10.000001)
    assert _request(core, 2, now=10.0, timeout_us=1).deadline == pytest.approx(10.000001)
    assert _request(core, 2, now=10.0, timeout_us=5_000_000).deadline == pytest.approx(15.0)
    assert _request(core, 2, now=10.0).deadline is None


def test_a_forming_batch_goes_at_once_when_a_manager_queues_behind_it():
    # Nobody can join it any more (whoever comes now is behind the manager): waiting out its delay would only delay
    # the manager.
    spec = PrioritySpec(levels=2, default_level=2)
    core = AdmissionCore(1, BatchRule(max_rows=4, delay=10.0, priorities=spec))
    forming = _request(core, 1, now=0.0)
    assert forming.state is TicketState.QUEUED  # a free slot waits up to the delay for more members
    manager = core.arrive(MANAGER, 1.0, None)
    assert core.dispatch(1.0) == [forming]
    assert forming.members == [forming] and manager.state is TicketState.QUEUED


OWN_DELAY = QueuePolicySpec(allow_timeout_override=True, delay=True)  # DELAY only for requests with a `timeout`


@pytest.mark.parametrize("leaves", ["a request without a time", "another one with a time"])
def test_a_request_leaving_the_queue_does_not_stop_the_others_delay(leaves):
    core = _core(levels=1, default=1, default_policy=OWN_DELAY)
    busy = _request(core, 1)
    timed = _request(core, 1, now=0.0, timeout_us=1_000_000)  # its time comes at 1.0
    if leaves == "another one with a time":
        gone = _request(core, 1, now=0.0, timeout_us=1_000_000)
    patient = _request(core, 1, now=0.0)
    if leaves == "a request without a time":
        gone = _request(core, 1, now=0.0)
    core.withdraw(gone, TicketState.CANCELLED, 0.5)
    assert core.release(busy, 5.0) == [patient]
    assert core.queued_tickets() == [timed]


def test_a_delay_comes_at_its_time_exactly_and_each_one_in_turn():
    core = _core(levels=1, default=1, default_policy=OWN_DELAY)
    busy = _request(core, 1)
    first = _request(core, 1, now=0.0, timeout_us=1_000_000)  # 1.0
    second = _request(core, 1, now=0.0, timeout_us=3_000_000)  # 3.0
    patient = _request(core, 1, now=0.0)
    assert core.dispatch(1.0) == []  # the slot is busy; `first` moves (its time is now)
    assert core.queued_tickets() == [second, patient, first]
    assert core.release(busy, 4.0) == [patient]  # `second` moved too, behind `first`
    assert core.queued_tickets() == [first, second]


def test_the_servers_queue_limit_still_bounds_the_whole_queue_of_a_model_with_levels():
    core = _core(levels=2, default=2)
    _request(core, 1)
    assert [_request(core, p, max_queue=2).state for p in (2, 1)] == [TicketState.QUEUED, TicketState.QUEUED]
    refused = _request(core, 1, max_queue=2)
    assert refused.refusal is Refusal.QUEUE_FULL


@pytest.mark.parametrize("levels", [None, 3])
def test_a_queued_request_of_a_model_with_levels_gives_its_runner_back_at_once(monkeypatch, levels):
    """A waiter in a prioritized queue steps aside from its handler runner at once (not after STEP_ASIDE_SECONDS):
    otherwise low-priority callers keep the runners and a high-priority call queues behind them in the handler pool,
    reaching this queue after them (bench/sections/priorities.py measured ~20 ms)."""
    import threading
    import time

    from service.core import admission
    from service.core.blocking import STEP_ASIDE_SECONDS

    steps: list[float] = []

    class Recording(admission.StepAsideLater):
        def __init__(self, after: float = STEP_ASIDE_SECONDS) -> None:
            steps.append(after)
            super().__init__(after)

    monkeypatch.setattr(admission, "StepAsideLater", Recording)
    spec = None if levels is None else PrioritySpec(levels=levels, default_level=2, default_policy=NO_POLICY)
    controller = admission.AdmissionController("m", 1, batching=BatchRule(max_rows=1, priorities=spec))
    holder = controller.acquire(REQUEST, None, key="k")
    granted: list[Ticket] = []
    waiter = threading.Thread(target=lambda: granted.append(controller.acquire(REQUEST, None, key="k", priority=1)))
    waiter.start()
    deadline = time.monotonic() + 30
    while controller.statistics().queued_requests == 0 and time.monotonic() < deadline:
        time.sleep(0.001)  # ordering-free: polls the waiter's arrival in the queue until a deadline
    controller.release(holder)
    waiter.join(timeout=30)
    assert granted and granted[0].state is TicketState.GRANTED
    controller.release(granted[0])
    assert steps == [0.0 if levels else STEP_ASIDE_SECONDS]
