"""service/core/service_rate.py: the service rate over its window, the predicted wait, the retry hint and the
arrival check of --refuse-predicted-wait, on a fake clock and fake statistics (no threads, no server)."""

from __future__ import annotations

import pytest

from service.core import service_rate
from service.core.admission import AdmissionController, TicketKind
from service.core.errors import NO_RETRY, AdmissionTimeout, QueueFull, ResidencyLimit, WaitExceedsDeadline
from service.core.outcomes import add_retry_hint
from service.core.service_rate import Progress, ServiceRate, predict_wait, retry_after, wait_seconds
from service.core.statistics import InferenceStatistics


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Totals:
    """What the estimator reads: set by the test."""

    def __init__(self) -> None:
        self.progress = Progress(0, 0)
        self.reads = 0

    def __call__(self) -> Progress:
        self.reads += 1
        return self.progress


def test_the_rate_is_completions_per_busy_second_and_unknown_before_any():
    clock, totals = Clock(), Totals()
    rate = ServiceRate(totals, clock, window=10.0, refresh=0.1)
    assert rate.per_slot() is None
    totals.progress = Progress(completed=4, busy_ns=2_000_000_000)  # 4 requests in 2 busy seconds
    clock.now += 1
    assert rate.per_slot() == pytest.approx(2.0)


def test_the_rate_counts_only_the_window_and_keeps_the_last_one_when_nothing_ran():
    clock, totals = Clock(), Totals()
    rate = ServiceRate(totals, clock, window=10.0, refresh=0.1)
    totals.progress = Progress(10, 10_000_000_000)  # 1/s for the first ten seconds
    assert rate.per_slot() == pytest.approx(1.0)
    clock.now += 11  # the window has passed: the next samples are measured from this one
    assert rate.per_slot() == pytest.approx(1.0)
    totals.progress = Progress(30, 12_000_000_000)  # then 20 requests in 2 busy seconds: 10/s
    clock.now += 5
    assert rate.per_slot() == pytest.approx(10.0)
    clock.now += 20  # nothing ran since: the last rate measured stays
    assert rate.per_slot() == pytest.approx(10.0)


def test_samples_are_taken_at_most_every_refresh_interval_once_a_rate_is_known():
    clock, totals = Clock(), Totals()
    rate = ServiceRate(totals, clock, window=10.0, refresh=0.1)
    assert rate.per_slot() is None
    totals.progress = Progress(2, 1_000_000_000)  # the first completions, within the interval: seen at once
    assert rate.per_slot() == pytest.approx(2.0)
    totals.progress = Progress(4, 1_500_000_000)
    assert rate.per_slot() == pytest.approx(2.0)  # within the interval: the rate measured last
    assert totals.reads == 2
    clock.now += 0.2
    assert rate.per_slot() == pytest.approx(4 / 1.5)  # the window still starts at the first sample
    assert totals.reads == 3


@pytest.mark.parametrize(
    ("ahead", "busy", "slots", "rate", "expected"),
    [
        (0, 0, 2, None, 0.0),  # a free slot and nobody queued: at once, rate or not
        (0, 1, 2, 5.0, 0.0),
        (0, 2, 2, None, None),  # must wait, and nothing measured yet
        (0, 2, 2, 5.0, 0.1),  # the next of 2 slots x 5/s
        (3, 2, 2, 5.0, 0.4),  # 4 completions at 10/s
        (3, 1, 1, 0.5, 8.0),
    ],
)
def test_the_predicted_wait(ahead, busy, slots, rate, expected):
    assert wait_seconds(ahead, busy, slots, rate) == expected


class Model:
    """A RatedModel: a real admission controller and real statistics, its estimator on the test's clock."""

    def __init__(self, slots: int = 1) -> None:
        self.name = "m"
        self.statistics = InferenceStatistics()
        self.admission = AdmissionController("m", slots)

    def ran(self, count: int, seconds_each: float) -> None:
        for _ in range(count):
            ns = round(seconds_each * 1e9)
            self.statistics.record_success(queue_ns=0, input_ns=0, infer_ns=ns, output_ns=0, total_ns=ns, batch_size=1)


def queue(model: Model, count: int) -> None:
    """Hold the slot and queue `count` requests (queued tickets need no thread: the core keeps them)."""
    with model.admission._lock:
        for _ in range(count + 1):
            model.admission.core.arrive(TicketKind.REQUEST, 0.0, None)


def test_a_prediction_reads_the_models_queue_and_statistics():
    model = Model(slots=1)
    model.ran(4, seconds_each=0.5)  # 2 requests per busy second
    queue(model, 3)
    prediction = predict_wait(model)
    assert (prediction.ahead, prediction.busy, prediction.slots) == (3, 1, 1)
    assert prediction.per_slot_rate == pytest.approx(2.0)
    assert prediction.seconds == pytest.approx(2.0)  # (3 + 1) / (1 x 2)
    assert retry_after(model) == pytest.approx(2.0)


def test_the_retry_hint_is_clamped_and_has_a_default_without_a_rate():
    unknown = Model()
    queue(unknown, 1)
    assert retry_after(unknown) == service_rate.UNKNOWN_RETRY_AFTER
    slow = Model()
    slow.ran(1, seconds_each=3600.0)
    queue(slow, 5)
    assert retry_after(slow) == service_rate.MAX_RETRY_AFTER
    fast = Model()
    fast.ran(1000, seconds_each=1e-6)
    queue(fast, 0)
    assert retry_after(fast) == service_rate.MIN_RETRY_AFTER


def test_a_queue_refusal_gets_the_models_hint_and_other_errors_keep_theirs():
    model = Model()
    model.ran(4, seconds_each=0.5)
    queue(model, 1)
    full, timed_out = QueueFull("full"), AdmissionTimeout("late")
    add_retry_hint(full, model)
    add_retry_hint(timed_out, model)
    assert full.retry_after == timed_out.retry_after == pytest.approx(1.0)  # (1 + 1) / (1 x 2)
    residency = ResidencyLimit("no room")  # about other models: the edge's default, not this model's queue
    add_retry_hint(residency, model)
    assert residency.retry_after is None
    set_already = QueueFull("full")
    set_already.retry_after = NO_RETRY
    add_retry_hint(set_already, model)
    assert set_already.retry_after == NO_RETRY
    other = ValueError("not a refusal")
    add_retry_hint(other, model)
    assert not hasattr(other, "retry_after")


def test_the_arrival_check_refuses_only_a_deadline_shorter_than_the_predicted_wait():
    model = Model()
    service_rate.refuse_if_wait_exceeds(model, deadline=10.0, now=10.0)  # a free slot: admitted, however late
    model.ran(4, seconds_each=0.5)  # 2/s
    queue(model, 1)  # predicted: (1 + 1) / 2 = 1 s
    service_rate.refuse_if_wait_exceeds(model, deadline=None, now=10.0)  # no deadline: admitted
    service_rate.refuse_if_wait_exceeds(model, deadline=11.5, now=10.0)  # 1.5 s left: admitted
    with pytest.raises(WaitExceedsDeadline) as refused:
        service_rate.refuse_if_wait_exceeds(model, deadline=10.5, now=10.0)
    assert "model 'm'" in str(refused.value) and "1.000 s" in str(refused.value) and "0.500 s" in str(refused.value)
    assert refused.value.retry_after == NO_RETRY


def test_the_arrival_check_admits_while_no_rate_is_known():
    model = Model()
    queue(model, 5)
    service_rate.refuse_if_wait_exceeds(model, deadline=10.001, now=10.0)
