"""System shared memory: a registry of regions (the protocol's SystemSharedMemory extension, as Triton defines it).

A client on the same host creates a POSIX shared-memory object (`shm_open`), registers part of it under a name
(SystemSharedMemoryRegister: name, key, offset, byte_size), then names that region in its requests instead of
sending tensor bytes: inputs are read from the object, requested outputs are written into it.

**The object stays the client's: nothing the client does to it can crash the server.** The server never maps a
region. It keeps the object's descriptor and copies through the kernel: `os.preadv` reads an input into memory
the server owns, `os.pwrite` writes an output. A client may shrink (truncate) its object at any moment, even
while a request reads it; a mapping would then turn the server's next touch of a page past the new end into
SIGBUS, which kills the process (Python cannot recover from it: the fault may be in ONNX Runtime's own threads).
A read or write through a descriptor instead sees the object's size at the moment of the system call: a read past
the end returns fewer bytes (the request fails naming the region and both sizes), a write past the end extends
the object. No size check before the use is needed for safety, so there is no race to lose. A write still
checks the size first (`RegionSlice.check_object`) and after, so that a shrunk region is refused rather than
silently grown back; a shrink that lands between that check and the write makes the write extend the object
again, never beyond the end of the region it registered. The price: each input is copied (a mapping gave a
view), and the kernel's copies run slower than a memcpy into a mapping on some machines (docs/speed.md).

A region's descriptor is opened when it is registered and closed when the last holder lets go. Its holders are
the registry (from register to unregister) and every request that uses it (from decoding to the end of its
response). So unregistering takes effect for new requests at once, while requests that hold the region keep a
valid descriptor until they finish: a descriptor is never closed (and its number reused) under a running request.
A region moves through RegionState:

    REGISTERED --unregister--> RELEASING (requests still hold it) --last request done--> CLOSED
    REGISTERED --unregister, no request holds it--> CLOSED

Reading and writing host memory on a caller's request is a privilege, so the server has no registry unless it
starts with `--shared-memory system`; keys are POSIX shared-memory names only (a leading "/", no other "/"),
optionally under an operator-chosen prefix. What a registry holds is bounded: names and keys of at most NAME_MAX
bytes, at most `max_regions` regions open at once (MAX_REGIONS, fewer under a low open-file limit: each holds a
descriptor) and `max_bytes` bytes registered at once, counting unregistered regions that requests still hold.

Nothing here imports gRPC or protobuf. The lock guards the table and the holder counts; it is never held across
a system call, nor across anything a request does with a region.
"""

from __future__ import annotations

import _posixshmem  # CPython's own binding of shm_open (what multiprocessing.shared_memory uses)
import enum
import errno
import mmap
import os
import resource
import stat
import threading
from dataclasses import dataclass

import numpy as np

from .core.errors import InvalidRequest, ServiceError

DEFAULT_MAX_BYTES = 1 << 30  # --shared-memory-max-bytes: as much as one request message may carry by default
MAX_REGIONS = 4096  # open at once, at most; fewer when the open-file limit is low (see `default_max_regions`)
NAME_MAX = 255  # bytes (UTF-8) of a region's name, and of a POSIX shared-memory key after its "/" (the file name)
_PAGE = mmap.PAGESIZE
_ITEM_ALIGNMENT = 64  # an input read from a region starts on a multiple of this (every datatype's alignment)
_REGISTER_REFUSED = "failed to register shared memory region '{name}': invalid args"  # Triton's words
CUDA_UNSUPPORTED = (
    "slotserve does not support CUDA shared memory; use system shared memory (start the server "
    "with --shared-memory system). CUDA IPC is planned for the TensorRT engine"
)


class RegionNotFound(ServiceError):
    """No region is registered under the name (NOT_FOUND, as Triton answers)."""

    error_reason: str | None = "region_not_found"


class RegionExists(ServiceError):
    """A region of that name is registered already (ALREADY_EXISTS, as Triton answers)."""

    error_reason: str | None = "region_exists"


class SharedMemoryLimit(ServiceError):
    """Registering would exceed --shared-memory-max-bytes or the region bound (RESOURCE_EXHAUSTED)."""

    error_reason: str | None = "shared_memory_limit"


class SharedMemoryUnsupported(ServiceError):
    """System shared memory is off on this server, or CUDA shared memory was asked for (UNIMPLEMENTED)."""

    error_reason: str | None = "unimplemented"


def disabled_message(what: str) -> str:
    return (
        f"{what}: system shared memory is off on this server; start it with --shared-memory system (off by "
        "default: it lets clients have the server read and write host memory they name)"
    )


def default_max_regions() -> int:
    """MAX_REGIONS, or a quarter of the soft open-file limit (RLIMIT_NOFILE) when that is lower: every open region
    holds a descriptor, and the rest must stay for connections, model files and the engines. A client that could
    use up the descriptors would make the server refuse every new connection."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_REGIONS
    return max(1, min(MAX_REGIONS, soft // 4))


def _utf8_length(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a region (None when it can): it must be non-empty and at most NAME_MAX bytes."""
    if not name:
        return "a shared memory region needs a name"
    length = _utf8_length(name)
    if length > NAME_MAX:
        return f"a shared memory region's name may be at most {NAME_MAX} bytes (UTF-8); this one has {length}"
    return None


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
    if _utf8_length(rest) > NAME_MAX:
        return f"it may be at most {NAME_MAX} bytes after the '/'"
    return None


def prefix_problem(prefix: str) -> str | None:
    """Why `prefix` cannot be --shared-memory-prefix (None when it can): keys are POSIX names, so a prefix is "/"
    followed by the start of a name."""
    if not prefix.startswith("/") or "/" in prefix[1:] or "\x00" in prefix:
        return (
            f"--shared-memory-prefix must be '/' followed by the start of a name, without another '/'; got {prefix!r}"
        )
    return None


class RegionState(enum.Enum):
    REGISTERED = "registered"  # in the table: new requests may use it
    RELEASING = "releasing"  # unregistered; its descriptor stays open for the requests that hold it
    CLOSED = "closed"  # the last holder let go and the descriptor is closed (terminal)


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
    open_regions: int  # descriptors open now: the registered regions and unregistered ones that requests still hold
    open_bytes: int  # what --shared-memory-max-bytes bounds: the byte_size of every open region
    holds: int  # region references held by requests now
    taken: int  # region references taken by requests since the server started (one per tensor in a region)


class Region:
    """One registered region and its object's descriptor. `_holders` and `state` are guarded by the registry's
    lock; the descriptor is only used while the caller holds the region (so it cannot be closed meanwhile)."""

    __slots__ = ("name", "key", "offset", "byte_size", "state", "_descriptor", "_holders", "_registry")

    def __init__(
        self, registry: SharedMemoryRegistry, name: str, key: str, offset: int, byte_size: int, descriptor: int
    ) -> None:
        self.name = name
        self.key = key
        self.offset = offset  # where the region begins in its object
        self.byte_size = byte_size
        self.state = RegionState.REGISTERED
        self._descriptor: int | None = descriptor
        self._holders = 1  # the registry's own reference
        self._registry = registry

    def info(self) -> RegionInfo:
        return RegionInfo(self.name, self.key, self.offset, self.byte_size)

    def slice(self, offset: int, byte_size: int, what: str) -> RegionSlice:
        """The bytes [offset, offset + byte_size) of this region (both >= 0), for `what` (e.g. "input 'INPUT0'").
        Raises InvalidRequest, naming region and numbers, for a range past the region's end."""
        if offset + byte_size > self.byte_size:
            # Triton's words first (an offset at or past the end, or a range past it), then ours. The region's
            # name comes early: the message's quoted strings stay close together (status_codes shortens a quoted
            # stretch longer than 120 characters).
            problem = "Invalid offset" if offset >= self.byte_size else "Invalid offset + byte size"
            raise InvalidRequest(
                f"{problem} for shared memory region: '{self.name}' ({what}: the region holds {self.byte_size} "
                f"bytes; shared_memory_offset {offset} + shared_memory_byte_size {byte_size} = {offset + byte_size} "
                "is past its end)"
            )
        return RegionSlice(self, offset, byte_size, what)

    def release(self) -> None:
        """A request is done with this region (call once per `SharedMemoryRegistry.hold`)."""
        self._registry._let_go(self, by_request=True)

    def check_current(self) -> None:
        """Raise InvalidRequest unless this region is still registered under its name."""
        self._registry.check_current(self)

    def descriptor(self) -> int:
        descriptor = self._descriptor
        if descriptor is None:  # a holder keeps it open: only a bug in the holder counts gets here
            raise RuntimeError(f"shared memory region '{self.name}' used after its descriptor was closed")
        return descriptor

    def object_size(self) -> int:
        """The object's size now (the client may have changed it since it registered the region)."""
        return os.fstat(self.descriptor()).st_size


@dataclass(frozen=True)
class RegionSlice:
    """Where one tensor lives: `byte_size` bytes of `region` from `offset`, for `what` ("input 'INPUT0'"). Valid
    while the request holds the region. Every read and write goes through the region's descriptor (see the module
    docstring): a client shrinking its object gets its request refused, never the server killed."""

    region: Region
    offset: int
    byte_size: int
    what: str = "a tensor"

    @property
    def start(self) -> int:
        """Where the slice begins in the region's object."""
        return self.region.offset + self.offset

    def array(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """The slice's bytes read into a new read-only array of `dtype` and `shape` (one copy, made now: later
        changes to the object are not seen). The caller has checked that the slice holds exactly that many bytes.
        Raises InvalidRequest, naming region and sizes, when the object no longer holds the whole slice."""
        data = self._read_buffer()
        self._read_into(data)
        array = data.view(dtype).reshape(shape)
        array.flags.writeable = False
        return array

    def buffer(self) -> memoryview:
        """The slice's bytes (read now, one copy) as a read-only memoryview. Raises as `array` does."""
        data = self._read_buffer()
        self._read_into(data)
        return memoryview(data).toreadonly()  # type: ignore[arg-type]  # numpy types __buffer__ from Python 3.12

    def check_object(self, byte_size: int) -> None:
        """Raise InvalidRequest, naming region and sizes, unless the object still holds the first `byte_size`
        bytes of the slice: an output is not written into an object its client has shrunk since registering."""
        if byte_size == 0:  # nothing to write: wherever the object ends now, nothing is lost
            return
        size = self.region.object_size()
        if self.start + byte_size > size:
            raise InvalidRequest(self._shrunk(byte_size, size, "nothing was written"))

    def write(self, data: np.ndarray | bytes, dtype: np.dtype | None = None) -> None:
        """Write `data` to the start of the slice: an array as `dtype` (cast first when it differs), bytes as they
        are. The caller has checked that it fits (`byte_size`, and `check_object` for every output of the
        request). Raises InvalidRequest, naming region and sizes, when the object is smaller than what was
        written once the write is done (the client shrank it meanwhile: the output is lost); an OS error
        (e.g. ENOSPC: /dev/shm is full and the region's pages were never allocated) as InvalidRequest too."""
        if isinstance(data, np.ndarray):
            if dtype is not None and data.dtype != dtype:
                data = data.astype(dtype)
            payload = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        else:
            payload = np.frombuffer(data, np.uint8)
        length = len(payload)
        if length == 0:
            return
        self.check_object(length)
        descriptor = self.region.descriptor()
        done = 0
        try:
            while done < length:
                written = os.pwrite(descriptor, payload[done:], self.start + done)  # type: ignore[arg-type]  # as above
                if written <= 0:  # a regular file writes at least a byte or fails; never loop without progress
                    raise OSError(errno.EIO, "the write made no progress")
                done += written
        except OSError as error:
            raise InvalidRequest(
                f"{self.what}: writing into shared memory region '{self.region.name}' (key "
                f"{self.region.key!r}) failed: {_reason(error)}"
            ) from None
        size = self.region.object_size()
        if self.start + length > size:
            raise InvalidRequest(self._shrunk(length, size, "the output written there is lost"))

    def _read_buffer(self) -> np.ndarray:
        """An empty buffer of `byte_size` bytes placed for the kernel's copy: at the same offset within a page as
        the slice's start in the object, so that source and target line up (the copy runs several times faster
        than into numpy's own placement, 16 bytes past a page boundary, on x86 at least); where that offset
        would misalign the tensor's items, at a page boundary."""
        within = self.start % _PAGE
        if within % _ITEM_ALIGNMENT:
            within = 0
        raw = np.empty(self.byte_size + _PAGE, np.uint8)
        skip = (within - raw.ctypes.data) % _PAGE
        return raw[skip : skip + self.byte_size]

    def _read_into(self, target: np.ndarray) -> None:
        """Fill `target` (a writable buffer of `byte_size` bytes) from the slice. A read at or past the object's
        end returns fewer bytes than asked for (never a signal): the object was shrunk."""
        view = target.data  # the array's own memoryview (numpy types __buffer__ only from Python 3.12)
        descriptor = self.region.descriptor()
        done = 0
        try:
            while done < self.byte_size:  # the kernel reads at most ~2 GiB per call
                count = os.preadv(descriptor, [view[done:]], self.start + done)
                if count == 0:  # the object ends at or before start + done (by fstat, where exactly)
                    size = min(self.region.object_size(), self.start + done)
                    raise InvalidRequest(self._shrunk(self.byte_size, size, "the request is refused"))
                done += count
        except OSError as error:
            raise InvalidRequest(
                f"{self.what}: reading shared memory region '{self.region.name}' (key "
                f"{self.region.key!r}) failed: {_reason(error)}"
            ) from None

    def _shrunk(self, needed: int, size: int, consequence: str) -> str:
        region = self.region
        return (
            f"{self.what}: shared memory region '{region.name}' (key {region.key!r}) was registered as "
            f"{region.byte_size} bytes from offset {region.offset} of its object (it held at least "
            f"{region.offset + region.byte_size} bytes then); this tensor needs bytes {self.start} to "
            f"{self.start + needed} of the object, which now holds {size} bytes (shrunk since it was "
            f"registered); {consequence}"
        )


class SharedMemoryRegistry:
    """The registered regions of one server. Thread-safe; every method returns promptly (opening and closing a
    descriptor are single system calls, made outside the lock)."""

    def __init__(self, prefix: str = "/", max_bytes: int = DEFAULT_MAX_BYTES, max_regions: int | None = None) -> None:
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.max_regions = default_max_regions() if max_regions is None else max_regions
        self._lock = threading.Lock()  # guards: _regions, _open_regions, _open_bytes, _holds, _taken,
        # and every Region's _holders and state
        self._regions: dict[str, Region] = {}
        self._open_regions = 0
        self._open_bytes = 0
        self._holds = 0
        self._taken = 0

    # ---- the protocol's calls -------------------------------------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Open the shared-memory object `key` read-write and register its `byte_size` bytes from `offset` as
        `name`.

        Raises InvalidRequest (naming region, key and numbers; nothing registered or left open) for an empty
        name or one longer than NAME_MAX bytes, a name already registered, a key that is not a POSIX
        shared-memory name or not under the prefix, a key that does not exist or is not a shared-memory object,
        a zero size or a range past the object's end; SharedMemoryLimit when the region would exceed the byte
        or region bound.
        """
        problem = name_problem(name)
        if problem is not None:
            raise InvalidRequest(problem)
        problem = key_problem(key)
        if problem is not None:
            raise InvalidRequest(f"shared memory region '{name}': key {key!r} is refused: {problem}")
        if not key.startswith(self.prefix):
            raise InvalidRequest(
                f"shared memory region '{name}': key {key!r} is refused: this server uses only "
                f"keys starting with {self.prefix!r} (--shared-memory-prefix)"
            )
        if byte_size <= 0:
            raise InvalidRequest(f"{_REGISTER_REFUSED.format(name=name)} (byte_size must be > 0, got {byte_size})")
        with self._lock:
            self._refuse_duplicate(name)
            self._check_bounds(name, byte_size)  # before the descriptor is taken (checked again below)
        descriptor = _open(name, key, offset, byte_size)
        try:
            with self._lock:  # again: a racing register may have taken the name or the room meanwhile
                self._refuse_duplicate(name)
                self._check_bounds(name, byte_size)
                self._regions[name] = Region(self, name, key, offset, byte_size, descriptor)
                self._open_regions += 1
                self._open_bytes += byte_size
        except BaseException:
            os.close(descriptor)  # refused: nothing stays open
            raise

    def unregister(self, name: str) -> None:
        """Remove `name` from the table (an unknown name is not an error, as in Triton). Requests that hold the
        region keep its descriptor until they finish; new requests no longer find it."""
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
                "before it ran; nothing was written to it"
            )

    def statistics(self) -> SharedMemoryStatistics:
        with self._lock:
            return SharedMemoryStatistics(
                regions=len(self._regions),
                registered_bytes=sum(r.byte_size for r in self._regions.values()),
                open_regions=self._open_regions,
                open_bytes=self._open_bytes,
                holds=self._holds,
                taken=self._taken,
            )

    # ---- internals --------------------------------------------------------------------------------------------

    def _refuse_duplicate(self, name: str) -> None:
        region = self._regions.get(name)
        if region is not None:
            raise RegionExists(  # Triton's words first: clients and Triton's own tests read them
                f"shared memory region '{name}' already in manager: it is already registered (key {region.key!r}, "
                f"offset {region.offset}, {region.byte_size} bytes); unregister it first"
            )

    def _check_bounds(self, name: str, byte_size: int) -> None:
        if self._open_regions >= self.max_regions:
            raise SharedMemoryLimit(
                f"shared memory region '{name}' is refused: {self._open_regions} regions are open (registered, "
                f"and unregistered ones that requests still use), the most this server keeps at once "
                f"({self.max_regions})"
            )
        if self._open_bytes + byte_size > self.max_bytes:
            raise SharedMemoryLimit(
                f"shared memory region '{name}' is refused: it takes {byte_size} bytes and {self._open_bytes} are "
                f"registered already (counting unregistered regions that requests still use); "
                f"--shared-memory-max-bytes is {self.max_bytes}"
            )

    def _let_go(self, region: Region, *, by_request: bool) -> None:
        """One holder (a request, or the registry at unregister) is done with `region`; the last one closes its
        descriptor."""
        with self._lock:
            region._holders -= 1
            if by_request:
                self._holds -= 1
            if region._holders > 0:
                return
            descriptor = region._descriptor
            region._descriptor = None
            region.state = RegionState.CLOSED
            self._open_regions -= 1
            self._open_bytes -= region.byte_size
        assert descriptor is not None  # only the last holder gets here, and only once
        os.close(descriptor)


def _open(name: str, key: str, offset: int, byte_size: int) -> int:
    """Open the shared-memory object `key` read-write and check that [offset, offset + byte_size) lies inside it.
    Returns the descriptor. Raises InvalidRequest naming what is wrong (nothing left open then)."""
    where = f"shared memory region '{name}': key {key!r}"
    try:
        # O_NONBLOCK: opening must never wait, neither for a lease another process holds on the object (without
        # it, open blocks for /proc/sys/fs/lease-break-time, 45 s by default, pinning a handler thread) nor on a
        # FIFO or a device; O_NOCTTY: nor make one the server's terminal (shm_open adds O_NOFOLLOW). Neither flag
        # changes reads and writes of a regular file.
        descriptor: int = _posixshmem.shm_open(key, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY, 0)
    except FileNotFoundError:
        raise InvalidRequest(
            f"Unable to open shared memory region: {key!r} ({where} does not exist; create it with shm_open first)"
        ) from None
    except OSError as error:
        raise InvalidRequest(f"{where} cannot be opened read-write: {_reason(error)}") from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidRequest(f"{where} is not a shared-memory object")
        if offset + byte_size > info.st_size:
            raise InvalidRequest(
                f"{_REGISTER_REFUSED.format(name=name)} (key {key!r}: offset {offset} + byte_size {byte_size} = "
                f"{offset + byte_size} is past the end of the object ({info.st_size} bytes))"
            )
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _reason(error: Exception) -> str:
    if isinstance(error, OSError):
        if error.errno == errno.ELOOP:  # shm_open does not follow symbolic links
            return "it is a symbolic link, not a shared-memory object"
        if error.errno == errno.EINVAL:  # the name is valid (checked first), so it names a folder
            return "it is not a shared-memory object"
        if error.errno == errno.EWOULDBLOCK:  # O_NONBLOCK: the open would have waited up to lease-break-time
            return (
                "another process holds a lease on it (fcntl F_SETLEASE); opening it would wait for that "
                "process to let go"
            )
        return error.strerror or str(error)
    return str(error)
