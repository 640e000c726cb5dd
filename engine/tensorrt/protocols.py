"""The small slice of TensorRT and cuda-python that the backend is written against, as Protocols.

The adapter is typed against these, not against the third-party `tensorrt-stubs` (10.13 only, not maintained by
NVIDIA, and not valid Python in places) nor against one TensorRT major: the real `tensorrt` / `tensorrt_lean`
modules of 10.x and 11.x and the test double in double/ all satisfy them. Every member here is listed in
api_names.py, and tests/tensorrt/test_api_conformance.py keeps the two in step.

Return values that TensorRT documents as "None on failure" are typed Optional here, although the stubs say
otherwise (for example `deserialize_cuda_engine` and `create_execution_context`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class CudaEngine(Protocol):
    """`tensorrt.ICudaEngine`: shared by every slot. Non-modifying calls and `create_execution_context` may be
    made from several threads at once (TensorRT's thread-safety rules)."""

    @property
    def num_io_tensors(self) -> int: ...

    @property
    def num_optimization_profiles(self) -> int: ...

    @property
    def device_memory_size_v2(self) -> int: ...

    def get_tensor_name(self, index: int) -> str: ...

    def get_tensor_mode(self, name: str) -> Any: ...

    def get_tensor_dtype(self, name: str) -> Any: ...

    def get_tensor_shape(self, name: str) -> Sequence[int]: ...

    def get_tensor_location(self, name: str) -> Any: ...

    def is_shape_inference_io(self, name: str) -> bool: ...

    def get_tensor_vectorized_dim(self, name: str) -> int: ...

    def get_tensor_components_per_element(self, name: str) -> int: ...

    def get_tensor_format_desc(self, name: str) -> str: ...

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> Sequence[Sequence[int]]: ...

    def create_execution_context(self) -> ExecutionContext | None: ...


class ExecutionContext(Protocol):
    """`tensorrt.IExecutionContext`: one slot. One thread at a time, one enqueue in flight."""

    def set_input_shape(self, name: str, shape: Sequence[int]) -> bool: ...

    def get_tensor_shape(self, name: str) -> Sequence[int]: ...

    def get_tensor_strides(self, name: str) -> Sequence[int]: ...

    def set_tensor_address(self, name: str, memory: int) -> bool: ...

    def set_output_allocator(self, name: str, output_allocator: Any) -> bool: ...

    def infer_shapes(self) -> list[str]: ...

    def execute_async_v3(self, stream_handle: int) -> bool: ...

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool: ...


class TrtRuntime(Protocol):
    """`tensorrt.Runtime`. Never construct one without a CUDA device: it segfaults on first use."""

    def deserialize_cuda_engine(self, serialized_engine: bytes) -> CudaEngine | None: ...


class TensorRTRuntimeModule(Protocol):
    """The module `tensorrt` or `tensorrt_lean` (runtime part)."""

    Logger: Any
    Runtime: Any
    ICudaEngine: Any
    IExecutionContext: Any
    IOutputAllocator: Any
    TensorIOMode: Any
    TensorLocation: Any
    DataType: Any
    __version__: str


class NetworkTensor(Protocol):
    """`tensorrt.ITensor` (only its name is read)."""

    @property
    def name(self) -> str: ...


class NetworkDefinition(Protocol):
    """`tensorrt.INetworkDefinition`."""

    @property
    def num_inputs(self) -> int: ...

    def get_input(self, index: int) -> NetworkTensor: ...


class OnnxParser(Protocol):
    """`tensorrt.OnnxParser`."""

    @property
    def num_errors(self) -> int: ...

    def parse_from_file(self, model: str) -> bool: ...

    def get_error(self, index: int) -> Any: ...


class OptimizationProfile(Protocol):
    """`tensorrt.IOptimizationProfile`."""

    def set_shape(self, input: str, min: Sequence[int], opt: Sequence[int], max: Sequence[int]) -> None: ...


class TimingCache(Protocol):
    """`tensorrt.ITimingCache`."""

    def serialize(self) -> Any: ...


class BuilderConfig(Protocol):
    """`tensorrt.IBuilderConfig`."""

    def set_memory_pool_limit(self, pool: Any, pool_size: int) -> None: ...

    def add_optimization_profile(self, profile: OptimizationProfile) -> int: ...

    def create_timing_cache(self, serialized_timing_cache: bytes) -> TimingCache: ...

    def set_timing_cache(self, cache: TimingCache, ignore_mismatch: bool) -> bool: ...

    def get_timing_cache(self) -> TimingCache: ...


class Builder(Protocol):
    """`tensorrt.Builder`: one per thread; the backend makes one per build."""

    def create_network(self, flags: int = 0) -> NetworkDefinition: ...

    def create_builder_config(self) -> BuilderConfig: ...

    def create_optimization_profile(self) -> OptimizationProfile: ...

    def build_serialized_network(self, network: NetworkDefinition, config: BuilderConfig) -> Any: ...


class TensorRTBuilderModule(TensorRTRuntimeModule, Protocol):
    """The full `tensorrt` module: the runtime plus the builder and the ONNX parser."""

    Builder: Any
    OnnxParser: Any
    INetworkDefinition: Any
    ITensor: Any
    IBuilderConfig: Any
    IOptimizationProfile: Any
    ITimingCache: Any
    MemoryPoolType: Any


class CudaRuntimeModule(Protocol):
    """`cuda.bindings.runtime`. Every call returns `(cudaError_t, *values)`; none raises on a CUDA error."""

    cudaError_t: Any
    cudaMemcpyKind: Any
    cudaDeviceProp: Any
    cudaStreamNonBlocking: Any
    cudaHostAllocDefault: Any

    def cudaDriverGetVersion(self) -> tuple[Any, int]: ...

    def cudaRuntimeGetVersion(self) -> tuple[Any, int]: ...

    def cudaGetDeviceCount(self) -> tuple[Any, Any]: ...

    def cudaSetDevice(self, device: int) -> tuple[Any]: ...

    def cudaGetDeviceProperties(self, device: int) -> tuple[Any, Any]: ...

    def cudaGetErrorName(self, error: Any) -> tuple[Any, bytes]: ...

    def cudaMemGetInfo(self) -> tuple[Any, int, int]: ...

    def cudaDeviceReset(self) -> tuple[Any]: ...

    def cudaDeviceSynchronize(self) -> tuple[Any]: ...

    def cudaMalloc(self, size: int) -> tuple[Any, int]: ...

    def cudaFree(self, devPtr: int) -> tuple[Any]: ...

    def cudaHostAlloc(self, size: int, flags: int) -> tuple[Any, int]: ...

    def cudaFreeHost(self, ptr: int) -> tuple[Any]: ...

    def cudaMemcpyAsync(self, dst: int, src: int, count: int, kind: Any, stream: Any) -> tuple[Any]: ...

    def cudaStreamCreateWithFlags(self, flags: int) -> tuple[Any, Any]: ...

    def cudaStreamSynchronize(self, stream: Any) -> tuple[Any]: ...

    def cudaStreamDestroy(self, stream: Any) -> tuple[Any]: ...


class CudaUtilsModule(Protocol):
    """`cuda.bindings.utils` (cuda-bindings >= 12.9.1)."""

    def get_cuda_native_handle(self, obj: Any) -> int: ...


# Which Protocol covers which owner of api_names (for the conformance test).
RUNTIME_PROTOCOLS: dict[str, type] = {
    "": TensorRTRuntimeModule,
    "Runtime": TrtRuntime,
    "ICudaEngine": CudaEngine,
    "IExecutionContext": ExecutionContext,
}
BUILDER_PROTOCOLS: dict[str, type] = {
    "Builder": Builder,
    "OnnxParser": OnnxParser,
    "INetworkDefinition": NetworkDefinition,
    "ITensor": NetworkTensor,
    "IBuilderConfig": BuilderConfig,
    "IOptimizationProfile": OptimizationProfile,
    "ITimingCache": TimingCache,
}
CUDART_PROTOCOLS: dict[str, type] = {"": CudaRuntimeModule}
CUDA_UTILS_PROTOCOLS: dict[str, type] = {"": CudaUtilsModule}
