"""The parts of the autoscaling signals that need no server (issue 37): the admission core's oldest queued request
(AdmissionStatistics.oldest_request_arrival, read at scrape time as slotserve_model_oldest_wait_seconds) and the
refusal reasons (slotserve_model_refusals_total). tests/integration/observability/test_autoscaling_signals.py
watches them move on a real server."""

from __future__ import annotations

from collections import Counter

from service.core.admission import AdmissionCore, AdmissionStatistics, BatchRule, TicketKind, TicketState
from service.process.metrics import REFUSAL_REASONS, TRITON_REASON_OF, _oldest_wait, _refusals

REQUEST, MANAGER = TicketKind.REQUEST, TicketKind.MANAGER


def test_the_oldest_arrival_is_the_earliest_queued_request_and_none_without_one():
    core = AdmissionCore(1)
    assert core.statistics().oldest_request_arrival is None
    holder = core.arrive(REQUEST, 1.0, None)
    assert core.statistics().oldest_request_arrival is None  # it holds a slot: it waits for nothing
    manager = core.arrive(MANAGER, 2.0, None)  # an unload waiting for the slot: no request
    first = core.arrive(REQUEST, 3.0, None)
    second = core.arrive(REQUEST, 4.0, None)
    assert [manager.state, first.state, second.state] == [TicketState.QUEUED] * 3
    assert core.statistics().oldest_request_arrival == 3.0

    core.withdraw(first, TicketState.CANCELLED, 5.0)  # the oldest leaves: the next one is the oldest
    assert core.statistics().oldest_request_arrival == 4.0
    core.release(holder, 6.0)  # the manager is granted; the request still waits
    assert core.statistics().oldest_request_arrival == 4.0
    core.release(manager, 7.0)
    assert second.state is TicketState.GRANTED
    assert core.statistics().oldest_request_arrival is None


def test_a_batch_granted_from_the_queue_takes_its_members_arrivals_with_it():
    core = AdmissionCore(1, BatchRule(max_rows=2))
    holder = core.arrive(REQUEST, 0.0, None, key="k")
    queued = [core.arrive(REQUEST, float(t), None, key="k") for t in (1, 2, 3)]
    assert core.statistics().oldest_request_arrival == 1.0
    core.release(holder, 4.0)  # the first two go together as one batch
    assert [t.state for t in queued] == [TicketState.GRANTED, TicketState.GRANTED, TicketState.QUEUED]
    assert core.statistics().oldest_request_arrival == 3.0


def test_a_closed_queue_has_no_oldest_request():
    core = AdmissionCore(1)
    core.arrive(REQUEST, 0.0, None)
    core.arrive(REQUEST, 1.0, None)
    core.close()
    assert core.statistics().oldest_request_arrival is None


def _admission(oldest: float | None) -> AdmissionStatistics:
    return AdmissionStatistics(
        capacity=1,
        active_slots=1,
        manager_active=False,
        queued=0 if oldest is None else 1,
        queued_requests=0 if oldest is None else 1,
        queued_managers=0,
        closed=False,
        granted_total=0,
        expired_total=0,
        cancelled_total=0,
        refused_total=0,
        oldest_request_arrival=oldest,
    )


def test_the_oldest_wait_is_its_age_now_the_longest_over_versions_and_zero_without_a_waiter():
    family = _oldest_wait(
        [("a", _admission(10.0)), ("a", _admission(7.5)), ("b", _admission(None)), ("c", _admission(12.0))], 12.0
    )
    assert family.type == "gauge" and family.documentation
    assert {s.labels["model"]: s.value for s in family.samples} == {"a": 4.5, "b": 0.0, "c": 0.0}


def test_refusals_are_the_reasons_triton_calls_rejected_each_from_zero_and_nothing_else():
    assert set(REFUSAL_REASONS) == {reason for reason, kind in TRITON_REASON_OF.items() if kind == "REJECTED"}
    assert {"server_busy", "residency_limit", "memory_limit", "shutting_down"} <= set(REFUSAL_REASONS)

    class Snapshot:  # _refusals reads only `failures`
        def __init__(self, failures: Counter) -> None:
            self.failures = dict(failures)

    observed = [
        ("a", None, Snapshot(Counter({"server_busy": 2, "invalid_request_error": 5, "memory_limit": 1}))),
        ("a", None, Snapshot(Counter({"server_busy": 1}))),  # a second version of a: summed
        ("b", None, Snapshot(Counter())),
    ]
    family = _refusals(observed)  # type: ignore[arg-type]
    assert family.type == "counter" and family.documentation
    counts = {(s.labels["model"], s.labels["reason"]): s.value for s in family.samples if s.name.endswith("_total")}
    expected = {(model, reason): 0 for model in "ab" for reason in REFUSAL_REASONS}
    expected[("a", "server_busy")] = 3
    expected[("a", "memory_limit")] = 1
    assert counts == expected  # invalid_request_error is the request's fault, not a want of capacity
