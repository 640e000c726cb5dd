"""ModelInfer messages on the wire, without copying tensor bytes.

protobuf's Python messages copy every bytes field twice on the way in (into the message, then into a new
`bytes` object on each access) and the response path copies each output three times (`tobytes`, into the
message, into the serialized string). For large tensors those copies are most of the cost, so ModelInfer's
gRPC handler uses these two functions as its (de)serializer:

* `parse_infer_request` walks the top level of the message itself: `raw_input_contents` entries (field 7)
  become memoryview slices of the received bytes (zero copies), and only the small remainder goes through
  protobuf. Small messages go straight to protobuf, which is faster for them.
* `serialize_infer_response` serializes the small part with protobuf and appends each raw output as a
  field-6 entry (tag, length, bytes) taken straight from the array's buffer: one copy, into the result.

The wire format allows a repeated field's entries anywhere in a message; their relative order is what counts,
and it is kept. Nothing here imports gRPC.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from generated import grpc_service_pb2 as pb

# Below this size protobuf's own parser wins; above it copies dominate.
LARGE_MESSAGE_BYTES = 64 * 1024

_RAW_INPUT_FIELD = 7
_RAW_OUTPUT_TAG = bytes([(6 << 3) | 2])  # raw_output_contents, length-delimited


# A raw output as the wire layer appends it: a C-contiguous little-endian array, or its bytes.
RawOutput = np.ndarray[Any, Any] | bytes


class WireError(ValueError):
    """The bytes are not a well-formed message."""


@dataclass
class InferRequest:
    """A ModelInferRequest whose raw input contents may live outside the message (as buffer views)."""

    message: pb.ModelInferRequest
    raw_contents: list[bytes | memoryview] = field(default_factory=list)  # one per input


@dataclass
class InferResponse:
    """A ModelInferResponse without raw contents, plus the output arrays serialized after it."""

    message: pb.ModelInferResponse
    raw_outputs: list[RawOutput] = field(default_factory=list)  # C-contiguous little-endian arrays or bytes

    def to_message(self) -> pb.ModelInferResponse:
        """The whole response as one protobuf message (for paths that need one, e.g. streams)."""
        message = pb.ModelInferResponse()
        message.CopyFrom(self.message)
        message.raw_output_contents.extend(bytes(byte_view(item)) for item in self.raw_outputs)
        return message


def byte_view(item: RawOutput | memoryview) -> memoryview:
    """A raw output's bytes as a flat memoryview, without copying. An array is viewed as uint8 first: the buffer
    protocol cannot describe every dtype (ml_dtypes' bfloat16 has no buffer format, so `memoryview()` of a BF16
    array raises). `item` is a C-contiguous array or a bytes-like object."""
    if isinstance(item, np.ndarray):
        return item.reshape(-1).view(np.uint8).data
    return memoryview(item)


def _varint(data: bytes, position: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if position >= len(data):
            raise WireError("truncated varint")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def parse_infer_request(data: bytes) -> InferRequest:
    """Parse a serialized ModelInferRequest. Raw input contents of a large message are views of `data`.
    Raises WireError (or protobuf's DecodeError) for malformed bytes."""
    if len(data) < LARGE_MESSAGE_BYTES:
        message = pb.ModelInferRequest.FromString(data)
        return InferRequest(message, list(message.raw_input_contents))
    view = memoryview(data)
    raw_contents: list[bytes | memoryview] = []
    rest: list[memoryview] = []
    position = 0
    end = len(data)
    while position < end:
        start = position
        key, position = _varint(data, position)
        wire_type = key & 7
        if wire_type == 2:
            length, position = _varint(data, position)
            stop = position + length
            if stop > end:
                raise WireError("truncated length-delimited field")
            if key >> 3 == _RAW_INPUT_FIELD:
                raw_contents.append(view[position:stop])
            else:
                rest.append(view[start:stop])
            position = stop
        elif wire_type == 0:
            _, position = _varint(data, position)
            rest.append(view[start:position])
        elif wire_type == 1:
            position += 8
            rest.append(view[start:position])
        elif wire_type == 5:
            position += 4
            rest.append(view[start:position])
        elif wire_type in (3, 4):
            # A group (deprecated, never sent by a proto3 sender) is not walked here: protobuf decides, keeping a
            # well-formed one as an unknown field and refusing a malformed one, as it does for small messages.
            message = pb.ModelInferRequest.FromString(data)
            return InferRequest(message, list(message.raw_input_contents))
        else:
            raise WireError(f"unsupported wire type {wire_type}")
    if position != end:
        raise WireError("truncated fixed-size field")
    return InferRequest(pb.ModelInferRequest.FromString(b"".join(rest)), raw_contents)


def serialize_infer_response(response: bytes | pb.ModelInferResponse | InferResponse) -> bytes:
    """Bytes of a ModelInferResponse, or of an InferResponse with its raw outputs appended (one copy each).
    Bytes (a response the dataplane serialized already, so that a failure is counted as one) pass unchanged."""
    if isinstance(response, bytes):
        return response
    if isinstance(response, pb.ModelInferResponse):
        return response.SerializeToString()
    parts: list[bytes | memoryview] = [response.message.SerializeToString()]
    for item in response.raw_outputs:
        buffer = byte_view(item)
        parts.append(_RAW_OUTPUT_TAG)
        parts.append(_encode_varint(buffer.nbytes))
        parts.append(buffer)
    return b"".join(parts)


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
