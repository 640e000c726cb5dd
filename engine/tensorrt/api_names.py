"""Every TensorRT and CUDA-runtime name the TensorRT backend uses, in one place.

The backend (backend.py, model.py, slot.py, engine_io.py, builder.py, cuda.py) reaches TensorRT and
`cuda.bindings.runtime` only through the names listed here; `tests/tensorrt/test_api_conformance.py` checks each of
them against the real modules that install without a GPU, in both API generations (`tensorrt_lean` 11 and 10 for the
runtime, `cuda.bindings` 13 and 12 for CUDA, the published `tensorrt-stubs` 10.13 for the builder), and checks that
the test double (`double/`) provides them too. A rename or removal in a TensorRT or cuda-python release therefore
fails our tests here, not on a customer's GPU.

Layout: `{owner: (attribute, ...)}`. The owner "" is the module itself; any other owner is a class (or enum) of
the module, and its attributes are methods, properties or enum members.

When you use a new name in the backend, add it here (and to the matching Protocol in protocols.py).
"""

from __future__ import annotations

MODULE = ""

# The TensorRT runtime: present in both `tensorrt` and the runtime-only `tensorrt_lean`, in 10.x and 11.x.
RUNTIME: dict[str, tuple[str, ...]] = {
    MODULE: (
        "Logger",
        "Runtime",
        "ICudaEngine",
        "IExecutionContext",
        "IOutputAllocator",
        "TensorIOMode",
        "TensorLocation",
        "DataType",
        "__version__",
    ),
    "Logger": ("WARNING",),
    "Runtime": ("deserialize_cuda_engine",),
    "ICudaEngine": (
        "num_io_tensors",
        "get_tensor_name",
        "get_tensor_mode",
        "get_tensor_dtype",
        "get_tensor_shape",
        "get_tensor_location",
        "is_shape_inference_io",
        "get_tensor_vectorized_dim",
        "get_tensor_components_per_element",
        "get_tensor_format_desc",
        "get_tensor_profile_shape",
        "num_optimization_profiles",
        "device_memory_size_v2",
        "create_execution_context",
    ),
    "IExecutionContext": (
        "set_input_shape",
        "get_tensor_shape",
        "get_tensor_strides",
        "set_tensor_address",
        "set_output_allocator",
        "infer_shapes",
        "execute_async_v3",
        "set_optimization_profile_async",
    ),
    # IOutputAllocator's methods (reallocate_output_async, notify_shape) are ours to implement: the base class
    # exposes none (TensorRT looks them up on the subclass, python/src/infer/pyCore.cpp PyOutputAllocator).
    "TensorIOMode": ("INPUT", "OUTPUT"),
    "TensorLocation": ("DEVICE",),
    # The I/O types the backend serves (engine.tensorrt.backend maps them to KServe names). FP8, INT4, FP4 and
    # E8M0 have no KServe datatype and are refused at load.
    "DataType": ("FLOAT", "HALF", "BF16", "INT8", "INT32", "INT64", "BOOL", "UINT8"),
}

# The builder and the ONNX parser: only in the full `tensorrt` package (not in `tensorrt_lean`), so they are
# checked against the published stubs. None of these names is among TensorRT 11's removals (REMOVED_IN_TRT11).
BUILDER: dict[str, tuple[str, ...]] = {
    MODULE: (
        "Builder",
        "OnnxParser",
        "INetworkDefinition",
        "ITensor",
        "IBuilderConfig",
        "IOptimizationProfile",
        "ITimingCache",
        "MemoryPoolType",
    ),
    "Builder": ("create_network", "create_builder_config", "create_optimization_profile", "build_serialized_network"),
    "OnnxParser": ("parse_from_file", "num_errors", "get_error"),
    "INetworkDefinition": ("num_inputs", "get_input"),
    "ITensor": ("name",),
    "IBuilderConfig": (
        "set_memory_pool_limit",
        "add_optimization_profile",
        "create_timing_cache",
        "set_timing_cache",
        "get_timing_cache",
    ),
    "IOptimizationProfile": ("set_shape",),
    "ITimingCache": ("serialize",),
    "MemoryPoolType": ("WORKSPACE",),
}

# cuda-python's runtime module, `from cuda.bindings import runtime` (cuda-bindings >= 12.6; `from cuda import
# cudart` is gone in 13.x). Every function returns a tuple whose first item is a cudaError_t.
CUDART: dict[str, tuple[str, ...]] = {
    MODULE: (
        "cudaDriverGetVersion",
        "cudaRuntimeGetVersion",
        "cudaGetDeviceCount",
        "cudaSetDevice",
        "cudaGetDeviceProperties",
        "cudaGetErrorName",
        "cudaMemGetInfo",
        "cudaDeviceReset",
        "cudaDeviceSynchronize",
        "cudaMalloc",
        "cudaFree",
        "cudaHostAlloc",
        "cudaFreeHost",
        "cudaMemcpyAsync",
        "cudaStreamCreateWithFlags",
        "cudaStreamSynchronize",
        "cudaStreamDestroy",
        "cudaError_t",
        "cudaMemcpyKind",
        "cudaDeviceProp",
        "cudaStreamNonBlocking",
        "cudaHostAllocDefault",
    ),
    "cudaError_t": ("cudaSuccess", "cudaErrorMemoryAllocation"),
    "cudaMemcpyKind": ("cudaMemcpyHostToDevice", "cudaMemcpyDeviceToHost"),
    "cudaDeviceProp": ("name", "major", "minor"),
}

# `from cuda.bindings import utils` (cuda-bindings >= 12.9.1): `int(stream)` is deprecated there in favour of this.
CUDA_UTILS: dict[str, tuple[str, ...]] = {
    MODULE: ("get_cuda_native_handle",),
}

# Removed in TensorRT 11 (NVIDIA's 10.x -> 11.x migration guide; python/src/infer/pyCore.cpp). The backend must
# use none of them; the 10.13 stubs still list them, so this list is what catches a regression to them.
REMOVED_IN_TRT11: frozenset[str] = frozenset(
    {
        "ICudaEngine.device_memory_size",
        "ICudaEngine.get_device_memory_size_for_profile",
        "ICudaEngine.create_execution_context_without_device_memory",
        "NetworkDefinitionCreationFlag.EXPLICIT_BATCH",
        "BuilderFlag.FP16",
        "BuilderFlag.INT8",
        "BuilderFlag.BF16",
        "BuilderFlag.FP8",
        "BuilderFlag.INT4",
        "BuilderFlag.FP4",
        "BuilderFlag.OBEY_PRECISION_CONSTRAINTS",
        "BuilderFlag.PREFER_PRECISION_CONSTRAINTS",
        "IBuilderConfig.int8_calibrator",
        "Builder.platform_has_fast_fp16",
        "Builder.platform_has_fast_int8",
        "Builder.platform_has_tf32",
        "ICudaEngine.weight_streaming_budget",
        "PreviewFeature.PROFILE_SHARING_0806",
        # Removed already in 10.0 (the binding-index API).
        "ICudaEngine.get_binding_index",
        "ICudaEngine.get_binding_shape",
        "IExecutionContext.execute_async_v2",
        "IExecutionContext.execute_async",
        "IExecutionContext.set_binding_shape",
    }
)


def qualified(names: dict[str, tuple[str, ...]]) -> list[str]:
    """`owner.attribute` (or just `attribute` for module-level names) for every entry of `names`."""
    return [f"{owner}.{attr}" if owner else attr for owner, attrs in names.items() for attr in attrs]
