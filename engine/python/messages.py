"""Every message between the server and a python-model worker (engine/python/backend.py <-> worker.py), as typed
records of one vocabulary that both processes import.

Each message is a record (a NamedTuple, or a frozen dataclass inside the rare ones) of a `Kind`; code on either
side reads its fields by name and tells messages apart by their type (`isinstance`, `match`), never by position
or by a string tag. On the pipe (engine/python/transport.py `send`, `receive`) a message travels as a plain tuple,
its kind's number first and its fields in order: pickle writes a NamedTuple as a reference to its class plus its
fields, which costs about 6 microseconds a request both ways on the 2-core test machine, where an add_sub round
trip takes about 150. That tuple is written by the record's own `to_wire` and read by its own `from_wire` (through
`decode`), the only places where positions are known. The common Execute and Done do not travel pickled: they are
packed with `struct` into their lane's control area (`pack_into`, `unpack_from`; the layout is written down above
`_Packer`) and the pipe carries a doorbell (engine/python/transport.py `ring`); a record that is not of the common
kind falls back to its tuple. Records nested inside a message of a request's path (the
requests of an Execute, the results of a Done or a Response, their tensors' Descriptors) travel as plain tuples
too; those inside BLS messages (a CallRequest, a CallReply) travel as themselves.

    kind         direction         record       what
    INIT         server -> worker  Init         the worker's settings: load model.py, auto-complete, initialize
    READY        worker -> server  Ready        the model initialized: its completed configuration, execute's kind
    LOAD_FAILED  worker -> server  LoadFailed   loading model.py or initialize raised (its words)
    EXECUTE      server -> worker  Execute      run the requests laid out in one lane's request segment, one call
    DONE         worker -> server  Done         a call that is not decoupled answered: one Result per request
    FAILED       worker -> server  Failed       a call failed as a whole (execute raised before any response)
    RESPONSE     worker -> server  Response     one response of a decoupled call, in the lane's response segment;
                                                answered with a Reply once the server copied its tensors out
    GROW         worker -> server  Grow         the lane's response segment is too small: answered with a Reply
                                                naming the new one, or GrowRefused
    REPLY        server -> worker  Reply        the answer to the worker's Response or Grow, matched by its tag
    BLS_CALL     worker -> server  BlsCall      a BLS call of a request in flight, run by the server
    BLS_PART     server -> worker  BlsPart      a part of a BLS call's answer (a decoupled callee's, one by one)
    RELEASED     worker -> server  Released     a request the model rescheduled: as a Result of a Done, or, for a
                                                decoupled call, a message of its own (engine/python/rescheduling.py)
    STOP         server -> worker  Stop         run finalize and exit
    METRIC       worker -> server  MetricCall   a custom-metrics operation of the model (pb_utils.MetricFamily,
                                                Metric): answered with a Reply carrying a MetricAnswer

    results (one per request in a Done; one in a Response; a BLS reply's responses):
    TENSORS      Tensors      the response's tensors (Descriptors into a segment)
    ERROR        ErrorResult  a response carrying an error: a TritonCode and the model's words

A *run* is one `execute` call of a worker (its number, unique per worker); a *lane* is one of a worker's requests in
flight at once, each with its own request and response segments and its own words of the cancel board. A worker
serves one lane unless its model overlaps its calls (`async def execute` of a decoupled model: docs/python-models.md).
A *tag* numbers a worker's question (a Response, a Grow, a BlsCall) so that its answer finds the thread waiting.

Two things do not travel here: a request's cancellation is a word of the cancel board, a segment both processes map
(the server writes the run's number there; the model's `is_cancelled()` reads it), and a worker's logs go through
its stdout and stderr, pipes of their own (engine/python/output.py).
"""

from __future__ import annotations

import enum
import struct
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias, TypeVar

from ..datatypes import NAMES


class Kind(enum.IntEnum):
    """What a record is: its number leads its tuple on the wire (`decode` finds the record by it)."""

    INIT = 1
    READY = 2
    LOAD_FAILED = 3
    EXECUTE = 4
    DONE = 5
    FAILED = 6
    RESPONSE = 7
    GROW = 8
    REPLY = 9
    BLS_CALL = 10
    BLS_PART = 11
    RELEASED = 12
    STOP = 13
    TENSORS = 14
    ERROR = 15
    METRIC = 16


# The kinds as plain ints: what the wire carries (pickle writes an enum member as a call to its class).
_INIT = int(Kind.INIT)
_READY = int(Kind.READY)
_LOAD_FAILED = int(Kind.LOAD_FAILED)
_EXECUTE = int(Kind.EXECUTE)
_DONE = int(Kind.DONE)
_FAILED = int(Kind.FAILED)
_RESPONSE = int(Kind.RESPONSE)
_GROW = int(Kind.GROW)
_REPLY = int(Kind.REPLY)
_BLS_CALL = int(Kind.BLS_CALL)
_BLS_PART = int(Kind.BLS_PART)
_RELEASED = int(Kind.RELEASED)
_STOP = int(Kind.STOP)
_TENSORS = int(Kind.TENSORS)
_ERROR = int(Kind.ERROR)
_METRIC = int(Kind.METRIC)

Wire: TypeAlias = tuple[Any, ...]  # a record as the pipe carries it: its kind's number, then its fields

_R = TypeVar("_R")

if TYPE_CHECKING:

    def _new(cls: type[_R], fields: Iterable[Any]) -> _R:
        """A record made from its fields, in order."""

else:
    # NamedTuple's own __new__ is a Python function; tuple's is C: from_wire, on every message of a request's path,
    # makes its records with it.
    _new = tuple.__new__


# ---- tensors and requests -------------------------------------------------------------------------------------


class Descriptor(NamedTuple):
    """Where one tensor lies in a segment (engine/python/transport.py lays tensors out and reads them back)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def descriptors_to_wire(descriptors: Sequence[Descriptor]) -> list[tuple[Any, ...]]:
    """Descriptors as plain tuples (four times cheaper to pickle both ways than the named ones)."""
    return list(map(tuple, descriptors))


def descriptors_from_wire(items: list[tuple[Any, ...]]) -> list[Descriptor]:
    """The Descriptors `descriptors_to_wire` wrote."""
    return [_new(Descriptor, item) for item in items]


class SegmentName(NamedTuple):
    """A shared-memory segment as a message names it: its file (which the receiver maps, then unlinks) and size."""

    path: str
    size: int


class Request(NamedTuple):
    """One inference request as it crosses the pipe, either way: each request of an Execute (server -> worker) and
    the request of a BLS call (worker -> server, in its CallRequest). `inputs` lie in a segment the message names
    (the lane's request segment; the BLS call's own); `outputs` are the requested outputs (empty: all of them)."""

    inputs: Sequence[Descriptor]
    outputs: Sequence[str]
    request_id: str
    correlation_id: int | str
    flags: int
    parameters: Mapping[str, object]

    def to_wire(self) -> Wire:
        """The request as a plain tuple (inside an Execute)."""
        return (list(map(tuple, self.inputs)), self.outputs, self.request_id, self.correlation_id, self.flags,
                self.parameters)  # fmt: skip

    @classmethod
    def from_wire(cls, wire: Wire) -> Request:
        """The request `to_wire` wrote."""
        inputs = [_new(Descriptor, item) for item in wire[0]]
        return _new(cls, (inputs, wire[1], wire[2], wire[3], wire[4], wire[5]))


# ---- results: one per request ----------------------------------------------------------------------------------


class Tensors(NamedTuple):
    """A response's tensors, laid out in a segment (the lane's response segment; a BLS reply's own)."""

    descriptors: Sequence[Descriptor]

    def to_wire(self) -> Wire:
        """The record as the pipe carries it: its kind\'s number, then its fields. Never raises."""
        return (_TENSORS, descriptors_to_wire(self.descriptors))

    @classmethod
    def from_wire(cls, wire: Wire) -> Tensors:
        """The record its `to_wire` wrote."""
        return _new(cls, ([_new(Descriptor, item) for item in wire[1]],))


class ErrorResult(NamedTuple):
    """A response carrying an error: `code` is a TritonCode (engine/python/error_codes.py), `message` the model's
    words (or the server's, for a BLS call that failed)."""

    code: int
    message: str

    def to_wire(self) -> Wire:
        """The record as the pipe carries it: its kind\'s number, then its fields. Never raises."""
        return (_ERROR, int(self.code), self.message)

    @classmethod
    def from_wire(cls, wire: Wire) -> ErrorResult:
        """The record its `to_wire` wrote."""
        return _new(cls, wire[1:])


class Released(NamedTuple):
    """A request the model released with RELEASE_RESCHEDULE (worker -> server; engine/python/rescheduling.py):
    `position` is its place in the call, `flags` the release flags the model set, `run` the call's number. A Result
    of a Done (a call that is not decoupled), or a message of its own (a decoupled call's: the server files it by
    run)."""

    position: int
    flags: int
    run: int = 0

    def to_wire(self) -> Wire:
        """The record as the pipe carries it: its kind\'s number, then its fields. Never raises."""
        return (_RELEASED, *self)

    @classmethod
    def from_wire(cls, wire: Wire) -> Released:
        """The record its `to_wire` wrote."""
        return _new(cls, wire[1:])


Result: TypeAlias = Tensors | ErrorResult | Released  # what the worker sends for one request


# ---- the load ------------------------------------------------------------------------------------------------


class Init(NamedTuple):
    """The first message (server -> worker): the settings the worker loads the model with (backend.py
    start_worker: the model's file and configuration, its instance's names, its segments)."""

    settings: dict[str, Any]

    def to_wire(self) -> Wire:
        """The record as the pipe carries it: its kind\'s number, then its fields. Never raises."""
        return (_INIT, self.settings)

    @classmethod
    def from_wire(cls, wire: Wire) -> Init:
        """The record its `to_wire` wrote."""
        return cls(wire[1])


class Ready(NamedTuple):
    """The worker imported model.py and ran `initialize`: `config` is the completed configuration (JSON), and
    `async_execute` says whether the model's `execute` is a coroutine function (`async def`)."""

    config: str
    async_execute: bool

    def to_wire(self) -> Wire:
        """The record as the pipe carries it: its kind\'s number, then its fields. Never raises."""
        return (_READY, *self)

    @classmethod
    def from_wire(cls, wire: Wire) -> Ready:
        """The record its `to_wire` wrote."""
        return _new(cls, wire[1:])


class LoadFailed(NamedTuple):
    """Importing model.py, auto_complete_config or initialize raised: `message` is "Type: words" of the exception."""

    message: str

    def to_wire(self) -> Wire:
        """The record as the pipe carries it: its kind\'s number, then its fields. Never raises."""
        return (_LOAD_FAILED, self.message)

    @classmethod
    def from_wire(cls, wire: Wire) -> LoadFailed:
        """The record its `to_wire` wrote."""
        return cls(wire[1])


# ---- calls ---------------------------------------------------------------------------------------------------


class Execute(NamedTuple):
    """Run `requests` (their tensors in the lane's request segment) as one execute call numbered `run`, on lane
    `lane`. `segments` names the lane's segments that were replaced since the lane's last call
    ({"request"|"response": its name}), which the worker maps before it reads the requests."""

    run: int
    lane: int
    requests: list[Request]
    segments: dict[str, SegmentName]

    def to_wire(self) -> Wire:
        """The record as the pipe carries it: its kind\'s number, then its fields. Never raises."""
        return (_EXECUTE, self.run, self.lane, [request.to_wire() for request in self.requests], self.segments)

    @classmethod
    def from_wire(cls, wire: Wire) -> Execute:
        """The record its `to_wire` wrote."""
        return _new(cls, (wire[1], wire[2], [Request.from_wire(request) for request in wire[3]], wire[4]))

    def pack_into(self, control: memoryview) -> bool:
        """Write the record into `control` (a lane's control area: the head of its request segment) field by field,
        for the common call: no segment replaced, no request parameters, integer correlation ids. Returns False,
        having written nothing the worker will read, when the record is not of that kind or does not fit (it then
        travels on the pipe, pickled). Never raises."""
        if self.segments:
            return False
        for request in self.requests:
            if request.parameters:
                return False
        try:  # all but the run, and each request less its parameters (none): a shape the lane's last calls had
            shape = (self.lane, *[request[:5] for request in self.requests])
            known = _EXECUTES_WRITTEN.get(shape)
        except TypeError:  # a field that cannot be a key (a list for a tuple): packed the long way
            shape, known = None, None
        if known is None:
            packer = _Packer("qHH", [self.run, self.lane, len(self.requests)], varying=1)
            try:
                for request in self.requests:
                    packer.request(request)
                known = packer.compiled()
            except _NOT_PACKABLE:
                return False
            if shape is not None:
                _remember(_EXECUTES_WRITTEN, shape, known)
        try:
            return _write(control, _EXECUTE, known, (self.run,))
        except _NOT_PACKABLE:
            return False

    @classmethod
    def unpack_from(cls, control: memoryview) -> Execute:
        """The record `pack_into` wrote into `control`. Raises ValueError when `control` holds no packed Execute."""
        values = _unpacked(control, _EXECUTE)
        known = _EXECUTES_READ.get(values[1:])  # all but the run: the lane's last calls were of this shape
        if known is not None:
            return _new(cls, (values[0], known[0], list(known[1]), {}))
        try:
            run, lane, count = values[0], values[1], values[2]
            at = 3
            requests = []
            for _ in range(count):
                request, at = _request_from(values, at)
                requests.append(request)
        except (IndexError, TypeError, UnicodeDecodeError) as error:
            raise ValueError(f"the control area holds no Execute: {error}") from None
        _remember(_EXECUTES_READ, values[1:], (lane, tuple(requests)))
        return _new(cls, (run, lane, requests, {}))


class Done(NamedTuple):
    """A call that is not decoupled answered: one Result per request, in order, the tensors in the lane's response
    segment."""

    run: int
    results: list[Result]
    model_ns: int  # how long the model's execute ran (its coroutine included), for a traced request's execute span

    def to_wire(self) -> Wire:
        """The record as the pipe carries it: its kind\'s number, then its fields. Never raises."""
        return (_DONE, self.run, [result.to_wire() for result in self.results], self.model_ns)

    @classmethod
    def from_wire(cls, wire: Wire) -> Done:
        """The record its `to_wire` wrote."""
        return _new(cls, (wire[1], [_RESULTS[result[0]].from_wire(result) for result in wire[2]], wire[3]))

    def pack_into(self, control: memoryview) -> bool:
        """Write the record into `control` (a lane's control area: the head of its response segment) field by
        field, for the common answer: every result Tensors or an ErrorResult. Returns False, having written nothing
        the server will read, when a result is another (a Released) or the record does not fit (it then travels on
        the pipe, pickled). Never raises."""
        try:  # all but the run and model_ns: a shape the lane's last answers had
            results = tuple(self.results)
            shape: tuple[Any, ...] | None = results
            known = _DONES_WRITTEN.get(results)
        except TypeError:  # a field that cannot be a key (a list for a tuple): packed the long way
            shape, known = None, None
        if known is None:
            packer = _Packer("qqH", [self.run, self.model_ns, len(self.results)], varying=2)
            try:
                for result in self.results:
                    if isinstance(result, Tensors):
                        packer.add("BH", _TENSORS, len(result.descriptors))
                        for descriptor in result.descriptors:
                            packer.descriptor(descriptor)
                    elif isinstance(result, ErrorResult):
                        words = result.message.encode()
                        packer.add(f"Bq{len(words)}s", _ERROR, int(result.code), words)
                    else:
                        return False
                known = packer.compiled()
            except _NOT_PACKABLE:
                return False
            if shape is not None:
                _remember(_DONES_WRITTEN, shape, known)
        try:
            return _write(control, _DONE, known, (self.run, self.model_ns))
        except _NOT_PACKABLE:
            return False

    @classmethod
    def unpack_from(cls, control: memoryview) -> Done:
        """The record `pack_into` wrote into `control`. Raises ValueError when `control` holds no packed Done."""
        values = _unpacked(control, _DONE)
        known = _DONES_READ.get(values[2:])  # all but the run and model_ns: the lane's last answers were of this shape
        if known is not None:
            return _new(cls, (values[0], list(known), values[1]))
        try:
            run, model_ns, count = values[0], values[1], values[2]
            at = 3
            results: list[Result] = []
            for _ in range(count):
                if values[at] == _TENSORS:
                    described = values[at + 1]
                    at += 2
                    descriptors = []
                    for _ in range(described):
                        descriptor, at = _descriptor_from(values, at)
                        descriptors.append(descriptor)
                    results.append(_new(Tensors, (tuple(descriptors),)))
                else:
                    results.append(_new(ErrorResult, (values[at + 1], values[at + 2].decode())))
                    at += 3
        except (IndexError, TypeError, UnicodeDecodeError) as error:
            raise ValueError(f"the control area holds no Done: {error}") from None
        _remember(_DONES_READ, values[2:], tuple(results))
        return _new(cls, (run, results, model_ns))


class Failed(NamedTuple):
    """Call `run` failed as a whole (execute raised before any response, or returned what does not fit the
    requests; a decoupled call: its requests whose final flag was not sent fail): `message` says why."""

    run: int
    message: str

    def to_wire(self) -> Wire:
        """The record as the pipe carries it: its kind\'s number, then its fields. Never raises."""
        return (_FAILED, *self)

    @classmethod
    def from_wire(cls, wire: Wire) -> Failed:
        """The record its `to_wire` wrote."""
        return _new(cls, wire[1:])


class Response(NamedTuple):
    """One response of decoupled call `run` for its request at `position`: `result` (None: the final flag alone),
    its tensors in the lane's response segment; `final` with the final flag. The worker waits for the Reply to
    `tag` (the server copied the tensors out) before it reuses the segment."""

    tag: int
    run: int
    position: int
    result: Tensors | ErrorResult | None
    final: bool

    def to_wire(self) -> Wire:
        """The record as the pipe carries it: its kind\'s number, then its fields. Never raises."""
        result = None if self.result is None else self.result.to_wire()
        return (_RESPONSE, self.tag, self.run, self.position, result, self.final)

    @classmethod
    def from_wire(cls, wire: Wire) -> Response:
        """The record its `to_wire` wrote."""
        result = None if wire[4] is None else _result_from_wire(wire[4])
        return _new(cls, (wire[1], wire[2], wire[3], result, wire[5]))


class Grow(NamedTuple):
    """Call `run`'s response needs `size` bytes, more than its lane's response segment has: the Reply to `tag` is
    the new segment's name, or GrowRefused."""

    tag: int
    run: int
    size: int

    def to_wire(self) -> Wire:
        """The record as the pipe carries it: its kind\'s number, then its fields. Never raises."""
        return (_GROW, *self)

    @classmethod
    def from_wire(cls, wire: Wire) -> Grow:
        """The record its `to_wire` wrote."""
        return _new(cls, wire[1:])


@dataclass(frozen=True, slots=True)
class GrowRefused:
    """The answer to a Grow when the server could not make the larger response segment: the call fails with
    `message` (the server answers its client RESOURCE_EXHAUSTED), the worker and its segments are intact."""

    message: str


# ---- custom metrics (pb_utils.MetricFamily, Metric; the server's registry: service/process/custom_metrics.py) ----


class MetricKind(enum.IntEnum):
    """A family's kind, as Triton numbers them (pb_utils.MetricFamily.COUNTER, GAUGE, HISTOGRAM)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class MetricAction(enum.Enum):
    """What a MetricUpdate does to its metric (each kind allows some: the server refuses the others)."""

    INCREMENT = "increment"
    SET = "set"
    OBSERVE = "observe"


Labels: TypeAlias = tuple[tuple[str, str], ...]  # a metric's labels, (name, value) sorted by name


@dataclass(frozen=True, slots=True)
class FamilyNew:
    """`pb_utils.MetricFamily(name, description, kind)`: make the family, or take the one of that name (its first
    description is kept, as on Triton; another kind is refused)."""

    name: str
    description: str
    kind: MetricKind


@dataclass(frozen=True, slots=True)
class MetricNew:
    """`family.Metric(labels, buckets)`: make the metric of these labels in `family`, or take the one that exists
    (its buckets are kept). `buckets` is None except for a histogram's."""

    family: str
    labels: Labels
    buckets: tuple[float, ...] | None


@dataclass(frozen=True, slots=True)
class MetricUpdate:
    """`metric.increment(value)`, `set(value)` or `observe(value)` on the metric of `labels` in `family`."""

    family: str
    labels: Labels
    action: MetricAction
    value: float


@dataclass(frozen=True, slots=True)
class MetricRead:
    """`metric.value()`: the server's value of the metric of `labels` in `family` (every worker's updates)."""

    family: str
    labels: Labels


MetricOp: TypeAlias = FamilyNew | MetricNew | MetricUpdate | MetricRead


@dataclass(frozen=True, slots=True)
class MetricAnswer:
    """The server's answer to a MetricCall: `error` (empty: done) is the refusal the model's call raises as
    TritonModelException; `value` is a MetricRead's value."""

    value: float = 0.0
    error: str = ""


ReplyPayload: TypeAlias = SegmentName | GrowRefused | MetricAnswer | None


class Reply(NamedTuple):
    """The server's answer to the worker's question `tag`: for a Grow, the new segment's name or
    GrowRefused; for a Response, None."""

    tag: int
    payload: ReplyPayload

    def to_wire(self) -> Wire:
        """The record as the pipe carries it: its kind\'s number, then its fields. Never raises."""
        return (_REPLY, *self)

    @classmethod
    def from_wire(cls, wire: Wire) -> Reply:
        """The record its `to_wire` wrote."""
        return _new(cls, wire[1:])


class MetricCall(NamedTuple):
    """A custom-metrics operation of the model (from initialize, execute, finalize or a thread of its own): the
    server applies it to its registry and answers a Reply to `tag` whose payload is a MetricAnswer."""

    tag: int
    op: MetricOp

    def to_wire(self) -> Wire:
        """The record as the pipe carries it: its kind\'s number, then its fields. Never raises."""
        return (_METRIC, *self)

    @classmethod
    def from_wire(cls, wire: Wire) -> MetricCall:
        """The record its `to_wire` wrote."""
        return _new(cls, wire[1:])


class Stop(NamedTuple):
    """Run `finalize` and exit (server -> worker)."""

    def to_wire(self) -> Wire:
        """The record as the pipe carries it: its kind\'s number, then its fields. Never raises."""
        return (_STOP,)

    @classmethod
    def from_wire(cls, wire: Wire) -> Stop:
        """The record its `to_wire` wrote."""
        return cls()


# ---- BLS calls -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallRequest:
    """A BLS call, worker -> server: the callee, its request, and where the request's inputs lie."""

    model: str
    version: str  # "" for the highest ready version (Triton's model_version -1)
    request: Request
    segment: SegmentName | None  # the inputs' segment; None when there is no input
    decoupled: bool = False  # exec(decoupled=True): every response of the callee
    timeout_us: int = 0  # the request's own timeout (Triton's `timeout`, microseconds); 0: none


@dataclass(frozen=True, slots=True)
class CallReply:
    """A part of a BLS call's answer, server -> worker: its responses in order (an error ends a decoupled
    callee's), and the segment their tensors lie in (None when none has a byte)."""

    responses: tuple[Tensors | ErrorResult, ...]
    segment: SegmentName | None = field(default=None)


class BlsCall(NamedTuple):
    """A BLS call (`InferenceRequest.exec`/`async_exec`) that a request of `run` made: the server runs it with that
    request's deadline and cancellation and answers BlsPart messages of the same `tag`."""

    tag: int
    run: int
    call: CallRequest

    def to_wire(self) -> Wire:
        """The record as the pipe carries it: its kind\'s number, then its fields. Never raises."""
        return (_BLS_CALL, *self)

    @classmethod
    def from_wire(cls, wire: Wire) -> BlsCall:
        """The record its `to_wire` wrote."""
        return _new(cls, wire[1:])


class BlsPart(NamedTuple):
    """A part of the answer to BLS call `tag`: one for an ordinary call (final); for a decoupled one, one per
    response of the callee as it comes, then a final one (or the callee's last response, final)."""

    tag: int
    reply: CallReply
    final: bool

    def to_wire(self) -> Wire:
        """The record as the pipe carries it: its kind\'s number, then its fields. Never raises."""
        return (_BLS_PART, *self)

    @classmethod
    def from_wire(cls, wire: Wire) -> BlsPart:
        """The record its `to_wire` wrote."""
        return _new(cls, wire[1:])


# ---- packed records: an Execute and its Done in a lane's control area (engine/python/transport.py) -----------------
#
# The request's path crosses without pickling: the server packs an Execute into the head of the lane's request
# segment and the worker a Done into the head of its response segment, with `struct`, and the pipe carries only a
# doorbell frame naming the lane (transport.ring). The area holds a head (the record's kind u8, the length u16 of
# the body's format), the body's `struct` format (ASCII), then the body packed by it, little-endian, in one call
# each way: the format spells each string's length and each shape's rank, so reading a record is one unpack and a
# walk through its values. Only Execute.pack_into / unpack_from, Done.pack_into / unpack_from and the helpers below
# know the body's order:
#
#   Execute     run q, lane H, requests H, then each request:
#   request     correlation id Q, flags I, id s, outputs H, each output's name s, inputs H, each input's descriptor
#   descriptor  name s, datatype B (its index in engine/datatypes.py's NAMES), rank B, each dim q, offset Q, nbytes Q
#   Done        run q, model_ns q, results H, then each result: TENSORS B + descriptors H + each descriptor, or
#               ERROR B + code q + message s
#
# (`s` is a string's UTF-8 bytes, their count written in the format.)

_HEAD = struct.Struct("<BH")
# What packing a record that is not of the common kind (or does not fit in the control area) raises on its way.
_NOT_PACKABLE = (struct.error, OverflowError, ValueError, TypeError, UnicodeEncodeError, KeyError)
_DATATYPE_CODES = {name: code for code, name in enumerate(NAMES)}
# The tensor names a process packs, with their part of a format, by (name, rank): a model's few names recur in every
# call. Forgotten all at once past _DESCRIPTORS_KEPT (names that change from call to call cannot grow it).
_DESCRIPTORS: dict[tuple[str, int], tuple[bytes, str]] = {}
_DESCRIPTORS_KEPT = 256
# What a call's records cost to write and read is mostly Python's walk through their fields, and a model's calls
# come in a few shapes (the same inputs, shapes and outputs): each process remembers, per shape, the compiled
# `struct` of a body's format (by its text: _WRITE_FORMATS, _READ_FORMATS) and what a body read back made (by its
# values less those that change every call, the run and model_ns: _EXECUTES_READ, _DONES_READ; the records made
# are shared, so they hold tuples, never lists a reader could change). Each is forgotten all at once past
# _SHAPES_KEPT entries, so shapes that change from call to call cannot grow it.
_WRITE_FORMATS: dict[str, tuple[struct.Struct, bytes]] = {}
_READ_FORMATS: dict[bytes, struct.Struct] = {}
_EXECUTES_READ: dict[tuple[Any, ...], tuple[int, tuple[Request, ...]]] = {}
_DONES_READ: dict[tuple[Any, ...], tuple[Result, ...]] = {}
_EXECUTES_WRITTEN: dict[tuple[Any, ...], _Compiled] = {}
_DONES_WRITTEN: dict[tuple[Any, ...], _Compiled] = {}
_SHAPES_KEPT = 64
_Remembered = TypeVar("_Remembered")
_NO_PARAMETERS: Mapping[str, object] = types.MappingProxyType({})  # a request read back has none: never changed


def _remember(memo: dict[Any, _Remembered], key: Any, value: _Remembered) -> _Remembered:
    """Keep `value` under `key` in `memo` (emptied first when it is full); returns `value`."""
    if len(memo) >= _SHAPES_KEPT:
        memo.clear()
    memo[key] = value
    return value


class _Packer:
    """A record's body as it is packed: its format's parts and its values, written in one `struct` call."""

    __slots__ = ("formats", "values", "varying")

    def __init__(self, head: str, values: list[Any], varying: int) -> None:
        self.formats = ["<", head]
        self.values = values
        self.varying = varying  # how many of the first values change with every record (`compiled`)

    def add(self, fmt: str, *values: Any) -> None:
        self.formats.append(fmt)
        self.values.extend(values)

    def request(self, request: Request) -> None:
        if request.parameters or type(request.correlation_id) is not int:
            raise ValueError("not the common request: parameters, or a string correlation id")
        request_id = request.request_id.encode()
        outputs = [name.encode() for name in request.outputs]
        self.formats.append(f"QI{len(request_id)}sH" + "".join(f"{len(name)}s" for name in outputs) + "H")
        self.values.extend((request.correlation_id, request.flags, request_id, len(outputs), *outputs))
        self.values.append(len(request.inputs))
        for descriptor in request.inputs:
            self.descriptor(descriptor)

    def descriptor(self, descriptor: Descriptor) -> None:
        shape = descriptor.shape
        key = (descriptor.name, len(shape))
        spelled = _DESCRIPTORS.get(key)
        if spelled is None:  # a tensor name and rank not seen lately: its bytes and its part of the format
            name = descriptor.name.encode()
            spelled = _DESCRIPTORS[key] = (name, f"{len(name)}sBB{len(shape)}qQQ")
            if len(_DESCRIPTORS) > _DESCRIPTORS_KEPT:
                _DESCRIPTORS.clear()
        self.formats.append(spelled[1])
        self.values.extend((spelled[0], _DATATYPE_CODES[descriptor.datatype], len(shape), *shape))
        self.values.append(descriptor.offset)
        self.values.append(descriptor.nbytes)

    def compiled(self) -> _Compiled:
        """The body's compiled format, its text, and its values less the `varying` first ones (the run; a Done's
        model_ns too), which `_write` is given apart. Raises struct.error for a value its format refuses (checked
        here, by packing it once, so what is remembered always packs)."""
        fmt = "".join(self.formats)
        compiled = _WRITE_FORMATS.get(fmt)
        if compiled is None:
            compiled = _remember(_WRITE_FORMATS, fmt, (struct.Struct(fmt), fmt.encode()))
        body, spelled = compiled
        body.pack(*self.values)
        return body, spelled, tuple(self.values[self.varying :])


# A record's body ready to write: its compiled format, the format's text, its values less the varying first ones.
_Compiled: TypeAlias = tuple[struct.Struct, bytes, tuple[Any, ...]]


def _write(control: memoryview, kind: int, compiled: _Compiled, varying: tuple[Any, ...]) -> bool:
    """Write a record of `kind` into `control`: the head, the body's format and its values, `varying` first.
    Returns False when they do not fit. Raises struct.error for a varying value its format refuses."""
    body, spelled, rest = compiled
    at = _HEAD.size + len(spelled)
    if at + body.size > len(control):
        return False
    body.pack_into(control, at, *varying, *rest)
    control[_HEAD.size : at] = spelled
    _HEAD.pack_into(control, 0, kind, len(spelled))
    return True


def _unpacked(control: memoryview, kind: int) -> tuple[Any, ...]:
    """The values of the body of the record of `kind` in `control`. Raises ValueError when it holds none."""
    try:
        found, length = _HEAD.unpack_from(control, 0)
        if found != kind:
            raise ValueError(f"the control area holds a record of kind {found}, not of kind {kind}")
        spelled = bytes(control[_HEAD.size : _HEAD.size + length])
        body = _READ_FORMATS.get(spelled)
        if body is None:
            body = _remember(_READ_FORMATS, spelled, struct.Struct(str(spelled, "ascii")))
        return body.unpack_from(control, _HEAD.size + length)
    except (struct.error, UnicodeDecodeError) as error:
        raise ValueError(f"the control area holds no packed record: {error}") from None


def _request_from(values: tuple[Any, ...], at: int) -> tuple[Request, int]:
    correlation_id, flags, request_id, count = values[at : at + 4]
    at += 4
    outputs = tuple(name.decode() for name in values[at : at + count])
    at += count
    count = values[at]
    at += 1
    inputs = []
    for _ in range(count):
        descriptor, at = _descriptor_from(values, at)
        inputs.append(descriptor)
    return _new(Request, (tuple(inputs), outputs, request_id.decode(), correlation_id, flags, _NO_PARAMETERS)), at


def _descriptor_from(values: tuple[Any, ...], at: int) -> tuple[Descriptor, int]:
    name, code, rank = values[at : at + 3]
    end = at + 3 + rank
    fields = (name.decode(), NAMES[code], values[at + 3 : end], values[end], values[end + 1])
    return _new(Descriptor, fields), end + 2


# ---- the wire --------------------------------------------------------------------------------------------------

Message: TypeAlias = (
    Init
    | Ready
    | LoadFailed
    | Execute
    | Done
    | Failed
    | Response
    | Grow
    | Reply
    | Stop
    | BlsCall
    | BlsPart
    | Released
    | MetricCall
)
ToWorker: TypeAlias = Init | Execute | Reply | BlsPart | Stop  # what the server sends
ToServer: TypeAlias = (  # what the worker sends
    Ready | LoadFailed | Done | Failed | Response | Grow | BlsCall | Released | MetricCall
)

_MESSAGES: dict[int, Any] = {
    _INIT: Init,
    _READY: Ready,
    _LOAD_FAILED: LoadFailed,
    _EXECUTE: Execute,
    _DONE: Done,
    _FAILED: Failed,
    _RESPONSE: Response,
    _GROW: Grow,
    _REPLY: Reply,
    _STOP: Stop,
    _BLS_CALL: BlsCall,
    _BLS_PART: BlsPart,
    _RELEASED: Released,
    _METRIC: MetricCall,
}
_RESULTS: dict[int, Any] = {_TENSORS: Tensors, _ERROR: ErrorResult, _RELEASED: Released}


def decode(wire: Wire) -> Message:
    """The message `wire` carries (what a record's `to_wire` wrote). Raises ValueError for a tuple that is none."""
    try:
        record = _MESSAGES[wire[0]]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"not a python-worker message: {wire!r:.200}") from None
    message: Message = record.from_wire(wire)
    return message


def _result_from_wire(wire: Wire) -> Result:
    result: Result = _RESULTS[wire[0]].from_wire(wire)
    return result
