"""Tensor bytes on the wire: raw little-endian contents and length-prefixed BYTES elements.

Shared by the server (decoding requests, encoding responses) and the client library. Pure numpy: no protobuf
and no gRPC here.

Raw decoding is zero-copy: the returned array is a read-only view over the request's buffer. Encoding makes
one copy (protobuf's bytes fields take `bytes` only).
"""

from __future__ import annotations

import struct

import numpy as np

from . import datatypes

_LENGTH = struct.Struct("<I")

# numpy makes arrays of at most this many dimensions (NPY_MAXDIMS, 64 since numpy 2.0); a shape of more is refused
# by name before any array is made, since numpy's own ValueError would read as an internal error.
MAX_RANK = 64


class TensorDecodeError(ValueError):
    """The bytes do not hold a tensor of the stated datatype and shape. The message names the problem."""


def element_count(shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def decode_raw(buffer: bytes, datatype: str, shape: tuple[int, ...], name: str) -> np.ndarray:
    """Array of `datatype` and `shape` over `buffer` (zero-copy for fixed-size types).

    Raises TensorDecodeError when the byte length does not match the shape or a BYTES element is truncated.
    """
    count = element_count(shape)
    if datatype == "BYTES":
        return deserialize_bytes(buffer, count, name).reshape(shape)
    dtype = datatypes.numpy_dtype(datatype)
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        raise TensorDecodeError(
            f"input '{name}': shape {list(shape)} of {datatype} needs {expected} bytes, got {len(buffer)}")
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


def encode_raw(array: np.ndarray) -> bytes:
    """Raw contents of `array`: row-major little-endian bytes, or length-prefixed elements for BYTES."""
    if array.dtype == object or array.dtype.kind in ("S", "U"):
        return serialize_bytes(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array.tobytes()


def serialize_bytes(array: np.ndarray) -> bytes:
    """Concatenate 4-byte little-endian lengths and element bytes (str elements are UTF-8 encoded)."""
    parts = []
    for element in np.asarray(array, dtype=object).reshape(-1):
        if isinstance(element, str):
            element = element.encode("utf-8")
        elif not isinstance(element, (bytes, bytearray, memoryview)):
            element = str(element).encode("utf-8")
        parts.append(_LENGTH.pack(len(element)))
        parts.append(bytes(element))
    return b"".join(parts)


def deserialize_bytes(buffer: bytes, count: int, name: str) -> np.ndarray:
    """Split length-prefixed BYTES contents into `count` elements (a 1-D object array of bytes).

    Raises TensorDecodeError on a truncated length prefix or element, or when the element count differs.
    """
    view = memoryview(buffer)
    elements = []
    offset = 0
    end = len(view)
    while offset < end:
        if offset + 4 > end:
            raise TensorDecodeError(f"input '{name}': BYTES element {len(elements)} has a truncated length prefix")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > end:
            raise TensorDecodeError(
                f"input '{name}': BYTES element {len(elements)} declares {length} bytes, only {end - offset} remain")
        elements.append(bytes(view[offset:offset + length]))
        offset += length
        if len(elements) > count:
            break
    if len(elements) != count:
        raise TensorDecodeError(
            f"input '{name}': shape holds {count} BYTES elements, the contents hold "
            f"{'more than ' + str(count) if len(elements) > count else len(elements)}")
    result = np.empty(count, dtype=object)
    result[:] = elements
    return result
