"""Prometheus metrics: what the server's own objects know, read when scraped, served over HTTP.

Each `Server` owns one `ServerMetrics`: a `prometheus_client.CollectorRegistry` of its own (never the global
default one, so several servers in one process, as in the tests, do not collide) holding one `SlotserveCollector`.
Nothing is recorded for the metrics on any code path: at scrape time the collector reads

* each model's status (state, slots, active slots, queue; `ModelEntry.status()` takes the model lock briefly),
* each model's admission statistics (the arrival of its oldest queued request, whose age at the scrape is
  slotserve_model_oldest_wait_seconds: with busy and configured slots, the pending count and the refusals by
  reason, what an autoscaler reads; docs/observability.md, "Autoscaling"),
* each model's InferenceStatistics (request outcomes, admission-wait and compute histograms; kept there under the
  lock the request path already takes, so /metrics adds nothing per request),
* the per-model lifecycle event counts of `events.Events` (loads, unloads, evictions, ...),
* residency (resident models, memory), the cold-load guard and the dataplane's unknown-model count.

Beside them, Triton's own per-model names (`TRITON_COUNTERS`, `TRITON_CACHE_COUNTERS`: `nv_inference_*`, and
`nv_cache_*` for models using the response cache), labelled `model` and `version` and typed counter as Triton
exposes them: without the `_total` suffix prometheus_client would add, so they are rendered by `triton_text`
and appended to the exposition. They read the same snapshot as ModelStatistics; durations are its nanosecond
sums divided by 1000 (microseconds, as Triton's).

Locking: the collector takes the registry lock, then each model lock, residency lock and events lock one at a
time and never two at once, so a scrape cannot deadlock with the request path or with lifecycle work.
`--metrics-port` serves it with prometheus_client's WSGI app on a small threading HTTP server of our own: the same
as `start_http_server`, except that its loop polls for shutdown every 0.1 s instead of 0.5 s (shutdown waits for
that poll) and a client that stalls mid-request is dropped after a timeout. `stop()`, at the end of the server's
shutdown, stops it and joins its thread.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..core.admission import AdmissionStatistics
from ..core.lifecycle import ModelEntry, ModelStatus
from ..core.outcomes import FAILED, STANDARD, SUCCESS
from ..core.statistics import BUCKETS_SECONDS, StatisticsSnapshot
from ..request_path.response_cache import model_enables_cache

if TYPE_CHECKING:  # what the collector reads at each scrape, given by service/process/server.py
    from ..core.events import Events
    from ..core.registry import ModelRegistry
    from ..core.residency import ColdLoadGuard, Residency
    from ..request_path.dataplane import Dataplane
    from .custom_metrics import CustomMetrics

# Each registered version's name, status and statistics, read once per scrape.
Observed = list[tuple[str, ModelStatus, StatisticsSnapshot]]
# A sample of a Triton family: the model version (None: server-wide), labels besides model and version, the value.
Sample = tuple[ModelEntry | None, Mapping[str, str], float]
# A per-model counter read from a statistics snapshot: name, help text, value.
SnapshotCounter = tuple[str, str, Callable[[StatisticsSnapshot], int]]

POLL_SECONDS = 0.1  # how often the HTTP loop checks for shutdown: stop() waits up to this long
REQUEST_TIMEOUT = 10.0  # seconds a scrape connection may stall before its thread gives up on it

# Lifecycle counters: metric name (without _total), the event counted, and what it means.
LIFECYCLE_COUNTERS = (
    (
        "slotserve_model_loads",
        "loaded",
        "Loads that published a complete pool (first request, register, "
        "repository load, reconfiguration with a new engine).",
    ),
    (
        "slotserve_model_load_failures",
        "load_failed",
        "Loads that published nothing: engine or configuration errors, residency_limit and memory_limit refusals.",
    ),
    ("slotserve_model_reconfigurations", "reconfigured", "Reconfigurations committed (in place or with a new engine)."),
    (
        "slotserve_model_unloads",
        "unloaded",
        "Unloads asked for by an operator (UnloadModel, bulk unload, RepositoryModelUnload) that freed a loaded pool.",
    ),
    (
        "slotserve_model_evictions",
        "evicted",
        "Idle models retired to make room for another model's load (--max-resident-models or --memory-budget).",
    ),
    ("slotserve_model_idle_retirements", "idle_retired", "Models retired after --idle-unload seconds idle."),
)


# Triton's per-model counters (docs/operations.md lists them): name, help text, value from the statistics snapshot.
TRITON_COUNTERS: tuple[SnapshotCounter, ...] = (
    (
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes (includes cached requests)",
        lambda s: s.success.count,
    ),
    (
        "nv_inference_count",
        "Number of inferences performed (a batch of n counts n; does not include cached requests)",
        lambda s: s.inference_count,
    ),
    (
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
        lambda s: s.execution_count,
    ),
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
        lambda s: s.success.ns // 1000,
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        lambda s: s.queue.ns // 1000,
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        lambda s: s.compute_input.ns // 1000,
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        lambda s: s.compute_infer.ns // 1000,
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        lambda s: s.compute_output.ns // 1000,
    ),
)
# Triton 2.51 labels its failure counter with a reason: BACKEND (the backend's execution failed: an exception, a
# dead worker or stub), REJECTED (turned away before running: a queue timeout, our limits), CANCELED (its client
# gave up) or OTHER (the rest: an ensemble whose step failed, a request refused before running). Each of our
# outcomes (an error reason: service/transport/status_codes.py's TABLE, or `failed`) has its row here:
# tests/unit/test_triton_failure_reasons.py fails on a reason without one, and tests/differential/
# test_failure_reasons.py asks real Triton for each case. Two deliberate differences: a failure Triton counts as a
# success (a python model's TritonError response, an output of the wrong datatype: Triton checks neither) is
# BACKEND here, and a request refused by validation (which Triton does not count at all) is OTHER.
TRITON_FAILURE_REASONS = ("BACKEND", "OTHER", "CANCELED", "REJECTED")
TRITON_REASON_OF: dict[str, str] = {
    # the backend's run failed
    FAILED: "BACKEND",
    "model_error": "BACKEND",  # a python model raised, returned a TritonError or a wrong output, or its worker died
    "model_error_unknown": "BACKEND",
    "model_error_not_found": "BACKEND",
    "model_error_invalid_argument": "BACKEND",
    "model_error_unavailable": "BACKEND",
    "model_error_unsupported": "BACKEND",
    "model_error_already_exists": "BACKEND",
    "device_failed": "BACKEND",  # the run broke the device (or a python model's workers died too often)
    "out_of_memory": "BACKEND",
    # the client gave up
    "cancelled": "CANCELED",
    # turned away before running
    "server_busy": "REJECTED",  # a full queue or an admission timeout (Triton: queue policy timeout)
    "residency_limit": "REJECTED",
    "memory_limit": "REJECTED",
    "tensor_memory_limit": "REJECTED",
    "shared_memory_limit": "REJECTED",
    "shutting_down": "REJECTED",
    "wait_exceeds_deadline": "REJECTED",  # --refuse-predicted-wait: turned away at arrival
    # refused before running for what the request asked, or the model could not be loaded for it
    "invalid_request_error": "OTHER",
    "region_not_found": "OTHER",
    "region_exists": "OTHER",  # SystemSharedMemoryRegister only: no request ends with it
    "model_not_found": "OTHER",
    "model_not_loaded": "OTHER",
    "load_failed": "OTHER",
    "backend_unavailable": "OTHER",
    "unimplemented": "OTHER",
    "unauthenticated": "OTHER",
    "management_disabled": "OTHER",
    "model_control_disabled": "OTHER",
    "load_files_limit": "OTHER",
    "repository_poll_failed": "OTHER",  # a repository load's, never a request's
}


def triton_failures(snapshot: StatisticsSnapshot, backend: str = "") -> dict[str, int]:
    """Failed requests by Triton's reason (every reason present, at zero when none). An ensemble's failed run is
    OTHER, as Triton's ensemble scheduler reports it (the step that failed counts BACKEND on its own model). A reason
    without a row is OTHER."""
    counts = dict.fromkeys(TRITON_FAILURE_REASONS, 0)
    for outcome, count in snapshot.failures.items():
        reason = TRITON_REASON_OF.get(outcome, "OTHER")
        if backend == "ensemble" and reason == "BACKEND":
            reason = "OTHER"
        counts[reason] += count
    return counts


class _TritonText:
    """Text-format families written as Triton writes them: counters keep their own names (no `_total`), and
    per-model samples are labelled model, then any other label, then version."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def counter(self, name: str, documentation: str, samples: Iterable[Sample]) -> None:
        self.family(name, documentation, "counter", samples)

    def family(self, name: str, documentation: str, kind: str, samples: Iterable[Sample]) -> None:
        """`samples`: (entry or None for a server-wide sample, extra labels, value)."""
        self._lines.append(f"# HELP {name} {documentation}")
        self._lines.append(f"# TYPE {name} {kind}")
        for entry, extra, value in samples:
            if entry is None:
                self._lines.append(f"{name} {value}")
                continue
            pairs = {"model": entry.name, **extra, "version": entry.spec.version}
            labels = ",".join(f'{key}="{_label(text)}"' for key, text in pairs.items())
            self._lines.append(f"{name}{{{labels}}} {value}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n" if self._lines else ""


# Served for models whose config enables the response cache, when the server has one (--response-cache-bytes).
TRITON_CACHE_COUNTERS: tuple[SnapshotCounter, ...] = (
    ("nv_cache_num_hits_per_model", "Number of response cache hits per model", lambda s: s.cache_hit.count),
    ("nv_cache_num_misses_per_model", "Number of response cache misses per model", lambda s: s.cache_miss.count),
    (
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds",
        lambda s: s.cache_hit.ns // 1000,
    ),
    (
        "nv_cache_miss_duration_per_model",
        "Total cache miss (lookup and insertion) duration per model, in microseconds",
        lambda s: s.cache_miss.ns // 1000,
    ),
)


class SlotserveCollector(Collector):
    """Every slotserve metric, computed from the live objects at each scrape."""

    def __init__(
        self,
        registry: ModelRegistry,
        residency: Residency,
        events: Events,
        cold_loads: ColdLoadGuard | None = None,
        dataplane: Dataplane | None = None,
        custom_metrics: CustomMetrics | None = None,  # python models' own families, served after Triton's
    ) -> None:
        self._registry = registry
        self._residency = residency
        self._events = events
        self._cold_loads = cold_loads
        self._dataplane = dataplane
        self._custom_metrics = custom_metrics

    def collect(self) -> Iterator[Metric]:
        entries = self._registry.entries()
        observed: Observed = [(entry.name, entry.status(), entry.statistics.snapshot()) for entry in entries]
        yield from _model_gauges(observed)
        yield _oldest_wait([(entry.name, entry.admission.statistics()) for entry in entries], time.monotonic())
        yield _requests(observed)
        yield _refusals(observed)
        yield _histogram(
            "slotserve_model_admission_wait_seconds",
            "Seconds from a successful request's arrival at its model until it held a slot "
            "(queueing, plus waiting for a cold load).",
            observed,
            lambda s: (s.queue_buckets, s.queue.ns),
        )
        yield _histogram(
            "slotserve_model_compute_seconds",
            "Seconds the engine ran a successful request (a streaming model: until its last response).",
            observed,
            lambda s: (s.infer_buckets, s.compute_infer.ns),
        )
        yield from _executions(observed)
        yield from _lifecycle_counters([name for name, _, _ in observed], self._events.counts())
        yield from self._server_metrics()

    def triton_text(self) -> str:
        """Triton's per-model families in the Prometheus text format (see TRITON_COUNTERS), Triton's order."""
        rows = [(entry, entry.statistics.snapshot()) for entry in self._registry.entries()]
        cache = self._dataplane.response_cache if self._dataplane is not None else None
        if cache is not None and not cache.enabled:
            cache = None
        lines = _TritonText()
        if rows:
            name, documentation, value = TRITON_COUNTERS[0]
            lines.counter(name, documentation, [(entry, {}, value(snapshot)) for entry, snapshot in rows])
            failures = [
                (entry, {"reason": reason}, count)
                for entry, snapshot in rows
                for reason, count in triton_failures(snapshot, entry.spec.backend).items()
            ]
            lines.counter(
                "nv_inference_request_failure", "Number of failed inference requests, all batch sizes", failures
            )
            for name, documentation, value in TRITON_COUNTERS[1:]:
                lines.counter(name, documentation, [(entry, {}, value(snapshot)) for entry, snapshot in rows])
        cached = [row for row in rows if cache is not None and model_enables_cache(row[0].spec.config)]
        if cached:
            for name, documentation, value in TRITON_CACHE_COUNTERS:
                lines.counter(name, documentation, [(entry, {}, value(snapshot)) for entry, snapshot in cached])
        if rows:
            pending: list[tuple[ModelEntry, dict[str, str], int]] = [
                # a sequence's request waiting for its slot or its turn is pending too, as on Triton
                (entry, {}, _waiting_requests(entry.status()) + entry.sequences.pending_count())
                for entry, _ in rows
            ]
            lines.family(
                "nv_inference_pending_request_count", "Requests waiting for a slot, per model", "gauge", pending
            )
        if cache is not None:
            stats = cache.statistics()
            for name, documentation, figure in (
                ("nv_cache_num_entries", "Number of responses stored in the response cache", stats.entries),
                ("nv_cache_num_evictions", "Number of response cache evictions", stats.evictions),
                ("nv_cache_util", "Response cache utilization [0.0 - 1.0]", stats.bytes / stats.capacity_bytes),
            ):
                lines.family(name, documentation, "gauge", [(None, {}, figure)])
        custom = self._custom_metrics.text() if self._custom_metrics is not None else ""
        return lines.text() + custom

    def _server_metrics(self) -> Iterator[Metric]:
        residency = self._residency
        yield GaugeMetricFamily(
            "slotserve_resident_models",
            "Models holding a loaded pool (engine and slots) right now.",
            value=len(residency.resident_names()),
        )
        yield GaugeMetricFamily(
            "slotserve_memory_bytes",
            "Memory the loaded pools report together (what --memory-budget limits).",
            value=residency.memory_in_use(),
        )
        yield GaugeMetricFamily(
            "slotserve_memory_budget_bytes", "--memory-budget; 0 = no budget.", value=residency.memory_budget
        )
        yield GaugeMetricFamily(
            "slotserve_max_resident_models", "--max-resident-models; 0 = no limit.", value=residency.max_resident_models
        )
        if self._cold_loads is not None:
            loads = self._cold_loads.statistics()
            running, waiting = loads.running, loads.waiting
            yield GaugeMetricFamily("slotserve_cold_loads_running", "Cold loads in progress.", value=running)
            yield GaugeMetricFamily(
                "slotserve_cold_loads_waiting", "Cold loads waiting for --max-concurrent-loads.", value=waiting
            )
        if self._dataplane is not None:
            yield CounterMetricFamily(
                "slotserve_unknown_model_requests",
                "Inference requests naming a model that is not registered (NOT_FOUND).",
                value=self._dataplane.unknown_model_requests,
            )


def _label(value: str) -> str:
    """A label value escaped as the text format wants (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _model_gauges(observed: Observed) -> Iterator[Metric]:
    """Per-model state read from ModelStatus."""
    gauges: tuple[tuple[str, str, Callable[[ModelStatus], int]], ...] = (
        (
            "slotserve_model_loaded",
            "1 while the model holds a loaded pool, else 0.",
            lambda status: 1 if status.loaded else 0,
        ),
        ("slotserve_model_slots", "Configured slot count.", lambda status: status.slots),
        ("slotserve_model_active_slots", "Slots held by requests right now.", lambda status: status.active_slots),
        (
            "slotserve_model_queued_requests",
            "Requests waiting in the model's FIFO queue for a slot.",
            _waiting_requests,
        ),
        (
            "slotserve_model_memory_bytes",
            "Memory the model's loaded pool reports (0 when unloaded).",
            lambda status: status.memory_bytes or 0,
        ),
    )
    for name, documentation, value in gauges:
        family = GaugeMetricFamily(name, documentation, labels=["model"])
        combine = max if name == "slotserve_model_loaded" else sum
        for model, statuses in _by_model((model, status) for model, status, _ in observed).items():
            family.add_metric([model], combine(value(status) for status in statuses))
        yield family


def _waiting_requests(status: ModelStatus) -> int:
    """The requests in a model's queue. ModelStatus.queued_requests counts every ticket there, and an unload or a
    reconfiguration waiting for the slots to drain is no request: counted, it would ask an autoscaler for a replica
    that nobody needs."""
    return status.queued_requests - status.queued_managers


def _by_model(rows: Iterable[tuple[str, Any]]) -> dict[str, list[Any]]:
    """Rows grouped by model name, in the order first seen. The slotserve_model_* families are per model: a model
    serving several versions (each its own entry) is summed over them, so no series repeats; Triton's nv_*
    families carry the version label."""
    grouped: dict[str, list[Any]] = {}
    for model, row in rows:
        grouped.setdefault(model, []).append(row)
    return grouped


def _requests(observed: Observed) -> Metric:
    """Finished inference requests (ModelInfer and each stream request) by outcome."""
    family = CounterMetricFamily(
        "slotserve_model_requests",
        "Finished inference requests by outcome: success, or the error reason the client got (server_busy, "
        "residency_limit, memory_limit, shutting_down, invalid_request_error, model_not_found, cancelled, "
        "load_failed, ...), or failed for an internal error.",
        labels=["model", "outcome"],
    )
    for model, snapshots in _by_model((model, snapshot) for model, _, snapshot in observed).items():
        totals: dict[str, int] = {}
        for snapshot in snapshots:
            for outcome, count in _outcomes(snapshot).items():
                totals[outcome] = totals.get(outcome, 0) + count
        for outcome, count in totals.items():
            family.add_metric([model, outcome], count)
    return family


# Refusals: the outcomes of requests turned away before they ran for want of capacity (a slot in time, residency,
# memory) or because the server is stopping, each counted from the start at zero. They are the REJECTED rows of
# TRITON_REASON_OF; server_busy is a full queue (--max-queue), an admission timeout, or every busy slot overdue.
REFUSAL_REASONS = tuple(reason for reason, triton in TRITON_REASON_OF.items() if triton == "REJECTED")


def _refusals(observed: Observed) -> Metric:
    """Requests turned away before running, by reason (the same counts as slotserve_model_requests' outcomes)."""
    family = CounterMetricFamily(
        "slotserve_model_refusals",
        "Requests turned away before running, by reason: server_busy (the queue was full, the admission timeout "
        "passed, or every busy slot ran past it), residency_limit, memory_limit, tensor_memory_limit, "
        "shared_memory_limit, shutting_down.",
        labels=["model", "reason"],
    )
    for model, snapshots in _by_model((model, snapshot) for model, _, snapshot in observed).items():
        for reason in REFUSAL_REASONS:
            family.add_metric([model, reason], sum(snapshot.failures.get(reason, 0) for snapshot in snapshots))
    return family


def _oldest_wait(admissions: list[tuple[str, AdmissionStatistics]], now: float) -> Metric:
    """How long the oldest request waiting in each model's queue has waited at `now` (monotonic seconds, the
    admission controller's clock); 0 when none waits. A model's versions: the longest."""
    family = GaugeMetricFamily(
        "slotserve_model_oldest_wait_seconds",
        "Seconds the oldest request waiting in the model's queue for a slot has waited so far; 0 when none waits.",
        labels=["model"],
    )
    for model, readings in _by_model(admissions).items():
        arrivals = [r.oldest_request_arrival for r in readings if r.oldest_request_arrival is not None]
        family.add_metric([model], max(0.0, now - min(arrivals)) if arrivals else 0.0)
    return family


def _outcomes(snapshot: StatisticsSnapshot) -> dict[str, int]:
    counts = {outcome: 0 for outcome in STANDARD}  # at zero from the start, so rates exist before the first
    counts.update(snapshot.failures)
    counts[SUCCESS] = snapshot.success.count
    return counts


def _histogram(
    name: str,
    documentation: str,
    observed: Observed,
    read: Callable[[StatisticsSnapshot], tuple[tuple[int, ...], int]],
) -> Metric:
    """A per-model histogram from non-cumulative bucket counts (BUCKETS_SECONDS, then +Inf) and a sum in ns."""
    family = HistogramMetricFamily(name, documentation, labels=["model"])
    bounds = [_go_float(bound) for bound in BUCKETS_SECONDS] + ["+Inf"]
    for model, snapshots in _by_model((model, snapshot) for model, _, snapshot in observed).items():
        reads = [read(snapshot) for snapshot in snapshots]
        counts = [sum(column) for column in zip(*(c for c, _ in reads), strict=True)]
        total_ns = sum(ns for _, ns in reads)
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip(bounds, counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        family.add_metric([model], buckets, total_ns / 1e9)
    return family


def _go_float(bound: float) -> str:
    """A bucket bound as Prometheus writes it (prometheus_client's floatToGoString, which is not annotated)."""
    return str(floatToGoString(bound))  # type: ignore[no-untyped-call]


# Upper bounds of the batch-size histogram (rows per engine run); sizes above the last land in +Inf.
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _executions(observed: Observed) -> Iterator[Metric]:
    """Engine runs per model, and the rows each took (one request per run on a model without batching; a
    batching model runs each batch of requests once)."""
    executions = CounterMetricFamily(
        "slotserve_model_executions",
        "Engine runs (executions): one per request on a model without dynamic "
        "batching, one per batch on a batching model.",
        labels=["model"],
    )
    sizes = HistogramMetricFamily(
        "slotserve_model_batch_size", "Rows (batch dimension) each engine run took.", labels=["model"]
    )
    for model, snapshots in _by_model((model, snapshot) for model, _, snapshot in observed).items():
        runs = sum(snapshot.execution_count for snapshot in snapshots)
        batches = [b for snapshot in snapshots for b in snapshot.batch_stats]
        executions.add_metric([model], runs)
        buckets = [(str(bound), sum(b.count for b in batches if b.batch_size <= bound)) for bound in BATCH_SIZE_BUCKETS]
        buckets.append(("+Inf", runs))
        sizes.add_metric([model], buckets, sum(b.batch_size * b.count for b in batches))
    yield executions
    yield sizes


def _lifecycle_counters(models: Iterable[str], counts: dict[tuple[str, str], int]) -> Iterator[Metric]:
    models = list(dict.fromkeys(models))  # one series per model: lifecycle events name the model, not a version
    for name, event, documentation in LIFECYCLE_COUNTERS:
        family = CounterMetricFamily(name, documentation, labels=["model"])
        for model in models:
            family.add_metric([model], counts.get((event, model), 0))
        yield family


class BusyCallsCollector(Collector):
    """Calls the handler budget refused (service/transport/servicers/common.py CallTracker.refused), server-wide:
    they are refused before their model is read. Registered beside SlotserveCollector by service/process/server.py."""

    def __init__(self, refused: Callable[[], int]) -> None:
        self._refused = refused

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "slotserve_busy_calls",
            "Calls refused at once because every handler thread of their kind was in use (UNAVAILABLE server_busy, "
            "before any model is named: counted for no model).",
            value=self._refused(),
        )


class ServerMetrics:
    """One server's metrics registry and, with --metrics-port, the HTTP endpoint that serves it."""

    def __init__(self, collector: Collector) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._collector = collector
        self._lock = threading.Lock()  # guards: _httpd, _thread
        self._httpd: ThreadingWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def render(self) -> str:
        """The Prometheus text exposition, as /metrics serves it: ours, then Triton's names (triton_text)."""
        triton = getattr(self._collector, "triton_text", None)
        return generate_latest(self.registry).decode() + (triton() if triton is not None else "")

    def start(self, host: str, port: int) -> int:
        """Serve /metrics (any path answers) on host:port; port 0 picks a free one. Returns the bound port.
        Raises OSError if it cannot be bound."""
        with self._lock:
            httpd = _http_server(host, port, self._app)
            thread = threading.Thread(
                target=httpd.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, name="metrics-http", daemon=True
            )
            thread.start()
            self._httpd, self._thread = httpd, thread
            self.port = httpd.server_port
        return self.port

    def stop(self) -> None:
        """Stop serving and join the serving thread. Idempotent. A scrape already running finishes on its own
        short-lived thread (it reads statuses; nothing it does waits)."""
        with self._lock:
            httpd, thread = self._httpd, self._thread
            self._httpd = self._thread = None
        if httpd is None or thread is None:  # set together by start
            return
        httpd.shutdown()
        httpd.server_close()
        thread.join()

    def _app(self, environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes]:
        """Every path answers the text exposition (Prometheus format 0.0.4, as Triton serves it)."""
        body = self.render().encode()
        start_response("200 OK", [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))])
        return [body]


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _QuietHandler(WSGIRequestHandler):
    """One scrape. Writes no access log (a scrape every few seconds would drown the server's own lines)."""

    timeout = REQUEST_TIMEOUT  # a socket timeout: a stalled client cannot hold its thread forever

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def _http_server(host: str, port: int, app: WSGIApplication) -> ThreadingWSGIServer:
    """A bound threading WSGI server for `app` on host:port, IPv4 or IPv6 as the host resolves (as
    prometheus_client's start_http_server chooses)."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(ThreadingWSGIServer):
        address_family = family

    return make_server(str(address[0]), port, app, Server, handler_class=_QuietHandler)
