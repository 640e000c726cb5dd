"""Per-request traces: what one sampled request went through, recorded as it happens, handed to a sink at its end.

A request is sampled once, as the dataplane takes it (`Tracer.start`: the model's trace settings,
service/core/trace_settings.py, Triton's `trace_rate` / `trace_count`); a request that is not sampled carries
`trace=None`, and every hook on the path is one `is not None` check: tracing off costs nothing else. A sampled
request carries a `RequestTrace`, which records:

* Triton's activities as steady-clock timestamps (`time.perf_counter_ns`, the clock the statistics use): REQUEST_START,
  QUEUE_START, COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END, REQUEST_END, as Triton's trace
  file has them (service/process/trace_output.py writes them);
* the phases as spans and events with attributes (`Span`, `Event`): decode, cache lookup, admission wait (the queue
  length found at arrival, the wait), the model's initialization when the request waited for it, the slot held, the
  batch it ran in (its rows, the batch's id), execute, its sequence slot, encode, and the outcome (its error reason);
* child traces (`child`): each ensemble step and each BLS call of the request, with the parent's id, sampled with it.

A trace tree (a request and its children) is handed to its `TraceSink` once, when the root and every child ended.

Threads: a trace's own records are written by the threads that run its request one after another (its handler, a
stream's worker); children may be made and finished on other threads (an ensemble's helpers, a python model's BLS
calls), so the tree's bookkeeping (children, open count) is under one lock per tree, a leaf taken only by traced
requests. Nothing here blocks but that lock; nothing imports gRPC or OpenTelemetry.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from .trace_settings import Sampled, TraceLevel, TraceMode, TraceSettings, TraceSettingsStore

# Triton's activities, in the order a request goes through them (its trace file's timestamp names).
REQUEST_START = "REQUEST_START"
QUEUE_START = "QUEUE_START"
COMPUTE_START = "COMPUTE_START"
COMPUTE_INPUT_END = "COMPUTE_INPUT_END"
COMPUTE_OUTPUT_START = "COMPUTE_OUTPUT_START"
COMPUTE_END = "COMPUTE_END"
REQUEST_END = "REQUEST_END"
ACTIVITIES = (
    REQUEST_START,
    QUEUE_START,
    COMPUTE_START,
    COMPUTE_INPUT_END,
    COMPUTE_OUTPUT_START,
    COMPUTE_END,
    REQUEST_END,
)

# Triton's tensor activities (the TENSORS level): a request's inputs as its model's queue took them, its outputs.
TENSOR_QUEUE_INPUT = "TENSOR_QUEUE_INPUT"
TENSOR_BACKEND_OUTPUT = "TENSOR_BACKEND_OUTPUT"

# The phases' names (spans and events), as the OTLP export and the docs name them.
DECODE = "decode"
CACHE_LOOKUP = "cache lookup"
ADMISSION_WAIT = "admission wait"
INITIALIZATION = "initialization"
SLOT_HELD = "slot held"
BATCH_FORMED = "batch formed"
EXECUTE = "execute"
SEQUENCE_SLOT = "sequence slot"
ENCODE = "encode"
OUTCOME = "outcome"

Attributes = Mapping[str, str | int | float | bool]

_ids = itertools.count(1)  # Triton's trace ids: one counter for the process, a child's id after its parent's


@dataclass(frozen=True)
class TraceContext:
    """What the transport says about a request's trace: its frontend ("GRPC"; "" for a call from inside the server)
    and the client's W3C `traceparent` / `tracestate` headers ("" when not sent)."""

    frontend: str = ""
    traceparent: str = ""
    tracestate: str = ""


@dataclass(frozen=True)
class RemoteParent:
    """A valid W3C traceparent: the client's trace id and span id, its flags, and its tracestate as sent."""

    trace_id: int
    span_id: int
    flags: int
    tracestate: str = ""


_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


def parse_traceparent(traceparent: str, tracestate: str = "") -> RemoteParent | None:
    """The W3C Trace Context `traceparent` header read (version 00, or a later version's first four fields), or
    None when it is absent or invalid (all-zero ids, version ff, bad hex): an invalid header starts a new trace, as
    the W3C spec says a receiver must."""
    match = _TRACEPARENT.match(traceparent.strip().lower())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    parsed = RemoteParent(int(trace_id, 16), int(span_id, 16), int(flags, 16), tracestate.strip())
    if parsed.trace_id == 0 or parsed.span_id == 0:
        return None
    return parsed


class Span(NamedTuple):
    """A phase of a request: its name, its steady-clock start and end, what it says. (NamedTuples: a traced request
    makes a dozen records, and a frozen dataclass costs several times a tuple to build.)"""

    name: str
    start_ns: int
    end_ns: int
    attributes: Attributes


class Event(NamedTuple):
    """A moment of a request: its name, its steady-clock time, what it says."""

    name: str
    ns: int
    attributes: Attributes


class TensorRecord(NamedTuple):
    """One tensor as Triton's TENSORS level writes it: the activity, the tensor's name, datatype and shape, and its
    values as text (Triton's: comma-separated numbers, 1/0 for BOOL, each BYTES element quoted; FP16/BF16 empty)."""

    activity: str
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: str


def tensor_text(array: np.ndarray, datatype: str) -> str:
    """A tensor's values as Triton's trace writes them (see TensorRecord)."""
    if datatype in ("FP16", "BF16"):
        return ""
    values = np.asarray(array).reshape(-1).tolist()
    if datatype == "BYTES":
        return ",".join(
            '"' + (value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)) + '"'
            for value in values
        )
    if datatype == "BOOL":
        return ",".join("1" if value else "0" for value in values)
    if datatype in ("FP32", "FP64"):
        return ",".join(format(value, "g") for value in values)
    return ",".join(str(value) for value in values)


class TraceSink(Protocol):
    """Where finished trace trees go (service/process/trace_output.py: Triton's trace files, OTLP export)."""

    def emit(self, trace: RequestTrace) -> None:
        """A finished root trace, its children finished too. Called on the request's (or its last child's) thread:
        must not block on the network or the disk for long (queue, then write elsewhere)."""
        ...


class _NoSink:
    def emit(self, trace: RequestTrace) -> None:
        return None


class _Tree:
    """The bookkeeping shared by a root trace and its children: how many are still open, under one leaf lock."""

    __slots__ = ("lock", "open", "emitted")

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards: open, emitted, and every trace's `children` list of this tree
        self.open = 1  # the root
        self.emitted = False


class RequestTrace:
    """One sampled request's record (see the module docstring). Made by `Tracer.start` or `child`; ended once by
    `finish`. Its `id` is Triton's numeric trace id (process-wide, increasing); `parent` is the calling request's
    trace for an ensemble step or a BLS call."""

    __slots__ = (
        "id",
        "model",
        "version",
        "request_id",
        "sampled",
        "parent",
        "remote",
        "frontend",
        "timestamps",
        "spans",
        "events",
        "children",
        "tensors",
        "attributes",
        "outcome",
        "error_reason",
        "error_message",
        "finished",
        "granted_ns",
        "model_ns",
        "_sink",
        "_tree",
    )

    def __init__(
        self,
        model: str,
        sampled: Sampled,
        sink: TraceSink,
        *,
        request_id: str = "",
        parent: RequestTrace | None = None,
        remote: RemoteParent | None = None,
        frontend: str = "",
        started_ns: int | None = None,
    ) -> None:
        self.id = next(_ids)
        self.model = model
        self.version = ""
        self.request_id = request_id
        self.sampled = sampled
        self.parent = parent
        self.remote = remote
        self.frontend = frontend
        self.timestamps: list[tuple[str, int]] = [
            (REQUEST_START, time.perf_counter_ns() if started_ns is None else started_ns)
        ]
        self.spans: list[Span] = []
        self.events: list[Event] = []
        self.children: list[RequestTrace] = []
        self.tensors: list[TensorRecord] = []  # only at the TENSORS level
        self.attributes: dict[str, str | int | float | bool] = {}
        self.outcome = ""
        self.error_reason = ""
        self.error_message = ""
        self.finished = False
        self.granted_ns = 0  # when its slot (or its batch's run) was granted: the slot held span's start
        self.model_ns = 0  # how long the model's own code ran, where a backend reports it (`model_ran`)
        self._sink = sink
        self._tree: _Tree = _Tree() if parent is None else parent._tree

    @property
    def mode(self) -> TraceMode:
        return self.sampled.settings.mode

    @property
    def wants_tensors(self) -> bool:
        """Whether its settings' level includes TENSORS (its inputs and outputs are recorded)."""
        return TraceLevel.TENSORS in self.sampled.settings.levels

    def record_tensors(self, activity: str, arrays: Mapping[str, object], datatypes: Mapping[str, str]) -> None:
        """Record `arrays` (name -> numpy array; others are skipped) under `activity`, each as Triton writes it."""
        for name, array in arrays.items():
            if isinstance(array, np.ndarray):
                datatype = datatypes.get(name, "")
                shape = tuple(int(d) for d in array.shape)
                self.tensors.append(TensorRecord(activity, name, datatype, shape, tensor_text(array, datatype)))

    @property
    def root(self) -> RequestTrace:
        trace = self
        while trace.parent is not None:
            trace = trace.parent
        return trace

    # ---- recording (the request's own threads) ---------------------------------------------------------------

    def stamp(self, activity: str, ns: int | None = None) -> None:
        """One of Triton's activities at `ns` (default: now)."""
        self.timestamps.append((activity, time.perf_counter_ns() if ns is None else ns))

    def span(self, name: str, start_ns: int, end_ns: int, **attributes: str | int | float | bool) -> None:
        self.spans.append(Span(name, start_ns, end_ns, attributes))

    def event(self, name: str, ns: int | None = None, **attributes: str | int | float | bool) -> None:
        self.events.append(Event(name, time.perf_counter_ns() if ns is None else ns, attributes))

    def timestamp(self, activity: str) -> int | None:
        """The last time `activity` was stamped, or None."""
        for name, ns in reversed(self.timestamps):
            if name == activity:
                return ns
        return None

    def queued(self, queue_length: int, model_ready: bool) -> int:
        """The request arrives at its model's admission: QUEUE_START, with the queue it found (tickets waiting
        then: its place in the FIFO) and whether the model was loaded. Returns the time, for `admitted`."""
        now = time.perf_counter_ns()
        self.stamp(QUEUE_START, now)
        self.attributes["queue.position_at_arrival"] = queue_length
        self.attributes["model.ready_at_arrival"] = model_ready
        return now

    def admitted(
        self,
        queued_ns: int,
        error: BaseException | None = None,
        *,
        loaded: bool = False,
        admission_ns: int | None = None,
    ) -> int:
        """Admission answered (granted, or refused with `error`): the admission wait's span, from `queued_ns` for
        `admission_ns` (the admission's own measure of the wait, its ticket's arrival to its grant; None: up to now),
        and, when the model was loaded meanwhile (`loaded`: it was not ready as the request arrived), the
        initialization the request waited for: from the grant to now (the load, by this request or another, and
        taking a context). Returns now (the slot's grant as the lease holds it)."""
        now = time.perf_counter_ns()
        granted = now if admission_ns is None else min(now, queued_ns + max(0, admission_ns))
        attributes: dict[str, str | int | float | bool] = {"wait_ns": granted - queued_ns}
        if error is not None:
            attributes["refused"] = type(error).__name__
        self.span(ADMISSION_WAIT, queued_ns, granted, **attributes)
        if loaded and error is None:
            self.span(INITIALIZATION, granted, now, waited=True)
        self.granted_ns = now
        return now

    def computed(
        self,
        compute_start: int,
        input_end: int,
        output_start: int,
        compute_end: int,
        **execute: str | int | float | bool,
    ) -> None:
        """A run's compute: Triton's four compute activities, the execute span (the engine call: for a python model
        the worker's round trip, with the model's own execute time as its `model_ns` attribute) and the slot held
        (from its grant to `compute_end`, when the slot was given back)."""
        if self.model_ns:
            execute["model_ns"] = self.model_ns
        self.timestamps.extend(
            (
                (COMPUTE_START, compute_start),
                (COMPUTE_INPUT_END, input_end),
                (COMPUTE_OUTPUT_START, output_start),
                (COMPUTE_END, compute_end),
            )
        )
        self.span(EXECUTE, input_end, output_start, **execute)
        if self.granted_ns:
            self.span(SLOT_HELD, self.granted_ns, compute_end)

    def model_ran(self, nanoseconds: int) -> None:
        """engine.interface.TraceHook: the backend measured the model's own code (a python model's execute, in its
        worker); recorded on the execute span."""
        self.model_ns = nanoseconds

    def set_version(self, version: str) -> None:
        self.version = version

    # ---- children (any thread) ---------------------------------------------------------------------------------

    def child(self, model: str, request_id: str = "", *, kind: str) -> RequestTrace | None:
        """A trace for a request this one makes (`kind`: "ensemble step" or "bls"), sampled with it (under its
        settings) and ended by its own `finish`; None when this tree was already handed to its sink (a call made
        after the request ended is not recorded)."""
        tree = self._tree
        with tree.lock:
            if tree.emitted:
                return None
            tree.open += 1
            trace = RequestTrace(
                model, Sampled(model, self.sampled.settings), self._sink, request_id=request_id, parent=self
            )
            trace.attributes["call"] = kind
            self.children.append(trace)
        return trace

    # ---- the end ------------------------------------------------------------------------------------------

    def finish(self, outcome: str = "success", error: BaseException | None = None, ns: int | None = None) -> None:
        """The request ended (REQUEST_END) with `outcome` (the statistics' word: success, or the refusal's or
        failure's reason) and its error; idempotent. Hands the tree to the sink when nothing of it is open."""
        if self.finished:
            return
        self.finished = True
        end = time.perf_counter_ns() if ns is None else ns
        self.stamp(REQUEST_END, end)
        self.outcome = outcome
        if error is not None:
            self.error_reason = outcome  # the reason word the client's ErrorInfo and the statistics have
            self.error_message = str(error)
        self.event(OUTCOME, end, outcome=outcome, **({"error_reason": self.error_reason} if error is not None else {}))
        tree = self._tree
        with tree.lock:
            tree.open -= 1
            done = tree.open == 0 and not tree.emitted
            if done:
                tree.emitted = True
        if done:
            self._sink.emit(self.root)

    def walk(self) -> list[RequestTrace]:
        """This trace and its descendants, parents before children (read once the tree was emitted)."""
        found = [self]
        for child in self.children:
            found.extend(child.walk())
        return found


class Tracer:
    """The dataplane's one decision per request: a `RequestTrace`, or None (not traced), and where traces go.

    `any_on` is one attribute read (the store's); `start` is called only when it is True or the request has a
    traced parent."""

    def __init__(self, store: TraceSettingsStore, sink: TraceSink | None = None) -> None:
        self.store = store
        self.sink: TraceSink = sink if sink is not None else _NoSink()

    @property
    def any_on(self) -> bool:
        return self.store.any_on

    def start(
        self,
        model: str,
        request_id: str,
        context: TraceContext | None,
        parent: RequestTrace | None,
        started_ns: int,
        *,
        kind: str = "bls",
    ) -> RequestTrace | None:
        """The trace of a request to `model` that began at `started_ns`: a child of `parent` (an ensemble step's or a
        BLS call's caller was traced: always traced with it), else sampled by the model's settings (rate, count);
        in opentelemetry mode a request with a valid client `traceparent` is traced whatever the rate and count, as
        Triton 2.51 does (its docs: context propagation). None: not traced."""
        if parent is not None:
            trace = parent.child(model, request_id, kind=kind)
            if trace is not None:
                trace.timestamps[0] = (REQUEST_START, started_ns)
            return trace
        sampled = self.store.sample(model)
        remote = None
        if context is not None and context.traceparent:
            remote = parse_traceparent(context.traceparent, context.tracestate)
            if sampled is None and remote is not None:
                settings = self.store.settings(model)
                if settings.mode is TraceMode.OPENTELEMETRY and settings.levels and settings.rate != 0:
                    sampled = Sampled(model, settings)
        if sampled is None:
            return None
        frontend = context.frontend if context is not None else ""
        return RequestTrace(
            model, sampled, self.sink, request_id=request_id, remote=remote, frontend=frontend, started_ns=started_ns
        )


def tracing_off() -> Tracer:
    """A tracer that never traces (a dataplane built without trace settings)."""
    return Tracer(TraceSettingsStore(TraceSettings()))


__all__ = [
    "ACTIVITIES",
    "Event",
    "RemoteParent",
    "RequestTrace",
    "Span",
    "TraceContext",
    "TraceSink",
    "Tracer",
    "parse_traceparent",
    "tracing_off",
]
