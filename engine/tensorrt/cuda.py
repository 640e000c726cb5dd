"""The CUDA runtime calls of the TensorRT backend, over cuda-python's `cuda.bindings.runtime`.

Why cuda-python and not pycuda (docs/tensorrt.md says it too): cuda-python ships binary wheels and talks to the
device's *primary* context, the one TensorRT uses; pycuda is source-only on PyPI, needs the CUDA toolkit to build,
and `pycuda.autoinit` makes a context that is current on the importing thread only, while slotserve runs its slots
on many threads.

Every function of `cuda.bindings.runtime` returns `(cudaError_t, *values)` and never raises on a CUDA error;
`CudaRuntime` turns a non-success code into `CudaError`. All calls block the calling thread for as long as CUDA
does (allocation, synchronization); cuda-python releases the GIL around them, so a slot thread waiting in
`stream_synchronize` does not stall other Python threads.

The current device is per host thread: `use_device` must run in every thread before its first CUDA call. It is
cached per thread, so calling it at the top of every entry point costs one attribute lookup.
"""

from __future__ import annotations

import ctypes
import importlib
import threading
from functools import lru_cache
from typing import Any

import numpy as np

from .protocols import CudaRuntimeModule, CudaUtilsModule

# Errors that leave the process's CUDA context unusable: every later call on the device returns them ("sticky").
# cuda-bindings documents each as "This leaves the process in an inconsistent state and any further CUDA work will
# return the same error. To continue using CUDA, the process must be terminated and relaunched."
STICKY_ERRORS = frozenset(
    {
        "cudaErrorIllegalAddress",
        "cudaErrorLaunchTimeout",
        "cudaErrorAssert",
        "cudaErrorHardwareStackError",
        "cudaErrorIllegalInstruction",
        "cudaErrorMisalignedAddress",
        "cudaErrorInvalidAddressSpace",
        "cudaErrorInvalidPc",
        "cudaErrorLaunchFailure",
        "cudaErrorContained",
        "cudaErrorTensorMemoryLeak",
        "cudaErrorMpsClientTerminated",
        "cudaErrorExternalDevice",
    }
)


class CudaError(Exception):
    """A CUDA runtime call failed. `out_of_memory` is True for cudaErrorMemoryAllocation (of pinned host memory
    when `call` is cudaHostAlloc); `sticky` when the device's CUDA context is now unusable."""

    def __init__(self, call: str, code_name: str, out_of_memory: bool) -> None:
        super().__init__(f"{call} failed: {code_name}")
        self.call = call
        self.code_name = code_name
        self.out_of_memory = out_of_memory

    @property
    def host_memory(self) -> bool:
        return self.call == "cudaHostAlloc"

    @property
    def sticky(self) -> bool:
        return self.code_name in STICKY_ERRORS


def cuda_version_text(version: int) -> str:
    """12040 -> "12.4" (the encoding of cudaDriverGetVersion / cudaRuntimeGetVersion: 1000 * major + 10 * minor)."""
    return f"{version // 1000}.{version % 1000 // 10}"


# The device made current on this thread, and by which runtime module. The module itself (not its id) is kept,
# so a new module object at a reused address (a fresh test double) is never mistaken for the old one.
_THREAD = threading.local()


class CudaRuntime:
    """Checked wrappers over one `cuda.bindings.runtime` module (or the test double's). Stateless apart from
    the per-thread current-device cache; safe to share between threads."""

    def __init__(self, module: CudaRuntimeModule, utils: CudaUtilsModule | None = None) -> None:
        self.module = module
        self.utils = utils  # cuda.bindings.utils of the same cuda-bindings (None: int(stream) is used)
        self._success = module.cudaError_t.cudaSuccess
        self._out_of_memory = module.cudaError_t.cudaErrorMemoryAllocation

    # -- errors

    def error_name(self, code: Any) -> str:
        try:
            err, name = self.module.cudaGetErrorName(code)
            if err == self._success:
                return name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # a name lookup must never hide the original error
            pass
        return str(code)

    def _check(self, result: tuple[Any, ...], call: str) -> tuple[Any, ...]:
        err = result[0]
        if err != self._success:
            raise CudaError(call, self.error_name(err), err == self._out_of_memory)
        return result[1:]

    # -- devices

    def device_count(self) -> tuple[int, str]:
        """(number of usable devices, reason when 0). Never raises: this is the probe that must run before a
        TensorRT Runtime is created (one made without a device segfaults on first use)."""
        err, count = self.module.cudaGetDeviceCount()
        if err != self._success:
            return 0, self.error_name(err)
        if not count:
            return 0, "no CUDA device found"
        return int(count), ""

    def versions(self) -> tuple[int, int]:
        """(CUDA version the driver supports, CUDA version cuda-python's runtime was built for), 0 where unknown.
        Works without a usable device (0 for the driver when none is installed). Never raises."""
        found = []
        for call in (self.module.cudaDriverGetVersion, self.module.cudaRuntimeGetVersion):
            try:
                err, version = call()
            except Exception:  # a version query must never hide the error being reported
                err, version = None, 0
            found.append(int(version) if err == self._success and version else 0)
        return found[0], found[1]

    def use_device(self, device: int) -> None:
        """Make `device` current on the calling thread (once per thread and device)."""
        if getattr(_THREAD, "module", None) is self.module and getattr(_THREAD, "device", None) == device:
            return
        self._check(self.module.cudaSetDevice(device), "cudaSetDevice")
        _THREAD.module = self.module
        _THREAD.device = device

    def device_name(self, device: int) -> str:
        (props,) = self._check(self.module.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
        name = props.name
        if isinstance(name, bytes):
            name = name.split(b"\0", 1)[0].decode(errors="replace")
        return str(name).strip()

    def compute_capability(self, device: int) -> tuple[int, int]:
        """(major, minor): what a TensorRT plan is tied to (a plan from another compute capability is refused)."""
        (props,) = self._check(self.module.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
        return int(props.major), int(props.minor)

    def device_reset(self) -> None:
        """cudaDeviceReset: destroy every allocation and stream of this process on the current device, and its
        CUDA context; the next call makes a fresh one. Nothing made on the old context may be used afterwards."""
        self._check(self.module.cudaDeviceReset(), "cudaDeviceReset")

    def device_synchronize(self) -> None:
        """Block until all work on the current device finished."""
        self._check(self.module.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current device. Device-wide: other processes and models count too."""
        free, total = self._check(self.module.cudaMemGetInfo(), "cudaMemGetInfo")
        return int(free), int(total)

    # -- memory

    def malloc(self, nbytes: int) -> int:
        (pointer,) = self._check(self.module.cudaMalloc(max(1, nbytes)), "cudaMalloc")
        return int(pointer)

    def free(self, pointer: int) -> None:
        self._check(self.module.cudaFree(pointer), "cudaFree")

    def host_alloc(self, nbytes: int) -> int:
        """Pinned (page-locked) host memory: asynchronous copies need it (from pageable memory they are
        staged and synchronous)."""
        (pointer,) = self._check(
            self.module.cudaHostAlloc(max(1, nbytes), self.module.cudaHostAllocDefault), "cudaHostAlloc"
        )
        return int(pointer)

    def free_host(self, pointer: int) -> None:
        self._check(self.module.cudaFreeHost(pointer), "cudaFreeHost")

    def copy_to_device_async(self, device_pointer: int, host_pointer: int, nbytes: int, stream: Any) -> None:
        kind = self.module.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check(
            self.module.cudaMemcpyAsync(device_pointer, host_pointer, nbytes, kind, stream),
            "cudaMemcpyAsync(host to device)",
        )

    def copy_to_host_async(self, host_pointer: int, device_pointer: int, nbytes: int, stream: Any) -> None:
        kind = self.module.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check(
            self.module.cudaMemcpyAsync(host_pointer, device_pointer, nbytes, kind, stream),
            "cudaMemcpyAsync(device to host)",
        )

    # -- streams

    def stream_create(self) -> Any:
        """A non-blocking stream: it never implicitly synchronizes with the legacy default stream, so one slot's
        work never waits for another's."""
        (stream,) = self._check(
            self.module.cudaStreamCreateWithFlags(self.module.cudaStreamNonBlocking), "cudaStreamCreateWithFlags"
        )
        return stream

    def stream_handle(self, stream: Any) -> int:
        """The stream's address as a Python int, which is what TensorRT's `stream_handle` arguments take.
        cuda-bindings 12.9.1 deprecated `int(stream)` for `cuda.bindings.utils.get_cuda_native_handle`; the
        latter is used where it exists."""
        if isinstance(stream, int):
            return stream
        utils = self.utils
        return int(utils.get_cuda_native_handle(stream)) if utils is not None else int(stream)

    def stream_synchronize(self, stream: Any) -> None:
        """Block until all work queued on `stream` finished. Errors of asynchronous work surface here."""
        self._check(self.module.cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    def stream_destroy(self, stream: Any) -> None:
        self._check(self.module.cudaStreamDestroy(stream), "cudaStreamDestroy")


@lru_cache(maxsize=1)
def real_cuda_utils() -> CudaUtilsModule | None:
    """`cuda.bindings.utils`, or None where cuda-bindings is older than 12.9.1 (or absent)."""
    try:
        module: CudaUtilsModule = importlib.import_module("cuda.bindings.utils")
    except ImportError:
        return None
    return module if hasattr(module, "get_cuda_native_handle") else None


def host_view(pointer: int, nbytes: int) -> np.ndarray:
    """A writable uint8 numpy view over `nbytes` of host memory at `pointer` (pinned memory from
    `CudaRuntime.host_alloc`). The view must be dropped before the memory is freed."""
    array_type = ctypes.c_ubyte * max(1, nbytes)
    return np.ctypeslib.as_array(array_type.from_address(pointer))[:nbytes]
