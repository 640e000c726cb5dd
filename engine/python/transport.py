"""How tensors move between the server and a python-model worker: shared-memory segments, not pickles.

Each worker has two segments the server creates and owns: requests (server -> worker) and responses
(worker -> server), plus a small cancel board. The pipe carries only control messages: tensor descriptors
(name, datatype, shape, offset, size) and small request fields. A segment too small for a call is replaced by a
larger one (the server creates it and names it in the control message; the worker maps it). A segment's file is
unlinked as soon as the other side has mapped it (`Segment.attach` unlinks what it maps), so a file is named only
between its creation and that mapping.

Memory: a segment's memory is reserved when it is made (`posix_fallocate`), never left sparse: on a tmpfs that is
full (Docker's 64 MiB /dev/shm) making it fails with OutOfSharedMemoryError, which names /dev/shm and its free
space, where writing into a sparse file would kill the writer with SIGBUS. Segments up to KEEP_SEGMENT_BYTES are
sized to a power of two and reused from call to call; a larger one is sized to fit and used for one call only:
when the call ends both sides drop it (`single_use`; the server makes a small one for the next call), so one large
request does not pin its memory for the worker's life.

Copies per tensor: a request's input is copied once, into the request segment; the model gets a read-only
numpy view of it (valid for the call: the segment is reused by the next one). An output is copied by the
worker into the response segment, then once out of it by the server (the segment is reused by the next call),
so two copies. BYTES tensors are laid out as 4-byte little-endian lengths followed by the bytes (KServe's raw
format) and rebuilt as numpy object arrays of `bytes` on the other side.

BLS calls (a model calling another model of the server) go the other way and use a segment per call: the worker
copies the call's inputs into a segment it creates (`write_call`: one copy) and sends a `CallRequest`; the server
maps it, unlinks its file and hands read-only views of it to the callee (no copy), then copies the callee's outputs
into a segment it creates (`write_reply`: one copy) and answers a `CallReply`; the worker maps it, unlinks its file
and gives the model views of it (no copy: the mapping lives as long as the arrays do). So one copy each way.
The control messages themselves (an Execute and its answer, the worker's Grow and Response questions, BLS calls and
their parts) are records of engine/python/messages.py; `send` and `receive` carry them.

A request's path crosses without pickling. The first CONTROL_BYTES of each lane's request and response segment are
its control area (the tensors are laid out after it): the server packs a call's Execute there and the worker its
Done (messages.py `pack_into`: struct, one format per record), and each rings the other with a doorbell, a 7-byte
frame on the pipe naming the lane (`ring`); the reader of the pipe reads the record out of the lane's control area
as it takes the doorbell (`receive`). What is not the common call (a segment handed over, request parameters, a
string sequence id, a Released result, a record too large for the area) is pickled on the pipe as before. The pipe
is the doorbell, rather than an eventfd, a futex or a semaphore beside it, so each direction keeps one channel and
one reader: packed and pickled messages arrive in the order they were sent (a Grow before its Done, BLS calls and
decoupled Responses between calls), and a waiting reader still wakes when the other process dies (the pipe hangs
up). bench/python_doorbell.py measures the options; docs/speed.md ("Python models") has the figures.

Files are named `slotserve-py-<pid>-<random>` after the process that made them. Whatever a process could not
unlink (it was killed) is removed by the next server to start (`remove_leftovers`: files of processes that are
gone), and a server that exits removes its own and its workers' (`remove_own_at_exit`).
"""

from __future__ import annotations

import atexit
import errno
import math
import mmap
import os
import pickle
import re
import struct
import tempfile
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from .. import tensor_codec
from ..datatypes import NAMES, numpy_dtype
from ..errors import OutOfSharedMemoryError
from .messages import (
    CallReply,
    CallRequest,
    Descriptor,
    ErrorResult,
    GrowRefused,
    Message,
    SegmentName,
    Tensors,
    decode,
)

ALIGNMENT = 64
MIN_SEGMENT = 1 << 16
# The head of each lane's request and response segment: where an Execute and its Done cross, packed (`control`);
# the tensors are laid out after it.
CONTROL_BYTES = 4096
# Segments up to this size are kept from call to call; a larger one is used for one call only (`single_use`).
KEEP_SEGMENT_BYTES = 16 << 20
_LARGE_GRANULE = 1 << 20  # a single-use segment is rounded up to whole MiB only
_MiB = float(1 << 20)

_NUMPY = {name: numpy_dtype(name) for name in NAMES if name not in ("BYTES", "BF16")}  # fixed-size, plain numpy


def _shm_directory() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class Segment:
    """A shared-memory file mapped into this process. `create` makes a new one (the server); `attach` maps
    one by path (the worker). Raises OSError when the memory cannot be had."""

    def __init__(self, path: str, size: int, mapping: mmap.mmap | None) -> None:
        self.path = path
        self.size = size
        self.mapping = mapping
        self.view = memoryview(mapping if mapping is not None else b"")

    @classmethod
    def released(cls) -> Segment:
        """The place of a segment dropped after a single use: no file, no memory, size 0."""
        return cls("", 0, None)

    @property
    def name(self) -> SegmentName:
        """How a message names this segment (for the other process to `attach`)."""
        return SegmentName(self.path, self.size)

    @property
    def is_released(self) -> bool:
        """Whether this is the place of a segment dropped after a single use (no memory)."""
        return self.mapping is None

    @classmethod
    def create(cls, size: int) -> Segment:
        """A new segment of at least `size` bytes (`segment_size`), its memory reserved. Raises
        OutOfSharedMemoryError when the shared-memory file system has no room for it, OSError otherwise."""
        size = segment_size(size)
        directory = _shm_directory()
        path = os.path.join(directory, f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except OSError as error:
            raise _no_room(error, directory, size) from None
        try:
            # Reserved, not sparse: a write into a page the file system cannot supply is SIGBUS, which kills.
            os.posix_fallocate(descriptor, 0, size)
            mapping = _mapped(descriptor, size)
        except BaseException as error:
            os.unlink(path)
            raise _no_room(error, directory, size) from None
        finally:
            os.close(descriptor)
        return cls(path, size, mapping)

    @classmethod
    def attach(cls, path: str, size: int) -> Segment:
        """Map the segment another process made, then unlink its file: both sides have it now, and no file is
        left behind whatever happens to either. Raises OSError when it is gone (its maker died)."""
        descriptor = os.open(path, os.O_RDWR)
        try:
            mapping = _mapped(descriptor, size)
        finally:
            os.close(descriptor)
        segment = cls(path, size, mapping)
        segment.unlink()
        return segment

    def unlink(self) -> None:
        """Remove the file (both sides keep their mappings)."""
        if not self.path:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Unmap. A numpy view a model kept past its call keeps the mapping alive; it is then left to the
        garbage collector instead of being unmapped under the view."""
        try:
            self.view.release()
            if self.mapping is not None:
                self.mapping.close()
        except BufferError:
            pass


def _mapped(descriptor: int, size: int) -> mmap.mmap:
    """The file mapped shared, its pages mapped at once (MAP_POPULATE): a segment is written or read whole soon
    after, and one call into the kernel costs a fraction of a page fault per page (a single-use segment is new
    every call)."""
    return mmap.mmap(descriptor, size, flags=mmap.MAP_SHARED | _POPULATE)


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def _no_room(error: BaseException, directory: str, size: int) -> BaseException:
    """OutOfSharedMemoryError for a file system that is full (naming it and its free space); `error` otherwise."""
    if not isinstance(error, OSError) or error.errno not in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
        return error
    try:
        stats = os.statvfs(directory)
        free, total = stats.f_bavail * stats.f_frsize / _MiB, stats.f_blocks * stats.f_frsize / _MiB
        room = f"{free:.1f} MiB free of {total:.0f} MiB"
    except OSError:
        room = "its free space unknown"
    return OutOfSharedMemoryError(
        f"{directory} has no room for a {size / _MiB:.1f} MiB segment to carry a python model's tensors "
        f"({room}); the server needs a larger {directory} for tensors this size (docs/operations.md)"
    )


def segment_size(size: int) -> int:
    """The size of a segment made for `size` bytes: a power of two (at least MIN_SEGMENT) up to
    KEEP_SEGMENT_BYTES, so that a slowly growing tensor does not resize every call; above it, whole MiB (the
    segment is used once: rounding it up to a power of two would only take memory)."""
    if size <= KEEP_SEGMENT_BYTES:
        return max(MIN_SEGMENT, 1 << max(0, int(size - 1).bit_length()))
    return -(-size // _LARGE_GRANULE) * _LARGE_GRANULE


def single_use(segment: Segment | None) -> bool:
    """Whether `segment` is dropped when the call that used it ends (both sides apply this rule)."""
    return segment is not None and segment.size > KEEP_SEGMENT_BYTES


def kept(segment: Segment | None) -> Segment | None:
    """The worker's rule at the end of a call: `segment`, or None (unmapped) when it was single-use; the server
    sends a new one with the next call."""
    if segment is not None and single_use(segment):
        segment.close()
        return None
    return segment


# ---- files: leftovers of dead processes, and this process's at exit ------------------------------------------

PREFIX = "slotserve-py-"
_NAME = re.compile(rf"{PREFIX}(\d+)-")
_LEFTOVER_MARGIN = 2.0  # seconds: a process's start time read from /proc is exact to about a second
_WORKERS_LOCK = threading.Lock()  # guards: _WORKER_PIDS, _AT_EXIT
_WORKER_PIDS: set[int] = set()  # the workers this process started (their files are removed at its exit)
_AT_EXIT = False


def segments_of(pid: int) -> list[str]:
    """The paths of the segments process `pid` created that are still named (a dead worker's BLS inputs)."""
    directory = _shm_directory()
    prefix = f"{PREFIX}{pid}-"
    try:
        return [os.path.join(directory, name) for name in os.listdir(directory) if name.startswith(prefix)]
    except OSError:
        return []


def remove_leftovers(directory: str | None = None) -> list[str]:
    """Remove the segment files left by processes that are gone: the pid in the name is dead, or it belongs to a
    process that started after the file was last changed (the pid was reused, as a restarted container's pid 1
    is). Files of live processes are left alone, so servers sharing a /dev/shm never touch each other's. Returns
    the paths removed; never raises (a file it cannot judge or remove stays)."""
    directory = directory or _shm_directory()
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        match = _NAME.match(name)
        if match is None:
            continue
        path = os.path.join(directory, name)
        try:
            if _left_over(int(match.group(1)), os.stat(path).st_mtime):
                os.unlink(path)
                removed.append(path)
        except OSError:
            continue
    return removed


def _left_over(pid: int, changed: float) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    started = _start_time(pid)
    return started is not None and changed < started - _LEFTOVER_MARGIN


def _start_time(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch), from /proc; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def started_worker(pid: int) -> None:
    """Note a worker this process started: its files are removed at this process's exit."""
    with _WORKERS_LOCK:
        _WORKER_PIDS.add(pid)


def ended_worker(pid: int) -> None:
    """Forget a worker this process started (it ended and its files were removed)."""
    with _WORKERS_LOCK:
        _WORKER_PIDS.discard(pid)


def remove_own_at_exit() -> None:
    """Have this process remove, when it exits, every segment file named after it or after a worker it started
    (what a hung or killed worker, or an exit in the middle of a call, left named). Registered once."""
    global _AT_EXIT
    with _WORKERS_LOCK:
        if _AT_EXIT:
            return
        _AT_EXIT = True
    atexit.register(_remove_own)


def _remove_own() -> None:
    with _WORKERS_LOCK:
        pids = {os.getpid(), *_WORKER_PIDS}
    for pid in pids:
        for path in segments_of(pid):
            try:
                os.unlink(path)
            except OSError:
                pass


def _encode_bytes(array: np.ndarray) -> bytes:
    """A BYTES tensor as length-prefixed elements: tensor_codec's layout, laid out without a list of parts (two
    objects an element made 2 million short strings cost hundreds of MiB on the way to a worker)."""
    return tensor_codec.serialize_bytes(array)


def _decode_bytes(buffer: memoryview, count: int) -> np.ndarray:
    return tensor_codec.deserialize_bytes(buffer, count, "BYTES tensor")


def datatype_of(array: np.ndarray) -> str | None:
    """The KServe datatype a numpy array is sent as; None when none fits."""
    dtype = array.dtype
    try:
        return _DATATYPE_OF[dtype]
    except KeyError:
        pass
    datatype = _datatype_of_dtype(dtype)
    _DATATYPE_OF[dtype] = datatype  # a few dtypes ever: every tensor of every call asks, so remember the answer
    return datatype


def _datatype_of_dtype(dtype: np.dtype) -> str | None:
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    for name, candidate in _NUMPY.items():
        if dtype == candidate or (dtype.kind == candidate.kind and dtype.itemsize == candidate.itemsize):
            return name
    if dtype.name == "bfloat16":
        return "BF16"
    return None


_DATATYPE_OF: dict[np.dtype, str | None] = {}


class Layout:
    """Tensors laid out for one segment from byte `start` on (CONTROL_BYTES for a lane's segments, whose head is
    their control area; 0 for a BLS call's): call `plan` with every tensor, read `size` (the end of the last one),
    then `write`."""

    def __init__(self, start: int = 0) -> None:
        self.size = start
        self._pending: list[tuple[Descriptor, bytes | np.ndarray]] = []

    def plan(self, name: str, array: np.ndarray, datatype: str) -> Descriptor:
        """Reserve room for `array` (sent as `datatype`) after the tensors planned so far and return its Descriptor;
        BYTES are encoded now. Never raises for an array `datatype_of` fits."""
        payload: bytes | np.ndarray
        if datatype == "BYTES":
            payload = _encode_bytes(array)
            nbytes = len(payload)
        else:
            # Bytes, not the array: numpy's own dtypes and ml_dtypes' bfloat16 alike (a buffer cannot carry that one).
            payload = np.ascontiguousarray(array).view(np.uint8)
            nbytes = payload.nbytes
        offset = -(-self.size // ALIGNMENT) * ALIGNMENT
        descriptor = Descriptor(name, datatype, array.shape, offset, nbytes)  # numpy's shape: a tuple of ints
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
            elif descriptor.nbytes:  # a C-contiguous array: its bytes, without numpy's indexing machinery
                view[descriptor.offset : end] = payload.data.cast("B")
        self._pending = []


def read(segment: Segment, descriptor: Descriptor, *, copy: bool, bf16: Any = None) -> np.ndarray:
    """The tensor `descriptor` names: a view of the segment (read-only) or, with `copy`, an array of its own.
    BYTES tensors are always rebuilt (new objects)."""
    _, datatype, shape, offset, nbytes = descriptor
    if datatype == "BYTES":
        return _decode_bytes(segment.view[offset : offset + nbytes], math.prod(shape)).reshape(shape)
    if not copy:  # np.frombuffer at an offset, not of a slice: it holds the mapping as well, for less
        dtype = bf16 if datatype == "BF16" else _NUMPY[datatype]
        array = np.frombuffer(segment.view, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)
        array.flags.writeable = False
        return array
    if datatype == "BF16":  # a buffer cannot carry ml_dtypes' bfloat16: a view's copy
        return np.frombuffer(segment.view, dtype=bf16, count=math.prod(shape), offset=offset).reshape(shape).copy()
    array = np.empty(shape, _NUMPY[datatype])  # an array of its own, its bytes copied in (half a view's copy)
    if nbytes:
        array.data.cast("B")[:] = segment.view[offset : offset + nbytes]
    return array


def read_writable(segment: Segment | None, descriptor: Descriptor, bf16: Any = None) -> np.ndarray:
    """The tensor as a writable view of the segment (a BLS call's output: the segment is the model's alone)."""
    if segment is None:  # every tensor of the reply is empty: there is no segment
        dtype = object if descriptor.datatype == "BYTES" else bf16 if descriptor.datatype == "BF16" else None
        return np.empty(descriptor.shape, dtype=dtype or _NUMPY[descriptor.datatype])
    if descriptor.datatype == "BYTES":
        return read(segment, descriptor, copy=False)
    raw = segment.view[descriptor.offset : descriptor.offset + descriptor.nbytes]
    dtype = bf16 if descriptor.datatype == "BF16" else _NUMPY[descriptor.datatype]
    return np.frombuffer(raw, dtype=dtype, count=math.prod(descriptor.shape)).reshape(descriptor.shape)


# ---- control messages -----------------------------------------------------------------------------------------


def send(connection: Connection, message: Message) -> None:
    """Write one control message, as the plain tuple its record writes (`to_wire`). Plain pickle, not
    Connection.send's ForkingPickler (which builds a pickler with its reducer table per message): the tuples hold
    only tuples, lists, dicts, strings, numbers and the few BLS records. The framing is Connection's. Blocks while
    the pipe is full; raises OSError when the peer is gone."""
    connection.send_bytes(pickle.dumps(message.to_wire(), pickle.HIGHEST_PROTOCOL))


# A request's path (an Execute, its Done) crosses in the lane's control area, packed (messages.py `pack_into`); the
# pipe carries only this doorbell: a frame of Connection's (4-byte big-endian length) whose payload is RING and the
# lane's number. A pickle never starts with RING (its first byte is PROTO, 0x80), so a frame is told apart by its
# first byte. Ringing on the pipe itself, rather than on an eventfd, a futex or a semaphore beside it, keeps one
# channel per direction, read by one reader: a packed message and the pickled ones before and after it (a Grow
# before a Done, BLS calls, a decoupled call's Responses) arrive in the order they were sent, and the reader's wait
# still ends when the peer dies (the pipe hangs up). The wake-up costs what a pipe message's did
# (bench/python_doorbell.py measured the others; docs/speed.md, "Python models").
RING = 0xFE
_RING_PAYLOAD = struct.Struct("<BH")  # RING, the lane
_RING_LENGTH = struct.pack("!i", _RING_PAYLOAD.size)  # Connection's framing: the payload's length


def ring(connection: Connection, lane: int) -> None:
    """Tell the peer that the message of `lane` lies packed in that lane's control area (written before this). One
    write of 7 bytes; the caller holds its send lock, as for `send`. Raises OSError when the peer is gone."""
    os.write(connection.fileno(), _RING_LENGTH + _RING_PAYLOAD.pack(RING, lane))  # 7 bytes: written whole


def receive(connection: Connection, packed: Callable[[int], Message] | None = None) -> Message:
    """Read one control message (blocks, without a timeout: the caller polls first where it needs one): a pickled
    record, or for a doorbell (`ring`) the record `packed(lane)` reads out of the lane's control area. Raises
    EOFError or OSError when the peer is gone, ValueError for bytes that are no message (a doorbell where no
    `packed` reader is given, or a control area that holds no packed record)."""
    data = _read_frame(connection.fileno())
    if data[:1] == _RING_BYTE:
        if packed is None or len(data) != _RING_PAYLOAD.size:
            raise ValueError(f"not a python-worker message: an unexpected doorbell {bytes(data[:8])!r}")
        return packed(_RING_PAYLOAD.unpack(data)[1])
    return decode(pickle.loads(data))


_RING_BYTE = bytes([RING])


def _read_frame(descriptor: int) -> bytes:
    """One frame of Connection's framing (a 4-byte big-endian length, -1 then an 8-byte one for 2 GiB and more,
    then the payload), read straight from the descriptor: Connection.recv_bytes gathers each part in a BytesIO and
    reads the length and the payload apart, which costs more than a small message's read. The first read takes
    _FIRST_READ bytes, a doorbell's whole frame, and never more than one frame holds: every payload sent here (a
    doorbell, a pickle) is at least _SMALLEST_PAYLOAD bytes. Raises EOFError when the peer closed, OSError when it
    is gone."""
    first = os.read(descriptor, _FIRST_READ)
    if len(first) < 4:
        if not first:
            raise EOFError("the peer closed the pipe")
        first += _read_exactly(descriptor, 4 - len(first))
    (size,) = _LENGTH.unpack_from(first)
    rest = first[4:]
    if size == -1:
        first = rest + _read_exactly(descriptor, max(0, 8 - len(rest)))
        (size,) = _LONG_LENGTH.unpack_from(first)
        rest = first[8:]
    if len(rest) > size:  # the first read took bytes of the next frame: no sender of ours writes such a frame
        raise ValueError(f"not a python-worker message: a frame of {size} bytes (at least {_SMALLEST_PAYLOAD})")
    if len(rest) == size:
        return rest
    return rest + _read_exactly(descriptor, size - len(rest))


def _read_exactly(descriptor: int, size: int) -> bytes:
    data = os.read(descriptor, size) if size else b""
    if len(data) == size:
        return data
    if not data:
        raise EOFError("the peer closed the pipe")
    parts = [data]
    left = size - len(data)
    while left:
        chunk = os.read(descriptor, left)
        if not chunk:
            raise EOFError("the peer closed the pipe")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


_LENGTH = struct.Struct("!i")
_LONG_LENGTH = struct.Struct("!Q")
_SMALLEST_PAYLOAD = _RING_PAYLOAD.size  # a pickle is longer (its protocol, its value, its STOP)
_FIRST_READ = _LENGTH.size + _SMALLEST_PAYLOAD


def control(segment: Segment) -> memoryview:
    """The control area of a lane's segment (its first CONTROL_BYTES), where a packed Execute or Done lies."""
    return segment.view[:CONTROL_BYTES]


# ---- BLS calls ------------------------------------------------------------------------------------------------


class NoRoom(Exception):
    """Raised in the worker where the server refused to grow the response segment (GrowRefused)."""


def granted(reply: object) -> SegmentName:
    """The name of the segment a Grow got (the payload of its Reply). Raises NoRoom when the server refused it."""
    if isinstance(reply, GrowRefused):
        raise NoRoom(reply.message)
    if not isinstance(reply, SegmentName):
        raise TypeError(f"a Grow's reply is a SegmentName or GrowRefused, got {reply!r:.100}")
    return reply


def write_call(tensors: Sequence[tuple[str, np.ndarray]]) -> tuple[Segment | None, tuple[Descriptor, ...]]:
    """Lay a BLS call's inputs into a new segment (the caller unlinks and closes it once the call is answered).
    Raises ValueError for an array no datatype fits, or when the shared memory has no room for the inputs."""
    layout = Layout()
    descriptors = tuple(layout.plan(name, array, _datatype_or_raise(name, array)) for name, array in tensors)
    if not descriptors:
        return None, descriptors
    try:
        segment = Segment.create(layout.size)
    except OutOfSharedMemoryError as error:
        raise ValueError(str(error)) from None
    layout.write(segment)
    return segment, descriptors


def read_call(call: CallRequest, bf16: Any = None) -> tuple[Segment | None, dict[str, np.ndarray]]:
    """Map a BLS call's input segment (its file unlinked at once) and view its inputs, read-only. The caller closes
    the segment once the call is done. Raises OSError when the segment is gone (its worker died)."""
    if call.segment is None:
        return None, {}
    segment = Segment.attach(call.segment.path, call.segment.size)
    return segment, {d.name: read(segment, d, copy=False, bf16=bf16) for d in call.request.inputs}


def write_reply(outcomes: Sequence[Mapping[str, np.ndarray] | ErrorResult]) -> CallReply:
    """A BLS call's reply: each outcome is the callee's outputs ({name: array}) or an ErrorResult. The outputs are
    copied into a new segment whose file the worker unlinks once it mapped it. Raises ValueError for an output no
    datatype fits, OutOfSharedMemoryError when the shared memory has no room for them."""
    layout = Layout()
    responses: list[Tensors | ErrorResult] = []
    for outcome in outcomes:
        if isinstance(outcome, ErrorResult):
            responses.append(outcome)
            continue
        planned = [layout.plan(name, array, _datatype_or_raise(name, array)) for name, array in outcome.items()]
        responses.append(Tensors(tuple(planned)))
    if layout.size == 0:
        return CallReply(tuple(responses), None)
    segment = Segment.create(layout.size)
    layout.write(segment)
    name = segment.name
    segment.close()  # the file holds the data until the worker maps it
    return CallReply(tuple(responses), name)


def read_reply(reply: CallReply, bf16: Any = None) -> list[dict[str, np.ndarray] | ErrorResult]:
    """The responses of a BLS reply: {name: array} with writable views of the reply's segment (mapped, its file
    unlinked; the mapping lives as long as the arrays), or its ErrorResult. Raises OSError when the segment cannot
    be mapped."""
    segment = None
    if reply.segment is not None:
        segment = Segment.attach(reply.segment.path, reply.segment.size)
    results: list[dict[str, np.ndarray] | ErrorResult] = []
    for response in reply.responses:
        if isinstance(response, Tensors):
            results.append({d.name: read_writable(segment, d, bf16) for d in response.descriptors})
        else:
            results.append(response)
    return results


def _datatype_or_raise(name: str, array: np.ndarray) -> str:
    if not isinstance(array, np.ndarray):
        raise ValueError(f"tensor '{name}' is a {type(array).__name__}, not a numpy array")
    datatype = datatype_of(array)
    if datatype is None:
        raise ValueError(f"tensor '{name}' has numpy dtype {array.dtype}, which has no Triton datatype")
    return datatype
