"""Per-model inference statistics, as the protocol's ModelStatistics and the Prometheus metrics report them.

Durations are nanoseconds. queue = admission wait plus waiting for the model to load (for a request in a
batch: until its batch began); compute_input = checking and preparing inputs (a batch: stacking them);
compute_infer = the engine run; compute_output = building the response. success and fail count whole requests
with their total duration. inference_count adds the rows (batch size) of each successful request;
execution_count counts engine runs, and `batch_stats` counts them per batch size with their compute times, as
Triton reports them: a model without dynamic batching runs one request per execution, a batching model runs
every request of a batch in one.

For the metrics the same record also keeps, at no extra lock, how each failed request ended (its outcome, see
service/core/outcomes.py) and histogram buckets of the queue and engine-run times of successful requests. Both
ModelStatistics and /metrics therefore read one set of counters and always agree.

Response cache (service/request_path/response_cache.py), as Triton counts it: a hit is a success (success and queue
include it, with no queue time: it waited for no slot) and is counted under cache_hit with the time its lookup and
answer took; it is not an inference, an execution or a compute time (compute counts exclude hits). A cacheable
request that missed is counted as usual plus under cache_miss with the time the lookup and the insertion took.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from dataclasses import dataclass

# Upper bounds (seconds) of the admission-wait and compute histograms: 100 µs (a warm slot) to a minute (a slow
# cold load behind a queue). Observations above the last bound land in the +Inf bucket.
BUCKETS_SECONDS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
_BOUNDS_NS = tuple(round(bound * 1e9) for bound in BUCKETS_SECONDS)


@dataclass(frozen=True)
class Duration:
    count: int = 0
    ns: int = 0


@dataclass(frozen=True)
class StatisticsSnapshot:
    success: Duration
    fail: Duration
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration
    inference_count: int
    execution_count: int
    last_inference_ms: int  # epoch milliseconds; 0 before the first request
    failures: dict[str, int]  # outcome -> failed requests (outcomes other than success)
    queue_buckets: tuple[int, ...] = ()  # per bucket of BUCKETS_SECONDS, then +Inf; not cumulative
    infer_buckets: tuple[int, ...] = ()
    batch_stats: tuple[BatchSizeStatistics, ...] = ()  # per batch size executed, smallest first
    cache_hit: Duration = Duration()  # response cache hits: count, and ns of their lookup and answer
    cache_miss: Duration = Duration()  # cacheable requests that missed: count, and ns of lookup plus insertion


@dataclass(frozen=True)
class BatchSizeStatistics:
    """Engine runs of one batch size (rows) and their compute times."""

    batch_size: int
    count: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int


class InferenceStatistics:
    """Thread-safe counters. Recording takes one short lock of its own (never the model lock)."""

    _DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards: every counter below
        self._success_count = self._success_ns = 0
        self._fail_count = self._fail_ns = 0
        self._queue_ns = self._input_ns = self._infer_ns = self._output_ns = 0
        self._inference_count = 0
        self._executions: dict[int, list[int]] = {}  # batch size -> [count, input_ns, infer_ns, output_ns]
        self._last_inference_ms = 0
        self._failures: dict[str, int] = {}
        self._queue_buckets = [0] * (len(_BOUNDS_NS) + 1)
        self._infer_buckets = [0] * (len(_BOUNDS_NS) + 1)
        self._cache_hits = self._cache_hit_ns = 0
        self._cache_misses = self._cache_miss_ns = 0

    def record_success(
        self,
        *,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        total_ns: int,
        batch_size: int,
        executed: bool = True,
    ) -> None:
        """A successful request of `batch_size` rows. `executed`: it ran alone, so its run is counted as an
        execution of that size too; a request in a batch passes False (its batch's run is counted once, by
        `record_execution`)."""
        now_ms = time.time_ns() // 1_000_000
        # Bucket indexes outside the lock; bisect_left puts a value equal to a bound in that bound's bucket
        # (Prometheus buckets count observations <= le).
        queue_bucket = bisect_left(_BOUNDS_NS, queue_ns)
        infer_bucket = bisect_left(_BOUNDS_NS, infer_ns)
        with self._lock:
            self._success_count += 1
            self._success_ns += total_ns
            self._queue_ns += queue_ns
            self._input_ns += input_ns
            self._infer_ns += infer_ns
            self._output_ns += output_ns
            self._inference_count += batch_size
            self._last_inference_ms = now_ms
            self._queue_buckets[queue_bucket] += 1
            self._infer_buckets[infer_bucket] += 1
            if executed:
                self._count_execution_locked(batch_size, input_ns, infer_ns, output_ns)

    def record_execution(self, *, batch_size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One engine run of a batch of `batch_size` rows (its requests record their own success)."""
        with self._lock:
            self._count_execution_locked(batch_size, input_ns, infer_ns, output_ns)

    def _count_execution_locked(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        totals = self._executions.get(batch_size)
        if totals is None:
            totals = self._executions[batch_size] = [0, 0, 0, 0]
        totals[0] += 1
        totals[1] += input_ns
        totals[2] += infer_ns
        totals[3] += output_ns

    def record_cache_hit(self, *, total_ns: int, hit_ns: int) -> None:
        """A request answered from the response cache: a success, not an inference or an execution."""
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            self._success_count += 1
            self._success_ns += total_ns
            self._cache_hits += 1
            self._cache_hit_ns += hit_ns
            self._last_inference_ms = now_ms

    def record_cache_miss(self, miss_ns: int) -> None:
        """A cacheable request that missed (it is also recorded as a success by record_success)."""
        with self._lock:
            self._cache_misses += 1
            self._cache_miss_ns += miss_ns

    def record_failure(self, total_ns: int, outcome: str = "failed") -> None:
        """A request that did not succeed; `outcome` is how it ended (service/core/outcomes.py outcome_of)."""
        with self._lock:
            self._fail_count += 1
            self._fail_ns += total_ns
            self._failures[outcome] = self._failures.get(outcome, 0) + 1

    def snapshot(self) -> StatisticsSnapshot:
        with self._lock:
            done = self._success_count  # every successful request was queued once (a cache hit with no wait)
            ran = done - self._cache_hits  # ... and, unless answered from the cache, prepared, run and encoded
            return StatisticsSnapshot(
                success=Duration(done, self._success_ns),
                fail=Duration(self._fail_count, self._fail_ns),
                queue=Duration(done, self._queue_ns),
                compute_input=Duration(ran, self._input_ns),
                compute_infer=Duration(ran, self._infer_ns),
                compute_output=Duration(ran, self._output_ns),
                inference_count=self._inference_count,
                execution_count=sum(totals[0] for totals in self._executions.values()),
                last_inference_ms=self._last_inference_ms,
                failures=dict(self._failures),
                queue_buckets=tuple(self._queue_buckets),
                infer_buckets=tuple(self._infer_buckets),
                batch_stats=tuple(
                    BatchSizeStatistics(size, *self._executions[size]) for size in sorted(self._executions)
                ),
                cache_hit=Duration(self._cache_hits, self._cache_hit_ns),
                cache_miss=Duration(self._cache_misses, self._cache_miss_ns),
            )
