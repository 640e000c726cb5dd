"""The records that cross a front end's link (service/frontends/link.py), one frozen dataclass per kind.

Who sends what:

* admission -> front end: `FrontendConfig` (first, once), `Readiness` (whenever health changes), `Reply` and
  `CallEnd` (a call's answers and its status), `Credit` (a stream's messages were taken), `StopListening`,
  `Exit`;
* front end -> admission: `Started` or `StartFailed` (once, after the config), `CallStart` (or, for a ModelInfer
  the front end decoded, `InferCall`), `CallMessage`,
  `CallHalfClose`, `CallCancel`, `ReplyWritten`.

A call is named by `call_id`, unique on its link (the front end counts them). Payloads are a message's serialized
bytes, exactly as gRPC carried them: the admission process (de)serializes them with the servicer's own
(de)serializers, so a forwarded call runs the very code a direct one runs.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

Metadata = tuple[tuple[str, str | bytes], ...]


@dataclass(frozen=True)
class TlsMaterial:
    """The server's TLS files, read and checked once by the admission process (service/transport/tls.py)."""

    private_key: bytes
    certificate: bytes
    client_ca: bytes | None  # set: mutual TLS, every client must present a certificate signed by it


@dataclass(frozen=True)
class FrontendConfig:
    """What a front end serves: the address (the port the admission process reserved), gRPC's settings, TLS."""

    index: int
    address: str  # host:port to bind, with SO_REUSEPORT
    grpc_arguments: tuple[tuple[str, int], ...]  # grpc.server options (message limits, keepalive, ...)
    concurrent_rpcs: int  # maximum_concurrent_rpcs
    max_workers: int  # handler threads kept
    reflection: bool
    tls: TlsMaterial | None
    serving: bool  # the health the front end starts with
    parent_pid: int  # the admission process: a front end whose parent changed exits


@dataclass(frozen=True)
class Started:
    """The front end serves on the address (its listener is open)."""

    index: int
    pid: int


@dataclass(frozen=True)
class StartFailed:
    """The front end could not serve (the address could not be bound); it exits after sending this."""

    index: int
    error: str


@dataclass(frozen=True)
class Readiness:
    """health.v1's status for every service (SERVING when true) as the admission process says it."""

    serving: bool


@dataclass(frozen=True)
class CallStart:
    """A new call: its method (`/package.Service/Method`), the client's metadata, the time it had left when the
    front end forwarded it (None: no deadline), its peer, and for a unary call its request."""

    call_id: int
    method: str
    metadata: Metadata
    time_remaining: float | None
    peer: str
    request: bytes | None  # None: a client stream; its messages follow as CallMessage


@dataclass(frozen=True)
class CallMessage:
    """One message of a client stream."""

    call_id: int
    payload: bytes


@dataclass(frozen=True)
class CallHalfClose:
    """The client sent its last message."""

    call_id: int


@dataclass(frozen=True)
class CallCancel:
    """The RPC ended in the front end before its status came (client cancel, deadline, disconnect, the front end's
    own stop): the admission process cancels the call."""

    call_id: int


@dataclass(frozen=True)
class Credit:
    """The admission process took `count` more messages of a client stream: the front end may send that many more
    (the stream's backpressure crosses the link)."""

    call_id: int
    count: int


@dataclass(frozen=True)
class Reply:
    """One response message of a call."""

    call_id: int
    payload: bytes


@dataclass(frozen=True)
class ReplyWritten:
    """The front end handed a stream's response to gRPC (the client took it): the admission process's handler may
    make the next one (its write timeout covers the wait)."""

    call_id: int


@dataclass(frozen=True)
class Placed:
    """Where a tensor's bytes are in its record's shared-memory segment."""

    offset: int
    nbytes: int


@dataclass(frozen=True)
class SegmentName:
    """A shared-memory segment (engine/python/transport.py's Segment): the receiver maps it, then unlinks it."""

    path: str
    size: int


@dataclass(frozen=True)
class Tensor:
    """One tensor's bytes in the raw layout (KServe's: little-endian; BYTES as length-prefixed items), with what
    rebuilds it: its name, protocol datatype (which gives its numpy dtype) and shape."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    # In the frame (a PickleBuffer is pickled as bytes: one copy, into the frame), or in the record's segment.
    data: bytes | pickle.PickleBuffer | Placed


@dataclass(frozen=True)
class InferCall:
    """A ModelInfer the front end decoded (service/frontends/infer.py): `start` as for any call (its request
    None), then the dataplane's fields. `header` is the request message without its tensor contents, read only
    for a model with a response cache (its key covers the outputs' and the request's parameters)."""

    start: CallStart
    model: str
    version: str
    id: str
    parameters: dict[str, object]
    inputs: tuple[Tensor, ...]
    outputs: tuple[str, ...]  # requested outputs; empty: every output
    timeout_us: int
    sequence_parameters: dict[str, tuple[str, object]]
    header: bytes
    segment: SegmentName | None = None  # where the inputs that are Placed are (large requests)


@dataclass(frozen=True)
class InferAnswer:
    """A ModelInfer's answer for the front end to encode: its outputs in the model's output order."""

    model: str
    version: str
    id: str
    outputs: tuple[Tensor, ...]
    segment: SegmentName | None = None  # where the outputs that are Placed are (large answers)


@dataclass(frozen=True)
class CallEnd:
    """The call's status, with a unary call's response (`reply`; one record per unary call). `cancel`: the handler
    cancelled the RPC (grpc.ServicerContext.cancel: a stream write timeout, the shutdown's end): the front end
    cancels it at once, even while its thread is blocked writing."""

    call_id: int
    code: int  # grpc.StatusCode's number
    details: str
    trailing_metadata: Metadata
    cancel: bool = False
    reply: bytes | None = None
    answer: InferAnswer | None = None  # an InferCall's answer (then `reply` is None)


@dataclass(frozen=True)
class StopListening:
    """Shutdown: refuse new calls; calls in progress may run `grace` seconds more before gRPC cancels them."""

    grace: float


@dataclass(frozen=True)
class Exit:
    """Every call has ended: stop within `seconds` and exit."""

    seconds: float


ToFrontend = FrontendConfig | Readiness | Reply | CallEnd | Credit | StopListening | Exit
ToAdmission = Started | StartFailed | CallStart | InferCall | CallMessage | CallHalfClose | CallCancel | ReplyWritten
