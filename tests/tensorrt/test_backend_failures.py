"""Failures a GPU produces, handled (issue 15, items 1 and 6-8): a driver too old for the installed CUDA, sticky
CUDA errors, a slot that fails half-way in profile-per-slot mode, and pinned host memory (counted, capped, and
its exhaustion reported as such). Over the test double."""

from __future__ import annotations

import numpy as np
import pytest

from engine import errors
from engine.testing.tensorrt_double import FakeDevice

from . import support
from .test_backend import ACTIVATION, WEIGHTS, check_add_sub, make_backend, run

ILLEGAL_ADDRESS = 700


# ------------------------------------------------------------------------------------- driver and CUDA


def test_a_driver_too_old_for_the_installed_cuda_is_named_with_both_versions(tmp_path):
    device = FakeDevice(driver_cuda_version=12040, runtime_cuda_version=13000)
    plan = support.write_add_sub_plan(FakeDevice(), tmp_path)
    with pytest.raises(errors.BackendUnavailableError) as caught:
        make_backend(device).load(support.spec(plan))
    message = str(caught.value)
    assert "CUDA 12.4" in message and "CUDA 13.0" in message and "580" in message
    assert "tensorrt-cu12" in message
    assert device.stats.runtimes_created == 0 and device.violations == []


# ------------------------------------------------------------------------------------------ sticky errors


@pytest.fixture
def add_sub(device, tmp_path):
    plan = support.write_add_sub_plan(device, tmp_path, weights_bytes=WEIGHTS, activation_bytes=ACTIVATION)
    return make_backend(device, tmp_path), plan


def test_a_sticky_error_fails_the_device_until_its_models_are_closed_then_a_load_rebuilds(device, add_sub, tmp_path):
    backend, plan = add_sub
    model = backend.load(support.spec(plan))
    first, second = model.create_context(), model.create_context()
    other_plan = support.write_add_sub_plan(device, tmp_path, name="other")
    other = backend.load(support.spec(other_plan))
    device.inject_fault(ILLEGAL_ADDRESS)
    with pytest.raises(errors.DeviceFailedError, match="cudaErrorIllegalAddress") as caught:
        run(first, support.add_sub_inputs(1))
    assert "GPU 0 failed" in str(caught.value) and "model 'add_sub'" in str(caught.value)
    enqueues = device.stats.enqueues
    # Every slot of every model on that device is refused at once, without touching the GPU.
    for context in (second, first):
        with pytest.raises(errors.DeviceFailedError, match="cudaErrorIllegalAddress"):
            run(context, support.add_sub_inputs(2))
    other_context = None
    with pytest.raises(errors.DeviceFailedError):
        other_context = other.create_context()
    assert device.stats.enqueues == enqueues and other_context is None
    # A new load must wait until nothing holds the old CUDA context: it names what still does.
    with pytest.raises(errors.ModelLoadError, match=r"still loaded: add_sub, other"):
        backend.load(support.spec(plan))
    for context in (first, second):
        context.close()
    model.close()
    with pytest.raises(errors.ModelLoadError, match=r"still loaded: other"):
        backend.load(support.spec(plan))
    other.close()
    rebuilt = backend.load(support.spec(plan))  # the device is reset and the engine built on a fresh context
    context = rebuilt.create_context()
    try:
        assert device.stats.resets == 1 and device.stats.runtimes_created == 2
        inputs = support.add_sub_inputs(3)
        check_add_sub(run(context, inputs), inputs)
    finally:
        context.close()
        rebuilt.close()
    assert device.leaks() == {}


def test_a_device_that_a_reset_does_not_recover_asks_for_a_restart(tmp_path):
    device = FakeDevice(total_memory=64 << 20, reset_recovers=False)
    plan = support.write_add_sub_plan(device, tmp_path)
    backend = make_backend(device, tmp_path)
    model = backend.load(support.spec(plan))
    context = model.create_context()
    device.inject_fault(ILLEGAL_ADDRESS)
    with pytest.raises(errors.DeviceFailedError):
        run(context, support.add_sub_inputs(1))
    context.close()
    model.close()
    with pytest.raises(errors.ModelLoadError, match="restart the server"):
        backend.load(support.spec(plan))
    assert device.violations == []


def test_a_non_sticky_failure_is_an_execution_error_and_the_slot_goes_on(device, add_sub, monkeypatch):
    backend, plan = add_sub
    model = backend.load(support.spec(plan))
    context = model.create_context()
    engine_context = context._context
    monkeypatch.setattr(type(engine_context), "execute_async_v3", lambda self, stream_handle: False)
    with pytest.raises(errors.ExecutionError) as caught:
        run(context, support.add_sub_inputs(1))
    assert not isinstance(caught.value, errors.DeviceFailedError)
    monkeypatch.undo()
    inputs = support.add_sub_inputs(2)
    check_add_sub(run(context, inputs), inputs)
    context.close()
    model.close()


# ------------------------------------------------------------------------------------ profile per slot


def test_a_slot_that_fails_half_way_releases_its_profile_once(tmp_path):
    device = FakeDevice(total_memory=64 << 20, profile_sharing=False)
    plan = support.write_add_sub_plan(device, tmp_path, profiles=3, weights_bytes=WEIGHTS, activation_bytes=ACTIVATION)
    model = make_backend(device).load(support.spec(plan, trt_profile_per_slot="true"))
    # Room for the context's activation memory, not for its buffers: the slot fails after taking a profile.
    squeeze = device.consume(device.free_memory - ACTIVATION - 100)
    with pytest.raises(errors.OutOfDeviceMemoryError):
        model.create_context()
    device.release(squeeze)
    contexts = [model.create_context() for _ in range(3)]
    try:
        assert sorted(c.profile for c in contexts) == [0, 1, 2]
        with pytest.raises(errors.ModelLoadError, match="every optimization profile is in use"):
            model.create_context()
        for context in contexts:  # each on its own profile: the pre-8.6 rule the double enforces holds
            inputs = support.add_sub_inputs(context.profile)
            check_add_sub(run(context, inputs), inputs)
    finally:
        for context in contexts:
            context.close()
        model.close()
    assert device.leaks() == {} and device.violations == []


# ----------------------------------------------------------------------------------- pinned host memory


def test_pinned_host_memory_is_counted_and_caps_the_capacity(device, add_sub):
    backend, plan = add_sub
    host_per_slot = support.add_sub_io_bytes()  # one pinned staging buffer per tensor, at its largest shape
    model = backend.load(support.spec(plan))
    try:
        assert model.capacity.host_bytes_per_slot == host_per_slot
        assert model.host_memory_bytes(3) == 3 * host_per_slot
        assert model.max_parallel_slots == 16
    finally:
        model.close()
    capped = backend.load(support.spec(plan, trt_pinned_memory_limit_bytes=str(2 * host_per_slot + 1)))
    try:
        assert capped.max_parallel_slots == 2 and "pinned host memory=2" in capped.capacity.notes
    finally:
        capped.close()
    assert device.stats.host_allocations_live == 0


def test_running_out_of_pinned_host_memory_is_reported_as_host_memory(tmp_path):
    device = FakeDevice(total_memory=64 << 20, pinned_memory=support.add_sub_io_bytes() // 2)
    plan = support.write_add_sub_plan(device, tmp_path)
    with pytest.raises(errors.OutOfHostMemoryError) as caught:
        make_backend(device).load(support.spec(plan))
    message = str(caught.value)
    assert "pinned host memory" in message and "GPU" not in message and "cudaHostAlloc" in message
    assert device.leaks() == {}


def test_the_data_in_pinned_buffers_is_what_the_request_sent(device, add_sub):
    # A guard for the staging path the pinned-memory accounting changed: every byte of a full batch round-trips.
    backend, plan = add_sub
    model = backend.load(support.spec(plan))
    context = model.create_context()
    try:
        inputs = {n: np.full((8, 16), v, np.int32) for n, v in (("INPUT0", 2**30), ("INPUT1", -(2**30)))}
        check_add_sub(run(context, inputs), inputs)
    finally:
        context.close()
        model.close()
