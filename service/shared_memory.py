"""System shared memory: a registry of mappings (the protocol's SystemSharedMemory extension, as Triton defines it).

A client on the same host creates a POSIX shared-memory object (`shm_open`), registers part of it under a name
(SystemSharedMemoryRegister: name, key, offset, byte_size), then names that region in its requests instead of
sending tensor bytes: inputs are read from the mapping without a copy where the engine allows, requested outputs
are written into it.

A region is mapped once, read-write, when it is registered, and unmapped when the last holder lets go. Its holders
are the registry (from register to unregister) and every request that uses it (from decoding to the end of its
response). So unregistering takes effect for new requests at once, while requests that hold the region keep a
valid mapping until they finish: memory is never unmapped under a running request. A region moves through
RegionState:

    REGISTERED --unregister--> RELEASING (requests still hold it) --last request done--> UNMAPPED
    REGISTERED --unregister, no request holds it--> UNMAPPED

Python's own mmap object is the last line of defence: it refuses to close while a numpy view over it is alive
(a response still being serialized, a traceback), and then unmaps when the last view goes (see `_unmap`).

Mapping host memory on a caller's request is a privilege, so the server has no registry unless it starts with
`--shared-memory system`; keys are POSIX shared-memory names only (a leading "/", no other "/"), optionally
under an operator-chosen prefix, and the bytes mapped at once are bounded.

Nothing here imports gRPC or protobuf. The lock guards the table and the holder counts; it is never held across
a system call that maps or unmaps memory, nor across anything a request does with a region.
"""

from __future__ import annotations

import enum
import errno
import mmap
import os
import stat
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import _posixshmem  # CPython's own binding of shm_open (what multiprocessing.shared_memory uses)
import numpy as np

from .core.errors import InvalidRequest, ServiceError

DEFAULT_MAX_BYTES = 1 << 30  # --shared-memory-max-bytes: as much as one request message may carry by default
MAX_REGIONS = 4096  # registered at once: each is a mapping, and the kernel bounds mappings per process (~65 530)
NAME_MAX = 255  # bytes of a POSIX shared-memory name after its "/" (the file name in /dev/shm)
CUDA_UNSUPPORTED = ("slotserve does not support CUDA shared memory; use system shared memory (start the server "
                    "with --shared-memory system). CUDA IPC is planned for the TensorRT engine")


class RegionNotFound(ServiceError):
    """No region is registered under the name (NOT_FOUND, as Triton answers)."""

    error_reason: str | None = "region_not_found"


class SharedMemoryLimit(ServiceError):
    """Registering would map more than --shared-memory-max-bytes or MAX_REGIONS (RESOURCE_EXHAUSTED)."""

    error_reason: str | None = "shared_memory_limit"


class SharedMemoryUnsupported(ServiceError):
    """System shared memory is off on this server, or CUDA shared memory was asked for (UNIMPLEMENTED)."""

    error_reason: str | None = "unimplemented"


def disabled_message(what: str) -> str:
    return (f"{what}: system shared memory is off on this server; start it with --shared-memory system (off by "
            "default: it lets clients have the server map host memory they name)")


def key_problem(key: str) -> str | None:
    """Why `key` is not a POSIX shared-memory name (None when it is one). Such names are "/" followed by up to
    NAME_MAX bytes without "/" or NUL; "/." and "/.." are not objects but the folders around them."""
    if not key.startswith("/"):
        return "it must start with '/' (a POSIX shared-memory name, never a path)"
    rest = key[1:]
    if not rest or rest in (".", ".."):
        return "it must name an object after its leading '/'"
    if "/" in rest:
        return "it may hold no '/' after the first (a POSIX shared-memory name, never a path)"
    if "\x00" in rest:
        return "it may not hold a NUL character"
    if len(rest.encode("utf-8", "surrogateescape")) > NAME_MAX:
        return f"it may be at most {NAME_MAX} bytes after the '/'"
    return None


def prefix_problem(prefix: str) -> str | None:
    """Why `prefix` cannot be --shared-memory-prefix (None when it can): keys are POSIX names, so a prefix is "/"
    followed by the start of a name."""
    if not prefix.startswith("/") or "/" in prefix[1:] or "\x00" in prefix:
        return (f"--shared-memory-prefix must be '/' followed by the start of a name, without another '/'; "
                f"got {prefix!r}")
    return None


class RegionState(enum.Enum):
    REGISTERED = "registered"  # in the table: new requests may use it
    RELEASING = "releasing"  # unregistered; still mapped for the requests that hold it
    UNMAPPED = "unmapped"  # the registry has let go of the mapping (terminal)


@dataclass(frozen=True)
class RegionInfo:
    """What SystemSharedMemoryStatus reports of one region."""

    name: str
    key: str
    offset: int
    byte_size: int


@dataclass(frozen=True)
class SharedMemoryStatistics:
    regions: int  # registered now
    registered_bytes: int  # their byte_size, summed
    mapped_regions: int  # mapped now: the registered ones and unregistered ones that requests still hold
    mapped_bytes: int  # what --shared-memory-max-bytes bounds: each mapping's length (region + its page offset)
    holds: int  # region references held by requests now
    taken: int  # region references taken by requests since the server started (one per tensor in a region)
    lingering: int  # let go by the registry but still mapped by a live view (unmapped when it goes)


class Region:
    """One registered region and its mapping. `_holders` and `state` are guarded by the registry's lock."""

    __slots__ = ("name", "key", "offset", "byte_size", "mapped_bytes", "state", "_mapping", "_start", "_holders",
                 "_registry")

    def __init__(self, registry: SharedMemoryRegistry, name: str, key: str, offset: int, byte_size: int,
                 mapping: mmap.mmap, start: int) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self.mapped_bytes = len(mapping)
        self.state = RegionState.REGISTERED
        self._mapping: mmap.mmap | None = mapping
        self._start = start  # where the region begins in the mapping (mappings start on a page boundary)
        self._holders = 1  # the registry's own reference
        self._registry = registry

    def info(self) -> RegionInfo:
        return RegionInfo(self.name, self.key, self.offset, self.byte_size)

    def slice(self, offset: int, byte_size: int, what: str) -> RegionSlice:
        """The bytes [offset, offset + byte_size) of this region (both >= 0), for `what` (e.g. "input 'INPUT0'").
        Raises InvalidRequest, naming region and numbers, for a range past the region's end."""
        if offset + byte_size > self.byte_size:
            # The region's name comes first: the message's quoted strings stay close together (status_codes
            # shortens a quoted stretch longer than 120 characters).
            raise InvalidRequest(
                f"{what}: shared memory region '{self.name}' holds {self.byte_size} bytes; shared_memory_offset "
                f"{offset} + shared_memory_byte_size {byte_size} = {offset + byte_size} is past its end")
        return RegionSlice(self, offset, byte_size)

    def release(self) -> None:
        """A request is done with this region (call once per `SharedMemoryRegistry.hold`)."""
        self._registry._let_go(self, by_request=True)

    def check_current(self) -> None:
        """Raise InvalidRequest unless this region is still registered under its name."""
        self._registry.check_current(self)

    def _view(self, dtype: np.dtype, count: int, offset: int) -> np.ndarray:
        mapping = self._mapping
        if mapping is None:  # a holder keeps the mapping: only a bug in the holder counts gets here
            raise RuntimeError(f"shared memory region '{self.name}' used after it was unmapped")
        return np.frombuffer(mapping, dtype, count, self._start + offset)


@dataclass(frozen=True)
class RegionSlice:
    """Where one tensor lives: `byte_size` bytes of `region` from `offset`. Valid while the request holds the
    region."""

    region: Region
    offset: int
    byte_size: int

    def array(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A read-only numpy view of the slice as `dtype` and `shape` (no copy). The caller has checked that the
        slice holds exactly that many bytes."""
        count = self.byte_size // dtype.itemsize
        array = self.region._view(dtype, count, self.offset).reshape(shape)
        array.flags.writeable = False
        if not array.flags.aligned:  # an offset that is not a multiple of the item size: engines want aligned data
            array = array.copy()
        return array

    def buffer(self) -> memoryview:
        """The slice's bytes as a read-only memoryview (no copy); release it (`with`) when done."""
        return memoryview(self.region._view(np.dtype(np.uint8), self.byte_size, self.offset)).toreadonly()

    def write(self, data: np.ndarray | bytes, dtype: np.dtype | None = None) -> None:
        """Copy `data` to the start of the slice in one pass: an array as `dtype` (cast on the way when it
        differs), bytes as they are. The caller has checked that it fits."""
        if isinstance(data, np.ndarray):
            dtype = data.dtype if dtype is None else dtype
            target = self.region._view(dtype, data.size, self.offset)
            np.copyto(target.reshape(data.shape), data, casting="unsafe")
        else:
            self.region._view(np.dtype(np.uint8), len(data), self.offset)[:] = np.frombuffer(data, np.uint8)


class SharedMemoryRegistry:
    """The registered regions of one server. Thread-safe; every method returns promptly (mapping and unmapping
    are single system calls, made outside the lock)."""

    def __init__(self, prefix: str = "/", max_bytes: int = DEFAULT_MAX_BYTES, max_regions: int = MAX_REGIONS) -> None:
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.max_regions = max_regions
        self._lock = threading.Lock()  # guards: _regions, _mapped_regions, _mapped_bytes, _holds, _taken, _lingering,
        # and every Region's _holders and state
        self._regions: dict[str, Region] = {}
        self._mapped_regions = 0
        self._mapped_bytes = 0
        self._holds = 0
        self._taken = 0
        self._lingering: list[weakref.ref] = []

    # ---- the protocol's calls -------------------------------------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map `byte_size` bytes of the shared-memory object `key` from `offset`, read-write, under `name`.

        Raises InvalidRequest (naming region, key and numbers; nothing registered or left mapped) for an empty
        name, a name already registered, a key that is not a POSIX shared-memory name or not under the prefix,
        a key that does not exist or is not a shared-memory object, a zero size or a range past the object's
        end; SharedMemoryLimit when the mapping would exceed the byte or region bound.
        """
        if not name:
            raise InvalidRequest("a shared memory region needs a name")
        problem = key_problem(key)
        if problem is not None:
            raise InvalidRequest(f"shared memory region '{name}': key {key!r} is refused: {problem}")
        if not key.startswith(self.prefix):
            raise InvalidRequest(f"shared memory region '{name}': key {key!r} is refused: this server maps only "
                                 f"keys starting with {self.prefix!r} (--shared-memory-prefix)")
        if byte_size <= 0:
            raise InvalidRequest(f"shared memory region '{name}': byte_size must be > 0, got {byte_size}")
        with self._lock:
            self._refuse_duplicate(name)
        mapping, start = _map(name, key, offset, byte_size, self._precheck_bounds)
        try:
            with self._lock:  # again: a racing register may have taken the name or the room meanwhile
                self._refuse_duplicate(name)
                self._check_bounds(name, len(mapping))
                self._regions[name] = Region(self, name, key, offset, byte_size, mapping, start)
                self._mapped_regions += 1
                self._mapped_bytes += len(mapping)
        except BaseException:
            mapping.close()  # refused: nothing stays mapped
            raise

    def unregister(self, name: str) -> None:
        """Remove `name` from the table (an unknown name is not an error, as in Triton). Requests that hold the
        region keep its mapping until they finish; new requests no longer find it."""
        with self._lock:
            region = self._regions.pop(name, None)
            if region is not None:
                region.state = RegionState.RELEASING
        if region is not None:
            self._let_go(region, by_request=False)

    def unregister_all(self) -> None:
        with self._lock:
            regions = list(self._regions.values())
            self._regions.clear()
            for region in regions:
                region.state = RegionState.RELEASING
        for region in regions:
            self._let_go(region, by_request=False)

    close = unregister_all  # at shutdown

    def status(self, name: str = "") -> list[RegionInfo]:
        """Every registered region (name ""), or the one named. Raises RegionNotFound for an unknown name."""
        with self._lock:
            if not name:
                return [region.info() for region in self._regions.values()]
            region = self._regions.get(name)
            if region is None:
                raise RegionNotFound(f"Unable to find system shared memory region: '{name}'")
            return [region.info()]

    # ---- requests ---------------------------------------------------------------------------------------------

    def hold(self, name: str, what: str) -> Region:
        """Take a reference to the region registered as `name` for a request (release it with
        `Region.release`). Raises RegionNotFound (Triton's wording, then `what`: "input 'INPUT0'")."""
        with self._lock:
            region = self._regions.get(name)
            if region is None:
                raise RegionNotFound(f"Unable to find shared memory region: '{name}' (named by {what})")
            region._holders += 1
            self._holds += 1
            self._taken += 1
            return region

    def check_current(self, region: Region) -> None:
        """Raise InvalidRequest unless `region` is still registered under its name (not unregistered, not
        replaced by another registration of that name)."""
        with self._lock:
            current = self._regions.get(region.name) is region
        if not current:
            raise InvalidRequest(
                f"shared memory region '{region.name}' was unregistered after this request was accepted and "
                "before it ran; nothing was read from it or written to it")

    def statistics(self) -> SharedMemoryStatistics:
        with self._lock:
            self._lingering = [ref for ref in self._lingering if _still_mapped(ref)]
            return SharedMemoryStatistics(
                regions=len(self._regions), registered_bytes=sum(r.byte_size for r in self._regions.values()),
                mapped_regions=self._mapped_regions, mapped_bytes=self._mapped_bytes, holds=self._holds,
                taken=self._taken, lingering=len(self._lingering))

    # ---- internals --------------------------------------------------------------------------------------------

    def _refuse_duplicate(self, name: str) -> None:
        region = self._regions.get(name)
        if region is not None:
            raise InvalidRequest(
                f"shared memory region '{name}' is already registered (key {region.key!r}, offset {region.offset},"
                f" {region.byte_size} bytes); unregister it first")

    def _precheck_bounds(self, name: str, length: int) -> None:
        """Refuse a mapping beyond the bounds before it is made (checked again when it is inserted)."""
        with self._lock:
            self._check_bounds(name, length)

    def _check_bounds(self, name: str, length: int) -> None:
        if len(self._regions) >= self.max_regions:
            raise SharedMemoryLimit(f"shared memory region '{name}' is refused: {len(self._regions)} regions are "
                                    f"registered, the most this server maps at once")
        if self._mapped_bytes + length > self.max_bytes:
            raise SharedMemoryLimit(
                f"shared memory region '{name}' is refused: mapping it takes {length} bytes and "
                f"{self._mapped_bytes} are mapped already (regions registered, and unregistered ones that "
                f"requests still use); --shared-memory-max-bytes is {self.max_bytes}")

    def _let_go(self, region: Region, *, by_request: bool) -> None:
        """One holder (a request, or the registry at unregister) is done with `region`; the last one unmaps it."""
        with self._lock:
            region._holders -= 1
            if by_request:
                self._holds -= 1
            if region._holders > 0:
                return
            mapping = region._mapping
            region._mapping = None
            region.state = RegionState.UNMAPPED
            self._mapped_regions -= 1
            self._mapped_bytes -= region.mapped_bytes
        self._unmap(mapping)

    def _unmap(self, mapping: mmap.mmap) -> None:
        try:
            mapping.close()
        except BufferError:
            # A numpy view made while a request held the region is still alive (a response being serialized, an
            # exception's traceback). Unmapping now would pull the memory from under it; CPython's mmap unmaps
            # when the last view goes instead. Counted until then.
            with self._lock:
                self._lingering.append(weakref.ref(mapping))


def _still_mapped(ref: weakref.ref) -> bool:
    mapping = ref()
    return mapping is not None and not mapping.closed


def _map(name: str, key: str, offset: int, byte_size: int,
         precheck: Callable[[str, int], None]) -> tuple[mmap.mmap, int]:
    """Map [offset, offset + byte_size) of the shared-memory object `key` read-write and shared. Returns the
    mapping (it starts at the page boundary at or below `offset`) and where the region begins in it. Raises
    InvalidRequest naming what is wrong, or what `precheck(name, length)` raises just before mapping."""
    where = f"shared memory region '{name}': key {key!r}"
    try:
        descriptor = _posixshmem.shm_open(key, os.O_RDWR, 0)
    except FileNotFoundError:
        raise InvalidRequest(f"{where} does not exist (create it with shm_open first)") from None
    except OSError as error:
        raise InvalidRequest(f"{where} cannot be opened read-write: {_reason(error)}") from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidRequest(f"{where} is not a shared-memory object")
        if offset + byte_size > info.st_size:
            raise InvalidRequest(
                f"{where}: offset {offset} + byte_size {byte_size} = {offset + byte_size} is past the end of the "
                f"object ({info.st_size} bytes)")
        start = offset % mmap.ALLOCATIONGRANULARITY
        precheck(name, start + byte_size)
        try:
            mapping = mmap.mmap(descriptor, start + byte_size, flags=mmap.MAP_SHARED,
                                prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=offset - start)
        except (OSError, OverflowError, ValueError) as error:
            raise InvalidRequest(f"{where} cannot be mapped: {_reason(error)}") from None
    finally:
        os.close(descriptor)  # the mapping keeps the object; the descriptor is not needed
    return mapping, start


def _reason(error: Exception) -> str:
    if isinstance(error, OSError):
        if error.errno == errno.ELOOP:  # shm_open does not follow symbolic links
            return "it is a symbolic link, not a shared-memory object"
        if error.errno == errno.EINVAL:  # the name is valid (checked first), so it names a folder
            return "it is not a shared-memory object"
        return error.strerror or str(error)
    return str(error)
