"""The fake `cuda.bindings.runtime` (FakeCudaRuntime) and `cuda.bindings.utils` (FakeCudaUtils).

As in cuda-bindings, every function returns `(cudaError_t, *values)` and never raises for a CUDA error (it
raises DoubleRuleViolation for a broken rule); streams are `cudaStream_t` objects, whose address
`cuda.bindings.utils.get_cuda_native_handle` gives. Without a driver, with a driver too old for the runtime, or
without a device, the calls fail the way the real ones do; after a sticky error (FakeDevice.inject_fault) they
return that error until cudaDeviceReset.
"""

from __future__ import annotations

import ctypes
import enum
from typing import TYPE_CHECKING, Any

from .device import Op

if TYPE_CHECKING:
    from .device import Allocation, SimulatedDevice


class cudaError_t(enum.IntEnum):  # noqa: N801 - the real names
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInsufficientDriver = 35
    cudaErrorNoDevice = 100
    cudaErrorInvalidDevice = 101
    cudaErrorInvalidResourceHandle = 400
    cudaErrorIllegalAddress = 700
    cudaErrorLaunchFailure = 719


class cudaMemcpyKind(enum.IntEnum):  # noqa: N801
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3
    cudaMemcpyDefault = 4


class cudaDeviceProp:  # noqa: N801
    """`name` (bytes, as cuda-bindings returns it), `totalGlobalMem` and the compute capability."""

    def __init__(
        self,
        name: bytes = b"",
        totalGlobalMem: int = 0,  # noqa: N803 - the real names
        major: int = 0,
        minor: int = 0,
    ) -> None:
        self._name, self._total, self._major, self._minor = name, totalGlobalMem, major, minor

    @property
    def name(self) -> bytes:
        return self._name

    @property
    def totalGlobalMem(self) -> int:  # noqa: N802
        return self._total

    @property
    def major(self) -> int:
        return self._major

    @property
    def minor(self) -> int:
        return self._minor


class cudaStream_t:  # noqa: N801
    """A stream handle object, as cuda-bindings returns from cudaStreamCreate*: `int()` of it and `getPtr()` give
    the address (cuda-bindings deprecated `int()` in 12.9.1 for `utils.get_cuda_native_handle`)."""

    def __init__(self, init_value: int = 0) -> None:
        self._ptr = int(init_value)

    def getPtr(self) -> int:  # noqa: N802
        return self._ptr

    def __int__(self) -> int:
        return self._ptr

    def __index__(self) -> int:
        return self._ptr

    def __eq__(self, other: object) -> bool:
        return isinstance(other, cudaStream_t) and other._ptr == self._ptr

    def __hash__(self) -> int:
        return hash(self._ptr)

    def __repr__(self) -> str:
        return f"<CUstream 0x{self._ptr:x}>"


class FakeCudaUtils:
    """Stands for `cuda.bindings.utils`."""

    @staticmethod
    def get_cuda_native_handle(obj: Any) -> int:
        if isinstance(obj, cudaStream_t):
            return obj.getPtr()
        raise TypeError(f"Unknown type: {type(obj)}")


class FakeCudaRuntime:
    """Stands for `cuda.bindings.runtime`."""

    cudaError_t = cudaError_t
    cudaMemcpyKind = cudaMemcpyKind
    cudaDeviceProp = cudaDeviceProp
    cudaStream_t = cudaStream_t
    cudaStreamDefault = 0
    cudaStreamNonBlocking = 1
    cudaHostAllocDefault = 0

    def __init__(self, device: SimulatedDevice) -> None:
        self._device = device

    def _unavailable(self) -> int | None:
        device = self._device
        if not device.driver or device.driver_too_old:
            return cudaError_t.cudaErrorInsufficientDriver
        if device.device_count == 0:
            return cudaError_t.cudaErrorNoDevice
        return None

    def _failure(self) -> int | None:
        """The error every call that touches the device's context returns now, if any."""
        unavailable = self._unavailable()
        if unavailable is not None:
            return unavailable
        sticky = self._device.sticky_error
        return cudaError_t(sticky) if sticky is not None else None

    # -- versions and devices

    def cudaDriverGetVersion(self) -> tuple[Any, ...]:  # noqa: N802
        return (cudaError_t.cudaSuccess, self._device.driver_cuda_version)

    def cudaRuntimeGetVersion(self) -> tuple[Any, ...]:  # noqa: N802
        return (cudaError_t.cudaSuccess, self._device.runtime_cuda_version)

    def cudaGetDeviceCount(self) -> tuple[Any, ...]:  # noqa: N802
        unavailable = self._unavailable()
        if unavailable == cudaError_t.cudaErrorInsufficientDriver:
            return (unavailable, None)
        if unavailable is not None:
            return (unavailable, 0)
        return (cudaError_t.cudaSuccess, self._device.device_count)

    def cudaSetDevice(self, device: int) -> tuple[Any, ...]:  # noqa: N802
        error = self._unavailable()
        if error is not None:
            return (error,)
        if not 0 <= int(device) < self._device.device_count:
            return (cudaError_t.cudaErrorInvalidDevice,)
        self._device.set_current(int(device))
        with self._device._lock:
            self._device.stats.set_device_calls += 1
        return (cudaError_t.cudaSuccess,)

    def cudaGetDevice(self) -> tuple[Any, ...]:  # noqa: N802
        return (cudaError_t.cudaSuccess, self._device.current())

    def cudaGetDeviceProperties(self, device: int) -> tuple[Any, ...]:  # noqa: N802
        error = self._unavailable()
        if error is not None:
            return (error, None)
        fake = self._device
        major, minor = fake.compute_capability
        return (cudaError_t.cudaSuccess, cudaDeviceProp(fake.name.encode(), fake.total_memory, major, minor))

    def cudaGetErrorName(self, error: Any) -> tuple[Any, ...]:  # noqa: N802
        try:
            return (cudaError_t.cudaSuccess, cudaError_t(int(error)).name.encode())
        except ValueError:
            return (cudaError_t.cudaErrorInvalidValue, b"")

    def cudaMemGetInfo(self) -> tuple[Any, ...]:  # noqa: N802
        error = self._failure()
        if error is not None:
            return (error, None, None)
        self._device.require_device("cudaMemGetInfo")
        return (cudaError_t.cudaSuccess, self._device.free_memory, self._device.total_memory)

    def cudaDeviceSynchronize(self) -> tuple[Any, ...]:  # noqa: N802
        error = self._failure()
        if error is not None:
            return (error,)
        self._device.require_device("cudaDeviceSynchronize")
        code = self._device.drain_all()
        return (cudaError_t(code) if code is not None else cudaError_t.cudaSuccess,)

    def cudaDeviceReset(self) -> tuple[Any, ...]:  # noqa: N802
        error = self._unavailable()
        if error is not None:
            return (error,)
        self._device.require_device("cudaDeviceReset")
        self._device.reset()
        return (cudaError_t.cudaSuccess,)

    # -- memory

    def cudaMalloc(self, size: int) -> tuple[Any, ...]:  # noqa: N802
        error = self._failure()
        if error is not None:
            return (error, None)
        self._device.require_device("cudaMalloc")
        allocation = self._device.allocate(int(size), "device")
        if allocation is None:
            return (cudaError_t.cudaErrorMemoryAllocation, None)
        return (cudaError_t.cudaSuccess, allocation.base)

    def cudaFree(self, devPtr: int) -> tuple[Any, ...]:  # noqa: N802, N803
        error = self._failure()
        if error is not None:
            return (error,)
        device = self._device
        device.require_device("cudaFree")
        with device._lock:
            allocation = device.device_allocation(int(devPtr))
            if allocation is None:
                return (cudaError_t.cudaErrorInvalidValue,)
            if allocation.busy_on():
                raise device.violate(f"cudaFree(0x{allocation.base:x}) while work in flight still uses it")
            device.release(allocation)
        return (cudaError_t.cudaSuccess,)

    def cudaHostAlloc(self, size: int, flags: int) -> tuple[Any, ...]:  # noqa: N802
        error = self._failure()
        if error is not None:
            return (error, None)
        self._device.require_device("cudaHostAlloc")
        allocation = self._device.allocate_host(int(size))
        if allocation is None:
            return (cudaError_t.cudaErrorMemoryAllocation, None)
        return (cudaError_t.cudaSuccess, allocation.base)

    def cudaMallocHost(self, size: int) -> tuple[Any, ...]:  # noqa: N802
        return self.cudaHostAlloc(size, self.cudaHostAllocDefault)

    def cudaFreeHost(self, ptr: int) -> tuple[Any, ...]:  # noqa: N802
        error = self._failure()
        if error is not None:
            return (error,)
        device = self._device
        device.require_device("cudaFreeHost")
        with device._lock:
            allocation = device.host_allocation(int(ptr))
            if allocation is None:
                return (cudaError_t.cudaErrorInvalidValue,)
            if allocation.busy_on():
                raise device.violate(f"cudaFreeHost(0x{allocation.base:x}) while an async copy still uses it")
            device.release_host(allocation)
        return (cudaError_t.cudaSuccess,)

    def cudaMemcpyAsync(self, dst: int, src: int, count: int, kind: Any, stream: Any) -> tuple[Any, ...]:  # noqa: N802
        device = self._device
        device.require_device("cudaMemcpyAsync")
        queue = device.stream(stream, "cudaMemcpyAsync")
        error = self._failure()
        if error is not None:
            return (error,)
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

    def _pinned(self, pointer: int, count: int, role: str) -> Allocation:
        host = self._device.find_host(pointer, count)
        if host is None:
            raise self._device.violate(
                f"cudaMemcpyAsync {role} 0x{pointer:x} (+{count}) is not pinned memory from cudaHostAlloc: an async "
                "copy from pageable memory is synchronous, and its buffer may move"
            )
        return host

    def _host_to_device(self, dst: int, src: int, count: int) -> Op | None:
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
                raise device.violate(
                    f"pinned host buffer 0x{src:x} was modified while the async copy reading it was in flight"
                )
            device.write_device(dst, snapshot)

        return Op(run, [host, target], "cudaMemcpyAsync(host to device)")

    def _device_to_host(self, dst: int, src: int, count: int) -> Op | None:
        host = self._pinned(dst, count, "destination")
        source = self._device.find_device(src, count)
        if source is None:
            return None
        device = self._device
        # Until the copy ran, the host side holds whatever was there: make that visibly wrong.
        from .device import POISON

        ctypes.memset(dst, POISON, count)

        def run() -> None:
            ctypes.memmove(dst, device.read_device(src, count), count)

        return Op(run, [host, source], "cudaMemcpyAsync(device to host)")

    # -- streams

    def cudaStreamCreateWithFlags(self, flags: int) -> tuple[Any, ...]:  # noqa: N802
        error = self._failure()
        if error is not None:
            return (error, None)
        self._device.require_device("cudaStreamCreateWithFlags")
        return (cudaError_t.cudaSuccess, cudaStream_t(self._device.new_stream(int(flags))))

    def cudaStreamCreate(self) -> tuple[Any, ...]:  # noqa: N802
        return self.cudaStreamCreateWithFlags(self.cudaStreamDefault)

    def cudaStreamSynchronize(self, stream: Any) -> tuple[Any, ...]:  # noqa: N802
        device = self._device
        device.require_device("cudaStreamSynchronize")
        queue = device.stream(stream, "cudaStreamSynchronize")
        error = self._failure()
        if error is not None:
            return (error,)
        if queue is None:
            return (cudaError_t.cudaErrorInvalidResourceHandle,)
        code = device.drain(queue)
        return (cudaError_t(code) if code is not None else cudaError_t.cudaSuccess,)

    def cudaStreamDestroy(self, stream: Any) -> tuple[Any, ...]:  # noqa: N802
        device = self._device
        device.require_device("cudaStreamDestroy")
        error = self._failure()
        if error is not None:
            return (error,)
        with device._lock:
            queue = device.stream(stream, "cudaStreamDestroy")
            if queue is None:
                return (cudaError_t.cudaErrorInvalidResourceHandle,)
            if queue.queue:
                raise device.violate(
                    f"cudaStreamDestroy(0x{queue.handle:x}) with {len(queue.queue)} operations "
                    "still queued: their buffers may be freed next"
                )
            device.drop_stream(queue)
        return (cudaError_t.cudaSuccess,)
