"""ModelInferRequest tensors to numpy and numpy back to ModelInferResponse tensors.

Inputs may arrive raw (`raw_input_contents`, what tritonclient sends) or typed (`contents`); never both in one
request. Raw inputs are decoded without copying (`np.frombuffer` over the request's bytes). Outputs are raw.

With system shared memory (service/transport/shared_memory.py), a tensor may instead name a registered region through
its parameters `shared_memory_region`, `shared_memory_byte_size` and `shared_memory_offset`, as Triton defines them:
such an input has no contents (raw_input_contents holds one entry per *other* input, in order), and is read into
an array of its own (one copy); such a requested output is written into the region (one copy) after the run,
and the response names it (datatype, shape) with an empty raw_output_contents entry, as Triton's does. BYTES
tensors use the protocol's serialized form there too. The decoded request holds a reference to every region it
names until `DecodedRequest.release`.

Every malformed input raises InvalidRequest naming the input and the problem (RegionNotFound for a region name
that is not registered); nothing is written to a region unless every output fits.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

import numpy as np

from engine import datatypes
from engine.interface import MAX_DIMENSION, MAX_ELEMENTS, ModelMetadata
from engine.tensor_codec import (
    BYTES_ELEMENT_COST,
    MAX_RANK,
    TensorDecodeError,
    decode_raw,
    deserialize_bytes,
    encode_raw,
)
from generated import grpc_service_pb2 as pb

from ..core.errors import InvalidRequest
from ..core.sequences import check_parameter_types
from ..request_path.dataplane import DecodedRequest, InferenceRequest, InferenceResponse
from ..request_path.request_info import plain_parameters
from . import wire
from .shared_memory import RegionNotFound, RegionSlice, SharedMemoryRegistry, disabled_message
from .tensor_memory import BYTES_COPIES
from .wire import LARGE_MESSAGE_BYTES, InferResponse

_TYPED_FIELDS = (
    "bool_contents",
    "int_contents",
    "int64_contents",
    "uint_contents",
    "uint64_contents",
    "fp32_contents",
    "fp64_contents",
    "bytes_contents",
)
REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"


R = TypeVar("R")
# raw_input_contents, or the wire layer's views of the received bytes in their place (service/transport/wire.py).
RawContents = Sequence[bytes | memoryview]
Buffer = bytes | memoryview
Tensor = pb.ModelInferRequest.InferInputTensor
Parameters = Mapping[str, pb.InferParameter]  # a tensor's or a request's protobuf parameter map
# An output to write into shared memory: its name, the slice, its contents (raw BYTES or the array), the dtype.
RegionWrite = tuple[str, RegionSlice, bytes | np.ndarray, np.dtype | None]


@dataclass
class MessageTensors:
    """The tensors of a ModelInferRequest, for the dataplane to decode (dataplane.RequestTensors). `raw_contents`
    (buffers, one per input not in shared memory) replaces the message's own raw_input_contents when the wire
    layer kept them out of it (service/transport/wire.py: views of the received bytes, no copy)."""

    message: pb.ModelInferRequest
    raw_contents: RawContents | None = None
    shared_memory: SharedMemoryRegistry | None = None

    def decoded_bytes(self) -> int:
        return decoded_bytes(self.message, self.raw_contents, self.shared_memory)

    def decode(self) -> DecodedRequest:
        return decode_request(self.message, self.raw_contents, self.shared_memory)

    def answer_key(self, decoded: DecodedRequest, version: str) -> bytes:
        from ..request_path.response_cache import request_key  # response_cache imports this module

        return request_key(self.message, decoded, version)


def inference_request(
    message: pb.ModelInferRequest,
    respond: Callable[[InferenceResponse], R],
    raw_contents: RawContents | None = None,
    shared_memory: SharedMemoryRegistry | None = None,
    client_deadline: float | None = None,
) -> InferenceRequest[R]:
    """The dataplane's neutral request for a ModelInferRequest; `respond` is `as_bytes` (ModelInfer) or
    `as_message` (a stream's infer_response)."""
    return InferenceRequest(
        model=message.model_name,
        version=message.model_version,
        id=message.id,
        tensors=MessageTensors(message, raw_contents, shared_memory),
        respond=respond,
        client_deadline=client_deadline,
        parameters=plain_parameters(message.parameters),
    )


def encoded(response: InferenceResponse) -> pb.ModelInferResponse | InferResponse:
    """The ModelInferResponse of an answer (see encode_response: large outputs stay out of the message)."""
    message = pb.ModelInferResponse(model_name=response.model, model_version=response.version, id=response.id)
    return encode_response(message, response.outputs, response.metadata, response.output_regions)


def as_bytes(response: InferenceResponse) -> bytes:
    """An answer's ModelInferResponse wire bytes, raw outputs appended with one copy (wire.serialize_infer_response)."""
    return wire.serialize_infer_response(encoded(response))


FINAL_RESPONSE = "triton_final_response"  # Triton's parameter on every stream response: is it the request's last?
ENABLE_EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"  # a stream request's ask for an empty last one


def as_message(response: InferenceResponse) -> pb.ModelInferResponse:
    """An answer as one whole ModelInferResponse, the way a stream carries it: with Triton's
    `triton_final_response` parameter saying whether it is the request's last answer."""
    message = encoded(response)
    whole = message.to_message() if isinstance(message, InferResponse) else message
    whole.parameters[FINAL_RESPONSE].bool_param = response.final
    return whole


def empty_final_response(request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    """The answer that ends a streaming model's request on the stream when the model sent its final flag alone
    and the client asked for it (Triton's `triton_enable_empty_final_response`): no outputs, the final parameter
    true. Like Triton 2.51's, it names the model and the request's id, and no version."""
    message = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
    message.parameters[FINAL_RESPONSE].bool_param = True
    return message


def wants_empty_final_response(request: pb.ModelInferRequest) -> bool:
    """Whether a stream request asks for an empty final answer (`triton_enable_empty_final_response`; decoding
    the request refused a parameter of another type)."""
    parameter = request.parameters.get(ENABLE_EMPTY_FINAL_RESPONSE)
    return parameter is not None and parameter.bool_param


def _check_final_response_ask(request: pb.ModelInferRequest) -> None:
    """Refuse `triton_enable_empty_final_response` of a type other than bool, in Triton 2.51's words (on
    ModelInfer too, where it means nothing)."""
    parameter = request.parameters.get(ENABLE_EMPTY_FINAL_RESPONSE)
    if parameter is not None and parameter.WhichOneof("parameter_choice") != "bool_param":
        raise InvalidRequest(f"invalid value type for '{ENABLE_EMPTY_FINAL_RESPONSE}' parameter, expected bool_param.")


def decode_request(
    request: pb.ModelInferRequest,
    raw_contents: RawContents | None = None,
    shared_memory: SharedMemoryRegistry | None = None,
) -> DecodedRequest:
    """Decode every input and the request parameters. `raw_contents` (buffers, one per input not in shared
    memory) replaces the message's own raw_input_contents when the wire layer kept them out of it;
    `shared_memory` is the server's registry (None: shared memory is off). Raises InvalidRequest or
    RegionNotFound, holding no region reference then; on success the caller must `release()` the result."""
    decoded = DecodedRequest({}, {}, [], 0)
    try:
        _decode_inputs(
            decoded, request, request.raw_input_contents if raw_contents is None else raw_contents, shared_memory
        )
        if request.outputs:
            decoded.outputs = _requested_outputs(request, decoded, shared_memory)
        if request.parameters:
            decoded.timeout_us = _timeout_us(request)
            _check_final_response_ask(request)
            decoded.sequence_parameters = _sequence_parameters(request)
    except BaseException:
        decoded.release()
        raise
    return decoded


def decoded_bytes(
    request: pb.ModelInferRequest,
    raw_contents: RawContents | None = None,
    shared_memory: SharedMemoryRegistry | None = None,
) -> int:
    """About how many bytes decoding `request`'s inputs takes and holds, told from the message alone (no tensor
    bytes are read), for service/transport/tensor_memory.py to refuse a request before that memory is taken.

    A fixed-size input counts its nbytes (a raw one is a view of its raw entry, which the request holds
    meanwhile: that entry's length is counted; typed contents are copied); one in shared memory counts its
    nbytes too, at most what the registered region holds past its offset (it is read into the server's own
    memory: regions are never mapped, see service/transport/shared_memory.py). A BYTES
    input counts BYTES_COPIES times (tensor_memory.py: the decoded elements and an engine's copies of them) what
    its decoded elements take: BYTES_ELEMENT_COST per element plus its contents (raw or in a region, the contents
    less their 4-byte lengths; typed, the contents' serialized size). A malformed input counts no more than that
    for what its contents can hold (BYTES elements no more than its contents hold; a region slice no more than
    the registered region holds, nothing for a region that is not registered). Raises InvalidRequest for a
    shape decode_request refuses; every other problem is left to decode_request."""
    raw: RawContents = request.raw_input_contents if raw_contents is None else raw_contents
    tensors = request.inputs
    count = len(tensors)
    total = 0
    if len(raw) == count:  # every input raw, the common request: a fixed-size one holds its entry, nothing more
        for index in range(count):
            tensor = tensors[index]
            if tensor.datatype == "BYTES":
                total += _input_bytes(
                    tensor,
                    datatypes.BY_NAME["BYTES"],
                    _checked_elements(tensor.name, tuple(tensor.shape)),
                    False,
                    raw[index],
                    None,
                )
            else:
                total += len(raw[index])
        return total
    next_raw = 0  # otherwise raw entries belong to the inputs not in shared memory, in order
    for index in range(count):
        tensor = tensors[index]
        placed = bool(tensor.parameters) and REGION in tensor.parameters
        buffer = None
        if raw and not placed:
            buffer = raw[next_raw] if next_raw < len(raw) else None
            next_raw += 1
        datatype = datatypes.BY_NAME.get(tensor.datatype)
        if datatype is not None:
            elements = _checked_elements(tensor.name, tuple(tensor.shape))
            total += _input_bytes(tensor, datatype, elements, placed, buffer, shared_memory)
    return total


def _input_bytes(
    tensor: Tensor,
    datatype: datatypes.DataType,
    elements: int,
    placed: bool,
    buffer: Buffer | None,
    shared_memory: SharedMemoryRegistry | None,
) -> int:
    """decoded_bytes of one input."""
    if datatype.name != "BYTES":
        if placed:  # read from the region into a buffer of the server's own, at decode
            return min(elements * datatype.itemsize, _slice_size(tensor.parameters, shared_memory))
        if buffer is not None:
            return min(elements * datatype.itemsize, len(buffer))
        if datatype.contents_field is None:
            return 0
        return min(elements, len(getattr(tensor.contents, datatype.contents_field))) * datatype.itemsize
    if placed or buffer is not None:
        size = _slice_size(tensor.parameters, shared_memory) if placed or buffer is None else len(buffer)
        decodable = min(elements, size // 4)
        return BYTES_COPIES * (decodable * BYTES_ELEMENT_COST + max(0, size - 4 * decodable))
    typed = min(elements, len(tensor.contents.bytes_contents))
    return BYTES_COPIES * (typed * BYTES_ELEMENT_COST + tensor.contents.ByteSize())


def _slice_size(parameters: Parameters, shared_memory: SharedMemoryRegistry | None) -> int:
    """The bytes a region slice can give: shared_memory_byte_size, within what the named region holds past the
    offset; 0 when decode_request would refuse the placement (no registry, an unknown region, a parameter
    missing or not an integer). Looks the region up without holding it."""
    place = _placement_or_none(parameters)
    if place is None or shared_memory is None:
        return 0
    name, offset, byte_size = place
    if not name:
        return 0
    try:
        (region,) = shared_memory.status(name)
    except RegionNotFound:
        return 0
    return max(0, min(byte_size, region.byte_size - offset))


def _placement_or_none(parameters: Parameters) -> tuple[str, int, int] | None:
    try:
        return _placement("", parameters)
    except InvalidRequest:
        return None


def _decode_inputs(
    decoded: DecodedRequest, request: pb.ModelInferRequest, raw: RawContents, shared_memory: SharedMemoryRegistry | None
) -> None:
    """Decode every input into `decoded`. A malformed input does not stop the others from being looked at: the
    InvalidRequest raised names each malformed input, in request order, each in Triton's words (Triton names one,
    in an order of its own: a client looking for its words about any of them finds them). RegionNotFound is
    raised at once."""
    tensors = request.inputs
    count = len(tensors)
    model = request.model_name
    # raw_input_contents holds one entry per input not in shared memory. The inputs in shared memory are looked
    # for first only when the counts differ, so the common request (every input raw) pays nothing for them.
    one_per_input = len(raw) == count
    if raw and not one_per_input:
        _check_raw_count(request, len(raw))
    inputs = decoded.inputs
    signature = decoded.signature
    problems: list[str] = []
    next_raw = 0
    for index in range(count):
        tensor = tensors[index]
        name = tensor.name
        datatype = tensor.datatype
        shape = tuple(tensor.shape)
        try:
            if name in inputs:
                raise InvalidRequest(f"input '{name}' already exists in request")
            place = _placement(f"input '{name}'", tensor.parameters) if tensor.parameters else None
            if place is None and raw:
                buffer = raw[next_raw]
                next_raw += 1
                dtype = _FIXED_SIZE.get(datatype)
                if (
                    dtype is not None
                    and not tensor.HasField("contents")
                    and len(buffer) == _checked_elements(name, shape) * dtype.itemsize
                ):  # the common input, _raw_input's checks in its order, inline: a zero-copy view
                    array = np.frombuffer(buffer, dtype).reshape(shape)
                else:  # (every refusal, and BYTES and BF16)
                    array = _raw_input(tensor, model, shape, buffer)
            elif place is not None:
                if tensor.HasField("contents"):
                    raise InvalidRequest(
                        f"unexpected 'content' provided when using shared memory for input tensor '{name}' for "
                        f"model '{model}' (it names shared memory region '{place[0]}'; use one or the other)"
                    )
                if raw and one_per_input:
                    raise InvalidRequest(
                        f"input '{name}' names shared memory region '{place[0]}' and has a raw_input_contents "
                        "entry too; an input in shared memory takes none"
                    )
                array = _region_input(decoded, tensor, model, shape, place, shared_memory)
            elif tensor.HasField("contents"):
                array = _typed_input(tensor, model, shape)
            else:
                raise InvalidRequest(
                    f"{_no_data(name, model)} (neither raw_input_contents, contents nor a shared memory region)"
                )
        except InvalidRequest as error:
            problems.append(str(error))
            continue
        inputs[name] = array
        signature[name] = (datatype, shape)
    if problems:
        raise InvalidRequest("; ".join(problems))


def _no_data(name: str, model: str) -> str:
    """Triton's words for an input with no data (tritonclient users know them)."""
    return f"unable to find data for input tensor '{name}' for model '{model}' in request."


def _known_datatype(tensor: Tensor, shape: tuple[int, ...]) -> tuple[datatypes.DataType, int]:
    """The input's datatype and element count; InvalidRequest for an unknown datatype or a shape no request may
    have. (Triton names an unknown datatype only against the model's: "data-type is '<invalid>'"; the model is
    not known here, so the message is slotserve's.)"""
    datatype = datatypes.BY_NAME.get(tensor.datatype)
    if datatype is None:
        raise InvalidRequest(
            f"input '{tensor.name}' has unknown datatype '{tensor.datatype}'; use one of {', '.join(datatypes.NAMES)}"
        )
    return datatype, _checked_elements(tensor.name, shape)


def _byte_size_mismatch(name: str, model: str, expected: int, got: int) -> str:
    """Triton's words for contents whose byte size does not match the shape (its clients and QA tests read them)."""
    return f"input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, got {got}"


def _raw_input(tensor: Tensor, model: str, shape: tuple[int, ...], buffer: Buffer) -> np.ndarray:
    """An input from its raw_input_contents entry: a zero-copy view (BYTES elements are copied out)."""
    name = tensor.name
    if tensor.HasField("contents"):
        raise _mixed_contents(name, model)
    dtype = _FIXED_SIZE.get(tensor.datatype)
    if dtype is not None:  # the common case, inline: one length check, one zero-copy view
        elements = _checked_elements(name, shape)
        if len(buffer) != elements * dtype.itemsize:
            raise InvalidRequest(
                f"{_byte_size_mismatch(name, model, elements * dtype.itemsize, len(buffer))} "
                f"(shape {list(shape)} of {tensor.datatype})"
            )
        return np.frombuffer(buffer, dtype).reshape(shape)
    datatype, elements = _known_datatype(tensor, shape)
    if datatype.name == "BYTES":
        try:
            return decode_raw(buffer, "BYTES", shape, name)  # type: ignore[arg-type]  # it reads any buffer
        except TensorDecodeError as error:
            raise InvalidRequest(_string_elements_problem(buffer, elements, name, model) or str(error)) from None
    if len(buffer) != elements * datatype.itemsize:  # BF16
        raise InvalidRequest(
            f"{_byte_size_mismatch(name, model, elements * datatype.itemsize, len(buffer))} "
            f"(shape {list(shape)} of {datatype.name})"
        )
    return decode_raw(buffer, datatype.name, shape, name)  # type: ignore[arg-type]  # it reads any buffer


def _string_elements_problem(buffer: Buffer, count: int, name: str, model: str) -> str | None:
    """What Triton says of serialized BYTES contents that do not hold `count` elements (its clients and QA tests
    read it), found as Triton finds it: length prefixes counted from the front, an element's bytes skipped (one
    that runs past the end ends the walk, and Triton lets that pass: None then, when the count is right). Read only
    for a refusal (the codec refused the contents)."""
    view = memoryview(buffer).cast("B")
    end = len(view)
    where = f"for inference input '{name}' for model '{model}'"
    offset = checked = 0
    while offset < end:
        if end - offset < 4:
            return (
                f"incomplete string length indicator {where}, expecting 4 bytes but only {end - offset} bytes "
                "available. Please make sure the string length indicator is in one buffer."
            )
        (length,) = _LENGTH.unpack_from(view, offset)
        checked += 1
        if checked > count:
            return f"unexpected number of string elements {checked} {where}, expecting {count}"
        offset += 4 + length
    if checked != count:
        return f"expected {count} string elements {where}, got {checked}"
    return None


def _mixed_contents(name: str, model: str) -> InvalidRequest:
    """An input with typed contents in a request that uses raw_input_contents, in Triton's words (tritonclient's
    grpc_explicit_int_content_client looks for them)."""
    return InvalidRequest(
        f"contents field must not be specified when using raw_input_contents for '{name}' for model '{model}'"
    )


def _check_raw_count(request: pb.ModelInferRequest, entries: int) -> None:
    """Raise InvalidRequest unless raw_input_contents' `entries` are one per input not in shared memory. An input
    with typed contents is refused first, as Triton refuses it: the count is then not the problem. Too few entries
    name the first input left without one, in Triton's words; too many are refused too (Triton ignores the
    extra entries: slotserve names the mistake)."""
    tensors = request.inputs
    count = len(tensors)
    placed = 0
    takers: list[str] = []  # the inputs that take a raw entry, in order
    for tensor in tensors:
        if tensor.parameters and _placement(f"input '{tensor.name}'", tensor.parameters) is not None:
            placed += 1
        elif tensor.HasField("contents"):
            raise _mixed_contents(tensor.name, request.model_name)
        else:
            takers.append(tensor.name)
    if entries == len(takers):
        return
    first = f"{_no_data(takers[entries], request.model_name)} " if entries < len(takers) else ""
    if placed:
        raise InvalidRequest(
            f"{first}raw_input_contents has {entries} entries for the {count - placed} inputs not in shared memory "
            f"(of {count}); send one per such input, in order"
        )
    raise InvalidRequest(
        f"{first}raw_input_contents has {entries} entries for {count} inputs; send one per input, in order"
    )


# Fixed-size datatypes decoded inline (BF16 and BYTES go through the codec).
_FIXED_SIZE = {name: datatypes.numpy_dtype(name) for name in datatypes.NAMES if name not in ("BF16", "BYTES")}
_LENGTH = struct.Struct("<I")  # a BYTES element's length prefix


def _checked_elements(name: str, shape: tuple[int, ...]) -> int:
    """The element count of `shape`; raises InvalidRequest for negative, absurd or oversized shapes, and for more
    dimensions than numpy's MAX_RANK."""
    if len(shape) > MAX_RANK:
        raise InvalidRequest(
            f"input '{name}' has {len(shape)} dimensions; a tensor may have at most {MAX_RANK} (numpy's limit)"
        )
    if shape:
        if min(shape) < 0:
            raise InvalidRequest(f"input '{name}' has a negative dimension in shape {list(shape)}")
        if max(shape) > MAX_DIMENSION:
            raise InvalidRequest(f"input '{name}' has an absurd dimension in shape {list(shape)}")
    elements = math.prod(shape)
    if elements > MAX_ELEMENTS:
        raise InvalidRequest(f"input '{name}' shape {list(shape)} has more elements than any request may hold")
    if not elements and shape and math.prod(d for d in shape if d) > MAX_ELEMENTS:
        # No element, but numpy cannot make an array of this shape (it multiplies every dimension).
        raise InvalidRequest(f"input '{name}' has an absurd shape {list(shape)}")
    return elements


def _placement(what: str, parameters: Parameters) -> tuple[str, int, int] | None:
    """(region name, offset, byte size) from a tensor's shared-memory parameters, or None when it names no
    region. Raises InvalidRequest, as Triton does, for a region name that is not a string, an offset or byte
    size that is not an integer or is given without a region, or a region without a byte size."""
    if REGION not in parameters:
        for key in (OFFSET, BYTE_SIZE):
            if key in parameters:
                raise InvalidRequest(f"{what} has '{key}' without '{REGION}'")
        return None
    region = parameters[REGION]
    if region.WhichOneof("parameter_choice") != "string_param":
        raise InvalidRequest(f"{what}: '{REGION}' must be a string_param (the region's name)")
    if BYTE_SIZE not in parameters:
        raise InvalidRequest(f"{what} names shared memory region '{region.string_param}' without '{BYTE_SIZE}'")
    return (
        region.string_param,
        _integer(what, parameters, OFFSET) if OFFSET in parameters else 0,
        _integer(what, parameters, BYTE_SIZE),
    )


def _integer(what: str, parameters: Parameters, key: str) -> int:
    parameter = parameters[key]
    kind = parameter.WhichOneof("parameter_choice")
    if kind not in ("int64_param", "uint64_param"):
        raise InvalidRequest(f"{what}: '{key}' must be an int64_param")
    value: int = getattr(parameter, kind)
    if value < 0:
        raise InvalidRequest(f"{what}: '{key}' must be >= 0, got {value}")
    return value


def _hold_slice(
    decoded: DecodedRequest, what: str, place: tuple[str, int, int], shared_memory: SharedMemoryRegistry | None
) -> RegionSlice:
    """Take a reference to the named region for the request (kept in `decoded.regions`) and check the range."""
    name, offset, byte_size = place
    if shared_memory is None:
        raise InvalidRequest(disabled_message(f"{what} names shared memory region '{name}'"))
    region = shared_memory.hold(name, what)
    decoded.regions.append(region)
    return region.slice(offset, byte_size, what)


def _region_input(
    decoded: DecodedRequest,
    tensor: Tensor,
    model: str,
    shape: tuple[int, ...],
    place: tuple[str, int, int],
    shared_memory: SharedMemoryRegistry | None,
) -> np.ndarray:
    """An input read from shared memory into a read-only array of its own (BYTES elements are copied out)."""
    name = tensor.name
    datatype, elements = _known_datatype(tensor, shape)
    what = f"input '{name}'"
    region_slice = _hold_slice(decoded, what, place, shared_memory)
    where = f"shared memory region '{place[0]}'"
    if datatype.name == "BYTES":
        with region_slice.buffer() as view:
            try:
                return deserialize_bytes(view, elements, name).reshape(shape)
            except TensorDecodeError as error:
                problem = _string_elements_problem(view, elements, name, model)
                raise InvalidRequest(f"{problem} (in {where})" if problem else f"{where}: {error}") from None
    needed = elements * datatype.itemsize
    if region_slice.byte_size != needed:
        raise InvalidRequest(
            f"{_byte_size_mismatch(name, model, needed, region_slice.byte_size)} (shape {list(shape)} of "
            f"{datatype.name} in {where}: {needed} bytes, {BYTE_SIZE} is {region_slice.byte_size})"
        )
    return region_slice.array(datatypes.numpy_dtype(datatype.name), shape)


# The contents fields in the order Triton reads them, and the datatype each holds (int_contents and uint_contents
# hold the 8- and 16-bit types too: an input of one of those takes its values from them).
_FIELD_TYPES = {
    "bool_contents": ("BOOL",),
    "int_contents": ("INT32", "INT8", "INT16"),
    "int64_contents": ("INT64",),
    "uint_contents": ("UINT32", "UINT8", "UINT16"),
    "uint64_contents": ("UINT64",),
    "fp32_contents": ("FP32",),
    "fp64_contents": ("FP64",),
    "bytes_contents": ("BYTES",),
}


def _typed_input(tensor: Tensor, model: str, shape: tuple[int, ...]) -> np.ndarray:
    """An input from its typed `contents`. Refused in Triton's words: values in a field of another type, values in
    two fields, a count that does not match the shape (as a byte size, or BYTES elements)."""
    name = tensor.name
    datatype, count = _known_datatype(tensor, shape)
    contents = tensor.contents
    expected = datatype.contents_field
    given = ""  # the field holding the values
    for kind, types in _FIELD_TYPES.items():
        if not len(getattr(contents, kind)):
            continue
        if given:
            raise InvalidRequest(
                f"unexpected explicit tensor data for input tensor '{name}' for model '{model}', binary data was "
                f"already supplied. ({given} and {kind} both hold values; send one)"
            )
        if datatype.name not in types:
            takes = f"takes {expected}" if expected else "can only be sent in raw_input_contents"
            raise InvalidRequest(
                f"unexpected explicit tensor data for input tensor '{name}' for model '{model}' of type "
                f"'{types[0]}', expected datatype '{datatype.name}' ({datatype.name} {takes}; got {kind})"
            )
        given = kind
    values = getattr(contents, expected) if expected else ()
    if len(values) != count:
        if datatype.name == "BYTES":
            found = min(len(values), count + 1)  # Triton stops counting one past the shape's
            problem = (
                f"unexpected number of string elements {found} for inference input '{name}' for model '{model}', "
                f"expecting {count}"
                if found > count
                else f"expected {count} string elements for inference input '{name}' for model '{model}', got {found}"
            )
        else:
            problem = _byte_size_mismatch(name, model, count * datatype.itemsize, len(values) * datatype.itemsize)
        raise InvalidRequest(
            f"{problem} (shape {list(shape)} needs {count} elements, {given or expected or 'contents'} holds "
            f"{len(values)})"
        )
    if not count:
        return np.empty(shape, dtype=object if datatype.name == "BYTES" else datatypes.numpy_dtype(datatype.name))
    if datatype.name == "BYTES":  # straight into the object array: a list of the elements first would add 8 bytes each
        return np.fromiter(values, dtype=object, count=count).reshape(shape)
    try:
        return np.array(values, dtype=datatypes.numpy_dtype(datatype.name)).reshape(shape)
    except OverflowError:
        raise InvalidRequest(f"input '{name}': a value in {expected} does not fit {datatype.name}") from None


def _requested_outputs(
    request: pb.ModelInferRequest, decoded: DecodedRequest, shared_memory: SharedMemoryRegistry | None
) -> list[str]:
    names = []
    for output in request.outputs:
        if output.name in names:
            raise InvalidRequest(f"output '{output.name}' is requested twice")
        if output.parameters:
            if "classification" in output.parameters:
                raise InvalidRequest(f"output '{output.name}' asks for classification, which slotserve does not do")
            what = f"output '{output.name}'"
            place = _placement(what, output.parameters)
            if place is not None:
                decoded.output_regions[output.name] = _hold_slice(decoded, what, place, shared_memory)
        names.append(output.name)
    return names


SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")


def _sequence_parameters(request: pb.ModelInferRequest) -> dict[str, tuple[str, object]]:
    """The sequence parameters a request carries, as (parameter_choice, value), their types checked by the sequence
    core for every model, as Triton checks them (service/core/sequences.py check_parameter_types). Raises its
    SequenceParameterError (an InvalidRequest)."""
    found: dict[str, tuple[str, object]] = {}
    for key in SEQUENCE_PARAMETERS:
        if key in request.parameters:
            parameter = request.parameters[key]
            kind = parameter.WhichOneof("parameter_choice") or "no value"
            found[key] = (kind, getattr(parameter, kind) if kind != "no value" else None)
    if found:
        check_parameter_types(found)
    return found


def _timeout_us(request: pb.ModelInferRequest) -> int:
    if "timeout" not in request.parameters:
        return 0
    parameter = request.parameters["timeout"]
    kind = parameter.WhichOneof("parameter_choice")
    if kind not in ("int64_param", "uint64_param"):
        raise InvalidRequest("parameter 'timeout' must be an integer number of microseconds")
    value: int = getattr(parameter, kind)
    if value < 0:
        raise InvalidRequest(f"parameter 'timeout' must be >= 0 microseconds, got {value}")
    return value


def encode_response(
    response: pb.ModelInferResponse,
    outputs: dict[str, np.ndarray],
    metadata: ModelMetadata,
    regions: dict[str, RegionSlice] | None = None,
) -> pb.ModelInferResponse | InferResponse:
    """Add `outputs` to `response` as raw contents, in the model's output order, typed as the model declares
    them. Small outputs go into the message (returned); when they add up to LARGE_MESSAGE_BYTES or more, the
    arrays are kept out of it and an InferResponse is returned, which the wire layer serializes with one copy.

    An output with an entry in `regions` (DecodedRequest.output_regions) is written into its shared-memory
    region instead, and gets an empty raw entry (so raw_output_contents stays one entry per output). Raises
    InvalidRequest, having written nothing, when an output does not fit its region."""
    tensors = response.outputs
    raw: list[bytes | np.ndarray] = []
    size = 0
    to_write: list[RegionWrite] = []
    for name, datatype, dtype in _output_plan(metadata):
        array = outputs.get(name)
        if array is None:
            continue
        target = regions.get(name) if regions else None
        if target is not None:
            item = encode_raw(array) if dtype is None else array
            to_write.append((name, target, item, dtype))
            raw.append(b"")
        elif dtype is None:
            item = encode_raw(array)
            size += len(item)
            raw.append(item)
        else:
            if array.dtype != dtype:
                array = array.astype(dtype)
            size += array.nbytes
            raw.append(array)
        tensors.add(name=name, datatype=datatype, shape=array.shape)
    if to_write:
        _write_regions(to_write)
    if size >= LARGE_MESSAGE_BYTES:
        return InferResponse(
            response, [np.ascontiguousarray(item) if type(item) is np.ndarray else item for item in raw]
        )
    # (mypy narrows `type(item) is` only where it holds: every other item is bytes.)
    response.raw_output_contents.extend(
        [item.tobytes() if type(item) is np.ndarray else cast(bytes, item) for item in raw]
    )
    return response


def _write_regions(to_write: list[RegionWrite]) -> None:
    """Write outputs into their regions (one copy each, cast to the declared datatype on the way), after
    checking that every one fits: a request whose outputs do not all fit changes no region."""
    for name, target, item, dtype in to_write:
        needed = item.size * dtype.itemsize if isinstance(item, np.ndarray) and dtype is not None else len(item)
        if needed > target.byte_size:
            raise InvalidRequest(
                f"output '{name}' needs {needed} bytes and shared memory region '{target.region.name}' gives it "
                f"{target.byte_size} ({BYTE_SIZE}); ask for at least {needed}"
            )
        target.check_object(needed)  # its client may have shrunk the object since registering the region
    for _name, target, item, dtype in to_write:
        target.write(item, dtype)


def _output_plan(metadata: ModelMetadata) -> list[tuple[str, str, np.dtype | None]]:
    """(name, datatype, numpy dtype or None for BYTES) per output, computed once per metadata object."""
    plan = metadata.__dict__.get("_output_plan")
    if plan is None:
        plan = [
            (t.name, t.datatype, None if t.datatype == "BYTES" else datatypes.numpy_dtype(t.datatype))
            for t in metadata.outputs
        ]
        object.__setattr__(metadata, "_output_plan", plan)
    return plan
