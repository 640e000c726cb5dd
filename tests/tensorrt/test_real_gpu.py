"""The TensorRT backend's CUDA and TensorRT calls on a real NVIDIA GPU. Skipped (with the reason) on machines
without one, which is every CI machine; run on a GPU machine with
`python -m pytest tests/tensorrt/test_real_gpu.py` (needs cuda-python; the TensorRT tests need `tensorrt` or
`tensorrt_lean`, the build test the full `tensorrt`).

These complement the double: they check what only hardware can, e.g. that cuda-python's return types (stream
handles, pointers, device properties) work the way the adapter uses them.
"""

from __future__ import annotations

import importlib
import threading

import numpy as np
import pytest

from engine import errors
from engine.interface import CancelToken
from engine.tensorrt.backend import TensorRTBackend
from engine.tensorrt.cuda import CudaRuntime, host_view

from . import support


def _real_cudart():
    try:
        from cuda.bindings import runtime
    except ImportError:
        return None
    err, count = runtime.cudaGetDeviceCount()
    return runtime if int(err) == 0 and count else None


CUDART = _real_cudart()
pytestmark = pytest.mark.skipif(CUDART is None, reason="needs cuda-python and an NVIDIA GPU")


def _tensorrt(builder: bool = False):
    for name in ("tensorrt", "tensorrt_lean"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "Runtime") and (hasattr(module, "Builder") or not builder):
            return module
    pytest.skip("needs the full tensorrt package" if builder else "needs tensorrt or tensorrt_lean")


def _round_trip(cuda: CudaRuntime, payload: np.ndarray) -> np.ndarray:
    """host -> device -> host through pinned buffers on a non-blocking stream."""
    nbytes = payload.nbytes
    stream = cuda.stream_create()
    device = cuda.malloc(nbytes)
    source, target = cuda.host_alloc(nbytes), cuda.host_alloc(nbytes)
    try:
        host_view(source, nbytes)[:] = payload.view(np.uint8).reshape(-1)
        cuda.copy_to_device_async(device, source, nbytes, stream)
        cuda.copy_to_host_async(target, device, nbytes, stream)
        cuda.stream_synchronize(stream)
        return host_view(target, nbytes).copy().view(payload.dtype).reshape(payload.shape)
    finally:
        cuda.free_host(source)
        cuda.free_host(target)
        cuda.free(device)
        cuda.stream_destroy(stream)


def test_cuda_runtime_calls_work_on_the_device():
    cuda = CudaRuntime(CUDART)
    count, reason = cuda.device_count()
    assert count >= 1 and reason == ""
    cuda.use_device(0)
    name = cuda.device_name(0)
    free, total = cuda.memory_info()
    print(f"device 0: {name}, {free / 2**30:.1f} of {total / 2**30:.1f} GiB free")
    assert name and 0 < free <= total
    before, _ = cuda.memory_info()
    pointer = cuda.malloc(256 << 20)
    during, _ = cuda.memory_info()
    cuda.free(pointer)
    assert before - during >= 256 << 20  # cudaMemGetInfo sees allocations: the capacity measurement relies on it
    payload = np.arange(1 << 20, dtype=np.float32)
    np.testing.assert_array_equal(_round_trip(cuda, payload), payload)
    stream = cuda.stream_create()
    try:
        handle = cuda.stream_handle(stream)  # what TensorRT's stream_handle arguments receive
        assert isinstance(handle, int) and handle != 0
    finally:
        cuda.stream_destroy(stream)


def test_cuda_out_of_memory_is_reported_as_such():
    cuda = CudaRuntime(CUDART)
    cuda.use_device(0)
    _, total = cuda.memory_info()
    from engine.tensorrt.cuda import CudaError

    with pytest.raises(CudaError) as caught:
        cuda.malloc(total * 2)
    assert caught.value.out_of_memory


def test_streams_from_several_threads_each_setting_the_device():
    cuda = CudaRuntime(CUDART)
    failures, barrier = [], threading.Barrier(4, timeout=30)

    def worker(index):
        try:
            cuda.use_device(0)
            barrier.wait()
            payload = np.full(1 << 18, index, dtype=np.int32)
            for _ in range(20):
                np.testing.assert_array_equal(_round_trip(cuda, payload), payload)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []


def test_tensorrt_refuses_a_foreign_plan_without_crashing(tmp_path):
    trt = _tensorrt()
    plan = tmp_path / "m" / "1" / "model.plan"
    plan.parent.mkdir(parents=True)
    plan.write_bytes(b"not a TensorRT plan" * 100)
    backend = TensorRTBackend(trt_module=trt, cudart_module=CUDART, cache_dir=tmp_path / "cache")
    with pytest.raises(errors.ModelLoadError, match="could not deserialize"):
        backend.load(support.spec(plan))


def test_build_load_and_run_concurrent_slots(tmp_path):
    trt = _tensorrt(builder=True)
    onnx_path = support.write_add_sub_onnx(tmp_path)
    backend = TensorRTBackend(trt_module=trt, cudart_module=CUDART, cache_dir=tmp_path / "cache")
    model = backend.load(support.spec(onnx_path))
    print(f"capacity {model.max_parallel_slots}, per slot {model.capacity.per_slot_bytes} bytes, "
          f"weights {model.capacity.weights_bytes} bytes")
    contexts = [model.create_context() for _ in range(4)]
    failures = []

    def worker(index):
        try:
            for round_ in range(50):
                inputs = support.add_sub_inputs(index * 1000 + round_, batch=1 + round_ % 8)
                result = contexts[index].execute(inputs, [], CancelToken())
                np.testing.assert_array_equal(result["OUTPUT0"], inputs["INPUT0"] + inputs["INPUT1"])
                np.testing.assert_array_equal(result["OUTPUT1"], inputs["INPUT0"] - inputs["INPUT1"])
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert failures == []
    finally:
        for context in contexts:
            context.close()
        model.close()
    restarted = TensorRTBackend(trt_module=trt, cudart_module=CUDART, cache_dir=tmp_path / "cache").load(
        support.spec(onnx_path))
    assert restarted.plan_source == "cache"
    restarted.close()
