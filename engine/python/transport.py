"""How tensors move between the server and a python-model worker: shared-memory segments, not pickles.

Each worker has two segments the server creates and owns: requests (server -> worker) and responses
(worker -> server), plus a small cancel board. The pipe carries only control messages: tensor descriptors
(name, datatype, shape, offset, size) and small request fields. A segment too small for a call is replaced by a
larger one (the server creates it and names it in the control message; the worker maps it); its file is
unlinked as soon as both sides have it mapped, so nothing is left in /dev/shm even if the server is killed.

Copies per tensor: a request's input is copied once, into the request segment; the model gets a read-only
numpy view of it (valid for the call: the segment is reused by the next one). An output is copied by the
worker into the response segment, then once out of it by the server (the segment is reused by the next call),
so two copies. BYTES tensors are laid out as 4-byte little-endian lengths followed by the bytes (KServe's raw
format) and rebuilt as numpy object arrays of `bytes` on the other side.
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
import uuid
from dataclasses import dataclass

import numpy as np

from ..datatypes import NAMES, numpy_dtype

ALIGNMENT = 64
MIN_SEGMENT = 1 << 16

_NUMPY = {name: numpy_dtype(name) for name in NAMES if name not in ("BYTES", "BF16")}  # fixed-size, plain numpy


def _shm_directory() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class Segment:
    """A shared-memory file mapped into this process. `create` makes a new one (the server); `attach` maps
    one by path (the worker). Raises OSError when the memory cannot be had."""

    def __init__(self, path: str, size: int, mapping: mmap.mmap) -> None:
        self.path = path
        self.size = size
        self.mapping = mapping
        self.view = memoryview(mapping)

    @classmethod
    def create(cls, size: int) -> Segment:
        size = max(MIN_SEGMENT, _rounded(size))
        path = os.path.join(_shm_directory(), f"slotserve-py-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(descriptor, size)
            mapping = mmap.mmap(descriptor, size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(descriptor)
        return cls(path, size, mapping)

    @classmethod
    def attach(cls, path: str, size: int) -> Segment:
        descriptor = os.open(path, os.O_RDWR)
        try:
            mapping = mmap.mmap(descriptor, size)
        finally:
            os.close(descriptor)
        return cls(path, size, mapping)

    def unlink(self) -> None:
        """Remove the file (both sides keep their mappings)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Unmap. A numpy view a model kept past its call keeps the mapping alive; it is then left to the
        garbage collector instead of being unmapped under the view."""
        try:
            self.view.release()
            self.mapping.close()
        except BufferError:
            pass


def _rounded(size: int) -> int:
    """`size` rounded up to a power of two, so that a slowly growing tensor does not resize every call."""
    return 1 << max(0, int(size - 1).bit_length())


@dataclass(frozen=True)
class Descriptor:
    """Where one tensor lies in a segment."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def _encode_bytes(array: np.ndarray) -> bytes:
    parts = []
    for element in array.reshape(-1):
        if isinstance(element, str):
            element = element.encode("utf-8")
        elif not isinstance(element, bytes | bytearray | memoryview):
            element = str(element).encode("utf-8")
        parts.append(struct.pack("<I", len(element)))
        parts.append(bytes(element))
    return b"".join(parts)


def _decode_bytes(buffer: memoryview, count: int) -> np.ndarray:
    result = np.empty(count, dtype=object)
    position = 0
    for index in range(count):
        (length,) = struct.unpack_from("<I", buffer, position)
        position += 4
        result[index] = bytes(buffer[position : position + length])
        position += length
    return result


def datatype_of(array: np.ndarray) -> str | None:
    """The KServe datatype a numpy array is sent as; None when none fits."""
    if array.dtype.kind in ("O", "S", "U"):
        return "BYTES"
    for name, dtype in _NUMPY.items():
        if array.dtype == dtype or (array.dtype.kind == dtype.kind and array.dtype.itemsize == dtype.itemsize):
            return name
    if array.dtype.name == "bfloat16":
        return "BF16"
    return None


class Layout:
    """Tensors laid out for one segment: call `plan` with every tensor, read `size`, then `write`."""

    def __init__(self) -> None:
        self.size = 0
        self._pending: list[tuple[Descriptor, object]] = []

    def plan(self, name: str, array: np.ndarray, datatype: str) -> Descriptor:
        if datatype == "BYTES":
            payload: object = _encode_bytes(array)
            nbytes = len(payload)  # type: ignore[arg-type]
        else:
            payload = np.ascontiguousarray(array)
            nbytes = payload.nbytes  # type: ignore[union-attr]
        offset = -(-self.size // ALIGNMENT) * ALIGNMENT
        descriptor = Descriptor(name, datatype, tuple(int(d) for d in array.shape), offset, nbytes)
        self.size = offset + nbytes
        self._pending.append((descriptor, payload))
        return descriptor

    def write(self, segment: Segment) -> None:
        """Copy every planned tensor into `segment` (which must hold `size` bytes)."""
        view = segment.view
        for descriptor, payload in self._pending:
            end = descriptor.offset + descriptor.nbytes
            if isinstance(payload, bytes):
                view[descriptor.offset : end] = payload
            else:
                target = np.frombuffer(view[descriptor.offset : end], dtype=np.uint8)
                target[:] = payload.reshape(-1).view(np.uint8)  # type: ignore[attr-defined]  # an ndarray here
        self._pending = []


def read(segment: Segment, descriptor: Descriptor, *, copy: bool, bf16=None) -> np.ndarray:
    """The tensor `descriptor` names: a view of the segment (read-only) or, with `copy`, an array of its own.
    BYTES tensors are always rebuilt (new objects)."""
    raw = segment.view[descriptor.offset : descriptor.offset + descriptor.nbytes]
    count = int(np.prod(descriptor.shape, dtype=np.int64))
    if descriptor.datatype == "BYTES":
        return _decode_bytes(raw, count).reshape(descriptor.shape)
    dtype = bf16 if descriptor.datatype == "BF16" else _NUMPY[descriptor.datatype]
    array = np.frombuffer(raw, dtype=dtype, count=count).reshape(descriptor.shape)
    if copy:
        return array.copy()
    array.flags.writeable = False
    return array
