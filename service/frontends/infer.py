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
from typing import Any

import grpc
import numpy as np

from engine.datatypes import numpy_dtype
from engine.interface import CancelToken
from engine.tensor_codec import encode_raw
from generated import grpc_service_pb2 as pb

from ..request_path.dataplane import Dataplane, DecodedRequest, InferenceRequest, InferenceResponse
from ..request_path.request_info import plain_parameters
from ..transport.servicers.common import AccessGate, CallTracker, client_deadline, rpc
from ..transport.servicers.inference import trace_context
from ..transport.tensors import decode_request
from ..transport.wire import LARGE_MESSAGE_BYTES, InferResponse, parse_infer_request, serialize_infer_response
from .messages import CallStart, InferAnswer, InferCall, Tensor

_LOG = logging.getLogger("slotserve.frontend")

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
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
    inputs = tuple(
        Tensor(name, datatype, tuple(shape), _raw_view(decoded.inputs[name]))
        for name, (datatype, shape) in decoded.signature.items()
    )
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
    )


def _raw_view(array: np.ndarray[Any, Any]) -> pickle.PickleBuffer:
    """The array's bytes without a copy (as bytes: a dtype numpy cannot export, such as bfloat16, is viewed as
    uint8 first)."""
    return pickle.PickleBuffer(np.ascontiguousarray(array).reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # numpy exports buffers


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
    raws: list[bytes] = []
    size = 0
    for tensor in answer.outputs:
        message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        data = bytes(tensor.data) if isinstance(tensor.data, pickle.PickleBuffer) else tensor.data
        raws.append(data)
        size += len(data)
    if size >= LARGE_MESSAGE_BYTES:
        return serialize_infer_response(InferResponse(message, list(raws)))
    message.raw_output_contents.extend(raws)
    return message.SerializeToString()


# ---- admission process -------------------------------------------------------------------------------------


class ForwardedTensors:
    """An InferCall's tensors, as the dataplane's RequestTensors: decoded already, rebuilt as read-only views."""

    def __init__(self, call: InferCall) -> None:
        self._call = call

    def decoded_bytes(self) -> int:
        return sum(len(_data(tensor)) for tensor in self._call.inputs)

    def decode(self) -> DecodedRequest:
        call = self._call
        return DecodedRequest(
            {
                tensor.name: np.frombuffer(_data(tensor), dtype=_dtype(tensor.datatype)).reshape(tensor.shape)
                for tensor in call.inputs
            },
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
    return data if isinstance(data, bytes) else bytes(data)


def infer_answer(response: InferenceResponse) -> InferAnswer:
    """`respond` of a forwarded ModelInfer: the outputs in the model's order, cast to their declared datatypes
    and copied (the engine may reuse its buffers once the slot is released)."""
    outputs = []
    for declared in response.metadata.outputs:
        array = response.outputs.get(declared.name)
        if array is None:
            continue
        if declared.datatype == "BYTES":
            data = encode_raw(array)
        else:
            wanted = _dtype(declared.datatype)
            if array.dtype != wanted:
                array = array.astype(wanted)
            data = np.ascontiguousarray(array).tobytes()
        outputs.append(Tensor(declared.name, declared.datatype, tuple(array.shape), data))
    return InferAnswer(response.model, response.version, response.id, tuple(outputs))


@functools.lru_cache(maxsize=64)
def _dtype(datatype: str) -> np.dtype[Any]:
    return numpy_dtype(datatype)


class ForwardedInfer:
    """The admission process's ModelInfer for an InferCall: the servicer's `rpc` wrapper around the dataplane."""

    def __init__(self, access: AccessGate, calls: CallTracker, dataplane: Dataplane) -> None:
        self.access = access  # read by `rpc`, as `calls`
        self.calls = calls
        self._dataplane = dataplane

    @rpc(inference=True)
    def ModelInfer(self, call: InferCall, context: grpc.ServicerContext, token: CancelToken) -> InferAnswer:
        request = InferenceRequest(
            model=call.model,
            version=call.version,
            id=call.id,
            tensors=ForwardedTensors(call),
            respond=infer_answer,
            client_deadline=client_deadline(context),
            parameters=call.parameters,
        )
        if self._dataplane.tracing_on:  # the trace headers are read only while some request may be traced
            request.trace_context = trace_context(context)
        return self._dataplane.infer(request, cancel=token)
