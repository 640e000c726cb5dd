"""The simulated GPU: device and pinned memory, streams and their deferred work, faults, and the broken-rule log.

`FakeDevice` (modules.py) is what a test creates: this module's SimulatedDevice with the fake modules bound to it,
its `cudart`, `cuda_utils`, `trt` and `trt_lean` attributes (cuda_runtime.py, tensorrt_runtime.py,
tensorrt_builder.py, modules.py). The fake modules use the device through SimulatedDevice, so none of them imports
the module that makes them.
"""

from __future__ import annotations

import bisect
import ctypes
import threading
import types
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import plans


class DoubleRuleViolation(AssertionError):
    """The code under test broke a TensorRT/CUDA rule that real hardware would punish with undefined behaviour."""


POISON = 0xA5  # what the host side of a device-to-host copy holds until the copy ran


class KernelFault(Exception):
    """Internal: a simulated kernel hit a sticky error (FakeDevice.inject_fault) while its stream drained."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


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
    runtimes_live: int = 0
    deserializations: int = 0
    engines_live: int = 0
    contexts_created: int = 0
    contexts_live: int = 0
    context_failures: int = 0
    streams_live: int = 0
    stream_flags: list[int] = field(default_factory=list)
    device_allocations_live: int = 0
    host_allocations_live: int = 0
    host_bytes_live: int = 0
    enqueues: int = 0
    copies: int = 0
    builds: int = 0
    timing_cache_hits: int = 0
    set_device_calls: int = 0
    resets: int = 0
    output_reallocations: int = 0
    events: list[str] = field(default_factory=list)


@dataclass(eq=False)
class Allocation:
    base: int
    size: int
    kind: str  # "device", "host", "weights", "activation", "consumed"
    data: Any = None  # bytearray (device), ctypes array (host), None (size-only)
    pending: dict[int, int] = field(default_factory=dict)  # stream handle -> queued operations using it

    def busy_on(self) -> list[int]:
        return [stream for stream, count in self.pending.items() if count > 0]


@dataclass(eq=False)
class Op:
    """One piece of queued GPU work. `kernel` marks a TensorRT run: an injected fault strikes there."""

    run: Callable[[], None]
    allocations: list[Allocation]
    description: str
    kernel: bool = False
    done: Callable[[], None] | None = None  # runs once the op ran or was dropped after a fault


@dataclass(eq=False)
class Stream:
    handle: int
    flags: int
    queue: deque[Op] = field(default_factory=deque)


class SimulatedDevice:
    """One simulated GPU (and its driver); FakeDevice (modules.py) binds the TensorRT and CUDA modules to it.

    `driver_cuda_version` is the CUDA version the driver supports, `runtime_cuda_version` the one cuda-python was
    built for (1000 * major + 10 * minor, as cudaDriverGetVersion reports them): a runtime of a newer major than
    the driver gets cudaErrorInsufficientDriver, as cuda-bindings 13 does on a CUDA 12 driver. `reset_recovers`
    False makes a sticky error survive cudaDeviceReset (NVIDIA documents that only a new process is sure to clear
    one). `pinned_memory` limits page-locked host memory (cudaHostAlloc fails past it, as when the OS refuses).

    Thread-safe: the device's tables are guarded by one re-entrant lock (re-entrant because object finalizers,
    which release memory, may run while the same thread holds it). Queued work runs outside the lock.
    """

    # The fake modules bound to this device: FakeDevice (modules.py) sets them in _bind_modules.
    cudart: Any
    cuda_utils: Any
    trt: types.ModuleType
    trt_lean: types.ModuleType

    def __init__(
        self,
        *,
        total_memory: int = 1 << 30,
        name: str = "Double GPU",
        device_count: int = 1,
        driver: bool = True,
        trt_version: str = "11.4.0.106",
        compute_capability: tuple[int, int] = (9, 0),
        driver_cuda_version: int = 13000,
        runtime_cuda_version: int = 13000,
        profile_sharing: bool = True,
        activation_bytes: int = 1 << 20,
        persistent_bytes: int = 0,
        require_set_device: bool = True,
        reset_recovers: bool = True,
        pinned_memory: int | None = None,
    ) -> None:
        self.total_memory = total_memory
        self.name = name
        self.device_count = device_count
        self.driver = driver
        self.trt_version = trt_version
        self.compute_capability = tuple(compute_capability)
        self.driver_cuda_version = driver_cuda_version if driver else 0
        self.runtime_cuda_version = runtime_cuda_version
        self.profile_sharing = profile_sharing
        self.activation_bytes = activation_bytes
        self.persistent_bytes = persistent_bytes
        self.require_set_device = require_set_device
        self.reset_recovers = reset_recovers
        self.pinned_memory = pinned_memory  # page-locked host memory the OS grants (None: unlimited)
        # The double infers an ONNX engine's output shapes by running the model on zeros; a model whose graph
        # branches on an input's value (silero_vad's `sr`) needs a real value for it here, {input: value}.
        self.probe_values: dict[str, Any] = {}
        self.hooks = Hooks()
        self.stats = Counters()
        self.violations: list[str] = []
        self.log: list[str] = []
        self.sticky_error: int | None = None  # the cudaError_t every call returns after a kernel fault
        self._pending_fault: int | None = None
        self._lock = threading.RLock()  # guards: every table below, stats, violations, _used, the fault fields
        self._used = 0
        self._device: dict[int, Allocation] = {}
        self._device_bases: list[int] = []
        self._host: dict[int, Allocation] = {}
        self._host_bases: list[int] = []
        self._streams: dict[int, Stream] = {}
        self._next_address = 0x7F00_0000_0000
        self._next_stream = 0x5000
        self._next_id = 0
        self._thread = threading.local()
        self._bind_modules()

    def _bind_modules(self) -> None:
        """Bind the fake CUDA and TensorRT modules to this device, at the end of __init__ (FakeDevice does)."""

    # -- rules

    def violate(self, message: str) -> DoubleRuleViolation:
        """Record a broken rule and return the exception to raise."""
        with self._lock:
            self.violations.append(message)
        return DoubleRuleViolation(message)

    def record_only(self, message: str) -> None:
        """For finalizers, which cannot raise into the caller."""
        with self._lock:
            self.violations.append(message)

    def require_device(self, what: str) -> None:
        if self.require_set_device and getattr(self._thread, "device", None) is None:
            raise self.violate(
                f"{what} on thread {threading.current_thread().name!r}, which never called cudaSetDevice"
            )

    def set_current(self, device: int) -> None:
        self._thread.device = device

    def current(self) -> int:
        return getattr(self._thread, "device", 0)

    @property
    def driver_too_old(self) -> bool:
        return self.driver_cuda_version // 1000 < self.runtime_cuda_version // 1000

    @property
    def usable(self) -> bool:
        return self.driver and not self.driver_too_old and self.device_count > 0

    def new_id(self) -> int:
        with self._lock:
            self._next_id += 1
            return self._next_id

    # -- faults

    def inject_fault(self, code: int) -> None:
        """The next TensorRT run to execute (when its stream drains) fails with `code`, a sticky error: from then
        on every CUDA call returns it and TensorRT calls fail, until cudaDeviceReset (see `reset_recovers`)."""
        with self._lock:
            self._pending_fault = int(code)

    def take_fault(self) -> int | None:
        with self._lock:
            code, self._pending_fault = self._pending_fault, None
            if code is not None:
                self.sticky_error = code
            return code

    def reset(self) -> None:
        """cudaDeviceReset: every allocation and stream of the process on this device is destroyed. TensorRT
        objects made on the old context must be gone first (using them after is undefined)."""
        with self._lock:
            live = {
                "runtimes": self.stats.runtimes_live,
                "engines": self.stats.engines_live,
                "contexts": self.stats.contexts_live,
            }
            live = {k: v for k, v in live.items() if v}
            if live:
                raise self.violate(
                    f"cudaDeviceReset while TensorRT objects of the old context are alive ({live}): "
                    "they hold its memory and would be used after it is destroyed"
                )
            for allocation in list(self._device.values()):
                if allocation.kind != "consumed":
                    self.release(allocation)
            for allocation in list(self._host.values()):
                self.release_host(allocation)
            self.stats.streams_live -= len(self._streams)
            self._streams.clear()
            self.stats.resets += 1
            self.stats.events.append("device reset")
            if self.reset_recovers:
                self.sticky_error = None

    # -- memory

    @property
    def free_memory(self) -> int:
        with self._lock:
            return self.total_memory - self._used

    def allocate(self, size: int, kind: str) -> Allocation | None:
        """Take `size` bytes of device memory (None when they do not fit)."""
        with self._lock:
            if size > self.total_memory - self._used:
                return None
            self._used += size
            base = self._next_address
            self._next_address += (size + 0xFFFF) & ~0xFFF  # aligned, with a gap so overruns never hit a neighbour
            allocation = Allocation(base, size, kind, bytearray(size) if kind == "device" else None)
            self._device[base] = allocation
            bisect.insort(self._device_bases, base)
            if kind == "device":
                self.stats.device_allocations_live += 1
            return allocation

    def release(self, allocation: Allocation) -> None:
        with self._lock:
            if self._device.pop(allocation.base, None) is None:
                return
            self._device_bases.remove(allocation.base)
            self._used -= allocation.size
            if allocation.kind == "device":
                self.stats.device_allocations_live -= 1

    def consume(self, nbytes: int) -> Allocation:
        """Take device memory as another process would (tests use it to exhaust the device)."""
        allocation = self.allocate(nbytes, "consumed")
        if allocation is None:
            raise ValueError(f"only {self.free_memory} bytes free")
        return allocation

    def allocate_host(self, size: int) -> Allocation | None:
        """Pinned host memory (None when the `pinned_memory` limit would be passed)."""
        with self._lock:
            if self.pinned_memory is not None and self.stats.host_bytes_live + size > self.pinned_memory:
                return None
        buffer = (ctypes.c_ubyte * max(1, size))()
        allocation = Allocation(ctypes.addressof(buffer), size, "host", buffer)
        with self._lock:
            self._host[allocation.base] = allocation
            bisect.insort(self._host_bases, allocation.base)
            self.stats.host_allocations_live += 1
            self.stats.host_bytes_live += size
        return allocation

    def release_host(self, allocation: Allocation) -> None:
        with self._lock:
            if self._host.pop(allocation.base, None) is None:
                return
            self._host_bases.remove(allocation.base)
            self.stats.host_allocations_live -= 1
            self.stats.host_bytes_live -= allocation.size

    def device_allocation(self, base: int) -> Allocation | None:
        with self._lock:
            found = self._device.get(base)
            return found if found is not None and found.kind == "device" else None

    def host_allocation(self, base: int) -> Allocation | None:
        with self._lock:
            return self._host.get(base)

    @staticmethod
    def _find(table: dict[int, Allocation], bases: list[int], pointer: int, nbytes: int) -> Allocation | None:
        index = bisect.bisect_right(bases, pointer) - 1
        if index < 0:
            return None
        allocation = table[bases[index]]
        if pointer + nbytes > allocation.base + allocation.size:
            return None
        return allocation

    def find_device(self, pointer: int, nbytes: int) -> Allocation | None:
        with self._lock:
            found = self._find(self._device, self._device_bases, pointer, nbytes)
            return found if found is not None and found.kind == "device" else None

    def find_host(self, pointer: int, nbytes: int) -> Allocation | None:
        with self._lock:
            return self._find(self._host, self._host_bases, pointer, nbytes)

    def read_device(self, pointer: int, nbytes: int) -> bytes:
        allocation = self.find_device(pointer, nbytes)
        assert allocation is not None
        offset = pointer - allocation.base
        return bytes(allocation.data[offset : offset + nbytes])

    def write_device(self, pointer: int, data: bytes) -> None:
        allocation = self.find_device(pointer, len(data))
        assert allocation is not None
        offset = pointer - allocation.base
        allocation.data[offset : offset + len(data)] = data

    # -- streams

    def new_stream(self, flags: int) -> int:
        with self._lock:
            self._next_stream += 0x10
            self._streams[self._next_stream] = Stream(self._next_stream, flags)
            self.stats.streams_live += 1
            self.stats.stream_flags.append(flags)
            return self._next_stream

    def stream(self, handle: Any, what: str) -> Stream | None:
        """The live stream `handle` (an int or a cudaStream_t); a violation for the default stream, None for an
        unknown handle."""
        handle = int(handle)
        if handle == 0:
            raise self.violate(f"{what} on the default stream (0): every slot must use its own stream")
        with self._lock:
            return self._streams.get(handle)

    def drop_stream(self, stream: Stream) -> None:
        with self._lock:
            if self._streams.pop(stream.handle, None) is not None:
                self.stats.streams_live -= 1

    def enqueue(self, stream: Stream, op: Op) -> None:
        """Queue `op` on `stream`; a violation if a buffer it uses is still in use by another stream's work."""
        with self._lock:
            for allocation in op.allocations:
                others = [s for s in allocation.busy_on() if s != stream.handle]
                if others:
                    raise self.violate(
                        f"{op.description}: {allocation.kind} buffer 0x{allocation.base:x} is still used by work in "
                        f"flight on stream 0x{others[0]:x}"
                    )
            for allocation in op.allocations:
                allocation.pending[stream.handle] = allocation.pending.get(stream.handle, 0) + 1
            stream.queue.append(op)

    def drain(self, stream: Stream, hook: bool = True) -> int | None:
        """Run everything queued on `stream`, in order (what cudaStreamSynchronize waits for). Returns the
        sticky error a faulting kernel raised, else None; after a fault the rest of the queue is dropped."""
        if hook and self.hooks.before_drain is not None:
            self.hooks.before_drain(stream.handle)
        while True:
            with self._lock:
                if not stream.queue:
                    return None
                op = stream.queue.popleft()
            try:
                if op.kernel:
                    code = self.take_fault()
                    if code is not None:
                        raise KernelFault(code)
                op.run()
            except KernelFault as fault:
                with self._lock:
                    dropped = [op] + list(stream.queue)
                    stream.queue.clear()
                    for each in dropped:
                        for allocation in each.allocations:
                            allocation.pending[stream.handle] -= 1
                for each in dropped:
                    if each.done is not None:
                        each.done()
                return fault.code
            with self._lock:
                for allocation in op.allocations:
                    allocation.pending[stream.handle] -= 1
            if op.done is not None:
                op.done()

    def drain_all(self) -> int | None:
        """cudaDeviceSynchronize: drain every stream (without the test hook)."""
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            code = self.drain(stream, hook=False)
            if code is not None:
                return code
        return None

    def pending_operations(self) -> int:
        with self._lock:
            return sum(len(s.queue) for s in self._streams.values())

    # -- plans

    def make_plan(
        self,
        *,
        inputs: Sequence[tuple[str, str, Sequence[int]]],
        outputs: Sequence[tuple[str, str, Sequence[int]]],
        function: str = "identity",
        profiles: Sequence[Mapping[str, Sequence[Sequence[int]]]] = (),
        weights_bytes: int = 1 << 20,
        activation_bytes: int | None = None,
        onnx: bytes | None = None,
        trt_version: str | None = None,
        device_name: str | None = None,
        compute_capability: tuple[int, int] | None = None,
        formats: Mapping[str, str] | None = None,
        host_tensors: Sequence[str] = (),
        data_dependent: Mapping[str, Sequence[int]] | None = None,
    ) -> bytes:
        """A serialized engine for this device (plans.py describes the arguments)."""
        return plans.make_plan(
            inputs=inputs,
            outputs=outputs,
            function=function,
            profiles=profiles,
            weights_bytes=weights_bytes,
            activation_bytes=self.activation_bytes if activation_bytes is None else activation_bytes,
            onnx=onnx,
            trt_version=trt_version or self.trt_version,
            device_name=device_name or self.name,
            compute_capability=compute_capability or self.compute_capability,
            formats=formats or {},
            host_tensors=host_tensors,
            data_dependent=data_dependent or {},
        )

    def write_plan(self, path: Path | str, **kwargs: Any) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.make_plan(**kwargs))
        return path

    # -- checks for tests

    def leaks(self) -> dict[str, int]:
        """Everything still allocated or alive (memory taken by `consume` excluded; a backend's cached Runtime is
        not counted: it lives as long as the backend); {} when clean."""
        stats = self.stats
        found = {
            "engines": stats.engines_live,
            "contexts": stats.contexts_live,
            "streams": stats.streams_live,
            "device allocations": stats.device_allocations_live,
            "host allocations": stats.host_allocations_live,
            "pending operations": self.pending_operations(),
        }
        with self._lock:
            found["device bytes"] = self._used - sum(a.size for a in self._device.values() if a.kind == "consumed")
        return {k: v for k, v in found.items() if v}
