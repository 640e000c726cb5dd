"""ModelInferRequest tensors to numpy and numpy back to ModelInferResponse tensors.

Inputs may arrive raw (`raw_input_contents`, what tritonclient sends) or typed (`contents`); never both.
Raw inputs are decoded without copying (`np.frombuffer` over the request's bytes). Outputs are always raw.
Every malformed input raises InvalidRequest naming the input and the problem.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine import datatypes
from engine.interface import MAX_DIMENSION, MAX_ELEMENTS, ModelMetadata
from engine.tensor_codec import TensorDecodeError, decode_raw, encode_raw, element_count
from generated import grpc_service_pb2 as pb

from .errors import InvalidRequest
from .wire import LARGE_MESSAGE_BYTES, InferResponse

_TYPED_FIELDS = ("bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents",
                 "fp32_contents", "fp64_contents", "bytes_contents")
_UNSUPPORTED_PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


@dataclass
class DecodedRequest:
    inputs: dict[str, np.ndarray]
    signature: dict[str, tuple[str, tuple[int, ...]]]  # name -> (datatype, shape), for ModelMetadata.check_request
    outputs: list[str]  # requested output names; empty = all
    timeout_us: int  # the request's `timeout` parameter; 0 = none

    def batch_size(self, metadata: ModelMetadata) -> int:
        if metadata.max_batch_size > 0:
            for _, shape in self.signature.values():
                if shape:
                    return shape[0]
        return 1


def decode_request(request: pb.ModelInferRequest, raw_contents=None) -> DecodedRequest:
    """Decode every input and the request parameters. `raw_contents` (buffers, one per input) replaces the
    message's own raw_input_contents when the wire layer kept them out of it. Raises InvalidRequest."""
    raw = request.raw_input_contents if raw_contents is None else raw_contents
    tensors = request.inputs
    count = len(tensors)
    if raw and len(raw) != count:
        raise InvalidRequest(
            f"raw_input_contents has {len(raw)} entries for {count} inputs; send one per input, in order")
    inputs: dict[str, np.ndarray] = {}
    signature: dict[str, tuple[str, tuple[int, ...]]] = {}
    for index in range(count):
        tensor = tensors[index]
        name = tensor.name
        if name in inputs:
            raise InvalidRequest(f"duplicate input '{name}'")
        datatype = tensor.datatype
        if datatype not in datatypes.BY_NAME:
            raise InvalidRequest(
                f"input '{name}' has unknown datatype '{datatype}'; use one of {', '.join(datatypes.NAMES)}")
        shape = tuple(tensor.shape)
        elements = _checked_elements(name, shape)
        if tensor.parameters:
            _check_tensor_parameters(name, tensor.parameters)
        if raw:
            if tensor.HasField("contents"):
                raise InvalidRequest(
                    f"input '{name}' has typed contents while the request uses raw_input_contents; use one or the "
                    "other")
            buffer = raw[index]
            dtype = _FIXED_SIZE.get(datatype)
            if dtype is not None:  # the common case, inline: one length check, one zero-copy view
                if len(buffer) != elements * dtype.itemsize:
                    raise InvalidRequest(
                        f"input '{name}': shape {list(shape)} of {datatype} needs {elements * dtype.itemsize} "
                        f"bytes, got {len(buffer)}")
                array = np.frombuffer(buffer, dtype).reshape(shape)
            else:
                try:
                    array = decode_raw(buffer, datatype, shape, name)
                except TensorDecodeError as error:
                    raise InvalidRequest(str(error)) from None
        elif tensor.HasField("contents"):
            array = _decode_typed(name, datatype, shape, tensor.contents)
        else:
            raise InvalidRequest(f"input '{name}' has no contents (neither raw_input_contents nor contents)")
        inputs[name] = array
        signature[name] = (datatype, shape)
    outputs = _requested_outputs(request) if request.outputs else []
    timeout_us = _timeout_us(request) if request.parameters else 0
    return DecodedRequest(inputs, signature, outputs, timeout_us)


# Fixed-size datatypes decoded inline (BF16 and BYTES go through the codec).
_FIXED_SIZE = {name: datatypes.numpy_dtype(name) for name in datatypes.NAMES if name not in ("BF16", "BYTES")}


def _checked_elements(name: str, shape: tuple[int, ...]) -> int:
    """The element count of `shape`; raises InvalidRequest for negative, absurd or oversized shapes."""
    if shape:
        if min(shape) < 0:
            raise InvalidRequest(f"input '{name}' has a negative dimension in shape {list(shape)}")
        if max(shape) > MAX_DIMENSION:
            raise InvalidRequest(f"input '{name}' has an absurd dimension in shape {list(shape)}")
    elements = math.prod(shape)
    if elements > MAX_ELEMENTS:
        raise InvalidRequest(f"input '{name}' shape {list(shape)} has more elements than any request may hold")
    return elements


def _check_tensor_parameters(name: str, parameters) -> None:
    for key in _UNSUPPORTED_PARAMETERS:
        if key in parameters:
            raise InvalidRequest(
                f"input '{name}' uses shared memory ({key}), which slotserve does not support; send the data in "
                "the request")


def _decode_typed(name: str, datatype: str, shape: tuple[int, ...], contents) -> np.ndarray:
    expected = datatypes.BY_NAME[datatype].contents_field
    if expected is None:
        raise InvalidRequest(f"input '{name}' is {datatype}, which can only be sent in raw_input_contents")
    for field in _TYPED_FIELDS:
        if field != expected and len(getattr(contents, field)):
            raise InvalidRequest(f"input '{name}' is {datatype} and takes {expected}; got {field}")
    values = getattr(contents, expected)
    count = element_count(shape)
    if len(values) != count:
        raise InvalidRequest(
            f"input '{name}' shape {list(shape)} needs {count} elements, {expected} holds {len(values)}")
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    try:
        return np.array(values, dtype=datatypes.numpy_dtype(datatype)).reshape(shape)
    except OverflowError:
        raise InvalidRequest(f"input '{name}': a value in {expected} does not fit {datatype}") from None


def _requested_outputs(request: pb.ModelInferRequest) -> list[str]:
    names = []
    for output in request.outputs:
        if output.name in names:
            raise InvalidRequest(f"output '{output.name}' is requested twice")
        if "classification" in output.parameters:
            raise InvalidRequest(f"output '{output.name}' asks for classification, which slotserve does not do")
        _check_tensor_parameters(output.name, output.parameters)
        names.append(output.name)
    return names


def _timeout_us(request: pb.ModelInferRequest) -> int:
    if "timeout" not in request.parameters:
        return 0
    parameter = request.parameters["timeout"]
    kind = parameter.WhichOneof("parameter_choice")
    if kind not in ("int64_param", "uint64_param"):
        raise InvalidRequest("parameter 'timeout' must be an integer number of microseconds")
    value = getattr(parameter, kind)
    if value < 0:
        raise InvalidRequest(f"parameter 'timeout' must be >= 0 microseconds, got {value}")
    return value


def encode_response(response: pb.ModelInferResponse, outputs: dict[str, np.ndarray],
                    metadata: ModelMetadata):
    """Add `outputs` to `response` as raw contents, in the model's output order, typed as the model declares
    them. Small outputs go into the message (returned); when they add up to LARGE_MESSAGE_BYTES or more, the
    arrays are kept out of it and an InferResponse is returned, which the wire layer serializes with one copy."""
    tensors = response.outputs
    raw = []
    size = 0
    for name, datatype, dtype in _output_plan(metadata):
        array = outputs.get(name)
        if array is None:
            continue
        if dtype is None:
            item = encode_raw(array)
            size += len(item)
        else:
            if array.dtype != dtype:
                array = array.astype(dtype)
            item = array
            size += item.nbytes
        raw.append(item)
        tensors.add(name=name, datatype=datatype, shape=array.shape)
    if size >= LARGE_MESSAGE_BYTES:
        return InferResponse(response, [np.ascontiguousarray(item) if type(item) is np.ndarray else item
                                        for item in raw])
    response.raw_output_contents.extend([item.tobytes() if type(item) is np.ndarray else item for item in raw])
    return response


def _output_plan(metadata: ModelMetadata) -> list[tuple[str, str, np.dtype | None]]:
    """(name, datatype, numpy dtype or None for BYTES) per output, computed once per metadata object."""
    plan = metadata.__dict__.get("_output_plan")
    if plan is None:
        plan = [(t.name, t.datatype, None if t.datatype == "BYTES" else datatypes.numpy_dtype(t.datatype))
                for t in metadata.outputs]
        object.__setattr__(metadata, "_output_plan", plan)
    return plan
