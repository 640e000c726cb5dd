"""The TensorRT backend's CUDA and TensorRT calls on a real NVIDIA GPU. Skipped (with the reason) on machines
without one, which is every CI machine; run on a GPU machine with
`python -m pytest tests/tensorrt/test_real_gpu.py` (needs cuda-python; the TensorRT tests need `tensorrt` or
`tensorrt_lean`, the build test the full `tensorrt`).

These complement the double: they check what only hardware can, e.g. that cuda-python's return types (stream
handles, pointers, device properties) work the way the adapter uses them, and that the engine behaviours the double
imitates (scalars, outputs whose shape only the data decides, shape inference refusing shapes that do not fit, a
batch profile, a channel-last I/O format) are what TensorRT does.
"""

from __future__ import annotations

import importlib
import shutil
import threading

import numpy as np
import pytest

from engine import errors
from engine.config.specs import BatchingSpec, ModelSpec
from engine.interface import CancelToken
from engine.tensorrt import driver
from engine.tensorrt.backend import TensorRTBackend, tensorrt_cuda_major
from engine.tensorrt.cuda import CudaRuntime, cuda_version_text, host_view

from ..conftest import DEMO_REPOSITORY
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
    print(
        f"capacity {model.max_parallel_slots}, per slot {model.capacity.per_slot_bytes} bytes, "
        f"weights {model.capacity.weights_bytes} bytes"
    )
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
        support.spec(onnx_path)
    )
    assert restarted.plan_source == "cache"
    restarted.close()


def _backend(tmp_path, builder: bool = True) -> TensorRTBackend:
    return TensorRTBackend(trt_module=_tensorrt(builder=builder), cudart_module=CUDART, cache_dir=tmp_path / "cache")


def _run(context, inputs):
    return context.execute(inputs, [], CancelToken())


def test_the_versions_fit_and_the_driver_picks_the_installed_extra():
    cuda = CudaRuntime(CUDART)
    driver_cuda, runtime_cuda = cuda.versions()
    trt = _tensorrt()
    print(
        f"driver CUDA {cuda_version_text(driver_cuda)}, cuda-python CUDA {cuda_version_text(runtime_cuda)}, "
        f"TensorRT {trt.__version__} for CUDA {tensorrt_cuda_major(trt)}, nvidia-smi {driver.nvidia_smi()}"
    )
    assert driver_cuda // 1000 >= runtime_cuda // 1000 > 0
    assert driver.driver_cuda_version() == driver_cuda  # libcuda's answer is cuda-python's
    extra = driver.choose_extra(driver_cuda, *driver.nvidia_smi())
    assert extra.cuda_major >= runtime_cuda // 1000


def test_a_scalar_input_silero_vad(tmp_path):
    source = DEMO_REPOSITORY / "silero_vad" / "1" / "model.onnx"
    if not source.exists():
        pytest.skip("needs the demo repository (make models)")
    onnx_path = tmp_path / "silero_vad" / "1" / "model.onnx"
    onnx_path.parent.mkdir(parents=True)
    shutil.copy(source, onnx_path)
    spec = support.spec(
        onnx_path,
        max_batch_size=0,
        trt_profile_min="input:1x576;state:2x1x128",
        trt_profile_opt="input:1x576;state:2x1x128",
        trt_profile_max="input:4x576;state:2x4x128",
    )
    model = _backend(tmp_path).load(spec)
    context = model.create_context()
    try:
        rng = np.random.default_rng(1)
        inputs = {
            "input": (0.1 * rng.standard_normal((1, 576))).astype(np.float32),
            "state": np.zeros((2, 1, 128), np.float32),
            "sr": np.array(16000, np.int64),
        }
        result = _run(context, inputs)
        import onnxruntime

        expected = onnxruntime.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, inputs)
        np.testing.assert_allclose(result["output"], expected[0], rtol=2e-2, atol=2e-2)
        np.testing.assert_allclose(result["stateN"], expected[1], rtol=2e-2, atol=2e-2)
    finally:
        context.close()
        model.close()


def test_a_data_dependent_output_through_the_output_allocator(tmp_path):
    model = _backend(tmp_path).load(support.spec(support.write_nonzero_onnx(tmp_path), max_batch_size=0))
    context = model.create_context()
    try:
        assert [t.shape for t in model.metadata.outputs] == [(2, -1)]
        rng = np.random.default_rng(2)
        for density in (0.0, 0.3, 1.0, 0.1):  # empty first: no buffer yet; then it grows, and is reused
            x = (rng.random((4, 4)) < density).astype(np.float32)
            np.testing.assert_array_equal(_run(context, {"INPUT0": x})["OUTPUT0"], np.array(np.nonzero(x)))
    finally:
        context.close()
        model.close()


def test_shapes_that_do_not_fit_each_other_are_refused_by_shape_inference(tmp_path):
    # add_sub's two inputs share the "batch" dimension; without max_batch_size only TensorRT knows that.
    onnx_path = support.write_add_sub_onnx(tmp_path)
    model = _backend(tmp_path).load(
        support.spec(onnx_path, max_batch_size=0, trt_profile_max="INPUT0:8x16;INPUT1:8x16")
    )
    context = model.create_context()
    try:
        with pytest.raises(errors.InvalidInputError, match="do not fit each other"):
            _run(context, {"INPUT0": np.zeros((2, 16), np.int32), "INPUT1": np.zeros((3, 16), np.int32)})
        inputs = support.add_sub_inputs(3, batch=3)
        np.testing.assert_array_equal(_run(context, inputs)["OUTPUT0"], inputs["INPUT0"] + inputs["INPUT1"])
    finally:
        context.close()
        model.close()


def test_a_batching_model_gets_its_batch_profile_and_runs_every_batch_size(tmp_path):
    onnx_path = support.write_add_sub_onnx(tmp_path)
    model = _backend(tmp_path).load(support.spec(onnx_path, batching=BatchingSpec(preferred_batch_sizes=(2, 4))))
    context = model.create_context()
    try:
        assert model.profile_shapes("INPUT0") == ((1, 16), (4, 16), (8, 16))
        for batch in range(1, 9):
            inputs = support.add_sub_inputs(batch, batch=batch)
            result = _run(context, inputs)
            np.testing.assert_array_equal(result["OUTPUT1"], inputs["INPUT0"] - inputs["INPUT1"])
    finally:
        context.close()
        model.close()


def test_a_channel_last_io_format_is_refused_at_load(tmp_path):
    trt = _tensorrt(builder=True)
    if not hasattr(trt, "TensorFormat"):
        pytest.skip("this TensorRT has no TensorFormat")
    cuda = CudaRuntime(CUDART)
    cuda.use_device(0)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    x = network.add_input("X", trt.DataType.FLOAT, (1, 3, 8, 8))
    identity = network.add_identity(x)
    out = identity.get_output(0)
    out.name = "Y"
    network.mark_output(out)
    x.allowed_formats = 1 << int(trt.TensorFormat.HWC)
    plan = builder.build_serialized_network(network, builder.create_builder_config())
    if plan is None:
        pytest.skip("this TensorRT would not build an FP32 HWC input")
    path = tmp_path / "hwc" / "1" / "model.plan"
    path.parent.mkdir(parents=True)
    path.write_bytes(bytes(memoryview(plan)))
    with pytest.raises(errors.ModelConfigError, match=r"input 'X' uses the I/O format"):
        TensorRTBackend(trt_module=trt, cudart_module=CUDART).load(
            ModelSpec(
                name="hwc",
                backend="tensorrt",
                model_file=path,
                platform="tensorrt_plan",
                parameters={"trt_memory_reserve_bytes": "0"},
            )
        )
