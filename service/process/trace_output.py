"""Where finished request traces go (service/core/tracing.py hands each trace tree to `TraceOutput.emit`): Triton's
JSON trace files (trace mode `triton`) or OTLP/gRPC export through OpenTelemetry's SDK (mode `opentelemetry`).

Triton mode writes Triton 2.51's trace file format (its docs/user_guide/trace.md "JSON Trace Output"; read in
`src/tracer.cc`), so Triton's trace summary tool (qa/common/trace_summary.py) reads our files: a JSON array of
objects, per trace (a request, and each ensemble step and BLS call of it with `parent_id`) one
`{"id", "model_name", "model_version", "request_id"?, "parent_id"?}` then one `{"id", "timestamps": [{"name", "ns"}]}`
per activity, steady-clock nanoseconds. A request that came through gRPC has Triton's frontend activities too:
GRPC_WAITREAD_START/END at its start (gRPC has read it before our handler runs) and GRPC_SEND_START/END around the
encoding of its response (our handler's part of the send; gRPC writes the bytes after it returns). The files as
Triton names them: with `log_frequency` 0, every trace goes to `file` (kept in memory and written when the settings
change or the server stops, as Triton does; past MAX_BUFFERED traces they are written early); with `log_frequency`
N, every N traces go to a new `file.0`, `file.1`, ..., the rest to the next one when the settings change or the
server stops; when a holder's `count` runs out at rate 1, what it collected goes to the next indexed file (Triton's
rule). Writing happens on the writer's own thread, never on a request's.

OpenTelemetry mode: each trace tree becomes spans sent by the SDK's BatchSpanProcessor to an OTLP/gRPC receiver at
`--trace-config opentelemetry,url=HOST:PORT` (default localhost:4317; Triton 2.51 sends OTLP/HTTP to
http://localhost:4318/v1/traces: point ours at the collector's gRPC port). A request's root span is "InferRequest",
the child of the client's W3C `traceparent` when it sent one (its `tracestate` kept); under it one span per model
request (the model's name; an ensemble step's or a BLS call's under its caller's), carrying Triton's activities as
events and the phases (decode, cache lookup, admission wait, initialization, slot held, execute, sequence slot,
encode) as child spans, the batch and the outcome as events.

Both run on a thread of their own (a bounded queue: past MAX_QUEUED waiting traces, a trace is dropped and counted),
never on a request's. `close` (the server's shutdown) writes what is buffered, stops the writer and shuts the
exporters down (each flushes what it holds, bounded by its own timeout).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, NamedTuple, TextIO, TypeVar

from ..core.trace_settings import TraceLevel, TraceMode, TraceSettings, TraceSettingsStore
from ..core.tracing import ENCODE, RequestTrace

_LOG = logging.getLogger(__name__)

T = TypeVar("T")

MAX_BUFFERED = 10_000  # traces a log_frequency-0 file keeps in memory before it writes them out early
MAX_QUEUED = 10_000  # finished traces waiting for the writer or the exporter; past it they are dropped (counted)
GATHER_SECONDS = 0.05  # how long a woken worker lets traces gather before it handles them (bounded wait)
GATHER_ITEMS = 256  # ... unless this many wait already
IDLE_RECHECK_SECONDS = 5.0  # an idle worker's wait (every wait has a bound; nothing is missed between)
WRITER_STOP_SECONDS = 10.0  # the longest close() waits for the writer to finish what is queued
DEFAULT_OTLP_URL = "localhost:4317"


def triton_version(version: str) -> int:
    """A version as Triton's trace file writes it (a number; -1 when there is none)."""
    return int(version) if version.isdigit() else -1


def frontend_timestamps(trace: RequestTrace) -> list[tuple[str, int]]:
    """The frontend activities of a request that came through gRPC: GRPC_WAITREAD_START/END at its start,
    GRPC_SEND_START/END around its last encode (see the module docstring)."""
    if trace.frontend != "GRPC" or trace.parent is not None:
        return []
    start = trace.timestamps[0][1]
    stamps = [("GRPC_WAITREAD_START", start), ("GRPC_WAITREAD_END", start)]
    encodes = [span for span in trace.spans if span.name == ENCODE]
    if encodes:
        stamps += [("GRPC_SEND_START", encodes[-1].start_ns), ("GRPC_SEND_END", encodes[-1].end_ns)]
    return stamps


def triton_records(root: RequestTrace) -> list[dict[str, Any]]:
    """A finished trace tree as the objects of Triton's trace file, each trace's in the order Triton writes them."""
    records: list[dict[str, Any]] = []
    for trace in root.walk():
        head: dict[str, Any] = {
            "id": trace.id,
            "model_name": trace.model,
            "model_version": triton_version(trace.version),
        }
        if trace.request_id:
            head["request_id"] = trace.request_id
        if trace.parent is not None:
            head["parent_id"] = trace.parent.id
        records.append(head)
        if TraceLevel.TIMESTAMPS in trace.sampled.settings.levels:
            stamps = sorted(frontend_timestamps(trace) + trace.timestamps, key=lambda stamp: stamp[1])
            for name, ns in stamps:
                records.append({"id": trace.id, "timestamps": [{"name": name, "ns": ns}]})
        for tensor in trace.tensors:
            shape = ",".join(str(d) for d in tensor.shape)
            described = {"name": tensor.name, "data": tensor.data, "shape": shape, "dtype": tensor.datatype}
            records.append({"id": trace.id, "activity": tensor.activity, "tensor": described})
    return records


def _open_trace_file(name: str) -> TextIO:
    """`name` truncated for writing, without blocking: a FIFO nobody reads fails at once (ENXIO) and one whose
    reader stalls fails its write (EAGAIN), as OSErrors that lose the traces, where a blocking open or write would
    hold the writer thread and then the server's shutdown (its final write) for ever. A regular file is unchanged
    by O_NONBLOCK. Raises OSError (a folder: EISDIR)."""
    descriptor = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, 0o644)
    return os.fdopen(descriptor, "w", encoding="utf-8")


class _TraceFile:
    """One trace file's state (guarded by the writer's lock): the traces collected since the last write, the next
    index, and the unindexed file once opened."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.buffered: list[str] = []  # each trace's records, serialized without the brackets
        self.index = 0
        self.main: TextIO | None = None

    def write_indexed(self) -> None:
        if not self.buffered:
            return
        name = f"{self.path}.{self.index}"
        self.index += 1
        with _open_trace_file(name) as stream:
            stream.write("[" + ",".join(self.buffered) + "]")
        self.buffered = []

    def write_main(self) -> None:
        if not self.buffered:
            return
        if self.main is None:
            self.main = _open_trace_file(self.path)  # open until close(): Triton's one file
            self.main.write("[")
        else:
            self.main.write(",")
        self.main.write(",".join(self.buffered))
        self.main.flush()
        self.buffered = []

    def close(self) -> None:
        if self.main is not None:
            self.main.write("]")
            self.main.close()
            self.main = None


class _Written(NamedTuple):
    """A trace tree for the writer, with the settings it was sampled under."""

    root: RequestTrace
    settings: TraceSettings


class _Worker(Generic[T]):
    """One thread that handles queued items in order (`handle`, on that thread), started with the first item and
    stopped by `close`. At most `limit` items wait: past it an item is dropped and counted (a sink that cannot keep
    up loses traces, never slows requests). `submit` never blocks but on the queue's leaf lock."""

    def __init__(self, name: str, handle: Callable[[T], None], limit: int) -> None:
        self._name = name
        self._handle = handle
        self._limit = limit
        self._lock = threading.Condition()  # guards: _queue, _closed, _thread, dropped
        self._queue: deque[T] = deque()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.dropped = 0

    def submit(self, item: T) -> None:
        with self._lock:
            if self._closed:
                return
            if len(self._queue) >= self._limit:
                self.dropped += 1
                return
            self._queue.append(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                self._thread.start()
            if len(self._queue) == 1:  # the worker waits without a limit only on an empty queue: wake it then only
                self._lock.notify()

    @property
    def started(self) -> bool:
        with self._lock:
            return self._thread is not None

    def close(self, timeout: float) -> bool:
        """Handle what is queued, then stop; waits at most `timeout`. Returns False when the thread is still busy
        then (its remaining items are lost, with a log line)."""
        with self._lock:
            self._closed = True
            thread = self._thread
            self._lock.notify()
        if thread is None:
            return True
        thread.join(timeout)
        if thread.is_alive():
            _LOG.warning("%s: did not finish within %s s", self._name, timeout)
            return False
        return True

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._lock.wait(IDLE_RECHECK_SECONDS)  # woken by submit or close; the bound only rechecks
                if not self._closed and len(self._queue) < GATHER_ITEMS:
                    # Gather more for a moment: a wake-up per trace (a GIL hand-over each) cost the requests more
                    # than the writing itself (measured: ~0.1 ms a request at rate 1). close() cuts it short.
                    self._lock.wait(GATHER_SECONDS)
                items = list(self._queue)
                self._queue.clear()
            if not items:  # closed and drained
                return
            for item in items:
                try:
                    self._handle(item)
                except Exception:  # noqa: BLE001 (a trace that cannot be written or sent is lost, never the worker)
                    _LOG.exception("%s: a trace could not be handled", self._name)


class TritonTraceFiles:
    """Triton mode's files. `add` queues a finished tree (never blocks on the disk); the writer thread serializes
    and writes. `flush` (a settings update) writes what every file collected, as Triton does when a setting is
    replaced. `close` writes the rest and closes the files."""

    def __init__(self) -> None:
        self._writer: _Worker[_Written | None] = _Worker("trace-files", self._handle, MAX_QUEUED)  # None: a flush
        self._files: dict[str, _TraceFile] = {}  # (these two: the writer's thread only, then close())
        self._frequencies: dict[str, int] = {}  # each file's last log_frequency: where its final write goes
        self.written = 0  # traces written (for tests)

    def add(self, root: RequestTrace, settings: TraceSettings) -> None:
        self._writer.submit(_Written(root, settings))

    def flush(self) -> None:
        if self._writer.started:
            self._writer.submit(None)

    def close(self) -> None:
        """Write everything queued and collected, close the files; waits for the writer at most
        WRITER_STOP_SECONDS (a disk that hangs longer loses the rest, with a log line)."""
        if not self._writer.close(WRITER_STOP_SECONDS):
            return
        for file in self._files.values():
            self._safely(file, self._final_write, file)
            self._safely(file, file.close)

    def _handle(self, item: _Written | None) -> None:
        if item is None:
            for file in list(self._files.values()):
                self._safely(file, self._final_write, file)
        else:
            self._write(item)

    def _write(self, item: _Written) -> None:
        settings = item.settings
        file = self._files.get(settings.file)
        if file is None:
            file = self._files[settings.file] = _TraceFile(settings.file)
        self._frequencies[settings.file] = settings.log_frequency
        file.buffered.append(json.dumps(triton_records(item.root), separators=(",", ":"))[1:-1])
        self.written += 1
        if settings.log_frequency and len(file.buffered) >= settings.log_frequency:
            self._safely(file, file.write_indexed)
        elif settings.count == 1 and settings.rate == 1:  # the holder's last trace: Triton writes an indexed file
            self._safely(file, file.write_indexed)
        elif not settings.log_frequency and len(file.buffered) >= MAX_BUFFERED:
            self._safely(file, file.write_main)

    def _final_write(self, file: _TraceFile) -> None:
        """What `file` collected: to the next indexed file with a log_frequency, else to the one file."""
        if self._frequencies.get(file.path, 0):
            file.write_indexed()
        else:
            file.write_main()

    @staticmethod
    def _safely(file: _TraceFile, action: Any, *args: Any) -> None:
        try:
            action(*args)
        except OSError as error:  # a trace file that cannot be written loses its traces, never a request
            _LOG.error("trace file %s: cannot write: %s", file.path, error)
            file.buffered = []


class OtlpExport:
    """OpenTelemetry mode: trace trees as spans, through one SDK TracerProvider + BatchSpanProcessor + OTLP/gRPC
    exporter per distinct exporter configuration (url, resource, bsp_*), made with the first trace that needs it.
    The spans are made on a thread of its own (the SDK's span objects cost about a millisecond a request on a busy
    2-core machine: not on the request's thread); the SDK is imported then (a server that never exports never
    imports it)."""

    def __init__(self) -> None:
        self._worker: _Worker[_Written] = _Worker("trace-export", self._send, MAX_QUEUED)
        self._lock = threading.Lock()  # guards: _providers, _closed
        self._providers: dict[tuple[tuple[str, str], ...], Any] = {}
        self._closed = False

    def export(self, root: RequestTrace, settings: TraceSettings) -> None:
        self._worker.submit(_Written(root, settings))

    @property
    def dropped(self) -> int:
        return self._worker.dropped

    def close(self) -> None:
        """Send what is queued, then shut every provider down (each flushes its batch processor, bounded by the
        SDK's own export timeout)."""
        self._worker.close(WRITER_STOP_SECONDS)
        with self._lock:
            self._closed = True
            providers, self._providers = list(self._providers.values()), {}
        for provider in providers:
            try:
                provider.shutdown()  # flushes the batch processor, then shuts the exporter down
            except Exception as error:  # noqa: BLE001 (a receiver gone at shutdown loses its spans, with a line)
                _LOG.warning("OTLP export: shutdown failed: %s", error)

    def _send(self, item: _Written) -> None:
        tracer = self._tracer(item.settings.opentelemetry)
        if tracer is not None:
            _send_tree(tracer, item.root)

    def _tracer(self, config: Mapping[str, str]) -> Any:
        key = tuple(sorted(config.items()))
        with self._lock:
            if self._closed:
                return None
            provider = self._providers.get(key)
            if provider is None:
                provider = self._providers[key] = _provider(config)
        return provider.get_tracer("slotserve")


def _endpoint(url: str) -> tuple[str, bool]:
    """An OTLP/gRPC endpoint from Triton's `url` (host:port, or http(s)://host:port[/path]: the path is dropped,
    gRPC has none), and whether it is insecure (anything but https)."""
    secure = url.startswith("https://")
    for scheme in ("http://", "https://"):
        if url.startswith(scheme):
            url = url[len(scheme) :]
    return url.split("/", 1)[0], not secure


def _resource(config: Mapping[str, str]) -> dict[str, str]:
    """Resource attributes: service.name slotserve, then `resource` (KEY=VALUE, several comma-separated)."""
    attributes = {"service.name": "slotserve"}
    for pair in config.get("resource", "").split(","):
        key, sep, value = pair.partition("=")
        if sep and key.strip():
            attributes[key.strip()] = value.strip()
    return attributes


def _provider(config: Mapping[str, str]) -> Any:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    endpoint, insecure = _endpoint(config.get("url", DEFAULT_OTLP_URL))
    provider = TracerProvider(resource=Resource.create(_resource(config)))
    processor_options: dict[str, int] = {}
    for option, name in (
        ("bsp_max_queue_size", "max_queue_size"),
        ("bsp_schedule_delay", "schedule_delay_millis"),
        ("bsp_max_export_batch_size", "max_export_batch_size"),
    ):
        if config.get(option, "").isdigit():
            processor_options[name] = int(config[option])
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=insecure)
    provider.add_span_processor(BatchSpanProcessor(exporter, **processor_options))  # type: ignore[arg-type]
    return provider


def _send_tree(tracer: Any, root: RequestTrace) -> None:
    """Start and end the spans of a finished tree, with their recorded times (steady clock moved to the wall
    clock by one offset read now)."""
    from opentelemetry import trace as otel
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    offset = time.time_ns() - time.perf_counter_ns()
    context = None
    remote = root.remote
    if remote is not None:
        state = TraceState.from_header([remote.tracestate]) if remote.tracestate else TraceState()
        parent = SpanContext(remote.trace_id, remote.span_id, True, TraceFlags(remote.flags & 1), state)
        context = otel.set_span_in_context(NonRecordingSpan(parent))
    start = root.timestamps[0][1]
    end = root.timestamp("REQUEST_END") or start
    top = tracer.start_span(
        "InferRequest", context=context, start_time=start + offset, attributes=_attributes(root, top=True)
    )
    for name, ns in frontend_timestamps(root):
        top.add_event(name, timestamp=ns + offset)
    _send_model_span(tracer, otel.set_span_in_context(top), root, offset)
    top.end(end_time=end + offset)


def _send_model_span(tracer: Any, context: Any, trace: RequestTrace, offset: int) -> None:
    from opentelemetry import trace as otel
    from opentelemetry.trace import Status, StatusCode

    start = trace.timestamps[0][1]
    end = trace.timestamp("REQUEST_END") or start
    span = tracer.start_span(trace.model, context=context, start_time=start + offset, attributes=_attributes(trace))
    for name, ns in trace.timestamps:
        span.add_event(name, timestamp=ns + offset)
    for event in trace.events:
        span.add_event(event.name, attributes=dict(event.attributes), timestamp=event.ns + offset)
    inner = otel.set_span_in_context(span)
    for phase in trace.spans:
        child = tracer.start_span(
            phase.name, context=inner, start_time=phase.start_ns + offset, attributes=dict(phase.attributes)
        )
        child.end(end_time=phase.end_ns + offset)
    for step in trace.children:
        _send_model_span(tracer, inner, step, offset)
    if trace.error_reason:
        span.set_status(Status(StatusCode.ERROR, f"{trace.error_reason}: {trace.error_message}"))
    span.end(end_time=end + offset)


def _attributes(trace: RequestTrace, top: bool = False) -> dict[str, str | int | bool]:
    attributes: dict[str, str | int | bool] = {
        "model_name": trace.model,
        "model_version": triton_version(trace.version),
        "request_id": trace.request_id,
        "triton.trace_id": trace.id,
        "outcome": trace.outcome,
    }
    if trace.parent is not None:
        attributes["parent_id"] = trace.parent.id
    if trace.error_reason:
        attributes["error_reason"] = trace.error_reason
        attributes["error_message"] = trace.error_message
    if not top:
        attributes.update(trace.attributes)  # type: ignore[arg-type]
    return attributes


class TraceOutput:
    """The server's trace sink (tracing.TraceSink): each finished tree goes to the output of the mode it was sampled
    under. Subscribed to the settings store: an update writes what the trace files collected (Triton writes a
    replaced setting's traces then). `close` in the server's shutdown."""

    def __init__(self, store: TraceSettingsStore) -> None:
        self.files = TritonTraceFiles()
        self.otlp = OtlpExport()
        store.subscribe(self.files.flush)

    def emit(self, trace: RequestTrace) -> None:
        settings = trace.sampled.settings
        if settings.mode is TraceMode.OPENTELEMETRY:
            self.otlp.export(trace, settings)
        elif settings.file:
            self.files.add(trace, settings)

    def close(self) -> None:
        self.files.close()
        self.otlp.close()


def trace_files(path: str) -> list[Path]:
    """The files Triton mode wrote for `path`: the one file, then the indexed ones in index order."""
    base = Path(path)
    found = [base] if base.exists() else []
    index = 0
    while (indexed := base.with_name(f"{base.name}.{index}")).exists():
        found.append(indexed)
        index += 1
    return found


__all__ = ["OtlpExport", "TraceOutput", "TritonTraceFiles", "trace_files", "triton_records"]
