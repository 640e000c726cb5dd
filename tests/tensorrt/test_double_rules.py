"""The test double is strict: each TensorRT / CUDA rule it claims to enforce is broken here on purpose, and the
double must refuse (raise DoubleRuleViolation, record the violation). A lenient double would let the backend
tests pass over code that crashes or corrupts results on a real GPU.

These tests drive the double's modules directly, the way the backend does, without the backend.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

from engine.testing.tensorrt_double import POISON, DoubleRuleViolation, FakeDevice

from . import support

pytestmark = pytest.mark.expect_violations


class Slot:
    """A raw add_sub slot over the double: engine, context, stream, device and pinned buffers per tensor."""

    def __init__(self, device: FakeDevice, engine=None, plan_kwargs=None):
        self.device = device
        rt = device.cudart
        assert rt.cudaSetDevice(0)[0] == 0
        if engine is None:
            runtime = device.trt.Runtime(device.trt.Logger())
            plan = device.make_plan(
                inputs=support.ADD_SUB_INPUTS,
                outputs=support.ADD_SUB_OUTPUTS,
                function="add_sub",
                profiles=support.add_sub_profiles(),
                **(plan_kwargs or {}),
            )
            engine = runtime.deserialize_cuda_engine(plan)
        self.engine = engine
        self.context = engine.create_execution_context()
        self.stream = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)[1]
        self.nbytes = support.BATCH * support.WIDTH * 4
        self.device_ptr, self.host_ptr = {}, {}
        for name in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1"):
            self.device_ptr[name] = rt.cudaMalloc(self.nbytes)[1]
            self.host_ptr[name] = rt.cudaHostAlloc(self.nbytes, 0)[1]
            assert self.context.set_tensor_address(name, self.device_ptr[name])

    def host(self, name: str) -> np.ndarray:
        return np.ctypeslib.as_array(
            (ctypes.c_int32 * (support.BATCH * support.WIDTH)).from_address(self.host_ptr[name])
        )

    def run(self, a: np.ndarray, b: np.ndarray, sync: bool = True) -> None:
        rt, kind = self.device.cudart, self.device.cudart.cudaMemcpyKind
        for name, array in (("INPUT0", a), ("INPUT1", b)):
            assert self.context.set_input_shape(name, array.shape)
            self.host(name)[: array.size] = array.reshape(-1)
            assert (
                rt.cudaMemcpyAsync(
                    self.device_ptr[name], self.host_ptr[name], array.nbytes, kind.cudaMemcpyHostToDevice, self.stream
                )[0]
                == 0
            )
        assert self.context.execute_async_v3(self.stream)
        for name in ("OUTPUT0", "OUTPUT1"):
            assert (
                rt.cudaMemcpyAsync(
                    self.host_ptr[name], self.device_ptr[name], a.nbytes, kind.cudaMemcpyDeviceToHost, self.stream
                )[0]
                == 0
            )
        if sync:
            assert rt.cudaStreamSynchronize(self.stream)[0] == 0


def _inputs(batch=2):
    values = support.add_sub_inputs(1, batch)
    return values["INPUT0"], values["INPUT1"]


def test_a_correct_sequence_computes_and_breaks_no_rule(device):
    slot = Slot(device)
    a, b = _inputs()
    slot.run(a, b)
    np.testing.assert_array_equal(slot.host("OUTPUT0")[: a.size].reshape(a.shape), a + b)
    np.testing.assert_array_equal(slot.host("OUTPUT1")[: a.size].reshape(a.shape), a - b)
    assert device.violations == []
    assert device.stats.enqueues == 1 and device.stats.copies == 4


def test_default_stream_is_refused(device):
    slot = Slot(device)
    a, b = _inputs()
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        slot.context.set_input_shape(name, array.shape)
    with pytest.raises(DoubleRuleViolation, match="default stream"):
        slot.context.execute_async_v3(0)
    with pytest.raises(DoubleRuleViolation, match="default stream"):
        device.cudart.cudaMemcpyAsync(
            slot.device_ptr["INPUT0"],
            slot.host_ptr["INPUT0"],
            4,
            device.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice,
            0,
        )
    assert len(device.violations) == 2


def test_second_enqueue_while_the_first_is_in_flight(device):
    slot = Slot(device)
    a, b = _inputs()
    slot.run(a, b, sync=False)
    with pytest.raises(DoubleRuleViolation, match="previous enqueue is still in flight"):
        slot.context.execute_async_v3(slot.stream)
    device.cudart.cudaStreamSynchronize(slot.stream)
    assert slot.context.execute_async_v3(slot.stream)  # after draining, the context may enqueue again


def test_a_context_is_used_by_one_thread_at_a_time(device):
    slot = Slot(device)
    inside, release = threading.Event(), threading.Event()

    def hold(name):
        if name == "set_input_shape" and threading.current_thread().name == "holder":
            inside.set()
            release.wait(10)

    device.hooks.in_context_call = hold
    holder = threading.Thread(target=lambda: slot.context.set_input_shape("INPUT0", (1, 16)), name="holder")
    holder.start()
    assert inside.wait(10)
    try:
        with pytest.raises(DoubleRuleViolation, match="another thread is inside this context"):
            slot.context.get_tensor_shape("OUTPUT0")
    finally:
        release.set()
        holder.join(10)
    # Handing a context to another thread between calls is allowed.
    assert slot.context.get_tensor_shape("INPUT0") == (1, 16)


def test_pinned_input_modified_while_its_copy_is_in_flight(device):
    slot = Slot(device)
    a, b = _inputs()
    slot.run(a, b, sync=False)
    slot.host("INPUT0")[0] += 1  # the next request staged before the previous one drained
    with pytest.raises(DoubleRuleViolation, match="modified while the async copy"):
        device.cudart.cudaStreamSynchronize(slot.stream)


def test_device_buffer_used_from_a_second_stream_while_in_flight(device):
    first = Slot(device)
    a, b = _inputs()
    first.run(a, b, sync=False)
    rt = device.cudart
    other_stream = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)[1]
    other_host = rt.cudaHostAlloc(64, 0)[1]
    with pytest.raises(DoubleRuleViolation, match="still used by work in flight on stream"):
        rt.cudaMemcpyAsync(
            first.device_ptr["OUTPUT0"], other_host, 64, rt.cudaMemcpyKind.cudaMemcpyHostToDevice, other_stream
        )


def test_two_contexts_bound_to_one_buffer_collide_when_both_in_flight(device):
    first = Slot(device)
    second = Slot(device, engine=first.engine)
    for name in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1"):  # second slot reuses the first slot's buffers
        second.context.set_tensor_address(name, first.device_ptr[name])
    a, b = _inputs()
    first.run(a, b, sync=False)
    for name in ("INPUT0", "INPUT1"):
        second.context.set_input_shape(name, a.shape)
    with pytest.raises(DoubleRuleViolation, match="still used by work in flight"):
        second.context.execute_async_v3(second.stream)


def test_free_or_destroy_while_in_flight(device):
    slot = Slot(device)
    a, b = _inputs()
    slot.run(a, b, sync=False)
    rt = device.cudart
    with pytest.raises(DoubleRuleViolation, match="cudaFree"):
        rt.cudaFree(slot.device_ptr["OUTPUT0"])
    with pytest.raises(DoubleRuleViolation, match="cudaFreeHost"):
        rt.cudaFreeHost(slot.host_ptr["OUTPUT0"])
    with pytest.raises(DoubleRuleViolation, match="cudaStreamDestroy"):
        rt.cudaStreamDestroy(slot.stream)
    rt.cudaStreamSynchronize(slot.stream)
    assert rt.cudaFree(slot.device_ptr["OUTPUT0"])[0] == 0  # fine once drained


def test_async_copy_from_pageable_memory_is_refused(device):
    slot = Slot(device)
    pageable = np.zeros(16, np.int32)
    with pytest.raises(DoubleRuleViolation, match="not pinned memory"):
        device.cudart.cudaMemcpyAsync(
            slot.device_ptr["INPUT0"],
            pageable.ctypes.data,
            pageable.nbytes,
            device.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice,
            slot.stream,
        )


def test_results_are_garbage_until_the_stream_is_synchronized(device):
    slot = Slot(device)
    a, b = _inputs()
    slot.run(a, b, sync=False)
    early = slot.host("OUTPUT0")[: a.size].copy()
    assert (early.view(np.uint8) == POISON).all()
    device.cudart.cudaStreamSynchronize(slot.stream)
    np.testing.assert_array_equal(slot.host("OUTPUT0")[: a.size].reshape(a.shape), a + b)


def test_address_too_small_or_not_device_memory(device):
    slot = Slot(device)
    rt = device.cudart
    small = rt.cudaMalloc(16)[1]
    slot.context.set_tensor_address("OUTPUT0", small)
    for name in ("INPUT0", "INPUT1"):
        slot.context.set_input_shape(name, (2, 16))
    with pytest.raises(DoubleRuleViolation, match="is not device memory with 128 bytes"):
        slot.context.execute_async_v3(slot.stream)
    slot.context.set_tensor_address("OUTPUT0", slot.host_ptr["OUTPUT0"])  # a host pointer
    with pytest.raises(DoubleRuleViolation, match="is not device memory"):
        slot.context.execute_async_v3(slot.stream)


def test_unset_shape_or_address_fails_the_enqueue(device):
    slot = Slot(device)
    slot.context.set_input_shape("INPUT0", (1, 16))
    assert slot.context.execute_async_v3(slot.stream) is False  # INPUT1 has no shape
    slot.context.set_input_shape("INPUT1", (1, 16))
    slot.context.set_tensor_address("OUTPUT1", 0)
    assert slot.context.execute_async_v3(slot.stream) is False  # OUTPUT1 has no address


def test_shapes_outside_the_profile_are_refused(device):
    slot = Slot(device)
    assert slot.context.set_input_shape("INPUT0", (8, 16))
    assert not slot.context.set_input_shape("INPUT0", (9, 16))
    assert not slot.context.set_input_shape("INPUT0", (0, 16))
    assert not slot.context.set_input_shape("INPUT0", (1, 17))
    assert not slot.context.set_input_shape("OUTPUT0", (1, 16))
    with pytest.raises(DoubleRuleViolation, match="no tensor named"):
        slot.context.set_input_shape("NOPE", (1, 16))
    with pytest.raises(DoubleRuleViolation, match="inputs only"):
        slot.engine.get_tensor_profile_shape("OUTPUT0", 0)


def test_bad_profile_index_raises_runtime_error(device):
    slot = Slot(device)
    with pytest.raises(RuntimeError):
        slot.context.set_optimization_profile_async(1, slot.stream)


def test_contexts_sharing_a_profile_are_refused_under_the_old_rule():
    device = FakeDevice(total_memory=64 << 20, profile_sharing=False)
    device.cudart.cudaSetDevice(0)
    plan = device.make_plan(
        inputs=support.ADD_SUB_INPUTS,
        outputs=support.ADD_SUB_OUTPUTS,
        function="add_sub",
        profiles=support.add_sub_profiles(2),
    )
    engine = device.trt.Runtime(device.trt.Logger()).deserialize_cuda_engine(plan)
    first = Slot(device, engine=engine)
    a, b = _inputs()
    first.run(a, b)
    second = Slot(device, engine=engine)  # new contexts start on profile 0, which `first` holds
    with pytest.raises(DoubleRuleViolation, match="share optimization profile 0"):
        second.run(a, b)
    device.cudart.cudaStreamSynchronize(second.stream)
    assert second.context.set_optimization_profile_async(1, second.stream)
    second.run(a, b)  # on its own profile: fine
    first.run(a, b)
    np.testing.assert_array_equal(second.host("OUTPUT0")[: a.size].reshape(a.shape), a + b)


def test_context_creation_returns_none_when_device_memory_runs_out():
    device = FakeDevice(total_memory=(1 << 20) + 3 * (1 << 20), activation_bytes=1 << 20)
    device.cudart.cudaSetDevice(0)
    plan = device.make_plan(
        inputs=support.ADD_SUB_INPUTS,
        outputs=support.ADD_SUB_OUTPUTS,
        function="add_sub",
        profiles=support.add_sub_profiles(),
        weights_bytes=1 << 20,
    )
    engine = device.trt.Runtime(device.trt.Logger()).deserialize_cuda_engine(plan)
    contexts = [engine.create_execution_context() for _ in range(4)]
    assert [c is not None for c in contexts] == [True, True, True, False]
    assert device.stats.context_failures == 1
    assert device.cudart.cudaMemGetInfo()[1] == 0
    assert device.cudart.cudaMalloc(1) == (device.cudart.cudaError_t.cudaErrorMemoryAllocation, None)
    del contexts, engine
    assert device.leaks() == {}


def test_deserialization_fails_for_other_versions_compute_capabilities_and_garbage(device):
    device.cudart.cudaSetDevice(0)
    runtime = device.trt.Runtime(device.trt.Logger())
    kwargs = dict(
        inputs=support.ADD_SUB_INPUTS,
        outputs=support.ADD_SUB_OUTPUTS,
        function="add_sub",
        profiles=support.add_sub_profiles(),
    )
    assert runtime.deserialize_cuda_engine(device.make_plan(trt_version="10.16.1.11", **kwargs)) is None
    assert runtime.deserialize_cuda_engine(device.make_plan(compute_capability=(8, 6), **kwargs)) is None
    # Another GPU model of the same compute capability: TensorRT loads the plan and only warns.
    assert runtime.deserialize_cuda_engine(device.make_plan(device_name="Other GPU", **kwargs)) is not None
    assert "plan built on 'Other GPU'" in device.log[-1]
    assert runtime.deserialize_cuda_engine(b"not a plan") is None
    assert runtime.deserialize_cuda_engine(device.make_plan(weights_bytes=device.total_memory + 1, **kwargs)) is None
    assert runtime.deserialize_cuda_engine(device.make_plan(**kwargs)) is not None


def test_no_driver_and_no_device():
    without_driver = FakeDevice(driver=False)
    rt = without_driver.cudart
    assert rt.cudaGetDeviceCount() == (rt.cudaError_t.cudaErrorInsufficientDriver, None)
    assert rt.cudaSetDevice(0) == (rt.cudaError_t.cudaErrorInsufficientDriver,)
    assert rt.cudaMalloc(16) == (rt.cudaError_t.cudaErrorInsufficientDriver, None)
    with pytest.raises(DoubleRuleViolation, match="segfaults on first use"):
        without_driver.trt.Runtime(without_driver.trt.Logger())
    without_device = FakeDevice(device_count=0)
    assert without_device.cudart.cudaGetDeviceCount() == (rt.cudaError_t.cudaErrorNoDevice, 0)
    with pytest.raises(DoubleRuleViolation):
        without_device.trt.Runtime(without_device.trt.Logger())
    with pytest.raises(DoubleRuleViolation):
        without_device.trt.Builder(without_device.trt.Logger())


def test_cuda_on_a_thread_without_cuda_set_device(device):
    device.cudart.cudaSetDevice(0)  # the main thread is fine; a new thread is not
    errors = []

    def worker():
        try:
            device.cudart.cudaMalloc(16)
        except DoubleRuleViolation as error:
            errors.append(error)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(10)
    assert len(errors) == 1 and "never called cudaSetDevice" in str(errors[0])


def test_builder_checks_profiles_and_builds_a_plan_that_runs_the_onnx_model(device, tmp_path):
    onnx_path = support.write_add_sub_onnx(tmp_path)
    device.cudart.cudaSetDevice(0)
    trt = device.trt
    logger = trt.Logger()
    builder = trt.Builder(logger)

    def build(profile_shapes):
        network = builder.create_network(0)
        assert trt.OnnxParser(network, logger).parse_from_file(str(onnx_path))
        config = builder.create_builder_config()
        if profile_shapes is not None:
            profile = builder.create_optimization_profile()
            for name in ("INPUT0", "INPUT1"):
                profile.set_shape(name, *profile_shapes)
            config.add_optimization_profile(profile)
        return builder.build_serialized_network(network, config)

    assert build(None) is None  # dynamic batch without a profile
    assert build(((1, 17), (2, 17), (4, 17))) is None  # contradicts the fixed dimension 16
    assert build(((2, 16), (1, 16), (4, 16))) is None  # not min <= opt <= max
    plan = build(((1, 16), (2, 16), (4, 16)))
    assert plan is not None and device.stats.builds == 1
    slot = Slot(device, engine=trt.Runtime(logger).deserialize_cuda_engine(bytes(memoryview(plan))))
    a, b = _inputs(batch=3)
    slot.run(a, b)
    np.testing.assert_array_equal(slot.host("OUTPUT1")[: a.size].reshape(a.shape), a - b)


def test_parser_reports_unsupported_types(device, tmp_path):
    from onnx import TensorProto

    path = support.write_identity_onnx(tmp_path, elem_type=TensorProto.STRING)
    device.cudart.cudaSetDevice(0)
    parser = device.trt.OnnxParser(device.trt.Builder(None).create_network(0), None)
    assert not parser.parse_from_file(str(path))
    assert parser.num_errors >= 1 and "unsupported ONNX type" in str(parser.get_error(0))


def test_context_keeps_its_engine_alive_and_destruction_is_counted(device):
    slot = Slot(device)
    context = slot.context
    del slot
    assert device.stats.engines_live == 1  # the context still refers to the engine
    del context
    assert device.stats.contexts_live == 0 and device.stats.engines_live == 0
    events = [e for e in device.stats.events if "destroyed" in e]
    assert events[0].startswith("context") and events[-1].startswith("engine")


# ----------------------------------------------------------------- as the library does (issue 15, item 10)


def _engine(device: FakeDevice, **plan_kwargs):
    device.cudart.cudaSetDevice(0)
    return device.trt.Runtime(device.trt.Logger()).deserialize_cuda_engine(device.make_plan(**plan_kwargs))


def test_streams_are_cuda_stream_objects_whose_handle_utils_gives(device):
    rt = device.cudart
    rt.cudaSetDevice(0)
    stream = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)[1]
    assert isinstance(stream, rt.cudaStream_t) and not isinstance(stream, int)
    assert device.cuda_utils.get_cuda_native_handle(stream) == stream.getPtr() == int(stream) != 0
    with pytest.raises(TypeError, match="Unknown type"):
        device.cuda_utils.get_cuda_native_handle(int(stream))


def test_a_scalar_input_takes_the_empty_shape_only(device):
    engine = _engine(device, inputs=[("sr", "INT64", ())], outputs=[("out", "INT64", ())])
    context = engine.create_execution_context()
    assert engine.get_tensor_shape("sr") == ()
    assert context.set_input_shape("sr", ())
    assert not context.set_input_shape("sr", (1,))


def test_shape_tensors_live_in_host_memory(device):
    engine = _engine(
        device,
        inputs=[("X", "FLOAT", (4,)), ("shape", "INT64", (2,))],
        outputs=[("Y", "FLOAT", (4,))],
        host_tensors=("shape",),
    )
    assert engine.get_tensor_location("shape") == device.trt.TensorLocation.HOST
    assert engine.is_shape_inference_io("shape") and not engine.is_shape_inference_io("X")
    context = engine.create_execution_context()
    rt = device.cudart
    stream = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)[1]
    for name, size in (("X", 16), ("shape", 16), ("Y", 16)):
        context.set_tensor_address(name, rt.cudaMalloc(size)[1])
    context.set_input_shape("X", (4,))
    context.set_input_shape("shape", (2,))
    with pytest.raises(DoubleRuleViolation, match="shape tensor 'shape' has a device address"):
        context.execute_async_v3(stream)


@pytest.mark.parametrize(
    "tensor_format,vectorized,components,nbytes",
    [
        ("LINEAR", -1, 1, 2 * 3 * 4 * 5 * 4),
        ("HWC", -1, 1, 2 * 3 * 4 * 5 * 4),
        ("CHW16", 1, 16, 2 * 16 * 4 * 5 * 4),
        ("HWC8", 1, 8, 2 * 8 * 4 * 5 * 4),
    ],
)
def test_io_formats_change_the_buffer_size_and_layout(device, tensor_format, vectorized, components, nbytes):
    shape = (2, 3, 4, 5)
    engine = _engine(
        device, inputs=[("X", "FLOAT", shape)], outputs=[("Y", "FLOAT", shape)], formats={"X": tensor_format}
    )
    assert engine.get_tensor_vectorized_dim("X") == vectorized
    assert engine.get_tensor_components_per_element("X") == components
    assert f"(k{tensor_format})" in engine.get_tensor_format_desc("X")
    context = engine.create_execution_context()
    context.set_input_shape("X", shape)
    strides = tuple(context.get_tensor_strides("X"))
    assert (strides == (60, 20, 5, 1)) == (tensor_format == "LINEAR")
    rt = device.cudart
    stream = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)[1]
    volume_bytes = 2 * 3 * 4 * 5 * 4
    for name in ("X", "Y"):
        context.set_tensor_address(name, rt.cudaMalloc(volume_bytes)[1])
    if nbytes > volume_bytes:  # buffers sized as volume x itemsize are too small for a vectorized format
        with pytest.raises(DoubleRuleViolation, match=f"is not device memory with {nbytes} bytes"):
            context.execute_async_v3(stream)
        return
    values = np.arange(120, dtype=np.float32).reshape(shape)
    source, target = rt.cudaHostAlloc(volume_bytes, 0)[1], rt.cudaHostAlloc(volume_bytes, 0)[1]
    np.ctypeslib.as_array((ctypes.c_float * 120).from_address(source))[:] = values.reshape(-1)
    kind = rt.cudaMemcpyKind
    rt.cudaMemcpyAsync(context._addresses["X"], source, volume_bytes, kind.cudaMemcpyHostToDevice, stream)
    assert context.execute_async_v3(stream)
    rt.cudaMemcpyAsync(target, context._addresses["Y"], volume_bytes, kind.cudaMemcpyDeviceToHost, stream)
    rt.cudaStreamSynchronize(stream)
    # The engine reads X in its format and writes Y row major: row-major bytes put into a channel-last X come
    # out rearranged.
    stored = np.ctypeslib.as_array((ctypes.c_float * 120).from_address(target)).reshape(shape)
    assert np.array_equal(stored, values) == (tensor_format == "LINEAR")


def make_allocator(device, base_init=True):
    """An IOutputAllocator that cudaMallocs what it is asked for and records the calls."""

    class Allocator(device.trt.IOutputAllocator):
        def __init__(self):
            if base_init:
                super().__init__()
            self.calls, self.shapes, self.pointers = [], {}, []

        def reallocate_output_async(self, name, memory, size, alignment, stream):
            self.calls.append((name, memory, size))
            self.pointers.append(device.cudart.cudaMalloc(size)[1])
            return self.pointers[-1]

        def notify_shape(self, name, shape):
            self.shapes[name] = tuple(shape)

    return Allocator()


def test_data_dependent_output_shapes_need_an_output_allocator(device):
    engine = _engine(
        device,
        inputs=[("X", "FLOAT", (3, 4))],
        outputs=[("Y", "INT64", (2, -1))],
        function="nonzero",
        data_dependent={"Y": [1]},
    )
    context = engine.create_execution_context()
    rt = device.cudart
    stream = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)[1]
    assert context.set_input_shape("X", (3, 4))
    assert tuple(engine.get_tensor_shape("Y")) == (2, -1) and tuple(context.get_tensor_shape("Y")) == (2, -1)
    assert context.get_max_output_size("Y") == 2 * 12 * 8
    x_device, x_host = rt.cudaMalloc(48)[1], rt.cudaHostAlloc(48, 0)[1]
    context.set_tensor_address("X", x_device)
    context.set_tensor_address("Y", rt.cudaMalloc(2 * 12 * 8)[1])
    assert context.execute_async_v3(stream) is False  # an address is not enough: TensorRT needs the allocator
    with pytest.raises(TypeError, match="IOutputAllocator.__init__"):
        context.set_output_allocator("Y", make_allocator(device, base_init=False))
    allocator = make_allocator(device)
    assert context.set_output_allocator("Y", allocator) and not context.set_output_allocator("X", allocator)
    values = np.zeros((3, 4), np.float32)
    values[0, 1] = values[2, 3] = 1
    np.ctypeslib.as_array((ctypes.c_float * 12).from_address(x_host))[:] = values.reshape(-1)
    rt.cudaMemcpyAsync(x_device, x_host, 48, rt.cudaMemcpyKind.cudaMemcpyHostToDevice, stream)
    assert context.execute_async_v3(stream)
    # Before execute_async_v3 returned, TensorRT asked for the memory and told the shape.
    assert allocator.shapes == {"Y": (2, 2)} and allocator.calls[0][0] == "Y" and allocator.calls[0][2] == 32
    assert rt.cudaStreamSynchronize(stream)[0] == 0
    assert allocator.pointers and device.stats.output_reallocations == 1
    written = np.frombuffer(device.read_device(allocator.pointers[0], 32), np.int64).reshape(2, 2)
    np.testing.assert_array_equal(written, np.array(np.nonzero(values)))  # in the allocator's memory


def test_an_allocator_that_returns_too_little_memory(device):
    engine = _engine(
        device,
        inputs=[("X", "FLOAT", (4,))],
        outputs=[("Y", "INT64", (1, -1))],
        function="nonzero",
        data_dependent={"Y": [1]},
    )
    context = engine.create_execution_context()
    rt = device.cudart
    stream = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)[1]
    context.set_input_shape("X", (4,))
    x_device, x_host = rt.cudaMalloc(16)[1], rt.cudaHostAlloc(16, 0)[1]
    np.ctypeslib.as_array((ctypes.c_float * 4).from_address(x_host))[:] = [1, 1, 1, 0]
    context.set_tensor_address("X", x_device)
    rt.cudaMemcpyAsync(x_device, x_host, 16, rt.cudaMemcpyKind.cudaMemcpyHostToDevice, stream)

    class Small(device.trt.IOutputAllocator):
        def reallocate_output_async(self, name, memory, size, alignment, stream):
            return rt.cudaMalloc(8)[1]

        def notify_shape(self, name, shape):
            pass

    context.set_output_allocator("Y", Small())
    with pytest.raises(DoubleRuleViolation, match="is not device memory with 24 bytes"):
        context.execute_async_v3(stream)


def test_shapes_that_do_not_fit_each_other(device):
    slot = Slot(device)
    assert slot.context.set_input_shape("INPUT0", (2, 16)) and slot.context.set_input_shape("INPUT1", (3, 16))
    shape = slot.context.get_tensor_shape("OUTPUT0")
    assert [d for d in shape] == []  # what `tuple(int(d) for d in shape)` sees: nothing
    with pytest.raises(ValueError):
        len(shape)
    with pytest.raises(RuntimeError, match="infer_shapes error code"):
        slot.context.infer_shapes()
    assert slot.context.execute_async_v3(slot.stream) is False
    assert slot.context.set_input_shape("INPUT1", (2, 16)) and slot.context.infer_shapes() == []


def test_infer_shapes_names_the_inputs_without_a_shape(device):
    slot = Slot(device)
    slot.context.set_input_shape("INPUT0", (2, 16))
    assert slot.context.infer_shapes() == ["INPUT1"]


def test_a_sticky_error_poisons_every_call_until_a_reset(device):
    slot = Slot(device)
    rt = device.cudart
    a, b = _inputs()
    device.inject_fault(rt.cudaError_t.cudaErrorIllegalAddress)
    slot.run(a, b, sync=False)
    assert rt.cudaStreamSynchronize(slot.stream) == (rt.cudaError_t.cudaErrorIllegalAddress,)
    assert rt.cudaMalloc(16) == (rt.cudaError_t.cudaErrorIllegalAddress, None)
    assert rt.cudaFree(slot.device_ptr["INPUT0"]) == (rt.cudaError_t.cudaErrorIllegalAddress,)
    assert slot.engine.create_execution_context() is None
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        slot.context.set_input_shape(name, array.shape)
    assert slot.context.execute_async_v3(slot.stream) is False
    assert rt.cudaGetDeviceCount() == (rt.cudaError_t.cudaSuccess, 1)  # the driver still answers
    runtime = slot.engine._runtime
    with pytest.raises(DoubleRuleViolation, match="cudaDeviceReset while TensorRT objects"):
        rt.cudaDeviceReset()
    del slot, runtime
    assert rt.cudaDeviceReset() == (rt.cudaError_t.cudaSuccess,)
    assert device.leaks() == {}  # the reset destroyed every allocation and stream
    assert rt.cudaMalloc(16)[0] == rt.cudaError_t.cudaSuccess


def test_a_sticky_error_that_a_reset_does_not_clear():
    device = FakeDevice(reset_recovers=False)
    rt = device.cudart
    rt.cudaSetDevice(0)
    device.inject_fault(rt.cudaError_t.cudaErrorLaunchFailure)
    slot = Slot(device)
    slot.run(*_inputs(), sync=False)
    assert rt.cudaStreamSynchronize(slot.stream)[0] == rt.cudaError_t.cudaErrorLaunchFailure
    del slot
    assert rt.cudaDeviceReset()[0] == rt.cudaError_t.cudaSuccess
    assert rt.cudaMalloc(16)[0] == rt.cudaError_t.cudaErrorLaunchFailure


def test_a_driver_too_old_for_the_runtime():
    device = FakeDevice(driver_cuda_version=12040, runtime_cuda_version=13000)
    rt = device.cudart
    assert rt.cudaGetDeviceCount() == (rt.cudaError_t.cudaErrorInsufficientDriver, None)
    assert rt.cudaDriverGetVersion() == (rt.cudaError_t.cudaSuccess, 12040)
    assert rt.cudaRuntimeGetVersion() == (rt.cudaError_t.cudaSuccess, 13000)
    assert FakeDevice(driver_cuda_version=13020, runtime_cuda_version=13000).cudart.cudaGetDeviceCount()[0] == 0
    assert FakeDevice(driver_cuda_version=12020, runtime_cuda_version=12090).cudart.cudaGetDeviceCount()[0] == 0


def test_the_compute_capability_is_a_device_property(device):
    err, props = device.cudart.cudaGetDeviceProperties(0)
    assert (props.major, props.minor) == device.compute_capability == (9, 0)
