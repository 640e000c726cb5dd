"""numpy arrays to and from inference messages, for InferenceClient.

Inputs always travel as `raw_input_contents` (what tritonclient does, and what every server accepts); outputs are
read from `raw_output_contents` by position, or from typed `contents` when a server sends no raw contents. The
byte layout itself is engine.tensor_codec's: this module only moves arrays in and out of protobuf messages.
Problems raise ClientError: INVALID_ARGUMENT for inputs that cannot be encoded, INTERNAL for a response that
does not decode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

import numpy as np

from engine import datatypes, tensor_codec
from generated import grpc_service_pb2 as pb

from .errors import ClientError

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UINT64_MAX = 2**64 - 1


def build_request(
    model: str,
    inputs: Mapping[str, Any],
    outputs: Iterable[str] | None = None,
    *,
    version: str = "",
    request_id: str = "",
    parameters: Mapping[str, Any] | None = None,
) -> pb.ModelInferRequest:
    """A ModelInferRequest with every input raw. `outputs` None or empty asks for every output."""
    request = pb.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    set_parameters(request.parameters, parameters or {})
    for name, value in inputs.items():
        array = np.asarray(value)
        request.inputs.add(name=name, datatype=datatype_of(name, array), shape=array.shape)
        request.raw_input_contents.append(tensor_codec.encode_raw(array))
    for name in outputs or ():
        request.outputs.add(name=name)
    return request


def datatype_of(name: str, array: np.ndarray) -> str:
    """The KServe datatype of an input array. Raises ClientError(INVALID_ARGUMENT) when none fits."""
    try:
        return datatypes.from_numpy(array.dtype)
    except KeyError:
        raise ClientError(
            "INVALID_ARGUMENT", f"input '{name}': numpy dtype {array.dtype} has no KServe datatype"
        ) from None


def set_parameters(target: MutableMapping[str, pb.InferParameter], parameters: Mapping[str, Any]) -> None:
    """Fill a map<string, InferParameter> from Python values (bool, int, float, str and numpy scalars)."""
    for key, value in parameters.items():
        _set_parameter(target[key], key, value)


def _set_parameter(parameter: pb.InferParameter, key: str, value: Any) -> None:
    # bool first: it is an int subclass.
    if isinstance(value, (bool, np.bool_)):
        parameter.bool_param = bool(value)
    elif isinstance(value, (int, np.integer)):
        _set_int_parameter(parameter, key, int(value))
    elif isinstance(value, (float, np.floating)):
        parameter.double_param = float(value)
    elif isinstance(value, str):
        parameter.string_param = value
    else:
        raise ClientError(
            "INVALID_ARGUMENT", f"parameter '{key}': {type(value).__name__} is not bool, int, float or str"
        )


def _set_int_parameter(parameter: pb.InferParameter, key: str, value: int) -> None:
    if _INT64_MIN <= value <= _INT64_MAX:
        parameter.int64_param = value
    elif _INT64_MAX < value <= _UINT64_MAX:
        parameter.uint64_param = value
    else:
        raise ClientError("INVALID_ARGUMENT", f"parameter '{key}': {value} does not fit in 64 bits")


def decode_response(response: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    """Output arrays by name, in the response's order.

    Raw outputs are read-only views over the response's bytes (as in tritonclient); copy one to modify it.
    BYTES outputs are object arrays of `bytes`.
    """
    raw = response.raw_output_contents
    if raw and len(raw) != len(response.outputs):
        raise ClientError(
            "INTERNAL", f"malformed response: {len(raw)} raw contents for {len(response.outputs)} outputs"
        )
    if raw:
        return {tensor.name: _decode_raw(tensor, raw[index]) for index, tensor in enumerate(response.outputs)}
    return {tensor.name: _decode_typed(tensor) for tensor in response.outputs}


def _decode_raw(tensor: pb.ModelInferResponse.InferOutputTensor, buffer: bytes) -> np.ndarray:
    try:
        return tensor_codec.decode_raw(buffer, tensor.datatype, tuple(tensor.shape), tensor.name)
    except KeyError:
        raise _unknown_datatype(tensor) from None
    except tensor_codec.TensorDecodeError as error:
        raise ClientError("INTERNAL", f"malformed response: {error}") from None


def _decode_typed(tensor: pb.ModelInferResponse.InferOutputTensor) -> np.ndarray:
    kind = datatypes.BY_NAME.get(tensor.datatype)
    if kind is None:
        raise _unknown_datatype(tensor)
    if kind.contents_field is None:
        raise ClientError(
            "INTERNAL",
            f"malformed response: output '{tensor.name}': {kind.name} has no typed "
            "contents and no raw contents were sent",
        )
    values = list(getattr(tensor.contents, kind.contents_field))
    shape = tuple(tensor.shape)
    if len(values) != tensor_codec.element_count(shape):
        raise ClientError(
            "INTERNAL",
            f"malformed response: output '{tensor.name}': shape {list(shape)} holds "
            f"{tensor_codec.element_count(shape)} elements, contents hold {len(values)}",
        )
    try:
        return _typed_array(values, kind.name).reshape(shape)
    except (OverflowError, ValueError) as error:
        raise ClientError("INTERNAL", f"malformed response: output '{tensor.name}': {error}") from None


def _typed_array(values: list[Any], datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array
    return np.array(values, dtype=datatypes.numpy_dtype(datatype))


def _unknown_datatype(tensor: pb.ModelInferResponse.InferOutputTensor) -> ClientError:
    return ClientError(
        "INTERNAL", f"malformed response: output '{tensor.name}' has unknown datatype '{tensor.datatype}'"
    )
