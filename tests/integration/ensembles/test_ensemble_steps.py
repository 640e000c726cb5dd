"""An ensemble and the life of its step models, on a real server: a step model that failed (its load, or its
device under a request) makes the ensemble unavailable with the step named, and the step's next load brings it
back; an evicted step changes nothing (its next call loads it); in explicit mode RepositoryModelLoad of an
ensemble loads its steps and RepositoryModelUnload of it leaves them loaded (Triton's behaviour). Also: a
queued step times out at the ensemble request's deadline, the steps of concurrent ensemble requests batch
together, and an ensemble's outputs go to system shared memory."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from client import ClientError
from engine.errors import DeviceFailedError, ModelLoadError
from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc

from .._shm import ShmObject, in_region, register
from .._support import CALL_TIMEOUT, write_fixture_model
from .test_ensembles import F, fixture_repository, start_fixture_server, wait_until, write_diamond, write_ensemble

JOIN_R = "step 3 (model 'join_r')"


def index_of(running) -> dict:
    return {m.name: m for m in running.client.repository_index()}


def one(running) -> dict:
    return running.client.infer("diamond", {"X": np.ones(2, "f")}, timeout=60)


def test_a_step_that_failed_to_load_makes_the_ensemble_unavailable_naming_it_and_its_load_brings_it_back(
    tmp_path, controls
):
    write_diamond(tmp_path)
    controls.gate("join_r", "load").fail_next(ModelLoadError("no weights for join_r"))
    with start_fixture_server(tmp_path, controls, allow_management=True) as running:
        entry = index_of(running)["diamond"]
        assert entry.state == "UNAVAILABLE"
        assert f"ensemble 'diamond': {JOIN_R} failed: " in entry.reason and "no weights for join_r" in entry.reason
        assert not running.client.model_ready("diamond")
        # a request does not get past the failed step (lazy mode: the ensemble's load refuses it, naming it)
        with pytest.raises(ClientError) as refused:
            one(running)
        assert refused.value.code == "FAILED_PRECONDITION"  # as for any model whose load failed (load_failed)
        assert refused.value.reason == "load_failed" and JOIN_R in refused.value.message
        assert controls.gate("left", "execute").arrivals == 0
        running.client.load("join_r")  # loads the ensemble again before it answers
        assert running.client.model_ready("diamond") and index_of(running)["diamond"].state == "READY"
        np.testing.assert_array_equal(one(running)["R"], [1, 1])


def test_a_failed_step_loaded_again_by_its_own_request_brings_the_ensemble_back(tmp_path, controls):
    write_diamond(tmp_path)
    controls.gate("join_r", "load").fail_next(ModelLoadError("no weights for join_r"))
    with start_fixture_server(tmp_path, controls) as running:
        assert not running.client.model_ready("diamond")
        # lazy mode: a direct request loads the step; the ensemble follows without anyone loading it
        running.client.infer("join_r", {"INPUT0": np.ones(1, "f")})
        wait_until(lambda: running.client.model_ready("diamond"))
        np.testing.assert_array_equal(one(running)["L"], [1, 1])


def test_a_step_whose_device_failed_makes_the_ensemble_unavailable_until_the_step_loads_again(tmp_path, controls):
    write_diamond(tmp_path)
    options = {"model_control_mode": "explicit", "load_models": ("*",), "allow_management": True}
    with start_fixture_server(tmp_path, controls, **options) as running:
        np.testing.assert_array_equal(one(running)["R"], [1, 1])
        controls.gate("join_r", "execute").fail_next(DeviceFailedError("device lost under join_r"))
        with pytest.raises(ClientError) as failed:
            one(running)
        assert failed.value.code == "UNAVAILABLE" and failed.value.reason == "device_failed"
        assert JOIN_R in failed.value.message
        # the step model's device failed, not the ensemble's (it has none): only the step is taken out of service
        counts = running.server.runtime.events.counts()
        assert counts[("device_failed", "join_r")] == 1 and ("device_failed", "diamond") not in counts
        wait_until(lambda: index_of(running)["diamond"].state == "UNAVAILABLE")
        entry = index_of(running)["diamond"]
        assert entry.reason == f"ensemble 'diamond': {JOIN_R} failed: device lost under join_r"
        assert not running.client.model_ready("diamond")
        assert index_of(running)["left"].state == "READY"  # the other steps are left as they are
        running.client.load("join_r")
        assert running.client.model_ready("diamond")
        np.testing.assert_array_equal(one(running)["R"], [1, 1])


def test_two_callers_loading_the_ensemble_again_after_its_step_leave_it_loaded_once_and_ready(tmp_path, controls):
    """RepositoryModelLoad of a step and the step watcher (woken by the step's "loaded" event) both load again
    the ensemble unloaded with the step. Whichever comes second must find it loaded and leave it so; reloading it
    (RECONFIGURING) made ModelReady false right after the client's load had answered (seen under make stress).
    Both are held behind a manager lease the test takes on the ensemble, so they queue in some order."""
    write_diamond(tmp_path)
    options = {"model_control_mode": "explicit", "load_models": ("*",), "allow_management": True}
    with start_fixture_server(tmp_path, controls, **options) as running:
        controls.gate("join_r", "execute").fail_next(DeviceFailedError("device lost under join_r"))
        with pytest.raises(ClientError):
            one(running)
        wait_until(lambda: index_of(running)["diamond"].state == "UNAVAILABLE")
        diamond = running.server.registry.get("diamond")
        events = running.server.runtime.events
        before = events.counts()
        held = diamond.exclusive(None)
        load = threading.Thread(target=lambda: running.client.load("join_r"))
        try:
            load.start()
            wait_until(lambda: diamond.status().queued_managers == 2)  # the client's load and the watcher's
        finally:
            held.release()
        load.join(timeout=60)
        assert not load.is_alive()
        assert running.client.model_ready("diamond")
        wait_until(lambda: diamond.status().queued_managers == 0 and not diamond.status().manager_active)
        after = events.counts()
        assert after.get(("load_started", "diamond"), 0) - before.get(("load_started", "diamond"), 0) == 1
        assert after.get(("reconfigured", "diamond"), 0) == before.get(("reconfigured", "diamond"), 0)
        assert running.client.model_ready("diamond")
        np.testing.assert_array_equal(one(running)["R"], [1, 1])


def test_an_evicted_step_leaves_the_ensemble_ready_and_its_next_call_loads_it(tmp_path, controls):
    fixture_repository(tmp_path, "wide", "other")
    write_ensemble(
        tmp_path, "through", [("X", F, [-1])], [("Y", F, [-1])], [("wide", {"INPUT0": "X"}, {"OUTPUT0": "Y"})]
    )
    # An ensemble is not counted (it holds no engine): room for one model is room for its one step.
    with start_fixture_server(tmp_path, controls, max_resident_models=1, load_at_startup=False) as running:
        running.client.infer("through", {"X": np.ones(2, "f")})  # loads the ensemble, then its step
        running.client.infer("other", {"INPUT0": np.ones(1, "f")})  # room for it: the least recently used goes
        counts = running.server.runtime.events.counts()
        assert counts.get(("evicted", "wide")) == 1 and ("evicted", "through") not in counts
        assert running.client.model_ready("through")
        assert index_of(running)["through"].state == "READY"
        np.testing.assert_array_equal(running.client.infer("through", {"X": np.full(2, 4, "f")})["Y"], [4, 4])
        assert running.server.runtime.events.counts()[("loaded", "wide")] == 2  # its next call loaded it


def test_loading_an_ensemble_in_explicit_mode_loads_its_steps_and_unloading_it_leaves_them(tmp_path, controls):
    write_diamond(tmp_path)
    with start_fixture_server(tmp_path, controls, model_control_mode="explicit", allow_management=True) as running:
        assert {m.state for m in running.client.repository_index()} == {"UNAVAILABLE"}
        running.client.load("diamond")
        assert {name: m.state for name, m in index_of(running).items()} == dict.fromkeys(
            ("diamond", "left", "right", "join_l", "join_r"), "READY"
        )
        np.testing.assert_array_equal(one(running)["L"], [1, 1])
        running.client.unload("diamond")
        states = {name: m.state for name, m in index_of(running).items()}
        assert states == {"diamond": "UNAVAILABLE", **dict.fromkeys(("left", "right", "join_l", "join_r"), "READY")}


def test_loading_an_ensemble_whose_step_fails_to_load_is_refused_naming_the_step(tmp_path, controls):
    write_diamond(tmp_path)
    controls.gate("join_r", "load").fail_next(ModelLoadError("no weights for join_r"))
    with start_fixture_server(tmp_path, controls, model_control_mode="explicit", allow_management=True) as running:
        with pytest.raises(ClientError) as refused:
            running.client.load("diamond")
        assert refused.value.message.startswith(  # Triton's words, then the step
            f"load failed for model 'diamond': version 1 is at UNAVAILABLE state: ensemble 'diamond': {JOIN_R} failed: "
        ), refused.value.message
        index = index_of(running)
        assert index["diamond"].state == "UNAVAILABLE" and JOIN_R in index["diamond"].reason
        assert index["left"].state == "READY"  # the steps that loaded stay loaded
        running.client.load("diamond")  # tries the failed step again: it loads now
        assert running.client.model_ready("diamond")


def test_a_queued_step_times_out_at_the_ensemble_requests_deadline_and_its_run_is_cancelled(tmp_path, controls):
    # 'left' has one slot (no --parallel-jobs): a first ensemble request holds it at execute; the second
    # request's left step queues behind it and meets the second request's deadline there.
    write_diamond(tmp_path)
    with start_fixture_server(tmp_path, controls) as running:
        left = controls.gate("left", "execute").hold()
        first: dict = {}
        holder = threading.Thread(target=lambda: first.update(one(running)))
        holder.start()
        left.wait_arrivals(1, timeout=30)
        started = time.monotonic()
        with pytest.raises(ClientError) as late:
            running.client.infer("diamond", {"X": np.ones(2, "f")}, timeout=1.0)
        assert late.value.code == "DEADLINE_EXCEEDED"
        assert time.monotonic() - started < 20  # bounded by the deadline, not by the held step
        assert left.arrivals == 1  # the queued step never reached its run

        def counted() -> bool:
            stats = {s.name: s for s in running.client.statistics()}
            return stats["diamond"].inference_stats.fail.count == 1 and stats["left"].inference_stats.fail.count == 1

        wait_until(counted)  # the queued step ended as a failure of its model, with the ensemble's
        assert running.server.registry.get("left").status().queued_requests == 0  # it left the queue
        left.release()
        holder.join(timeout=30)
        np.testing.assert_array_equal(first["L"], [1, 1])


def write_batching_step(root) -> None:
    write_fixture_model(
        root,
        "batched",
        inputs=[("INPUT0", "FP32", [-1])],
        outputs=[("OUTPUT0", "FP32", [-1])],
        max_batch_size=8,
        extra="dynamic_batching { max_queue_delay_microseconds: 100000 }\n",
    )
    write_ensemble(
        root,
        "via_batch",
        [("X", F, [-1])],
        [("Y", F, [-1])],
        [("batched", {"INPUT0": "X"}, {"OUTPUT0": "Y"})],
        max_batch_size=8,
    )


def test_the_steps_of_concurrent_ensemble_requests_run_as_one_batch(tmp_path, controls):
    # The step model has one slot: while a first ensemble request's step runs (held), three more ensemble requests
    # queue at the step; released, the three run as one batch of three rows.
    write_batching_step(tmp_path)
    with start_fixture_server(tmp_path, controls) as running:
        gate = controls.gate("batched", "execute").hold()
        results: dict = {}

        def call(value: int) -> None:
            results[value] = running.client.infer("via_batch", {"X": np.full((1, 2), value, "f")}, timeout=60)["Y"]

        first = threading.Thread(target=call, args=(0,))
        first.start()
        gate.wait_arrivals(1, timeout=30)
        others = [threading.Thread(target=call, args=(value,)) for value in (1, 2, 3)]
        for thread in others:
            thread.start()
        step = running.server.registry.get("batched")
        wait_until(lambda: step.status().queued_requests == 3)
        gate.release()
        for thread in [first, *others]:
            thread.join(timeout=60)
        assert sorted(results) == [0, 1, 2, 3]
        for value, answer in results.items():
            np.testing.assert_array_equal(answer, np.full((1, 2), value, "f"))  # each got its own rows back
        assert controls.batches("batched") == [1, 3]
        stats = {s.name: s for s in running.client.statistics()}
        assert (stats["batched"].inference_count, stats["batched"].execution_count) == (4, 2)
        assert stats["via_batch"].inference_count == 4


def test_an_ensembles_outputs_go_to_a_system_shared_memory_region(tmp_path, controls):
    write_diamond(tmp_path)
    x = np.arange(5, dtype=np.float32) - 2
    size = x.nbytes
    target = ShmObject(2 * size)
    try:
        target.write(0, b"\xee" * target.size)
        with start_fixture_server(tmp_path, controls, shared_memory="system") as running:
            stub = pb_grpc.GRPCInferenceServiceStub(running.client.channel)
            register(stub, "out", target.key, target.size, timeout=CALL_TIMEOUT)
            request = pb.ModelInferRequest(model_name="diamond", id="ens")
            request.inputs.add(name="X", datatype="FP32", shape=[5])
            request.raw_input_contents.append(x.tobytes())
            in_region(request.outputs.add(name="L"), "out", size, 0)
            in_region(request.outputs.add(name="R"), "out", size, size)
            response = stub.ModelInfer(request, timeout=CALL_TIMEOUT)
            assert [(t.name, t.datatype, list(t.shape)) for t in response.outputs] == [
                ("L", "FP32", [5]),
                ("R", "FP32", [5]),
            ]
            assert list(response.raw_output_contents) == [b"", b""]  # the bytes are in the region
            np.testing.assert_array_equal(target.array(0, "<f4", (5,)), x)
            np.testing.assert_array_equal(target.array(size, "<f4", (5,)), x)
            stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(), timeout=CALL_TIMEOUT)
    finally:
        target.close()
