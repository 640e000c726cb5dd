"""A model's predicted wait and the retry hint of its overload refusals, from its recent service rate (no gRPC).

**The service rate** (`ServiceRate`): requests completed per second of a busy slot, over the last `WINDOW_SECONDS`.
It is read from the model's own statistics (service/core/statistics.py: where every request's completion is
counted), never fed by a hook: the requests that ran and succeeded (`success` less response-cache hits), over the
engine time their runs took (each execution's compute input + infer + output, summed over `batch_stats`, so a
batch of eight counts its run once and its eight requests). A rate per busy slot-second rather than per wall-clock
second, so that a model with little traffic is not taken for a slow one. Samples are taken when somebody asks,
at most every `REFRESH_SECONDS` once a rate is known; the rate is the difference between the newest sample and the
last one at or before the window's start (the totals since the model's first request until the window has
filled). With no completion in the window the last rate measured stays; before any, the rate is unknown (None).

**The predicted wait** (`predict_wait`) of a request arriving now, from the admission's state:

    0                                     when a slot is free and nobody is queued (it would be granted at once)
    (ahead + 1) / (slots x rate)          otherwise

where `ahead` is the requests queued before it and `slots` the model's request slots: with every slot busy, slots
free at `slots x rate` a second on average, and the newcomer's turn comes with the `ahead + 1`-th. None when the
rate is unknown.

**The retry hint** (`retry_after`) of a refusal for overload: the predicted wait of a request arriving now, i.e. the
time after which a retry would find the backlog that refused this one served, clamped to `MIN_RETRY_AFTER ..
MAX_RETRY_AFTER`, or `UNKNOWN_RETRY_AFTER` when the rate is unknown. The edge sends it as `grpc-retry-pushback-ms`.

Limits, on purpose: the estimate is an average. It does not know the service time of the requests in the queue
(only of those that ran), the time a cold load or a queued manager will take (a queued manager is not counted in
`ahead`), other models holding resources the model needs, nor priorities (a request of a higher level is served
before the ones ahead of it). A rate from requests of another size, or from before a reconfiguration, lasts until
the window has passed. It is a hint to space retries and to refuse hopeless requests early, not a promise.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from .admission import AdmissionController
from .errors import WaitExceedsDeadline
from .statistics import InferenceStatistics, StatisticsSnapshot

WINDOW_SECONDS = 10.0  # the completions the rate counts: those of about the last ten seconds
REFRESH_SECONDS = 0.1  # a sample at most this often (a snapshot of the statistics takes their lock)
MIN_RETRY_AFTER = 0.01  # never "retry at once": the backlog that refused a request does not vanish in a microsecond
MAX_RETRY_AFTER = 30.0  # past half a minute a client does better to give up or go elsewhere than to wait
UNKNOWN_RETRY_AFTER = 1.0  # a model with no completion measured yet (its first load, say)

# The reasons whose hint comes from the model's own rate and queue: its queue refused or timed the request out.
# Other overload refusals (residency, memory budget, tensor memory, shutting down) are about other models or the
# whole server: the edge gives them their reason's fixed hint (service/transport/status_codes.py).
RATED_REASONS = frozenset({"server_busy"})


class Progress(NamedTuple):
    """A model's totals at one moment: requests that ran and succeeded, and the engine time of all its runs."""

    completed: int
    busy_ns: int


class _Sample(NamedTuple):
    at: float  # monotonic seconds
    progress: Progress


def progress_of(snapshot: StatisticsSnapshot) -> Progress:
    """The totals the rate is computed from (cache hits took no slot: they are left out)."""
    runs = snapshot.batch_stats
    busy_ns = sum(size.compute_input_ns + size.compute_infer_ns + size.compute_output_ns for size in runs)
    return Progress(snapshot.success.count - snapshot.cache_hit.count, busy_ns)


class ServiceRate:
    """Completions per busy slot-second of one model over a sliding window (see the module docstring).

    Thread-safe: one lock of its own, a leaf (the statistics are read with it released). Never blocks beyond
    that lock and the statistics' own; raises nothing.
    """

    def __init__(
        self,
        read: Callable[[], Progress],
        clock: Callable[[], float] = time.monotonic,
        window: float = WINDOW_SECONDS,
        refresh: float = REFRESH_SECONDS,
    ) -> None:
        self._read = read
        self._clock = clock
        self._window = window
        self._refresh = refresh
        self._lock = threading.Lock()  # guards: _samples, _rate, _sampled_at
        self._samples: deque[_Sample] = deque()
        self._rate: float | None = None
        self._sampled_at: float | None = None

    def per_slot(self) -> float | None:
        """Requests completed per second of a busy slot, recently; None before the first completion measured."""
        now = self._clock()
        with self._lock:
            # Until a rate is known every ask samples: a first completion must not wait out the interval.
            if self._rate is not None and self._sampled_at is not None and now - self._sampled_at < self._refresh:
                return self._rate
            self._sampled_at = now
        progress = self._read()  # outside the lock: it takes the statistics' lock
        with self._lock:
            self._samples.append(_Sample(now, progress))
            # Keep one sample at or before the window's start as the baseline; drop the older ones.
            while len(self._samples) > 1 and self._samples[1].at <= now - self._window:
                self._samples.popleft()
            base = self._samples[0].progress if len(self._samples) > 1 else Progress(0, 0)
            newest = self._samples[-1].progress
            completed, busy_ns = newest.completed - base.completed, newest.busy_ns - base.busy_ns
            if completed > 0 and busy_ns > 0:
                self._rate = completed / (busy_ns / 1e9)
            return self._rate


class RatedModel(Protocol):
    """What a prediction reads of a model (service/core/lifecycle.py ModelEntry)."""

    @property
    def name(self) -> str: ...

    @property
    def statistics(self) -> InferenceStatistics: ...

    @property
    def admission(self) -> AdmissionController: ...


# One estimator per model's statistics (an entry keeps its statistics for life): weak, so that nothing here keeps
# a model alive. The lock guards the dictionary only.
_RATES: weakref.WeakKeyDictionary[InferenceStatistics, ServiceRate] = weakref.WeakKeyDictionary()
_RATES_LOCK = threading.Lock()


def rate_of(model: RatedModel) -> ServiceRate:
    """The model's estimator, made on first use."""
    statistics = model.statistics
    with _RATES_LOCK:
        rate = _RATES.get(statistics)
        if rate is None:
            rate = _RATES[statistics] = ServiceRate(lambda: progress_of(statistics.snapshot()))
        return rate


@dataclass(frozen=True)
class WaitPrediction:
    seconds: float | None  # None: no service rate measured yet
    ahead: int  # requests queued before a newcomer
    busy: int  # request slots held
    slots: int  # request slots
    per_slot_rate: float | None  # completions per busy slot-second


def wait_seconds(ahead: int, busy: int, slots: int, per_slot_rate: float | None) -> float | None:
    """The predicted wait of a newcomer (module docstring): 0 with a free slot and nobody queued, else
    (ahead + 1) / (slots x rate); None without a rate."""
    if ahead == 0 and busy < slots:
        return 0.0
    if per_slot_rate is None or per_slot_rate <= 0:
        return None
    return (ahead + 1) / (max(1, slots) * per_slot_rate)


def predict_wait(model: RatedModel) -> WaitPrediction:
    """How long a request of `model` arriving now would wait for its slot. Takes the model lock briefly (the
    admission's statistics) and the estimator's; blocks on nothing else."""
    admission = model.admission.statistics()
    at_once = admission.queued_requests == 0 and admission.active_slots < admission.capacity
    rate = None if at_once else rate_of(model).per_slot()  # (a request granted at once costs no sample)
    seconds = wait_seconds(admission.queued_requests, admission.active_slots, admission.capacity, rate)
    return WaitPrediction(seconds, admission.queued_requests, admission.active_slots, admission.capacity, rate)


def retry_after(model: RatedModel) -> float:
    """Seconds a client refused for `model`'s overload should wait before retrying (module docstring)."""
    seconds = predict_wait(model).seconds
    if seconds is None:
        return UNKNOWN_RETRY_AFTER
    return min(MAX_RETRY_AFTER, max(MIN_RETRY_AFTER, seconds))


def refuse_if_wait_exceeds(model: RatedModel, deadline: float | None, now: float | None = None) -> None:
    """--refuse-predicted-wait, at a request's arrival: raise WaitExceedsDeadline when the model's predicted wait
    is longer than the time left before the request's admission `deadline` (monotonic seconds). A request without
    a deadline, or arriving before any rate is known, is admitted. Blocks on nothing (see predict_wait)."""
    if deadline is None:
        return
    prediction = predict_wait(model)
    if prediction.seconds is None or prediction.seconds == 0.0:
        return
    left = deadline - (time.monotonic() if now is None else now)
    if prediction.seconds > left:
        raise WaitExceedsDeadline(
            f"wait_exceeds_deadline: model '{model.name}' would take about {prediction.seconds:.3f} s to reach this "
            f"request ({prediction.ahead} queued, {prediction.slots} slot(s) at "
            f"{prediction.per_slot_rate:.1f} requests/s each); its deadline is {max(0.0, left):.3f} s away"
        )
