"""POSIX shared-memory objects made as a client makes them, for the shared-memory tests; and which descriptors of
them the process has open (/proc/self/fd), to show that regions are opened and closed when they should be, and
that nothing maps them (/proc/self/maps).

The test side never maps an object, and opens one only for the length of one read or write, so every descriptor
of a key that /proc/self/fd shows while a test counts them is the server's.
"""

from __future__ import annotations

import _posixshmem
import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from generated import grpc_service_pb2 as pb

_NUMBERS = itertools.count()
WAIT = 10.0


class ShmObject:
    """A shared-memory object of `size` bytes under a fresh key (/slotserve_test_<pid>_<n>), unlinked by close()."""

    def __init__(self, size: int, key: str | None = None) -> None:
        self.key = key or f"/slotserve_test_{os.getpid()}_{next(_NUMBERS)}"
        self.size = size
        descriptor = _posixshmem.shm_open(self.key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(descriptor, size)
        finally:
            os.close(descriptor)

    @property
    def path(self) -> Path:
        return Path("/dev/shm") / self.key[1:]

    def write(self, offset: int, data: bytes | np.ndarray) -> None:
        payload = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
        with open(self.path, "r+b", buffering=0) as handle:
            handle.seek(offset)
            handle.write(payload)

    def read(self, offset: int, size: int) -> bytes:
        with open(self.path, "rb", buffering=0) as handle:
            handle.seek(offset)
            return handle.read(size)

    def array(self, offset: int, dtype, shape) -> np.ndarray:
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        return np.frombuffer(self.read(offset, count * dtype.itemsize), dtype).reshape(shape)

    def close(self) -> None:
        try:
            _posixshmem.shm_unlink(self.key)
        except FileNotFoundError:
            pass


def mappings(key: str) -> int:
    """How many mappings of the shared-memory object `key` this process has now."""
    target = f"/dev/shm/{key[1:]}"
    count = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path
            if len(fields) == 6 and fields[5].rstrip("\n") in (target, target + " (deleted)"):
                count += 1
    return count


def descriptors(key: str, pid: int | str = "self") -> int:
    """How many descriptors of the shared-memory object `key` this process (or process `pid`) has open now."""
    target = f"/dev/shm/{key[1:]}"
    count = 0
    for entry in os.scandir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(entry.path)
        except FileNotFoundError:  # closed since the listing (the listing's own descriptor, for one)
            continue
        if link in (target, target + " (deleted)"):
            count += 1
    return count


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)  # ordering-free: re-checks a state predicate


def register(stub, name: str, key: str, byte_size: int, offset: int = 0, **kwargs):
    return stub.SystemSharedMemoryRegister(
        pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=offset, byte_size=byte_size), **kwargs
    )


def in_region(tensor, region: str, byte_size: int, offset: int | None = None) -> None:
    """Point a request's input or requested output at a region, as tritonclient's set_shared_memory does."""
    tensor.parameters["shared_memory_region"].string_param = region
    tensor.parameters["shared_memory_byte_size"].int64_param = byte_size
    if offset is not None:
        tensor.parameters["shared_memory_offset"].int64_param = offset
