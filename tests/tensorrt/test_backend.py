"""The TensorRT backend end to end over the test double (engine/testing/tensorrt_double/): loading plans and ONNX
models, metadata, concurrent slots, capacity from measured memory, out-of-memory cleanup, cancellation, the plan
cache, profile-per-slot mode, and the no-GPU path. Every test also fails if the backend broke a TensorRT/CUDA
rule (the `device` fixture checks the double's violations).

Events are ordered with the double's hooks and threading gates, never with sleeps.
"""

from __future__ import annotations

import re
import sys
import threading
import types

import numpy as np
import pytest

from engine import errors
from engine.config.specs import TensorSpec
from engine.interface import CancelToken
from engine.tensorrt import backend as backend_module
from engine.tensorrt import create_backend
from engine.tensorrt.backend import FALLBACK_HINT, TensorRTBackend
from engine.testing.tensorrt_double import FakeDevice

from . import support

MiB = 1 << 20
WEIGHTS = MiB
ACTIVATION = MiB


def make_backend(device: FakeDevice, tmp_path=None, lean: bool = False) -> TensorRTBackend:
    cache = tmp_path / "plan-cache" if tmp_path is not None else None
    return TensorRTBackend(
        trt_module=device.trt_lean if lean else device.trt,
        cudart_module=device.cudart,
        cuda_utils_module=device.cuda_utils,
        cache_dir=cache,
    )


def run(context, inputs, outputs=(), cancel=None):
    return context.execute(inputs, list(outputs), cancel or CancelToken())


def check_add_sub(result, inputs):
    np.testing.assert_array_equal(result["OUTPUT0"], inputs["INPUT0"] + inputs["INPUT1"])
    np.testing.assert_array_equal(result["OUTPUT1"], inputs["INPUT0"] - inputs["INPUT1"])


@pytest.fixture
def add_sub(device, tmp_path):
    """(backend, spec) for a prebuilt add_sub plan."""
    plan = support.write_add_sub_plan(device, tmp_path, weights_bytes=WEIGHTS, activation_bytes=ACTIVATION)
    return make_backend(device, tmp_path), support.spec(plan)


# ----------------------------------------------------------------------------------------------- load, metadata


def test_load_a_prebuilt_plan_and_report_its_metadata(device, add_sub):
    backend, spec = add_sub
    model = backend.load(spec)
    try:
        assert model.metadata.max_batch_size == 8 and model.metadata.platform == "tensorrt_plan"
        assert [(t.name, t.datatype, t.shape) for t in model.metadata.inputs] == [
            ("INPUT0", "INT32", (16,)),
            ("INPUT1", "INT32", (16,)),
        ]
        assert [(t.name, t.datatype, t.shape) for t in model.metadata.outputs] == [
            ("OUTPUT0", "INT32", (16,)),
            ("OUTPUT1", "INT32", (16,)),
        ]
        assert model.interruptible is False and model.plan_source == "prebuilt"
        assert device.stats.deserializations == 1 and device.stats.engines_live == 1
        assert device.stats.contexts_live == 0  # the capacity probe's context is gone again
    finally:
        model.close()
    assert device.leaks() == {}


def test_declared_config_is_checked_against_the_engine(device, add_sub):
    backend, spec = add_sub
    int32 = TensorSpec("INPUT0", "INT32", (16,))
    cases = {
        "is INT32 in the engine, FP32 in the config": dict(inputs=(TensorSpec("INPUT0", "FP32", (16,)),)),
        r"has dims \[16\] in the engine": dict(inputs=(TensorSpec("INPUT0", "INT32", (17,)),)),
        "are not in the config": dict(inputs=(int32,)),
        "is not in the engine": dict(outputs=(TensorSpec("OUTPUT9", "INT32", (16,)),)),
        "needs 1..16": dict(max_batch_size=16),
    }
    for message, overrides in cases.items():
        with pytest.raises(errors.ModelConfigError, match=message):
            backend.load(support.spec(spec.model_file, **overrides))
    assert device.leaks() == {}


def test_engine_types_without_a_kserve_datatype_are_refused(device, tmp_path):
    plan = device.write_plan(
        tmp_path / "fp8" / "1" / "model.plan", inputs=[("X", "FP8", (4,))], outputs=[("Y", "FP8", (4,))]
    )
    with pytest.raises(errors.ModelConfigError, match="FP8, which has no KServe datatype"):
        make_backend(device).load(support.spec(plan, max_batch_size=0))
    assert device.leaks() == {}


@pytest.mark.parametrize(
    "trt_type,datatype",
    [
        ("FLOAT", "FP32"),
        ("HALF", "FP16"),
        ("BF16", "BF16"),
        ("INT8", "INT8"),
        ("INT64", "INT64"),
        ("BOOL", "BOOL"),
        ("UINT8", "UINT8"),
    ],
)
def test_every_served_datatype_round_trips(device, tmp_path, trt_type, datatype):
    from engine.datatypes import numpy_dtype

    plan = device.write_plan(
        tmp_path / "identity" / "1" / "model.plan", inputs=[("X", trt_type, (2, 3))], outputs=[("Y", trt_type, (2, 3))]
    )
    model = make_backend(device).load(support.spec(plan, max_batch_size=0))
    context = model.create_context()
    try:
        assert model.metadata.inputs[0].datatype == datatype
        value = (np.arange(6).reshape(2, 3) % 2).astype(numpy_dtype(datatype))
        result = run(context, {"X": value})["Y"]
        assert result.dtype == value.dtype and np.array_equal(result, value)
    finally:
        context.close()
        model.close()


# --------------------------------------------------------------------------------------------------- execute


def test_execute_returns_requested_outputs_and_checks_requests(device, add_sub):
    backend, spec = add_sub
    model = backend.load(spec)
    context = model.create_context()
    try:
        inputs = support.add_sub_inputs(7, batch=3)
        check_add_sub(run(context, inputs), inputs)
        copies = device.stats.copies
        only = run(context, inputs, ["OUTPUT1"])
        assert list(only) == ["OUTPUT1"] and device.stats.copies == copies + 3  # 2 in, 1 out
        with pytest.raises(errors.InvalidInputError, match=r"shapes from \[1, 16\] to \[8, 16\]"):
            run(context, support.add_sub_inputs(1, batch=9))
        with pytest.raises(errors.InvalidInputError, match="datatype FP32, the model expects INT32"):
            run(context, {"INPUT0": np.zeros((1, 16), np.float32), "INPUT1": inputs["INPUT1"]})
        with pytest.raises(errors.InvalidInputError, match=re.escape("missing required input(s) ['INPUT1']")):
            run(context, {"INPUT0": inputs["INPUT0"]})
        with pytest.raises(errors.InvalidInputError, match="unknown requested output"):
            run(context, inputs, ["OUTPUT7"])
        check_add_sub(run(context, inputs), inputs)  # the slot is still good
    finally:
        context.close()
        model.close()
    assert device.leaks() == {}


def test_slots_run_concurrently_from_their_own_threads(device, add_sub):
    backend, spec = add_sub
    slots = 4
    model = backend.load(spec)
    contexts = [model.create_context() for _ in range(slots)]
    # Every worker waits in cudaStreamSynchronize until all of them got there: all four enqueues are then in
    # flight at the same moment, on four streams, and the double checks no buffer or context is shared.
    all_in_flight = threading.Barrier(slots, timeout=10)
    device.hooks.before_drain = lambda stream: all_in_flight.wait()
    results, failures = {}, []

    def worker(index):
        try:
            inputs = support.add_sub_inputs(100 + index, batch=1 + index)
            results[index] = (inputs, run(contexts[index], inputs))
        except BaseException as error:  # reported to the main thread below
            failures.append(error)

    threads = [threading.Thread(target=worker, args=(i,), name=f"slot-{i}") for i in range(slots)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    device.hooks.before_drain = None
    try:
        assert failures == []
        for inputs, result in results.values():
            check_add_sub(result, inputs)
        assert device.stats.enqueues == slots
        # Each worker thread made the device current itself (the main thread did too, for load/create).
        assert device.stats.set_device_calls >= slots + 1
        assert set(device.stats.stream_flags) == {device.cudart.cudaStreamNonBlocking}
    finally:
        for context in contexts:
            context.close()
        model.close()
    assert device.leaks() == {}


# -------------------------------------------------------------------------------------------------- capacity


def slot_bytes(persistent: int = 0) -> int:
    return ACTIVATION + persistent + support.add_sub_io_bytes()


def test_capacity_comes_from_measured_memory(tmp_path):
    # 1 MiB per context that no API reports: capacity must come from the measured cost, not the API's figure
    # (which would allow 5 here).
    persistent = MiB
    device = FakeDevice(total_memory=WEIGHTS + 3 * slot_bytes(persistent), persistent_bytes=persistent)
    plan = support.write_add_sub_plan(device, tmp_path, weights_bytes=WEIGHTS, activation_bytes=ACTIVATION)
    model = make_backend(device).load(support.spec(plan))
    try:
        assert model.max_parallel_slots == 3
        assert model.capacity.per_slot_bytes == slot_bytes(persistent)
        assert model.memory_bytes(3) == WEIGHTS + 3 * slot_bytes(persistent)
        contexts = [model.create_context() for _ in range(3)]
        for context in contexts:
            context.close()
    finally:
        model.close()
    assert device.leaks() == {} and device.violations == []


@pytest.mark.parametrize("limit,expected", [({"instance_count": 2}, 2), ({"max_parallel_slots": "3"}, 3), ({}, 16)])
def test_capacity_is_capped(tmp_path, limit, expected):
    device = FakeDevice(total_memory=1 << 30)
    plan = support.write_add_sub_plan(device, tmp_path, weights_bytes=WEIGHTS, activation_bytes=ACTIVATION)
    model = make_backend(device).load(support.spec(plan, **limit))
    try:
        assert model.max_parallel_slots == expected
    finally:
        model.close()


def test_default_reserve_keeps_headroom(tmp_path):
    device = FakeDevice(total_memory=WEIGHTS + (256 << 20) + 2 * slot_bytes())
    plan = support.write_add_sub_plan(device, tmp_path, weights_bytes=WEIGHTS, activation_bytes=ACTIVATION)
    model = make_backend(device).load(support.spec(plan, trt_memory_reserve_bytes=""))  # the default: 256 MiB
    try:
        assert model.max_parallel_slots == 2
    finally:
        model.close()


# ------------------------------------------------------------------------------------ out of memory, cleanup


def test_out_of_memory_on_context_k_of_n_frees_everything(tmp_path):
    device = FakeDevice(total_memory=WEIGHTS + 3 * slot_bytes())
    plan = support.write_add_sub_plan(device, tmp_path, weights_bytes=WEIGHTS, activation_bytes=ACTIVATION)
    model = make_backend(device).load(support.spec(plan))
    assert model.max_parallel_slots == 3
    built = [model.create_context(), model.create_context()]
    device.consume(slot_bytes())  # another process takes the third slot's memory
    with pytest.raises(errors.OutOfDeviceMemoryError, match="out of GPU memory"):
        model.create_context()
    assert device.stats.context_failures == 1
    # What the server's pool builder does on failure: contexts first, then the engine.
    for context in reversed(built):
        context.close()
    model.close()
    assert device.leaks() == {} and device.violations == []
    destroyed = [e.split()[0] for e in device.stats.events if e.endswith("destroyed")]
    assert destroyed[-1] == "engine" and destroyed.count("engine") == 1


def test_out_of_memory_for_buffers_frees_the_half_built_slot(tmp_path):
    device = FakeDevice(total_memory=WEIGHTS + 2 * slot_bytes())
    plan = support.write_add_sub_plan(device, tmp_path, weights_bytes=WEIGHTS, activation_bytes=ACTIVATION)
    model = make_backend(device).load(support.spec(plan))
    first = model.create_context()
    device.consume(device.free_memory - ACTIVATION - 100)  # room for the context, not for its buffers
    streams, contexts = device.stats.streams_live, device.stats.contexts_live
    with pytest.raises(errors.OutOfDeviceMemoryError) as caught:
        model.create_context()
    # Freed while the exception (and its traceback) is still alive.
    assert device.stats.streams_live == streams and device.stats.contexts_live == contexts
    del caught
    first.close()
    model.close()
    assert device.leaks() == {} and device.violations == []


def test_load_fails_cleanly_when_not_even_one_slot_fits(tmp_path):
    device = FakeDevice(total_memory=WEIGHTS + ACTIVATION // 2)
    plan = support.write_add_sub_plan(device, tmp_path, weights_bytes=WEIGHTS, activation_bytes=ACTIVATION)
    with pytest.raises(errors.OutOfDeviceMemoryError):
        make_backend(device).load(support.spec(plan))
        # the engine must be freed even though the exception is still held here
    assert device.leaks() == {}


def test_load_fails_cleanly_when_the_weights_do_not_fit(tmp_path):
    device = FakeDevice(total_memory=WEIGHTS // 2)
    plan = support.write_add_sub_plan(device, tmp_path, weights_bytes=WEIGHTS, activation_bytes=ACTIVATION)
    with pytest.raises(errors.OutOfDeviceMemoryError, match="weights"):
        make_backend(device).load(support.spec(plan))
    assert device.leaks() == {}


def test_close_is_idempotent_and_model_close_closes_leftover_contexts(device, add_sub):
    backend, spec = add_sub
    model = backend.load(spec)
    first, second = model.create_context(), model.create_context()
    first.close()
    first.close()
    model.close()  # `second` is still open: closed first, then the engine
    model.close()
    second.close()
    assert device.leaks() == {}
    with pytest.raises(errors.ExecutionError, match="closed"):
        run(second, support.add_sub_inputs(1))
    with pytest.raises(errors.ModelLoadError, match="closed"):
        model.create_context()


# -------------------------------------------------------------------------------------------- cancellation


def test_cancelled_before_enqueue_is_dropped(device, add_sub):
    backend, spec = add_sub
    model = backend.load(spec)
    context = model.create_context()
    try:
        token = CancelToken()
        token.cancel()
        with pytest.raises(errors.ExecutionCancelled, match="before the run was enqueued"):
            run(context, support.add_sub_inputs(1), cancel=token)
        assert device.stats.enqueues == 0 and device.stats.copies == 0
    finally:
        context.close()
        model.close()


def test_cancel_arriving_while_shapes_are_set_still_skips_the_enqueue(device, add_sub):
    backend, spec = add_sub
    model = backend.load(spec)
    context = model.create_context()
    token = CancelToken()
    device.hooks.in_context_call = lambda name: token.cancel() if name == "get_tensor_shape" else None
    try:
        with pytest.raises(errors.ExecutionCancelled, match="before the run was enqueued"):
            run(context, support.add_sub_inputs(1), cancel=token)
        assert device.stats.enqueues == 0 and device.stats.copies == 0
    finally:
        device.hooks.in_context_call = None
        context.close()
        model.close()


def test_cancel_after_enqueue_waits_for_the_stream_then_drops_the_result(device, add_sub):
    backend, spec = add_sub
    model = backend.load(spec)
    context = model.create_context()
    token = CancelToken()
    draining, release = threading.Event(), threading.Event()

    def gate(stream):
        draining.set()
        assert release.wait(10)

    outcome = []

    def worker():
        try:
            outcome.append(run(context, support.add_sub_inputs(3), cancel=token))
        except BaseException as error:
            outcome.append(error)

    device.hooks.before_drain = gate
    thread = threading.Thread(target=worker)
    thread.start()
    assert draining.wait(10)  # enqueued, the GPU "running"
    token.cancel()
    assert device.pending_operations() == 5  # 2 copies in, the run, 2 copies out: nothing can be taken back
    release.set()
    thread.join(10)
    device.hooks.before_drain = None
    try:
        assert len(outcome) == 1 and isinstance(outcome[0], errors.ExecutionCancelled)
        assert device.pending_operations() == 0 and device.stats.enqueues == 1
        inputs = support.add_sub_inputs(4)
        check_add_sub(run(context, inputs), inputs)  # the slot is reusable at once
    finally:
        context.close()
        model.close()
    assert device.leaks() == {}


def test_cancel_right_after_enqueue_skips_the_copy_out(device, add_sub):
    backend, spec = add_sub
    model = backend.load(spec)
    context = model.create_context()
    token = CancelToken()
    device.hooks.after_enqueue = token.cancel
    try:
        with pytest.raises(errors.ExecutionCancelled, match="result was dropped"):
            run(context, support.add_sub_inputs(1), cancel=token)
        assert device.stats.enqueues == 1 and device.stats.copies == 2  # inputs only
        assert device.pending_operations() == 0
    finally:
        device.hooks.after_enqueue = None
        context.close()
        model.close()


# ------------------------------------------------------------------------------------------ no GPU, no modules


@pytest.mark.parametrize(
    "options,reason", [({"driver": False}, "cudaErrorInsufficientDriver"), ({"device_count": 0}, "cudaErrorNoDevice")]
)
def test_no_device_means_backend_unavailable_with_the_fallback_hint(tmp_path, options, reason):
    device = FakeDevice(**options)
    plan = support.write_add_sub_plan(FakeDevice(), tmp_path)
    with pytest.raises(errors.BackendUnavailableError) as caught:
        make_backend(device).load(support.spec(plan))
    message = str(caught.value)
    assert reason in message and 'backend: "onnxruntime"' in message and FALLBACK_HINT in message
    assert device.stats.runtimes_created == 0  # the probe came first: no Runtime without a device
    assert device.violations == []


def _machine_has_a_gpu() -> bool:
    try:
        from cuda.bindings import runtime
    except ImportError:
        return False
    err, count = runtime.cudaGetDeviceCount()
    return int(err) == 0 and bool(count)


@pytest.mark.skipif(_machine_has_a_gpu(), reason="this machine has a CUDA device; the check is for GPU-less ones")
def test_the_real_modules_on_this_gpu_less_machine(tmp_path):
    plan = support.write_add_sub_plan(FakeDevice(), tmp_path)
    with pytest.raises(errors.BackendUnavailableError) as caught:
        TensorRTBackend().load(support.spec(plan))  # whatever of cuda-python / TensorRT is installed
    assert FALLBACK_HINT in str(caught.value)


def test_missing_cuda_python_or_tensorrt(monkeypatch, device, tmp_path):
    plan = support.write_add_sub_plan(device, tmp_path)
    monkeypatch.setattr(backend_module, "import_cudart", lambda: None)
    with pytest.raises(errors.BackendUnavailableError, match=r"cuda-python.*pip install \.\[tensorrt-cu12\]"):
        TensorRTBackend().load(support.spec(plan))
    monkeypatch.setattr(backend_module, "import_tensorrt", lambda: None)
    with pytest.raises(errors.BackendUnavailableError, match=r"tensorrt package.*pip install \.\[tensorrt-cu12\]"):
        TensorRTBackend(cudart_module=device.cudart).load(support.spec(plan))


def test_a_stubs_only_tensorrt_namespace_package_counts_as_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))  # what tensorrt-stubs leaves
    monkeypatch.setitem(sys.modules, "tensorrt_lean", None)  # None in sys.modules: import raises ImportError
    assert backend_module.import_tensorrt() is None


def test_create_backend_can_select_the_double(tmp_path):
    backend = create_backend({"double": "true", "double_memory": str(64 << 20), "cache_dir": str(tmp_path)})
    device = backend.double_device
    plan = support.write_add_sub_plan(device, tmp_path)
    model = backend.load(support.spec(plan))
    context = model.create_context()
    inputs = support.add_sub_inputs(5)
    check_add_sub(run(context, inputs), inputs)
    context.close()
    model.close()
    assert device.leaks() == {} and device.violations == []
    assert type(create_backend()) is TensorRTBackend


# ------------------------------------------------------------------------------------- ONNX, the plan cache


def test_build_from_onnx_then_a_restart_uses_the_cached_plan(device, tmp_path):
    onnx_path = support.write_add_sub_onnx(tmp_path)
    model_spec = support.spec(onnx_path)
    first = make_backend(device, tmp_path).load(model_spec)
    assert first.plan_source == "built" and device.stats.builds == 1
    inputs = support.add_sub_inputs(11, batch=5)
    context = first.create_context()
    check_add_sub(run(context, inputs), inputs)  # computed by ONNX Runtime inside the double
    context.close()
    first.close()
    cache = tmp_path / "plan-cache"
    plans = sorted(p.name for p in cache.glob("*.plan"))
    assert len(plans) == 1 and plans[0].startswith("add_sub-") and list(cache.glob("timing-*.cache"))

    restarted = make_backend(device, tmp_path).load(model_spec)  # a new backend: as after a restart
    assert restarted.plan_source == "cache" and device.stats.builds == 1
    restarted.close()

    # A different profile is a different plan; the timing cache of the first build is reused.
    other = make_backend(device, tmp_path).load(support.spec(onnx_path, trt_opt_batch_size="2"))
    assert other.plan_source == "built" and device.stats.builds == 2 and device.stats.timing_cache_hits == 1
    other.close()
    assert len(list(cache.glob("*.plan"))) == 2

    # Another GPU model gets its own plan (and its own timing cache).
    other_gpu = FakeDevice(name="Other GPU")
    make_backend(other_gpu, tmp_path).load(model_spec).close()
    assert other_gpu.stats.builds == 1 and len(list(cache.glob("timing-*.cache"))) == 2
    assert device.leaks() == {} and other_gpu.leaks() == {}


def test_a_damaged_cached_plan_is_rebuilt(device, tmp_path):
    onnx_path = support.write_add_sub_onnx(tmp_path)
    make_backend(device, tmp_path).load(support.spec(onnx_path)).close()
    (cached,) = (tmp_path / "plan-cache").glob("*.plan")
    cached.write_bytes(b"damaged")
    model = make_backend(device, tmp_path).load(support.spec(onnx_path))
    assert model.plan_source == "built" and device.stats.builds == 2
    assert cached.read_bytes() != b"damaged"
    model.close()


def test_the_runtime_only_package_loads_cached_plans_but_cannot_build(device, tmp_path):
    onnx_path = support.write_add_sub_onnx(tmp_path)
    with pytest.raises(errors.BackendUnavailableError, match="full tensorrt package"):
        make_backend(device, tmp_path, lean=True).load(support.spec(onnx_path))
    make_backend(device, tmp_path).load(support.spec(onnx_path)).close()  # built with the full package
    model = make_backend(device, tmp_path, lean=True).load(support.spec(onnx_path))
    assert model.plan_source == "cache"
    model.close()
    assert device.leaks() == {}


def test_variable_dimensions_need_bounds(device, tmp_path):
    onnx_path = support.write_identity_onnx(tmp_path)
    backend = make_backend(device, tmp_path)
    with pytest.raises(errors.ModelConfigError, match=r'input \'INPUT0\' dimension 0 is variable.*"INPUT0:64"'):
        backend.load(support.spec(onnx_path))
    model = backend.load(support.spec(onnx_path, trt_profile_min="INPUT0:4", trt_profile_max="INPUT0:64"))
    context = model.create_context()
    try:
        assert model.metadata.inputs[0].shape == (-1,)
        assert model.profile_shapes("INPUT0") == ((1, 4), (8, 64), (8, 64))
        value = np.arange(2 * 64, dtype=np.float32).reshape(2, 64)
        np.testing.assert_array_equal(run(context, {"INPUT0": value})["OUTPUT0"], value)
        for bad in ((2, 65), (2, 3)):
            with pytest.raises(errors.InvalidInputError, match=r"from \[1, 4\] to \[8, 64\]"):
                run(context, {"INPUT0": np.zeros(bad, np.float32)})
    finally:
        context.close()
        model.close()
    default_max = backend.load(support.spec(onnx_path, trt_default_dim_max="32"))
    assert default_max.profile_shapes("INPUT0") == ((1, 1), (8, 32), (8, 32))
    default_max.close()
    for parameters, message in (
        ({"trt_profile_max": "INPUT9:4"}, "unknown inputs"),
        ({"trt_profile_max": "INPUT0:4x4"}, "gives input 'INPUT0' 2 dimensions"),
        ({"trt_profile_max": "INPUT0"}, "is not NAME:DxD"),
        ({"trt_profile_min": "INPUT0:8", "trt_profile_max": "INPUT0:4"}, "min <= opt <= max"),
        ({"trt_default_dim_max": "8", "trt_opt_batch_size": "9"}, "exceeds max_batch_size"),
    ):
        with pytest.raises(errors.ModelConfigError, match=message):
            backend.load(support.spec(onnx_path, **parameters))
    assert device.leaks() == {}


# ------------------------------------------------------------------------------------------ profile per slot


def test_profile_per_slot_mode_gives_each_slot_its_own_profile(tmp_path):
    # profile_sharing=False: the double enforces the pre-8.6 rule, so a shared profile would be a violation.
    device = FakeDevice(total_memory=64 << 20, profile_sharing=False)
    onnx_path = support.write_add_sub_onnx(tmp_path)
    model = make_backend(device, tmp_path).load(support.spec(onnx_path, instance_count=3, trt_profile_per_slot="true"))
    try:
        assert model.engine.num_optimization_profiles == 3 and model.max_parallel_slots == 3
        contexts = [model.create_context() for _ in range(3)]
        assert sorted(c.profile for c in contexts) == [0, 1, 2]
        with pytest.raises(errors.ModelLoadError, match="every optimization profile is in use"):
            model.create_context()
        gate = threading.Barrier(3, timeout=10)
        device.hooks.before_drain = lambda stream: gate.wait()
        results, failures = [], []

        def worker(context, seed):
            try:
                inputs = support.add_sub_inputs(seed)
                results.append((inputs, run(context, inputs)))
            except BaseException as error:
                failures.append(error)

        threads = [threading.Thread(target=worker, args=(c, i)) for i, c in enumerate(contexts)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        device.hooks.before_drain = None
        assert failures == [] and len(results) == 3
        for inputs, result in results:
            check_add_sub(result, inputs)
        middle = next(c for c in contexts if c.profile == 1)
        middle.close()
        replacement = model.create_context()
        assert replacement.profile == 1  # a closed slot's profile is handed to the next one
        for context in contexts + [replacement]:
            context.close()
    finally:
        model.close()
    assert device.leaks() == {} and device.violations == []


def test_profile_per_slot_with_a_prebuilt_plan_is_capped_by_its_profiles(device, tmp_path):
    plan = support.write_add_sub_plan(device, tmp_path, profiles=2)
    model = make_backend(device).load(support.spec(plan, trt_profile_per_slot="true"))
    assert model.max_parallel_slots == 2
    model.close()
    shared = make_backend(device).load(support.spec(plan))
    assert shared.max_parallel_slots == 16  # profiles do not limit slots when contexts share profile 0
    shared.close()
