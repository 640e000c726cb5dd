"""ModelInfer's fast path through a front end: the front end decodes the request and encodes the answer, the
admission process runs the decoded request (the one-GIL part of a request made as small as it can be).

* **Front end** (`infer_call`): parses the request (service/transport/wire.py), decodes it with the very function
  the admission process would use (service/transport/tensors.py `decode_request`: every check, every Triton
  word), and sends an `InferCall`: the request's fields and each input's bytes, typed (messages.py). What it does
  not cover takes the generic path (the request's bytes, decoded in the admission process as with one process):
  tensors in shared memory, typed contents, BYTES inputs, and anything its decoding refuses, so that a refusal is
  made, worded and counted exactly where it always was.
* **Admission process** (`ForwardedInfer`): the same `rpc` wrapper as the servicer's ModelInfer (access check,
  handler budget, CancelToken, error table: service/transport/servicers/common.py), then `Dataplane.infer` with a
  neutral `InferenceRequest` whose tensors (`ForwardedTensors`) are read-only views of the received record (no
  copy) and whose `respond` (`infer_answer`) turns the outputs into an `InferAnswer`: each output cast to its
  declared datatype and copied once, inside the dataplane's accounting as `as_bytes` does.
* **Front end** again (`answer_bytes`): the ModelInferResponse, as `tensors.encoded` + `as_bytes` make it.

The tensors cross in the link's frames (one copy into the socket, none out of it), not in a shared-memory segment:
for the small requests whose CPU this path is for, the frame is the cheaper carrier (no allocation or lifetime to
manage per call); large tensors cost one kernel copy more than a segment would.
"""

from __future__ import annotations

import functools
import logging
import pickle
import time
from typing import Any, NamedTuple

import grpc
import numpy as np

from engine.datatypes import numpy_dtype
from engine.errors import OutOfSharedMemoryError
from engine.interface import CancelToken
from engine.python.transport import ALIGNMENT, Segment
from engine.tensor_codec import encode_raw
from generated import grpc_service_pb2 as pb

from ..core.lifecycle import ModelEntry
from ..request_path.dataplane import Dataplane, DecodedRequest, InferenceRequest, InferenceResponse
from ..request_path.request_info import plain_parameters
from ..transport.servicers.common import AccessGate, CallTracker, client_deadline, rpc
from ..transport.servicers.inference import trace_context
from ..transport.tensors import decode_request
from ..transport.wire import LARGE_MESSAGE_BYTES, InferResponse, parse_infer_request, serialize_infer_response
from .messages import CallStart, InferAnswer, InferCall, Placed, SegmentName, Tensor

_LOG = logging.getLogger("slotserve.frontend")

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
SEGMENT_BYTES = LARGE_MESSAGE_BYTES  # a record whose tensors add up to this or more carries them in shared memory
QUICK_RUN_SECONDS = 0.001  # a model whose mean run takes less may have its ModelInfers run on a link's reader
QUICK_RUNS_SEEN = 8  # ...once it ran this many times
QUICK_CHECK_SECONDS = 0.5  # how long a model's entry and verdict are kept before they are looked up again
MAX_PEEKS = 256  # cached looks at models, at most
# Engines whose run only computes: a link's reader may run their quick models' calls. A python model's execute (or
# a fixture held by a gate) may block on anything, and a reader blocked in a run leaves its link unread (the
# call's own cancel, other calls' cancels, the front end's death) until the run returns.
INLINE_BACKENDS = frozenset({"onnxruntime", "tensorrt"})
SHARED_MEMORY_REGION = "shared_memory_region"  # the parameter naming a tensor's region (transport/shared_memory.py)

# ---- front end ---------------------------------------------------------------------------------------------


def infer_call(start: CallStart, data: bytes) -> InferCall | None:
    """The decoded record of a serialized ModelInferRequest, or None when it takes the generic path (see the
    module docstring). Never raises."""
    try:
        parsed = parse_infer_request(data)
        message = parsed.message
        if not _covered(message, len(parsed.raw_contents)):
            return None
        decoded = decode_request(message, parsed.raw_contents, None)
    except Exception:  # malformed: the generic path refuses it in the admission process, in its words
        return None
    try:
        return _record(start, message, decoded)
    except Exception:  # a case this path does not know: the generic path is always right
        _LOG.exception("front end: a ModelInfer takes the generic path (its record could not be made)")
        return None


def _record(start: CallStart, message: pb.ModelInferRequest, decoded: DecodedRequest) -> InferCall:
    names = list(decoded.signature)
    views = [_raw_view(decoded.inputs[name]) for name in names]
    placed = _placed(views) if sum(view.raw().nbytes for view in views) >= SEGMENT_BYTES else None
    carried: list[pickle.PickleBuffer | Placed] = list(views) if placed is None else list(placed[1])
    inputs = tuple(
        Tensor(name, decoded.signature[name][0], tuple(decoded.signature[name][1]), data)
        for name, data in zip(names, carried, strict=True)
    )
    segment = None
    if placed is not None:
        segment = SegmentName(placed[0].path, placed[0].size)
        placed[0].close()  # the file keeps the bytes until the admission process maps (and unlinks) it
    message.ClearField("raw_input_contents")
    return InferCall(
        start,
        message.model_name,
        message.model_version,
        message.id,
        plain_parameters(message.parameters),
        inputs,
        tuple(decoded.outputs),
        decoded.timeout_us,
        decoded.sequence_parameters,
        message.SerializeToString(),
        segment,
    )


def _raw_view(array: np.ndarray[Any, Any]) -> pickle.PickleBuffer:
    """The array's bytes without a copy (as bytes: a dtype numpy cannot export, such as bfloat16, is viewed as
    uint8 first)."""
    return pickle.PickleBuffer(np.ascontiguousarray(array).reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # numpy exports buffers


def _placed(views: list[pickle.PickleBuffer]) -> tuple[Segment, list[Placed]] | None:
    """The views' bytes written into a new shared-memory segment (reserved: engine/python/transport.py), each at
    an aligned offset; None when the shared-memory file system has no room (the bytes then go in the frame)."""
    offsets = []
    total = 0
    for view in views:
        offsets.append(total)
        total += -(-view.raw().nbytes // ALIGNMENT) * ALIGNMENT
    try:
        segment = Segment.create(max(total, ALIGNMENT))
    except (OutOfSharedMemoryError, OSError):  # no room in /dev/shm: the link carries them instead
        return None
    placed = []
    for view, offset in zip(views, offsets, strict=True):
        raw = view.raw()
        segment.view[offset : offset + raw.nbytes] = raw
        placed.append(Placed(offset, raw.nbytes))
    return segment, placed


def _covered(message: pb.ModelInferRequest, raw_count: int) -> bool:
    """Every input raw (none typed, none in shared memory), none BYTES, no output in shared memory."""
    if raw_count != len(message.inputs):
        return False
    if any(tensor.datatype == "BYTES" or SHARED_MEMORY_REGION in tensor.parameters for tensor in message.inputs):
        return False
    return not any(SHARED_MEMORY_REGION in output.parameters for output in message.outputs)


def answer_bytes(answer: InferAnswer) -> bytes:
    """The ModelInferResponse's wire bytes (small outputs in the message, large ones appended with one copy, as
    service/transport/tensors.py encode_response and as_bytes make them)."""
    message = pb.ModelInferResponse(model_name=answer.model, model_version=answer.version, id=answer.id)
    segment = Segment.attach(answer.segment.path, answer.segment.size) if answer.segment is not None else None
    try:
        raws: list[bytes | np.ndarray[Any, Any]] = []
        size = 0
        for tensor in answer.outputs:
            message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
            data = tensor.data
            if isinstance(data, Placed):
                assert segment is not None  # a Placed output comes with its segment
                raw: bytes | np.ndarray[Any, Any] = np.frombuffer(segment.view, np.uint8, data.nbytes, data.offset)
            else:
                raw = bytes(data) if isinstance(data, pickle.PickleBuffer) else data
            raws.append(raw)
            size += len(raw)
        if size >= LARGE_MESSAGE_BYTES:
            return serialize_infer_response(InferResponse(message, raws))  # one copy, out of the segment
        message.raw_output_contents.extend(bytes(raw) for raw in raws)
        return message.SerializeToString()
    finally:
        del raws
        if segment is not None:
            segment.close()


# ---- admission process -------------------------------------------------------------------------------------


class ForwardedTensors:
    """An InferCall's tensors, as the dataplane's RequestTensors: decoded already, rebuilt as read-only views of
    the record's bytes or of its segment (mapped, and its file unlinked, when the call is taken: `attach`)."""

    def __init__(self, call: InferCall, segment: Segment | None = None) -> None:
        self._call = call
        self._segment = segment

    @classmethod
    def attach(cls, call: InferCall) -> ForwardedTensors:
        """Map the call's segment, if it has one, and unlink its file (whatever becomes of the call, no file is
        left). Raises OSError when it is gone."""
        name = call.segment
        return cls(call, Segment.attach(name.path, name.size) if name is not None else None)

    def decoded_bytes(self) -> int:
        return sum(
            tensor.data.nbytes if isinstance(tensor.data, Placed) else len(_data(tensor))
            for tensor in self._call.inputs
        )

    def _array(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        dtype = _dtype(tensor.datatype)
        data = tensor.data
        if isinstance(data, Placed):
            assert self._segment is not None  # a Placed input comes with its segment
            array = np.frombuffer(self._segment.view, dtype, data.nbytes // dtype.itemsize, data.offset)
            array.flags.writeable = False  # as a view of received bytes is
            return array.reshape(tensor.shape)
        return np.frombuffer(_data(tensor), dtype=dtype).reshape(tensor.shape)

    def decode(self) -> DecodedRequest:
        call = self._call
        return DecodedRequest(
            {tensor.name: self._array(tensor) for tensor in call.inputs},
            {tensor.name: (tensor.datatype, tensor.shape) for tensor in call.inputs},
            list(call.outputs),
            call.timeout_us,
            sequence_parameters=dict(call.sequence_parameters),
        )

    def answer_key(self, decoded: DecodedRequest, version: str) -> bytes:
        from ..request_path.response_cache import request_key  # only a caching model needs it

        return request_key(pb.ModelInferRequest.FromString(self._call.header), decoded, version)


def _data(tensor: Tensor) -> bytes:
    data = tensor.data
    assert not isinstance(data, Placed)
    return data if isinstance(data, bytes) else bytes(data)


def infer_answer(response: InferenceResponse) -> InferAnswer:
    """`respond` of a forwarded ModelInfer: the outputs in the model's order, cast to their declared datatypes
    and copied (the engine may reuse its buffers once the slot is released)."""
    declared_outputs: list[tuple[str, str, tuple[int, ...]]] = []
    contents: list[bytes | np.ndarray[Any, Any]] = []
    for declared in response.metadata.outputs:
        array = response.outputs.get(declared.name)
        if array is None:
            continue
        if declared.datatype == "BYTES":
            contents.append(encode_raw(array))
        else:
            wanted = _dtype(declared.datatype)
            contents.append(np.ascontiguousarray(array if array.dtype == wanted else array.astype(wanted)))
        declared_outputs.append((declared.name, declared.datatype, tuple(array.shape)))
    carried: list[bytes | Placed] | None = None
    segment = None
    if sum(len(content) if isinstance(content, bytes) else content.nbytes for content in contents) >= SEGMENT_BYTES:
        views = [pickle.PickleBuffer(_bytes_view(content)) for content in contents]  # type: ignore[arg-type]  # numpy exports buffers
        placed = _placed(views)
        if placed is not None:  # copied into the segment (the front end serializes out of it: one copy more)
            carried = list(placed[1])
            segment = SegmentName(placed[0].path, placed[0].size)
            placed[0].close()
    if carried is None:  # copied here: the engine may reuse its buffers once the slot is released
        carried = [content if isinstance(content, bytes) else content.tobytes() for content in contents]
    outputs = tuple(
        Tensor(name, datatype, shape, data)
        for (name, datatype, shape), data in zip(declared_outputs, carried, strict=True)
    )
    return InferAnswer(response.model, response.version, response.id, outputs, segment)


def _bytes_view(content: bytes | np.ndarray[Any, Any]) -> bytes | np.ndarray[Any, Any]:
    return content if isinstance(content, bytes) else content.reshape(-1).view(np.uint8)


@functools.lru_cache(maxsize=64)
def _dtype(datatype: str) -> np.dtype[Any]:
    return numpy_dtype(datatype)


class _Peek(NamedTuple):
    """ForwardedInfer's cached look at a model (see `_peek`)."""

    entry: ModelEntry
    quick: bool
    until: float  # monotonic


class Taken(NamedTuple):
    """An InferCall taken by the admission process: the record, and its tensors (their segment mapped)."""

    call: InferCall
    tensors: ForwardedTensors


class ForwardedInfer:
    """The admission process's ModelInfer for an InferCall: the servicer's `rpc` wrapper around the dataplane."""

    def __init__(self, access: AccessGate, calls: CallTracker, dataplane: Dataplane) -> None:
        self.access = access  # read by `rpc`, as `calls`
        self.calls = calls
        self._dataplane = dataplane
        # (model, version) as a call names them -> its entry, whether its runs are quick, until when both hold:
        # admits_now's cache (a stale entry is not READY, or not the one the call reaches: the call then queues)
        self._peeks: dict[tuple[str, str], _Peek] = {}

    def admits_now(self, call: InferCall) -> bool:
        """Whether `call` would take a slot at once (a peek, without the model's lock: an answer may be stale by
        the time the call arrives, which then only queues as any call does): its model is READY, not batching,
        quick (`_peek`) and idle (no slot held, nothing queued), and the call is not part of a sequence. Called
        by the links' readers. Never raises."""
        if call.sequence_parameters:
            return False
        peek = self._peek(call.model, call.version)
        if peek is None or not peek.quick:
            return False
        entry = peek.entry
        return entry.is_ready() and not entry.batches and entry.admission.core.idle

    def _peek(self, model: str, version: str) -> _Peek | None:
        """The entry a call of `model` and `version` reaches and whether its runs have been quick (an engine of
        INLINE_BACKENDS, mean compute time under QUICK_RUN_SECONDS over at least QUICK_RUNS_SEEN runs: a model never
        seen run is not), looked
        up at most every QUICK_CHECK_SECONDS; None for a name the registry does not serve. Two readers racing
        here only look up twice."""
        now = time.monotonic()
        key = (model, version)
        known = self._peeks.get(key)
        if known is not None and now < known.until:
            return known
        try:
            entry = self._dataplane.resolve(model, version)
        except Exception:  # unknown model, no ready version: the handed-off run refuses it in its words
            return None
        snapshot = entry.statistics.snapshot()
        ran = snapshot.compute_infer.count
        spent = snapshot.compute_input.ns + snapshot.compute_infer.ns + snapshot.compute_output.ns
        quick = (
            entry.spec.backend in INLINE_BACKENDS and ran >= QUICK_RUNS_SEEN and spent < ran * QUICK_RUN_SECONDS * 1e9
        )
        peek = _Peek(entry, quick, now + QUICK_CHECK_SECONDS)
        if len(self._peeks) >= MAX_PEEKS:  # names and version spellings clients send: bounded
            self._peeks.clear()
        self._peeks[key] = peek
        return peek

    def take(self, call: InferCall) -> Taken:
        """The call with its tensors (its segment mapped and unlinked). Raises OSError when the segment is gone."""
        return Taken(call, ForwardedTensors.attach(call))

    @rpc(inference=True)
    def ModelInfer(self, taken: Taken, context: grpc.ServicerContext, token: CancelToken) -> InferAnswer:
        call = taken.call
        request = InferenceRequest(
            model=call.model,
            version=call.version,
            id=call.id,
            tensors=taken.tensors,
            respond=infer_answer,
            client_deadline=client_deadline(context),
            parameters=call.parameters,
        )
        if self._dataplane.tracing_on:  # the trace headers are read only while some request may be traced
            request.trace_context = trace_context(context)
        return self._dataplane.infer(request, cancel=token)
