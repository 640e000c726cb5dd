"""The TensorRT backend inside the whole server, over real gRPC: the test double (engine/testing/tensorrt_double/)
stands for TensorRT and the CUDA runtime and enforces their rules (one thread per context, one enqueue in flight per
context, no default stream, no buffer reuse while in flight); the `device` fixture fails the test if any rule was
broken. A model directory with `platform: "tensorrt_plan"` (or `backend: "tensorrt"`) and a prebuilt model.plan
is read by the repository like any other.

The double's `before_drain` hook holds a run at cudaStreamSynchronize, that is, while the GPU is still working on
it: the gate below uses it to order events (never sleeps), as the fixture backend's gates do for the contract's
scenarios."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from client import ClientError
from engine.tensorrt import TensorRTBackend, create_backend
from engine.testing.tensorrt_double import FakeDevice
from service.testing import serve

from . import support

MiB = 1 << 20
WEIGHTS = MiB
ACTIVATION = MiB
SLOT_BYTES = ACTIVATION + support.add_sub_io_bytes()
CAPACITY = 4  # the simulated device holds the weights and four slots
WAIT = 20.0


def write_model(
    repository,
    device: FakeDevice,
    *,
    style: str = "platform",
    name: str = "add_sub",
    max_batch_size: int = support.BATCH,
) -> None:
    support.write_add_sub_plan(device, repository, name=name, weights_bytes=WEIGHTS, activation_bytes=ACTIVATION)
    selector = 'platform: "tensorrt_plan"' if style == "platform" else 'backend: "tensorrt"'
    (repository / name / "config.pbtxt").write_text(
        f'name: "{name}"\n{selector}\nmax_batch_size: {max_batch_size}\n'
        'parameters { key: "trt_memory_reserve_bytes" value { string_value: "0" } }\n'
    )


@pytest.fixture
def device():
    """Overrides the package's fixture: room for exactly CAPACITY slots; rules checked at the end."""
    fake = FakeDevice(total_memory=WEIGHTS + CAPACITY * SLOT_BYTES)
    yield fake
    assert fake.violations == [], f"the server broke TensorRT/CUDA rules: {fake.violations}"


@pytest.fixture
def backend(device, tmp_path) -> TensorRTBackend:
    return TensorRTBackend(
        trt_module=device.trt,
        cudart_module=device.cudart,
        cuda_utils_module=device.cuda_utils,
        cache_dir=tmp_path / "plan-cache",
    )


@pytest.fixture
def repository(tmp_path, device):
    root = tmp_path / "models"
    write_model(root, device)
    return root


class DrainGate:
    """Holds every run at cudaStreamSynchronize (the GPU still busy with it) until opened."""

    def __init__(self, device: FakeDevice) -> None:
        self._cond = threading.Condition()
        self._open = False
        self.blocked = 0
        device.hooks.before_drain = self._hold

    def _hold(self, stream) -> None:
        with self._cond:
            self.blocked += 1
            self._cond.notify_all()
            assert self._cond.wait_for(lambda: self._open, WAIT), "the gate was never opened"
            self.blocked -= 1

    def wait_blocked(self, count: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.blocked >= count, WAIT), f"{count} run(s) never reached the GPU"

    def open(self) -> None:
        with self._cond:
            self._open = True
            self._cond.notify_all()


class Call:
    """A client call on its own thread; `result()` returns its value or raises its error."""

    def __init__(self, target) -> None:
        self._outcome: list = []
        self._thread = threading.Thread(target=self._run, args=(target,), daemon=True)
        self._thread.start()

    def _run(self, target) -> None:
        try:
            self._outcome.append((True, target()))
        except BaseException as error:  # handed to the test thread by result()
            self._outcome.append((False, error))

    def done(self) -> bool:
        return bool(self._outcome)

    def result(self):
        self._thread.join(WAIT)
        assert self._outcome, "the call did not finish"
        ok, value = self._outcome[0]
        if not ok:
            raise value
        return value


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.002)  # ordering-free: re-checks a state predicate


def infer(running, seed: int, timeout: float = WAIT) -> None:
    """One add_sub request through gRPC (`timeout`: its deadline), its outputs checked against numpy."""
    inputs = support.add_sub_inputs(seed)
    outputs = running.client.infer("add_sub", inputs, timeout=timeout)
    np.testing.assert_array_equal(outputs["OUTPUT0"], inputs["INPUT0"] + inputs["INPUT1"])
    np.testing.assert_array_equal(outputs["OUTPUT1"], inputs["INPUT0"] - inputs["INPUT1"])


# ---- serving ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["platform", "backend"])
def test_a_plan_is_served_over_grpc_with_one_engine_and_a_context_stream_and_buffers_per_slot(
    tmp_path, device, backend, style
):
    root = tmp_path / f"by-{style}"
    write_model(root, device, style=style)
    with serve(root, backends={"tensorrt": backend}, parallel_jobs=2) as running:
        infer(running, 1)
        requests = [support.add_sub_inputs(seed) for seed in (2, 3, 4)]
        answers = list(running.client.stream_infer("add_sub", requests, timeout=WAIT))
        for inputs, outputs in zip(requests, answers, strict=True):
            np.testing.assert_array_equal(outputs["OUTPUT0"], inputs["INPUT0"] + inputs["INPUT1"])
        metadata = running.client.model_metadata("add_sub")
        assert metadata.platform == "tensorrt_plan"
        assert [tensor.name for tensor in metadata.inputs] == ["INPUT0", "INPUT1"]
        status = running.management.get("add_sub")
        assert (status.backend, status.slots, status.max_parallel_slots) == ("tensorrt", 2, CAPACITY)
        assert status.memory_bytes == WEIGHTS + 2 * SLOT_BYTES  # weights once, per-slot memory twice
        stats = device.stats
        assert (stats.deserializations, stats.engines_live, stats.contexts_live, stats.streams_live) == (1, 1, 2, 2)
        assert set(stats.stream_flags) == {device.cudart.cudaStreamNonBlocking}  # never the default stream
        [model_stats] = running.client.statistics("add_sub")
        assert model_stats.inference_stats.success.count == 4
    assert device.leaks() == {}  # shutdown closed every context, stream and buffer, and the engine


def test_two_slots_run_at_once_and_a_third_request_waits_its_turn(repository, device, backend):
    with serve(repository, backends={"tensorrt": backend}, parallel_jobs=2, allow_management=True) as running:
        infer(running, 0)  # loaded
        gate = DrainGate(device)
        first, second = Call(lambda: infer(running, 1)), Call(lambda: infer(running, 2))
        gate.wait_blocked(2)  # both enqueued, on their own contexts and streams
        third = Call(lambda: infer(running, 3))
        wait_until(lambda: running.management.get("add_sub").queued_requests == 1, "the third request queued")
        assert device.stats.enqueues == 3  # the warm-up and the two held runs, not the third
        gate.open()
        for call in (first, second, third):
            call.result()
        status = running.management.get("add_sub")
        assert (status.active_slots, status.queued_requests, device.stats.enqueues) == (0, 0, 4)


def test_a_caller_that_gives_up_while_its_run_is_on_the_gpu_gets_its_slot_back_after_the_drain(
    repository, device, backend
):
    """TensorRT cannot stop an enqueued run: the caller gets its error at once, the result is dropped, and the
    slot returns only when the stream has drained (its buffers are not reused while the GPU may still write)."""
    with serve(repository, backends={"tensorrt": backend}, parallel_jobs=1, allow_management=True) as running:
        infer(running, 0)
        gate = DrainGate(device)
        impatient = Call(lambda: infer(running, 1, timeout=0.5))  # its deadline passes while the GPU holds it
        gate.wait_blocked(1)
        with pytest.raises(ClientError) as caught:
            impatient.result()
        assert caught.value.code == "DEADLINE_EXCEEDED"
        assert running.management.get("add_sub").active_slots == 1  # still draining: the slot is not back yet
        waiting = Call(lambda: infer(running, 2))
        wait_until(lambda: running.management.get("add_sub").queued_requests == 1, "the next request queued")
        gate.open()
        waiting.result()  # it got the slot after the drain, and correct outputs
        wait_until(lambda: running.management.get("add_sub").active_slots == 0, "the slot came back")
        [model_stats] = running.client.statistics("add_sub")
        assert (model_stats.inference_stats.success.count, model_stats.inference_stats.fail.count) == (2, 1)
        assert device.pending_operations() == 0


# ---- management ---------------------------------------------------------------------------------------------------


def test_a_resize_within_capacity_adds_contexts_to_the_same_engine_and_one_beyond_it_is_refused(
    repository, device, backend
):
    with serve(repository, backends={"tensorrt": backend}, parallel_jobs=2, allow_management=True) as running:
        infer(running, 0)
        status = running.management.register("add_sub", slots=3, timeout=WAIT)
        assert (status.slots, status.max_parallel_slots) == (3, CAPACITY)
        assert (device.stats.deserializations, device.stats.contexts_live) == (1, 3)  # same engine, one more slot
        with pytest.raises(ClientError) as caught:
            running.management.register("add_sub", slots=CAPACITY + 1, timeout=WAIT)
        assert caught.value.code == "INVALID_ARGUMENT" and str(CAPACITY) in caught.value.message
        assert device.stats.contexts_live == 3 and running.management.get("add_sub").slots == 3  # nothing changed
        infer(running, 1)


def test_unload_waits_for_the_running_request_then_frees_the_contexts_before_the_engine(repository, device, backend):
    with serve(repository, backends={"tensorrt": backend}, parallel_jobs=2, allow_management=True) as running:
        infer(running, 0)
        gate = DrainGate(device)
        running_request = Call(lambda: infer(running, 1))
        gate.wait_blocked(1)
        unload = Call(lambda: running.management.unload("add_sub", timeout=WAIT))
        wait_until(lambda: running.management.get("add_sub").queued_requests == 1, "the unload queued")
        assert not unload.done() and device.stats.engines_live == 1  # it waits for the run on the GPU
        gate.open()
        running_request.result()
        assert not unload.result().loaded
        assert device.leaks() == {}
        destroyed = [event.split()[0] for event in device.stats.events if event.endswith("destroyed")]
        # Every context (the two slots', and the one the load made to measure a slot's cost) before the engine.
        assert destroyed[-1] == "engine" and destroyed.count("context") == device.stats.contexts_created == 3


def test_out_of_memory_on_a_later_context_fails_the_load_frees_everything_and_the_server_goes_on(
    repository, device, backend
):
    """Another process takes the device memory after the first context was built: the pool is never published,
    what was built is freed (contexts before the engine), and the request gets FAILED_PRECONDITION."""
    load = backend.load

    def load_then_lose_memory(spec):
        model = load(spec)
        create_context = model.create_context

        built = []

        def create_context_then_squeeze():
            context = create_context()
            built.append(context)
            if len(built) == 1:  # the first slot's context: then the memory for the second is gone
                device.consume(device.free_memory - SLOT_BYTES // 2)
            return context

        model.create_context = create_context_then_squeeze
        return model

    backend.load = load_then_lose_memory
    with serve(
        repository, backends={"tensorrt": backend}, parallel_jobs=2, load_at_startup=False, allow_management=True
    ) as running:
        with pytest.raises(ClientError) as caught:
            infer(running, 1)
        assert (caught.value.code, caught.value.reason) == ("FAILED_PRECONDITION", "load_failed")
        status = running.management.get("add_sub")
        assert not status.loaded and "out of GPU memory" in status.last_error
        assert device.leaks() == {} and device.stats.context_failures == 1
        destroyed = [event.split()[0] for event in device.stats.events if event.endswith("destroyed")]
        assert destroyed[-1] == "engine"
        assert running.client.live()


def test_without_a_gpu_a_request_gets_failed_precondition_with_the_fallback_hint(repository):
    no_gpu = create_backend({"double": "true", "double_device_count": "0"})
    with serve(repository, backends={"tensorrt": no_gpu}, load_at_startup=False) as running:
        with pytest.raises(ClientError) as caught:
            infer(running, 1)
        assert (caught.value.code, caught.value.reason) == ("FAILED_PRECONDITION", "load_failed")
        assert "onnxruntime" in caught.value.message  # how to serve the same directory without a GPU
        assert running.client.live()


# ---- what a real GPU adds (issue 15) ---------------------------------------------------------------------------


def test_input_shapes_that_do_not_fit_each_other_are_invalid_argument(tmp_path, device, backend):
    root = tmp_path / "unbatched"
    write_model(root, device, max_batch_size=0)  # [-1, 16] twice: the server cannot tell the rows must match
    with serve(root, backends={"tensorrt": backend}) as running:
        with pytest.raises(ClientError) as caught:
            running.client.infer(
                "add_sub", {"INPUT0": np.zeros((2, 16), np.int32), "INPUT1": np.zeros((3, 16), np.int32)}, timeout=WAIT
            )
        assert (caught.value.code, caught.value.reason) == ("INVALID_ARGUMENT", "invalid_request_error")
        assert "do not fit each other" in caught.value.message and "[3, 16]" in caught.value.message
        assert running.management.get("add_sub").state == "READY"
        infer(running, 1)


def test_a_sticky_cuda_error_retires_the_model_and_the_next_request_rebuilds_it(repository, device, backend, caplog):
    with serve(repository, backends={"tensorrt": backend}, parallel_jobs=2, allow_management=True) as running:
        infer(running, 0)
        device.inject_fault(700)  # cudaErrorIllegalAddress in the next run's kernel
        with caplog.at_level(logging.INFO, logger="service.core.lifecycle"):
            with pytest.raises(ClientError) as caught:
                infer(running, 1)
            assert (caught.value.code, caught.value.reason) == ("UNAVAILABLE", "device_failed")
            assert "cudaErrorIllegalAddress" in caught.value.message
            # The failed request returned after the pool was retired: the model is out of service at once.
            status = running.management.get("add_sub")
            assert (status.loaded, status.state) == (False, "UNLOADED")
            assert "cudaErrorIllegalAddress" in status.last_error
            assert not running.client.model_ready("add_sub")
            events = [r for r in caplog.records if getattr(r, "event", None) == "device_failed"]
            assert len(events) == 1 and events[0].levelname == "ERROR" and events[0].model == "add_sub"
        # The next request loads the model again: the device is reset, the engine rebuilt on a fresh context.
        infer(running, 2)
        status = running.management.get("add_sub")
        assert (status.loaded, status.state, status.last_error) == (True, "READY", "")
        assert (device.stats.resets, device.stats.deserializations) == (1, 2)
    assert device.leaks() == {}
