"""ModelInferRequest tensors to numpy and numpy back to ModelInferResponse tensors.

Inputs may arrive raw (`raw_input_contents`, what tritonclient sends) or typed (`contents`); never both.
Raw inputs are decoded without copying (`np.frombuffer` over the request's bytes). Outputs are always raw.
Every malformed input raises InvalidRequest naming the input and the problem.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine import datatypes
from engine.interface import MAX_DIMENSION, MAX_ELEMENTS, ModelMetadata
from engine.tensor_codec import TensorDecodeError, decode_raw, encode_raw, element_count
from generated import grpc_service_pb2 as pb

from .errors import InvalidRequest

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


def decode_request(request: pb.ModelInferRequest) -> DecodedRequest:
    """Decode every input and the request parameters. Raises InvalidRequest."""
    raw = request.raw_input_contents
    tensors = request.inputs
    if raw and len(raw) != len(tensors):
        raise InvalidRequest(
            f"raw_input_contents has {len(raw)} entries for {len(tensors)} inputs; send one per input, in order")
    inputs: dict[str, np.ndarray] = {}
    signature: dict[str, tuple[str, tuple[int, ...]]] = {}
    for index, tensor in enumerate(tensors):
        name = tensor.name
        if name in inputs:
            raise InvalidRequest(f"duplicate input '{name}'")
        datatype = tensor.datatype
        if datatype not in datatypes.BY_NAME:
            raise InvalidRequest(
                f"input '{name}' has unknown datatype '{datatype}'; use one of {', '.join(datatypes.NAMES)}")
        shape = _checked_shape(name, tensor.shape)
        if tensor.parameters:
            _check_tensor_parameters(name, tensor.parameters)
        if raw:
            if tensor.HasField("contents"):
                raise InvalidRequest(
                    f"input '{name}' has typed contents while the request uses raw_input_contents; use one or the "
                    "other")
            try:
                array = decode_raw(raw[index], datatype, shape, name)
            except TensorDecodeError as error:
                raise InvalidRequest(str(error)) from None
        elif tensor.HasField("contents"):
            array = _decode_typed(name, datatype, shape, tensor.contents)
        else:
            raise InvalidRequest(f"input '{name}' has no contents (neither raw_input_contents nor contents)")
        inputs[name] = array
        signature[name] = (datatype, shape)
    outputs = _requested_outputs(request)
    return DecodedRequest(inputs, signature, outputs, _timeout_us(request))


def _checked_shape(name: str, dims) -> tuple[int, ...]:
    shape = tuple(dims)
    for dim in shape:
        if dim < 0:
            raise InvalidRequest(f"input '{name}' has a negative dimension in shape {list(shape)}")
        if dim > MAX_DIMENSION:
            raise InvalidRequest(f"input '{name}' has an absurd dimension in shape {list(shape)}")
    if element_count(shape) > MAX_ELEMENTS:
        raise InvalidRequest(f"input '{name}' shape {list(shape)} has more elements than any request may hold")
    return shape


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
                    metadata: ModelMetadata) -> pb.ModelInferResponse:
    """Append `outputs` to `response` as raw contents, in the model's output order, typed as the model
    declares them."""
    tensors = response.outputs
    raw = response.raw_output_contents
    for spec in metadata.outputs:
        array = outputs.get(spec.name)
        if array is None:
            continue
        datatype = spec.datatype
        if datatype != "BYTES":
            dtype = datatypes.numpy_dtype(datatype)
            if array.dtype != dtype:
                array = array.astype(dtype)
        tensor = tensors.add()
        tensor.name = spec.name
        tensor.datatype = datatype
        tensor.shape.extend(array.shape)
        raw.append(encode_raw(array))
    return response
