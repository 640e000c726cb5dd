"""TEST DOUBLE of TensorRT (runtime, builder, ONNX parser) and of cuda-python's `cuda.bindings.runtime`.

Not for serving: it computes on the CPU (numpy, or ONNX Runtime for engines "built" from ONNX) and exists so the
TensorRT backend can be driven end to end, and its use of the APIs checked, on machines without an NVIDIA GPU.
It is strict where the real stack gives undefined behaviour (a crash, corrupt results, a hang) instead of an
error: every broken rule raises DoubleRuleViolation at once and is recorded in `FakeDevice.violations`, so a test
fails even when the backend swallows the exception.

Usage:
    device = FakeDevice(total_memory=64 << 20)
    backend = TensorRTBackend(trt_module=device.trt, cudart_module=device.cudart)
    device.write_plan(path, inputs=[...], outputs=[...], function="identity")   # a prebuilt model.plan

`device.trt` is a full TensorRT module (with Builder and OnnxParser), `device.trt_lean` a runtime-only one, like
`tensorrt_lean`; `device.cudart` stands for `cuda.bindings.runtime`. Every public name they have exists in the
real modules (tests/tensorrt/test_api_conformance.py checks that), so the double cannot invent API.

Rules enforced (DoubleRuleViolation):
  * a context is used by one thread at a time (each context method takes a non-blocking guard);
  * one enqueue in flight per context: a second execute_async_v3 before its stream drained the first;
  * no default stream: stream 0 in execute_async_v3, cudaMemcpyAsync, set_optimization_profile_async;
  * no buffer reuse while in flight: a pinned host buffer changed between cudaMemcpyAsync (host to device) and
    the copy's execution; a device or pinned buffer touched from a second stream while work on another stream
    still uses it; cudaFree / cudaFreeHost / cudaStreamDestroy with work in flight;
  * async copies only from/to pinned memory (cudaHostAlloc / cudaMallocHost), and only to/from device memory;
  * an I/O address that is not device memory, or too small for the tensor's current shape;
  * CUDA or TensorRT used on a thread that never called cudaSetDevice (stricter than CUDA, which silently picks
    device 0: the backend's rule is to set the device in every thread);
  * a TensorRT Runtime or Builder created without a usable device (the real Runtime segfaults on first use);
  * with profile_sharing=False (the TensorRT <= 8.5 rule), two contexts of one engine enqueued on one profile;
  * get_tensor_profile_shape on an output, or any engine/context call with an unknown tensor name.

Real behaviours reproduced:
  * cudaGetDeviceCount -> (cudaErrorInsufficientDriver, None) without a driver, (cudaErrorNoDevice, 0) without
    a device; every other CUDA call then fails with that error;
  * device memory is a budget: cudaMalloc fails with cudaErrorMemoryAllocation, deserialize_cuda_engine and
    create_execution_context return None when weights or activation memory do not fit; cudaMemGetInfo reports it;
    a context also takes `persistent_bytes` that no API reports (as real contexts do);
  * work is deferred: nothing queued on a stream runs before cudaStreamSynchronize, and the host side of a
    device-to-host copy holds garbage (0xA5 bytes) until then, so reading results before synchronizing fails;
  * plans are serialized descriptions of a compute function ("identity", "add_sub", or "onnx" with the model's
    bytes) tied to the TensorRT version and GPU name: deserializing on another returns None;
  * set_input_shape returns False outside the active profile's [min, max]; execute_async_v3 returns False when a
    shape or address is unset; set_optimization_profile_async raises RuntimeError for a bad index.

Hooks (`device.hooks`) let tests order events without sleeping: `before_drain(stream)` runs in
cudaStreamSynchronize before the queued work, `in_context_call(name)` runs inside a context method while its
guard is held, `after_enqueue()` runs after a successful execute_async_v3.
"""

from __future__ import annotations

import base64
import bisect
import ctypes
import enum
import hashlib
import json
import logging
import threading
import types
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

_LOG = logging.getLogger(__name__)

PLAN_MAGIC = b"SLOTSERVE-TRT-DOUBLE-PLAN\n"
TIMING_MAGIC = b"SLOTSERVE-TRT-DOUBLE-TIMING\n"
POISON = 0xA5
FUNCTIONS = ("identity", "add_sub", "onnx")


class DoubleRuleViolation(AssertionError):
    """The code under test broke a TensorRT/CUDA rule that real hardware would punish with undefined behaviour."""


# ------------------------------------------------------------------------------------------ CUDA enums, types


class cudaError_t(enum.IntEnum):  # noqa: N801 - the real names
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInsufficientDriver = 35
    cudaErrorNoDevice = 100
    cudaErrorInvalidDevice = 101
    cudaErrorInvalidResourceHandle = 400


class cudaMemcpyKind(enum.IntEnum):  # noqa: N801
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3
    cudaMemcpyDefault = 4


class cudaDeviceProp:  # noqa: N801
    """Only `name` (bytes, as cuda-bindings returns it) and `totalGlobalMem`."""

    def __init__(self, name: bytes = b"", totalGlobalMem: int = 0) -> None:  # noqa: N803
        self._name, self._total = name, totalGlobalMem

    @property
    def name(self) -> bytes:
        return self._name

    @property
    def totalGlobalMem(self) -> int:  # noqa: N802
        return self._total


# ---------------------------------------------------------------------------------------- TensorRT enums, types


class TensorIOMode(enum.Enum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class TensorLocation(enum.Enum):
    DEVICE = 0
    HOST = 1


class DataType(enum.Enum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    FP8 = 6
    BF16 = 7
    INT64 = 8
    INT4 = 9
    FP4 = 10
    E8M0 = 11


class ExecutionContextAllocationStrategy(enum.Enum):
    STATIC = 0
    ON_PROFILE_CHANGE = 1
    USER_MANAGED = 2


class MemoryPoolType(enum.Enum):
    WORKSPACE = 0


class _Severity(enum.IntEnum):
    INTERNAL_ERROR = 0
    ERROR = 1
    WARNING = 2
    INFO = 3
    VERBOSE = 4


def nptype(trt_type: DataType) -> type:
    """numpy type of a DataType; TypeError for types numpy lacks (FP8, INT4, FP4, E8M0), as the real one."""
    table: dict[DataType, Any] = {
        DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT8: np.int8, DataType.INT32: np.int32,
        DataType.INT64: np.int64, DataType.BOOL: np.bool_, DataType.UINT8: np.uint8,
    }
    if trt_type == DataType.BF16:
        from ..datatypes import bfloat16

        return bfloat16().type
    if trt_type not in table:
        raise TypeError(f"Could not resolve TensorRT datatype to an equivalent numpy datatype: {trt_type}")
    return table[trt_type]


# ONNX TensorProto element types the fake parser accepts.
_ONNX_TYPES = {1: DataType.FLOAT, 10: DataType.HALF, 16: DataType.BF16, 3: DataType.INT8, 6: DataType.INT32,
               7: DataType.INT64, 9: DataType.BOOL, 2: DataType.UINT8}


# ------------------------------------------------------------------------------------------- device model


@dataclass
class Hooks:
    """Test hooks; each runs on the thread that triggers it. None: nothing happens."""

    before_drain: Callable[[int], None] | None = None
    in_context_call: Callable[[str], None] | None = None
    after_enqueue: Callable[[], None] | None = None


@dataclass
class Counters:
    """What the double observed. `events` lists creations/destructions in order ("context 3 destroyed")."""

    runtimes_created: int = 0
    deserializations: int = 0
    engines_live: int = 0
    contexts_created: int = 0
    contexts_live: int = 0
    context_failures: int = 0
    streams_live: int = 0
    stream_flags: list[int] = field(default_factory=list)
    device_allocations_live: int = 0
    host_allocations_live: int = 0
    enqueues: int = 0
    copies: int = 0
    builds: int = 0
    timing_cache_hits: int = 0
    set_device_calls: int = 0
    events: list[str] = field(default_factory=list)


@dataclass(eq=False)
class _Allocation:
    base: int
    size: int
    kind: str  # "device", "host", "weights", "activation", "consumed"
    data: Any = None  # bytearray (device), ctypes array (host), None (size-only)
    pending: dict[int, int] = field(default_factory=dict)  # stream handle -> queued operations using it

    def busy_on(self) -> list[int]:
        return [stream for stream, count in self.pending.items() if count > 0]


@dataclass(eq=False)
class _Op:
    run: Callable[[], None]
    allocations: list[_Allocation]
    description: str


@dataclass(eq=False)
class _Stream:
    handle: int
    flags: int
    queue: deque = field(default_factory=deque)


class FakeDevice:
    """One simulated GPU (and its driver) plus the TensorRT and CUDA modules bound to it.

    Thread-safe: the device's tables are guarded by one re-entrant lock (re-entrant because object finalizers,
    which release memory, may run while the same thread holds it). Queued work runs outside the lock.
    """

    def __init__(self, *, total_memory: int = 1 << 30, name: str = "Double GPU", device_count: int = 1,
                 driver: bool = True, trt_version: str = "11.4.0.106", profile_sharing: bool = True,
                 activation_bytes: int = 1 << 20, persistent_bytes: int = 0, require_set_device: bool = True) -> None:
        self.total_memory = total_memory
        self.name = name
        self.device_count = device_count
        self.driver = driver
        self.trt_version = trt_version
        self.profile_sharing = profile_sharing
        self.activation_bytes = activation_bytes
        self.persistent_bytes = persistent_bytes
        self.require_set_device = require_set_device
        self.hooks = Hooks()
        self.stats = Counters()
        self.violations: list[str] = []
        self.log: list[str] = []
        self._lock = threading.RLock()  # guards: every table below, stats, violations, _used
        self._used = 0
        self._device: dict[int, _Allocation] = {}
        self._device_bases: list[int] = []
        self._host: dict[int, _Allocation] = {}
        self._host_bases: list[int] = []
        self._streams: dict[int, _Stream] = {}
        self._next_address = 0x7F00_0000_0000
        self._next_stream = 0x5000
        self._next_id = 0
        self._thread = threading.local()
        self.cudart = FakeCudaRuntime(self)
        self.trt = _trt_module(self, builder=True)
        self.trt_lean = _trt_module(self, builder=False)

    # -- rules

    def violate(self, message: str) -> DoubleRuleViolation:
        """Record a broken rule and return the exception to raise."""
        with self._lock:
            self.violations.append(message)
        return DoubleRuleViolation(message)

    def _record_only(self, message: str) -> None:
        """For finalizers, which cannot raise into the caller."""
        with self._lock:
            self.violations.append(message)

    def require_device(self, what: str) -> None:
        if self.require_set_device and getattr(self._thread, "device", None) is None:
            raise self.violate(f"{what} on thread {threading.current_thread().name!r}, which never called "
                               "cudaSetDevice")

    @property
    def usable(self) -> bool:
        return self.driver and self.device_count > 0

    def new_id(self) -> int:
        with self._lock:
            self._next_id += 1
            return self._next_id

    # -- memory

    @property
    def free_memory(self) -> int:
        with self._lock:
            return self.total_memory - self._used

    def allocate(self, size: int, kind: str) -> _Allocation | None:
        """Take `size` bytes of device memory (None when they do not fit)."""
        with self._lock:
            if size > self.total_memory - self._used:
                return None
            self._used += size
            base = self._next_address
            self._next_address += (size + 0xFFFF) & ~0xFFF  # aligned, with a gap so overruns never hit a neighbour
            allocation = _Allocation(base, size, kind, bytearray(size) if kind == "device" else None)
            self._device[base] = allocation
            bisect.insort(self._device_bases, base)
            if kind == "device":
                self.stats.device_allocations_live += 1
            return allocation

    def release(self, allocation: _Allocation) -> None:
        with self._lock:
            if self._device.pop(allocation.base, None) is None:
                return
            self._device_bases.remove(allocation.base)
            self._used -= allocation.size
            if allocation.kind == "device":
                self.stats.device_allocations_live -= 1

    def consume(self, nbytes: int) -> _Allocation:
        """Take device memory as another process would (tests use it to exhaust the device)."""
        allocation = self.allocate(nbytes, "consumed")
        if allocation is None:
            raise ValueError(f"only {self.free_memory} bytes free")
        return allocation

    def _allocate_host(self, size: int) -> _Allocation:
        buffer = (ctypes.c_ubyte * max(1, size))()
        allocation = _Allocation(ctypes.addressof(buffer), size, "host", buffer)
        with self._lock:
            self._host[allocation.base] = allocation
            bisect.insort(self._host_bases, allocation.base)
            self.stats.host_allocations_live += 1
        return allocation

    def _release_host(self, allocation: _Allocation) -> None:
        with self._lock:
            self._host.pop(allocation.base)
            self._host_bases.remove(allocation.base)
            self.stats.host_allocations_live -= 1

    @staticmethod
    def _find(table: dict[int, _Allocation], bases: list[int], pointer: int, nbytes: int) -> _Allocation | None:
        index = bisect.bisect_right(bases, pointer) - 1
        if index < 0:
            return None
        allocation = table[bases[index]]
        if pointer + nbytes > allocation.base + allocation.size:
            return None
        return allocation

    def find_device(self, pointer: int, nbytes: int) -> _Allocation | None:
        with self._lock:
            found = self._find(self._device, self._device_bases, pointer, nbytes)
            return found if found is not None and found.kind == "device" else None

    def find_host(self, pointer: int, nbytes: int) -> _Allocation | None:
        with self._lock:
            return self._find(self._host, self._host_bases, pointer, nbytes)

    def read_device(self, pointer: int, nbytes: int) -> bytes:
        allocation = self.find_device(pointer, nbytes)
        assert allocation is not None
        offset = pointer - allocation.base
        return bytes(allocation.data[offset:offset + nbytes])

    def write_device(self, pointer: int, data: bytes) -> None:
        allocation = self.find_device(pointer, len(data))
        assert allocation is not None
        offset = pointer - allocation.base
        allocation.data[offset:offset + len(data)] = data

    # -- streams

    def new_stream(self, flags: int) -> int:
        with self._lock:
            self._next_stream += 0x10
            self._streams[self._next_stream] = _Stream(self._next_stream, flags)
            self.stats.streams_live += 1
            self.stats.stream_flags.append(flags)
            return self._next_stream

    def stream(self, handle: Any, what: str) -> _Stream | None:
        """The live stream `handle`; a violation for the default stream, None for an unknown handle."""
        handle = int(handle)
        if handle == 0:
            raise self.violate(f"{what} on the default stream (0): every slot must use its own stream")
        with self._lock:
            return self._streams.get(handle)

    def enqueue(self, stream: _Stream, op: _Op) -> None:
        """Queue `op` on `stream`; a violation if a buffer it uses is still in use by another stream's work."""
        with self._lock:
            for allocation in op.allocations:
                others = [s for s in allocation.busy_on() if s != stream.handle]
                if others:
                    raise self.violate(
                        f"{op.description}: {allocation.kind} buffer 0x{allocation.base:x} is still used by work in "
                        f"flight on stream 0x{others[0]:x}")
            for allocation in op.allocations:
                allocation.pending[stream.handle] = allocation.pending.get(stream.handle, 0) + 1
            stream.queue.append(op)

    def drain(self, stream: _Stream) -> None:
        """Run everything queued on `stream`, in order (what cudaStreamSynchronize waits for)."""
        if self.hooks.before_drain is not None:
            self.hooks.before_drain(stream.handle)
        while True:
            with self._lock:
                if not stream.queue:
                    return
                op = stream.queue.popleft()
            try:
                op.run()
            finally:
                with self._lock:
                    for allocation in op.allocations:
                        allocation.pending[stream.handle] -= 1

    def pending_operations(self) -> int:
        with self._lock:
            return sum(len(s.queue) for s in self._streams.values())

    # -- plans

    def make_plan(self, *, inputs: Sequence[tuple[str, str, Sequence[int]]],
                  outputs: Sequence[tuple[str, str, Sequence[int]]], function: str = "identity",
                  profiles: Sequence[Mapping[str, Sequence[Sequence[int]]]] = (),
                  weights_bytes: int = 1 << 20, activation_bytes: int | None = None, onnx: bytes | None = None,
                  trt_version: str | None = None, device_name: str | None = None) -> bytes:
        """A serialized engine for this device. Tensors are (name, DataType name, shape with -1); `profiles`
        give {input: (min, opt, max)} for each profile (default: one profile of the static input shapes)."""
        if function not in FUNCTIONS:
            raise ValueError(f"function must be one of {FUNCTIONS}")
        if not profiles:
            if any(d < 0 for _, _, shape in inputs for d in shape):
                raise ValueError("dynamic inputs need profiles")
            profiles = [{name: (shape, shape, shape) for name, _, shape in inputs}]
        description = {
            "trt_version": trt_version or self.trt_version, "device_name": device_name or self.name,
            "function": function, "onnx": base64.b64encode(onnx).decode() if onnx else None,
            "inputs": [[n, t, list(s)] for n, t, s in inputs], "outputs": [[n, t, list(s)] for n, t, s in outputs],
            "profiles": [{name: [list(s) for s in shapes] for name, shapes in p.items()} for p in profiles],
            "weights_bytes": weights_bytes,
            "activation_bytes": self.activation_bytes if activation_bytes is None else activation_bytes,
        }
        # A real plan carries the weights, so its size is about the weights' size; the filler stands for them.
        return PLAN_MAGIC + json.dumps(description, sort_keys=True).encode() + b"\n" + bytes(weights_bytes)

    def write_plan(self, path: Path | str, **kwargs: Any) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.make_plan(**kwargs))
        return path

    # -- checks for tests

    def leaks(self) -> dict[str, int]:
        """Everything still allocated or alive (memory taken by `consume` excluded); {} when clean."""
        stats = self.stats
        found = {"engines": stats.engines_live, "contexts": stats.contexts_live, "streams": stats.streams_live,
                 "device allocations": stats.device_allocations_live,
                 "host allocations": stats.host_allocations_live, "pending operations": self.pending_operations()}
        with self._lock:
            found["device bytes"] = self._used - sum(a.size for a in self._device.values() if a.kind == "consumed")
        return {k: v for k, v in found.items() if v}


# ------------------------------------------------------------------------------------------- CUDA runtime


class FakeCudaRuntime:
    """Stands for `cuda.bindings.runtime`: functions return `(cudaError_t, *values)` and never raise for a CUDA
    error (they raise DoubleRuleViolation for a broken rule)."""

    cudaError_t = cudaError_t
    cudaMemcpyKind = cudaMemcpyKind
    cudaDeviceProp = cudaDeviceProp
    cudaStreamDefault = 0
    cudaStreamNonBlocking = 1
    cudaHostAllocDefault = 0

    def __init__(self, device: FakeDevice) -> None:
        self._device = device

    def _unavailable(self) -> int | None:
        if not self._device.driver:
            return cudaError_t.cudaErrorInsufficientDriver
        if self._device.device_count == 0:
            return cudaError_t.cudaErrorNoDevice
        return None

    def cudaGetDeviceCount(self) -> tuple:  # noqa: N802
        if not self._device.driver:
            return (cudaError_t.cudaErrorInsufficientDriver, None)
        if self._device.device_count == 0:
            return (cudaError_t.cudaErrorNoDevice, 0)
        return (cudaError_t.cudaSuccess, self._device.device_count)

    def cudaSetDevice(self, device: int) -> tuple:  # noqa: N802
        error = self._unavailable()
        if error is not None:
            return (error,)
        if not 0 <= int(device) < self._device.device_count:
            return (cudaError_t.cudaErrorInvalidDevice,)
        self._device._thread.device = int(device)
        with self._device._lock:
            self._device.stats.set_device_calls += 1
        return (cudaError_t.cudaSuccess,)

    def cudaGetDevice(self) -> tuple:  # noqa: N802
        return (cudaError_t.cudaSuccess, getattr(self._device._thread, "device", 0))

    def cudaGetDeviceProperties(self, device: int) -> tuple:  # noqa: N802
        error = self._unavailable()
        if error is not None:
            return (error, None)
        return (cudaError_t.cudaSuccess, cudaDeviceProp(self._device.name.encode(), self._device.total_memory))

    def cudaGetErrorName(self, error: Any) -> tuple:  # noqa: N802
        try:
            return (cudaError_t.cudaSuccess, cudaError_t(int(error)).name.encode())
        except ValueError:
            return (cudaError_t.cudaErrorInvalidValue, b"")

    def cudaMemGetInfo(self) -> tuple:  # noqa: N802
        error = self._unavailable()
        if error is not None:
            return (error, None, None)
        self._device.require_device("cudaMemGetInfo")
        return (cudaError_t.cudaSuccess, self._device.free_memory, self._device.total_memory)

    def cudaMalloc(self, size: int) -> tuple:  # noqa: N802
        error = self._unavailable()
        if error is not None:
            return (error, None)
        self._device.require_device("cudaMalloc")
        allocation = self._device.allocate(int(size), "device")
        if allocation is None:
            return (cudaError_t.cudaErrorMemoryAllocation, None)
        return (cudaError_t.cudaSuccess, allocation.base)

    def cudaFree(self, devPtr: int) -> tuple:  # noqa: N802, N803
        self._device.require_device("cudaFree")
        with self._device._lock:
            allocation = self._device._device.get(int(devPtr))
            if allocation is None or allocation.kind != "device":
                return (cudaError_t.cudaErrorInvalidValue,)
            if allocation.busy_on():
                raise self._device.violate(f"cudaFree(0x{allocation.base:x}) while work in flight still uses it")
            self._device.release(allocation)
        return (cudaError_t.cudaSuccess,)

    def cudaHostAlloc(self, size: int, flags: int) -> tuple:  # noqa: N802
        error = self._unavailable()
        if error is not None:
            return (error, None)
        self._device.require_device("cudaHostAlloc")
        return (cudaError_t.cudaSuccess, self._device._allocate_host(int(size)).base)

    def cudaMallocHost(self, size: int) -> tuple:  # noqa: N802
        return self.cudaHostAlloc(size, self.cudaHostAllocDefault)

    def cudaFreeHost(self, ptr: int) -> tuple:  # noqa: N802
        self._device.require_device("cudaFreeHost")
        with self._device._lock:
            allocation = self._device._host.get(int(ptr))
            if allocation is None:
                return (cudaError_t.cudaErrorInvalidValue,)
            if allocation.busy_on():
                raise self._device.violate(f"cudaFreeHost(0x{allocation.base:x}) while an async copy still uses it")
            self._device._release_host(allocation)
        return (cudaError_t.cudaSuccess,)

    def cudaMemcpyAsync(self, dst: int, src: int, count: int, kind: Any, stream: Any) -> tuple:  # noqa: N802
        device = self._device
        device.require_device("cudaMemcpyAsync")
        queue = device.stream(stream, "cudaMemcpyAsync")
        if queue is None:
            return (cudaError_t.cudaErrorInvalidResourceHandle,)
        dst, src, count = int(dst), int(src), int(count)
        if kind == cudaMemcpyKind.cudaMemcpyHostToDevice:
            op = self._host_to_device(dst, src, count)
        elif kind == cudaMemcpyKind.cudaMemcpyDeviceToHost:
            op = self._device_to_host(dst, src, count)
        else:
            return (cudaError_t.cudaErrorInvalidValue,)
        if op is None:
            return (cudaError_t.cudaErrorInvalidValue,)
        device.enqueue(queue, op)
        with device._lock:
            device.stats.copies += 1
        return (cudaError_t.cudaSuccess,)

    def _pinned(self, pointer: int, count: int, role: str) -> _Allocation:
        host = self._device.find_host(pointer, count)
        if host is None:
            raise self._device.violate(
                f"cudaMemcpyAsync {role} 0x{pointer:x} (+{count}) is not pinned memory from cudaHostAlloc: an async "
                "copy from pageable memory is synchronous, and its buffer may move")
        return host

    def _host_to_device(self, dst: int, src: int, count: int) -> _Op | None:
        host = self._pinned(src, count, "source")
        target = self._device.find_device(dst, count)
        if target is None:
            return None
        snapshot = ctypes.string_at(src, count)
        device = self._device

        def run() -> None:
            # The copy reads the host buffer when the GPU gets to it, not when it was queued: a change in between
            # would be copied (or not) at random on real hardware.
            if ctypes.string_at(src, count) != snapshot:
                raise device.violate(f"pinned host buffer 0x{src:x} was modified while the async copy reading it "
                                     "was in flight")
            device.write_device(dst, snapshot)

        return _Op(run, [host, target], "cudaMemcpyAsync(host to device)")

    def _device_to_host(self, dst: int, src: int, count: int) -> _Op | None:
        host = self._pinned(dst, count, "destination")
        source = self._device.find_device(src, count)
        if source is None:
            return None
        device = self._device
        # Until the copy ran, the host side holds whatever was there: make that visibly wrong.
        ctypes.memset(dst, POISON, count)

        def run() -> None:
            ctypes.memmove(dst, device.read_device(src, count), count)

        return _Op(run, [host, source], "cudaMemcpyAsync(device to host)")

    def cudaStreamCreateWithFlags(self, flags: int) -> tuple:  # noqa: N802
        error = self._unavailable()
        if error is not None:
            return (error, None)
        self._device.require_device("cudaStreamCreateWithFlags")
        return (cudaError_t.cudaSuccess, self._device.new_stream(int(flags)))

    def cudaStreamCreate(self) -> tuple:  # noqa: N802
        return self.cudaStreamCreateWithFlags(self.cudaStreamDefault)

    def cudaStreamSynchronize(self, stream: Any) -> tuple:  # noqa: N802
        self._device.require_device("cudaStreamSynchronize")
        queue = self._device.stream(stream, "cudaStreamSynchronize")
        if queue is None:
            return (cudaError_t.cudaErrorInvalidResourceHandle,)
        self._device.drain(queue)
        return (cudaError_t.cudaSuccess,)

    def cudaStreamDestroy(self, stream: Any) -> tuple:  # noqa: N802
        device = self._device
        device.require_device("cudaStreamDestroy")
        with device._lock:
            queue = device.stream(stream, "cudaStreamDestroy")
            if queue is None:
                return (cudaError_t.cudaErrorInvalidResourceHandle,)
            if queue.queue:
                raise device.violate(f"cudaStreamDestroy(0x{queue.handle:x}) with {len(queue.queue)} operations "
                                     "still queued: their buffers may be freed next")
            del device._streams[queue.handle]
            device.stats.streams_live -= 1
        return (cudaError_t.cudaSuccess,)


# ------------------------------------------------------------------------------------------------ TensorRT


class _PlanDescription:
    """A parsed plan: tensors, profiles, the compute function."""

    def __init__(self, raw: dict) -> None:
        self.raw = raw
        self.inputs = [(n, DataType[t], tuple(s)) for n, t, s in raw["inputs"]]
        self.outputs = [(n, DataType[t], tuple(s)) for n, t, s in raw["outputs"]]
        self.tensors = {n: (t, s, True) for n, t, s in self.inputs}
        self.tensors.update({n: (t, s, False) for n, t, s in self.outputs})
        self.order = [n for n, _, _ in self.inputs] + [n for n, _, _ in self.outputs]
        self.profiles = [{name: tuple(tuple(s) for s in shapes) for name, shapes in p.items()}
                         for p in raw["profiles"]]
        self.function = raw["function"]
        self.onnx = base64.b64decode(raw["onnx"]) if raw.get("onnx") else None


class Logger:
    """Stands for tensorrt.Logger: records messages at or above `min_severity` in the device log."""

    Severity = _Severity
    INTERNAL_ERROR = _Severity.INTERNAL_ERROR
    ERROR = _Severity.ERROR
    WARNING = _Severity.WARNING
    INFO = _Severity.INFO
    VERBOSE = _Severity.VERBOSE

    def __init__(self, min_severity: _Severity = _Severity.WARNING) -> None:
        self.min_severity = min_severity

    def log(self, severity: _Severity, msg: str) -> None:
        if severity <= self.min_severity:
            _LOG.warning("[TensorRT double] %s", msg)


class _Bound:
    """Base of the double's classes that belong to one FakeDevice (set on per-device subclasses)."""

    _fake: FakeDevice


def _log(logger: Any, device: FakeDevice, message: str) -> None:
    device.log.append(message)
    if logger is not None:
        logger.log(_Severity.ERROR, message)


class Runtime(_Bound):
    """Stands for tensorrt.Runtime."""

    def __init__(self, logger: Any) -> None:
        device = self._fake
        if not device.usable:
            raise device.violate("tensorrt.Runtime created without a usable CUDA device: the real one returns an "
                                 "object that segfaults on first use (probe cudaGetDeviceCount first)")
        device.require_device("tensorrt.Runtime()")
        self.logger = logger
        with device._lock:
            device.stats.runtimes_created += 1

    def deserialize_cuda_engine(self, serialized_engine: Any) -> ICudaEngine | None:
        device = self._fake
        device.require_device("deserialize_cuda_engine")
        data = bytes(serialized_engine)
        if not data.startswith(PLAN_MAGIC):
            _log(self.logger, device, "deserialize_cuda_engine: not a plan")
            return None
        raw = json.loads(data[len(PLAN_MAGIC):].split(b"\n", 1)[0])
        if raw["trt_version"] != device.trt_version or raw["device_name"] != device.name:
            _log(self.logger, device, f"deserialize_cuda_engine: plan built by TensorRT {raw['trt_version']} for "
                                      f"{raw['device_name']!r}, this is {device.trt_version} on {device.name!r}")
            return None
        weights = device.allocate(int(raw["weights_bytes"]), "weights")
        if weights is None:
            _log(self.logger, device, "deserialize_cuda_engine: out of device memory")
            return None
        with device._lock:
            device.stats.deserializations += 1
        return device.trt.ICudaEngine(self, _PlanDescription(raw), weights)


class ICudaEngine(_Bound):
    """Stands for tensorrt.ICudaEngine. Holds its runtime (as the real binding keeps it alive)."""

    def __init__(self, runtime: Runtime, plan: _PlanDescription, weights: _Allocation) -> None:
        device = self._fake
        self._runtime = runtime
        self._plan = plan
        self._weights = weights
        self._id = device.new_id()
        self._contexts: weakref.WeakSet[IExecutionContext] = weakref.WeakSet()
        self._session: Any = None
        self._session_lock = threading.Lock()  # guards: _session, _shape_cache
        self._shape_cache: dict[tuple, dict[str, tuple[int, ...]]] = {}
        with device._lock:
            device.stats.engines_live += 1
            device.stats.events.append(f"engine {self._id} created")

    def __del__(self) -> None:
        device = self._fake
        device.release(self._weights)
        with device._lock:
            device.stats.engines_live -= 1
            device.stats.events.append(f"engine {self._id} destroyed")

    def _tensor(self, name: str) -> tuple[DataType, tuple[int, ...], bool]:
        found = self._plan.tensors.get(name)
        if found is None:
            raise self._fake.violate(f"engine has no tensor named {name!r}")
        return found

    @property
    def num_io_tensors(self) -> int:
        return len(self._plan.order)

    @property
    def num_optimization_profiles(self) -> int:
        return len(self._plan.profiles)

    @property
    def device_memory_size_v2(self) -> int:
        return int(self._plan.raw["activation_bytes"])

    def get_device_memory_size_for_profile_v2(self, profile_index: int) -> int:
        return int(self._plan.raw["activation_bytes"])

    def get_tensor_name(self, index: int) -> str:
        return self._plan.order[index]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return TensorIOMode.INPUT if self._tensor(name)[2] else TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name: str) -> DataType:
        return self._tensor(name)[0]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self._tensor(name)[1]

    def get_tensor_location(self, name: str) -> TensorLocation:
        self._tensor(name)
        return TensorLocation.DEVICE

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple[int, ...]]:
        if not self._tensor(name)[2]:
            raise self._fake.violate(f"get_tensor_profile_shape({name!r}): profiles exist for inputs only")
        if not 0 <= profile_index < len(self._plan.profiles):
            raise self._fake.violate(f"get_tensor_profile_shape: no profile {profile_index}")
        return list(self._plan.profiles[profile_index][name])

    def create_execution_context(self, strategy: Any = ExecutionContextAllocationStrategy.STATIC) -> Any:
        device = self._fake
        device.require_device("create_execution_context")
        # STATIC: the activation memory (max over profiles) is allocated now, plus persistent memory that no API
        # reports. Out of memory -> None, the way TensorRT reports it.
        activation = device.allocate(self.device_memory_size_v2 + device.persistent_bytes, "activation")
        if activation is None:
            with device._lock:
                device.stats.context_failures += 1
            return None
        context = device.trt.IExecutionContext(self, activation)
        self._contexts.add(context)
        return context

    # -- computation (what the "GPU" does when a stream drains)

    def _run_session(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import onnxruntime

        with self._session_lock:
            if self._session is None:
                options = onnxruntime.SessionOptions()
                options.intra_op_num_threads = 1
                options.log_severity_level = 3
                self._session = onnxruntime.InferenceSession(self._plan.onnx, options,
                                                             providers=["CPUExecutionProvider"])
            session = self._session
        names = [n for n, _, _ in self._plan.outputs]
        return dict(zip(names, session.run(names, arrays)))

    def _output_shapes(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        function = self._plan.function
        if function == "identity":
            return {out: shapes[inp] for (inp, _, _), (out, _, _) in zip(self._plan.inputs, self._plan.outputs)}
        if function == "add_sub":
            shape = np.broadcast_shapes(*shapes.values())
            return {out: tuple(shape) for out, _, _ in self._plan.outputs}
        key = tuple(sorted(shapes.items()))
        with self._session_lock:
            cached = self._shape_cache.get(key)
        if cached is None:
            zeros: dict[str, np.ndarray] = {n: np.zeros(shapes[n], nptype(t)) for n, t, _ in self._plan.inputs}
            cached = {n: tuple(a.shape) for n, a in self._run_session(zeros).items()}
            with self._session_lock:
                self._shape_cache[key] = cached
        return cached

    def _compute(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        function = self._plan.function
        if function == "identity":
            return {out: arrays[inp] for (inp, _, _), (out, _, _) in zip(self._plan.inputs, self._plan.outputs)}
        if function == "add_sub":
            first, second = (arrays[n] for n, _, _ in self._plan.inputs[:2])
            (sum_name, _, _), (difference_name, _, _) = self._plan.outputs[:2]
            return {sum_name: first + second, difference_name: first - second}
        return self._run_session(arrays)


class IExecutionContext(_Bound):
    """Stands for tensorrt.IExecutionContext. Keeps its engine alive (as the real binding does)."""

    def __init__(self, engine: ICudaEngine, activation: _Allocation) -> None:
        device = self._fake
        self._engine = engine
        self._activation = activation
        self._guard = threading.Lock()  # held by the one thread inside a method; contention is the violation
        self._profile = 0
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._addresses: dict[str, int] = {}
        self._in_flight = False
        self._id = device.new_id()
        with device._lock:
            device.stats.contexts_created += 1
            device.stats.contexts_live += 1
            device.stats.events.append(f"context {self._id} created")

    def __del__(self) -> None:
        device = self._fake
        if self._in_flight:
            device._record_only(f"context {self._id} destroyed while its enqueue was in flight")
        device.release(self._activation)
        with device._lock:
            device.stats.contexts_live -= 1
            device.stats.events.append(f"context {self._id} destroyed")

    class _Entered:
        def __init__(self, context: IExecutionContext, name: str) -> None:
            self.context, self.name = context, name

        def __enter__(self) -> None:
            if not self.context._guard.acquire(blocking=False):
                raise self.context._fake.violate(
                    f"IExecutionContext.{self.name} while another thread is inside this context (a context is used "
                    "by one thread at a time)")
            hook = self.context._fake.hooks.in_context_call
            if hook is not None:
                try:
                    hook(self.name)
                except BaseException:
                    self.context._guard.release()
                    raise

        def __exit__(self, *exc: object) -> None:
            self.context._guard.release()

    def _enter(self, name: str) -> IExecutionContext._Entered:
        return IExecutionContext._Entered(self, name)

    @property
    def engine(self) -> ICudaEngine:
        return self._engine

    @property
    def active_optimization_profile(self) -> int:
        return self._profile

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        with self._enter("set_optimization_profile_async"):
            device = self._fake
            device.require_device("set_optimization_profile_async")
            if device.stream(stream_handle, "set_optimization_profile_async") is None:
                return False
            if not 0 <= int(profile_index) < self._engine.num_optimization_profiles:
                raise RuntimeError(f"profile index {profile_index} out of range")
            self._profile = int(profile_index)
            self._shapes.clear()  # a profile switch forgets the input shapes
            return True

    def set_input_shape(self, name: str, shape: Sequence[int]) -> bool:
        with self._enter("set_input_shape"):
            dtype, static, is_input = self._engine._tensor(name)
            shape = tuple(int(d) for d in shape)
            if not is_input or len(shape) != len(static):
                return False
            low, _, high = self._engine._plan.profiles[self._profile][name]
            if any(not lo <= d <= hi for d, lo, hi in zip(shape, low, high)):
                return False
            self._shapes[name] = shape
            return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        with self._enter("get_tensor_shape"):
            dtype, static, is_input = self._engine._tensor(name)
            if is_input:
                return self._shapes.get(name, static)
            inputs = [n for n, _, _ in self._engine._plan.inputs]
            if any(n not in self._shapes for n in inputs):
                return static
            return self._engine._output_shapes({n: self._shapes[n] for n in inputs})[name]

    def set_tensor_address(self, name: str, memory: int) -> bool:
        with self._enter("set_tensor_address"):
            self._engine._tensor(name)
            self._addresses[name] = int(memory)
            return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        with self._enter("execute_async_v3"):
            enqueued = self._enqueue(stream_handle)
        if enqueued and self._fake.hooks.after_enqueue is not None:
            self._fake.hooks.after_enqueue()
        return enqueued

    def _enqueue(self, stream_handle: int) -> bool:
        device, plan = self._fake, self._engine._plan
        device.require_device("execute_async_v3")
        stream = device.stream(stream_handle, "execute_async_v3")
        if stream is None:
            return False
        if self._in_flight:
            raise device.violate(f"execute_async_v3 on context {self._id} while its previous enqueue is still in "
                                 "flight (synchronize its stream first)")
        if not device.profile_sharing:
            for other in list(self._engine._contexts):
                if other is not self and other._profile == self._profile:
                    raise device.violate(f"contexts {self._id} and {other._id} share optimization profile "
                                         f"{self._profile} (not allowed before TensorRT 8.6)")
        inputs = [n for n, _, _ in plan.inputs]
        if any(n not in self._shapes for n in inputs) or any(self._addresses.get(n, 0) == 0 for n in plan.order):
            _log(None, device, "execute_async_v3: an input shape or a tensor address is not set")
            return False
        shapes = dict(self._shapes)
        shapes.update(self._engine._output_shapes({n: self._shapes[n] for n in inputs}))
        addresses = dict(self._addresses)
        allocations = [self._activation]
        for name in plan.order:
            dtype = plan.tensors[name][0]
            nbytes = int(np.prod(shapes[name], dtype=np.int64)) * np.dtype(nptype(dtype)).itemsize
            allocation = device.find_device(addresses[name], nbytes)
            if allocation is None:
                raise device.violate(f"execute_async_v3: address 0x{addresses[name]:x} of {name!r} is not device "
                                     f"memory with {nbytes} bytes for shape {list(shapes[name])}")
            if allocation not in allocations:
                allocations.append(allocation)

        def run() -> None:
            arrays = {}
            for name, dtype, _ in plan.inputs:
                np_type = np.dtype(nptype(dtype))
                nbytes = int(np.prod(shapes[name], dtype=np.int64)) * np_type.itemsize
                arrays[name] = np.frombuffer(device.read_device(addresses[name], nbytes), np_type).reshape(shapes[name])
            results = self._engine._compute(arrays)
            for name, dtype, _ in plan.outputs:
                result: np.ndarray = np.ascontiguousarray(results[name], dtype=nptype(dtype))
                device.write_device(addresses[name], result.tobytes())
            self._in_flight = False

        device.enqueue(stream, _Op(run, allocations, f"execute_async_v3 on context {self._id}"))
        self._in_flight = True
        with device._lock:
            device.stats.enqueues += 1
        return True


# ------------------------------------------------------------------------------------------------ builder


class IHostMemory(bytes):
    """Stands for tensorrt.IHostMemory: a buffer (here, bytes)."""

    @property
    def nbytes(self) -> int:
        return len(self)


class ITensor:
    """A network input or output as the parser made it."""

    def __init__(self, name: str, dtype: DataType, shape: tuple[int, ...]) -> None:
        self._name, self._dtype, self._shape = name, dtype, shape

    @property
    def name(self) -> str:
        return self._name

    @property
    def dtype(self) -> DataType:
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape


class INetworkDefinition:
    def __init__(self) -> None:
        self._inputs: list[ITensor] = []
        self._outputs: list[ITensor] = []
        self._onnx: bytes | None = None

    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def get_input(self, index: int) -> ITensor:
        return self._inputs[index]

    def get_output(self, index: int) -> ITensor:
        return self._outputs[index]


class _ParserError:
    def __init__(self, message: str) -> None:
        self._message = message

    def desc(self) -> str:
        return self._message

    def __str__(self) -> str:
        return self._message


class OnnxParser:
    """Stands for tensorrt.OnnxParser: reads the model's I/O with the `onnx` package."""

    def __init__(self, network: INetworkDefinition, logger: Any) -> None:
        self._network = network
        self._logger = logger
        self._errors: list[_ParserError] = []

    @property
    def num_errors(self) -> int:
        return len(self._errors)

    def get_error(self, index: int) -> _ParserError:
        return self._errors[index]

    def parse_from_file(self, model: str) -> bool:
        import onnx

        try:
            data = Path(model).read_bytes()
            proto = onnx.load_from_string(data)
        except Exception as error:  # any unreadable file is a parse failure, as in TensorRT
            self._errors.append(_ParserError(f"cannot read {model}: {error}"))
            return False
        initializers = {i.name for i in proto.graph.initializer}
        graph = proto.graph
        for values, target in ((graph.input, self._network._inputs), (graph.output, self._network._outputs)):
            for value in values:
                if value.name in initializers:
                    continue
                tensor_type = value.type.tensor_type
                dtype = _ONNX_TYPES.get(tensor_type.elem_type)
                if dtype is None:
                    self._errors.append(_ParserError(f"{value.name}: unsupported ONNX type {tensor_type.elem_type}"))
                    continue
                shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1
                              for d in tensor_type.shape.dim)
                target.append(ITensor(value.name, dtype, shape))
        self._network._onnx = data
        return not self._errors


_Range = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


class IOptimizationProfile:
    def __init__(self) -> None:
        self._shapes: dict[str, _Range] = {}

    def set_shape(self, input: str, min: Sequence[int], opt: Sequence[int], max: Sequence[int]) -> None:  # noqa: A002
        self._shapes[input] = (tuple(min), tuple(opt), tuple(max))

    def get_shape(self, input: str) -> list[tuple[int, ...]]:  # noqa: A002
        return list(self._shapes.get(input, ()))


class ITimingCache:
    """Remembers which networks were timed; `_foreign` when it came from another GPU or TensorRT version."""

    def __init__(self, device: FakeDevice, entries: set[str], foreign: bool = False) -> None:
        self._device = device
        self._entries = entries
        self._foreign = foreign

    def serialize(self) -> IHostMemory:
        body = {"device": self._device.name, "trt_version": self._device.trt_version,
                "entries": sorted(self._entries)}
        return IHostMemory(TIMING_MAGIC + json.dumps(body).encode())


class IBuilderConfig:
    def __init__(self, device: FakeDevice) -> None:
        self._device = device
        self._profiles: list[IOptimizationProfile] = []
        self._pools: dict[Any, int] = {}
        self._cache: ITimingCache | None = None

    @property
    def num_optimization_profiles(self) -> int:
        return len(self._profiles)

    def set_memory_pool_limit(self, pool: Any, pool_size: int) -> None:
        self._pools[pool] = int(pool_size)

    def get_memory_pool_limit(self, pool: Any) -> int:
        return self._pools.get(pool, 0)

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        self._profiles.append(profile)
        return len(self._profiles) - 1

    def create_timing_cache(self, serialized_timing_cache: Any) -> ITimingCache:
        data = bytes(serialized_timing_cache)
        if not data.startswith(TIMING_MAGIC):
            return ITimingCache(self._device, set())
        body = json.loads(data[len(TIMING_MAGIC):])
        foreign = body["device"] != self._device.name or body["trt_version"] != self._device.trt_version
        return ITimingCache(self._device, set(body["entries"]), foreign)

    def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
        if cache._foreign and not ignore_mismatch:
            return False
        self._cache = cache
        return True

    def get_timing_cache(self) -> ITimingCache:
        if self._cache is None:
            self._cache = ITimingCache(self._device, set())
        return self._cache


class Builder(_Bound):
    """Stands for tensorrt.Builder: checks the profiles against the network and writes an "onnx" plan."""

    def __init__(self, logger: Any) -> None:
        device = self._fake
        if not device.usable:
            raise device.violate("tensorrt.Builder created without a usable CUDA device")
        self.logger = logger

    def create_network(self, flags: int = 0) -> INetworkDefinition:
        return INetworkDefinition()

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig(self._fake)

    def create_optimization_profile(self) -> IOptimizationProfile:
        return IOptimizationProfile()

    def _profile_error(self, network: INetworkDefinition, profile: IOptimizationProfile) -> str | None:
        for tensor in network._inputs:
            shapes = profile._shapes.get(tensor.name)
            if shapes is None:
                if any(d < 0 for d in tensor.shape):
                    return f"no profile shape for dynamic input {tensor.name}"
                continue
            for shape in shapes:
                if len(shape) != len(tensor.shape) or any(
                        fixed >= 0 and d != fixed for d, fixed in zip(shape, tensor.shape)):
                    return f"profile shape {list(shape)} does not fit {tensor.name} {list(tensor.shape)}"
            low, opt, high = shapes
            if any(not a <= b <= c for a, b, c in zip(low, opt, high)):
                return f"profile of {tensor.name} is not min <= opt <= max"
        return None

    def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig) -> IHostMemory | None:
        device = self._fake
        device.require_device("build_serialized_network")
        if network._onnx is None:
            _log(self.logger, device, "build_serialized_network: empty network")
            return None
        needs_profile = any(d < 0 for t in network._inputs for d in t.shape)
        if needs_profile and not config._profiles:
            _log(self.logger, device, "build_serialized_network: dynamic inputs need an optimization profile")
            return None
        for profile in config._profiles:
            error = self._profile_error(network, profile)
            if error is not None:
                _log(self.logger, device, f"build_serialized_network: {error}")
                return None
        digest = hashlib.sha256(network._onnx).hexdigest()
        cache = config.get_timing_cache()
        with device._lock:
            device.stats.builds += 1
            if digest in cache._entries:
                device.stats.timing_cache_hits += 1
        cache._entries.add(digest)
        profiles = [{t.name: p._shapes.get(t.name, (t.shape, t.shape, t.shape)) for t in network._inputs}
                    for p in (config._profiles or [IOptimizationProfile()])]
        plan = device.make_plan(
            inputs=[(t.name, t.dtype.name, t.shape) for t in network._inputs],
            outputs=[(t.name, t.dtype.name, t.shape) for t in network._outputs],
            function="onnx", onnx=network._onnx, profiles=profiles, weights_bytes=len(network._onnx))
        return IHostMemory(plan)


# ------------------------------------------------------------------------------------------- the modules


def _trt_module(device: FakeDevice, builder: bool) -> types.ModuleType:
    """A module object standing for `tensorrt` (builder=True) or `tensorrt_lean` (builder=False), whose
    device-bound classes are subclasses that know `device`."""
    module = types.ModuleType("tensorrt" if builder else "tensorrt_lean", "TensorRT test double")
    bound = {"_fake": device}
    module.__version__ = device.trt_version  # type: ignore[attr-defined]
    module.Logger = Logger  # type: ignore[attr-defined]
    module.Runtime = type("Runtime", (Runtime,), dict(bound))  # type: ignore[attr-defined]
    module.ICudaEngine = type("ICudaEngine", (ICudaEngine,), dict(bound))  # type: ignore[attr-defined]
    context_class = type("IExecutionContext", (IExecutionContext,), dict(bound))
    module.IExecutionContext = context_class  # type: ignore[attr-defined]
    shared: tuple[Any, ...] = (TensorIOMode, TensorLocation, DataType, ExecutionContextAllocationStrategy,
                               MemoryPoolType, IOptimizationProfile, ITimingCache, IHostMemory, nptype)
    for value in shared:
        setattr(module, value.__name__, value)
    if builder:
        module.Builder = type("Builder", (Builder,), dict(bound))  # type: ignore[attr-defined]
        builder_only: tuple[Any, ...] = (OnnxParser, INetworkDefinition, ITensor, IBuilderConfig)
        for value in builder_only:
            setattr(module, value.__name__, value)
    return module


def double_backend(cache_dir: Path | str | None = None, **device_options: Any):
    """A TensorRTBackend over a fresh FakeDevice: (backend, device). For tests and the gRPC-level test server
    only (see engine.tensorrt.create_backend)."""
    from .backend import TensorRTBackend

    device = FakeDevice(**device_options)
    return TensorRTBackend(trt_module=device.trt, cudart_module=device.cudart, cache_dir=cache_dir), device
