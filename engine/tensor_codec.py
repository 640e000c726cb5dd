"""Tensor bytes on the wire: raw little-endian contents and length-prefixed BYTES elements.

Shared by the server (decoding requests, encoding responses) and the client library. Pure numpy: no protobuf
and no gRPC here.

Raw decoding is zero-copy: the returned array is a read-only view over the request's buffer. Encoding makes
one copy (protobuf's bytes fields take `bytes` only).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import numpy as np

from . import datatypes

_LENGTH = struct.Struct("<I")

# numpy makes arrays of at most this many dimensions (NPY_MAXDIMS, 64 since numpy 2.0); a shape of more is refused
# by name before any array is made, since numpy's own ValueError would read as an internal error.
MAX_RANK = 64

# What a decoded BYTES element costs beyond its contents: its pointer in the object array (8 bytes) and a Python
# bytes object's header (33 bytes), rounded up by the allocator (to 16 bytes) -- 56 bytes for an element of up to
# 14 bytes, which took 4 + its length on the wire. Used to bound memory before decoding (service/tensor_memory.py).
BYTES_ELEMENT_COST = 8 + 33 + 15


class TensorDecodeError(ValueError):
    """The bytes do not hold a tensor of the stated datatype and shape. The message names the problem."""

    error_reason: str | None = "invalid_request_error"


def element_count(shape: Iterable[int]) -> int:
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
            f"input '{name}': shape {list(shape)} of {datatype} needs {expected} bytes, got {len(buffer)}"
        )
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


def encode_raw(array: np.ndarray) -> bytes:
    """Raw contents of `array`: row-major little-endian bytes, or length-prefixed elements for BYTES."""
    if array.dtype == object or array.dtype.kind in ("S", "U"):
        return serialize_bytes(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array.tobytes()


def serialize_bytes(array: np.ndarray) -> bytes:
    """Concatenate 4-byte little-endian lengths and element bytes (str elements are UTF-8 encoded, others as their
    str()). Raises ValueError for an element of 4 GiB or more, which a length prefix cannot state.

    Written for millions of short elements: the lengths are counted with numpy and the result is written into
    one buffer, so no per-element prefix object or list of parts is made (a join over them costs about 200 bytes
    per element on top of the result); elements all of one length are laid out by numpy in one pass."""
    flat = np.asarray(array, dtype=object).reshape(-1)
    if not all(type(element) is bytes for element in flat):
        flat = np.fromiter(map(_element_bytes, flat), dtype=object, count=flat.size)
    count = flat.size
    if not count:
        return b""
    lengths = np.fromiter(map(len, flat), dtype=np.int64, count=count)
    longest = int(lengths.max())
    if longest > _MAX_ELEMENT_BYTES:
        raise ValueError(f"a BYTES element of {longest} bytes does not fit a 4-byte length prefix")
    if int(lengths.min()) == longest:
        records = np.empty(count, dtype=_records_dtype(longest))
        records["length"] = longest
        if longest:
            # numpy copies each bytes object into its record; b"".join would hold an 80-byte buffer per element.
            records["data"] = flat
        return records.tobytes()
    out = bytearray(4 * count + int(lengths.sum()))
    pack_into = _LENGTH.pack_into
    position = 0
    for element in flat:
        size = len(element)
        pack_into(out, position, size)
        position += 4
        out[position : position + size] = element
        position += size
    return bytes(out)


def _element_bytes(element: object) -> bytes:
    if isinstance(element, bytes):
        return element
    if isinstance(element, str):
        return element.encode("utf-8")
    if isinstance(element, (bytearray, memoryview)):
        return bytes(element)
    return str(element).encode("utf-8")


_MAX_ELEMENT_BYTES = 0xFFFFFFFF


def _records_dtype(size: int) -> np.dtype:
    """Elements of `size` bytes each as numpy sees them on the wire: a 4-byte length, then the bytes."""
    return np.dtype([("length", "<u4"), ("data", f"V{size}")])


def deserialize_bytes(buffer: bytes | bytearray | memoryview, count: int, name: str) -> np.ndarray:
    """Split length-prefixed BYTES contents into `count` elements (a 1-D object array of bytes).

    Raises TensorDecodeError on a truncated length prefix or element, or when the element count differs.

    Each element becomes a Python bytes object (about 33 bytes of header, rounded up by the allocator, plus its
    contents) behind an 8-byte pointer: that is what an object array of bytes costs, about 56 bytes for a short
    element that took 6 on the wire (BYTES_ELEMENT_COST). Nothing else per element is kept: no intermediate list.
    Contents whose elements all have one length (checked with numpy) are split by numpy in one pass; others are
    walked once, each element stored straight into the result.
    """
    view = memoryview(buffer)
    end = view.nbytes
    if count and end % count == 0 and end // count >= 4:
        records = np.frombuffer(view, dtype=_records_dtype(end // count - 4), count=count)
        if (records["length"] == end // count - 4).all():
            return records["data"].astype(object)
    return _split_elements(view, count, name)


def _split_elements(view: memoryview, count: int, name: str) -> np.ndarray:
    end = view.nbytes
    # Every element takes at least its 4-byte length: when the contents cannot hold `count` of them the walk only
    # counts, for the error, and no result of `count` pointers (a shape may claim billions) is allocated.
    result = np.empty(count, dtype=object) if count <= end // 4 else None
    unpack_from = _LENGTH.unpack_from
    offset = 0
    index = 0
    while offset < end:
        if index == count:
            raise TensorDecodeError(
                f"input '{name}': shape holds {count} BYTES elements, the contents hold more than {count}"
            )
        if offset + 4 > end:
            raise TensorDecodeError(f"input '{name}': BYTES element {index} has a truncated length prefix")
        (length,) = unpack_from(view, offset)
        offset += 4
        stop = offset + length
        if stop > end:
            raise TensorDecodeError(
                f"input '{name}': BYTES element {index} declares {length} bytes, only {end - offset} remain"
            )
        if result is not None:
            result[index] = view[offset:stop].tobytes()
        index += 1
        offset = stop
    if index != count:
        raise TensorDecodeError(f"input '{name}': shape holds {count} BYTES elements, the contents hold {index}")
    assert result is not None  # no result only when count > end // 4, and then index < count raised above
    return result
