"""FakeDevice: the simulated GPU with the fake `cuda.bindings` and `tensorrt` / `tensorrt_lean` modules bound to it,
and `double_backend`."""

from __future__ import annotations

import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import tensorrt_builder, tensorrt_runtime
from .cuda_runtime import FakeCudaRuntime, FakeCudaUtils
from .device import SimulatedDevice

if TYPE_CHECKING:
    from engine.tensorrt.backend import TensorRTBackend


class FakeDevice(SimulatedDevice):
    """One simulated GPU (and its driver) plus the TensorRT and CUDA modules bound to it: `cudart` and
    `cuda_utils` stand for `cuda.bindings.runtime` and `.utils`, `trt` for `tensorrt` (with the builder), `trt_lean`
    for `tensorrt_lean`. Takes SimulatedDevice's options (device.py says what each one does)."""

    cudart: FakeCudaRuntime
    cuda_utils: FakeCudaUtils

    def _bind_modules(self) -> None:
        self.cudart = FakeCudaRuntime(self)
        self.cuda_utils = FakeCudaUtils()
        self.trt = trt_module(self, builder=True)
        self.trt_lean = trt_module(self, builder=False)


def trt_module(device: SimulatedDevice, builder: bool) -> types.ModuleType:
    """A module object standing for `tensorrt` (builder=True) or `tensorrt_lean` (builder=False), whose
    device-bound classes are subclasses that know `device`."""
    module = types.ModuleType("tensorrt" if builder else "tensorrt_lean", "TensorRT test double")
    bound = {"_fake": device}
    module.__version__ = device.trt_version  # type: ignore[attr-defined]
    for name in ("Runtime", "ICudaEngine", "IExecutionContext"):
        setattr(module, name, type(name, (getattr(tensorrt_runtime, name),), dict(bound)))
    shared: tuple[Any, ...] = (
        tensorrt_runtime.Logger,
        tensorrt_runtime.Dims,
        tensorrt_runtime.IOutputAllocator,
        tensorrt_runtime.TensorIOMode,
        tensorrt_runtime.TensorLocation,
        tensorrt_runtime.DataType,
        tensorrt_runtime.ExecutionContextAllocationStrategy,
        tensorrt_runtime.MemoryPoolType,
        tensorrt_runtime.nptype,
        tensorrt_builder.IOptimizationProfile,
        tensorrt_builder.ITimingCache,
        tensorrt_builder.IHostMemory,
    )
    for value in shared:
        setattr(module, value.__name__, value)
    if builder:
        module.Builder = type("Builder", (tensorrt_builder.Builder,), dict(bound))  # type: ignore[attr-defined]
        builder_only: tuple[Any, ...] = (
            tensorrt_builder.OnnxParser,
            tensorrt_builder.INetworkDefinition,
            tensorrt_builder.ITensor,
            tensorrt_builder.IBuilderConfig,
        )
        for value in builder_only:
            setattr(module, value.__name__, value)
    return module


def double_backend(cache_dir: Path | str | None = None, **device_options: Any) -> tuple[TensorRTBackend, FakeDevice]:
    """A TensorRTBackend over a fresh FakeDevice: (backend, device). For tests and the gRPC-level test server
    only (see engine.tensorrt.create_backend)."""
    from engine.tensorrt.backend import TensorRTBackend

    device = FakeDevice(**device_options)
    backend = TensorRTBackend(
        trt_module=device.trt, cudart_module=device.cudart, cuda_utils_module=device.cuda_utils, cache_dir=cache_dir
    )
    return backend, device
