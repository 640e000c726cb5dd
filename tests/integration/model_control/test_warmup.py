"""config.pbtxt `model_warmup` on a real server: the samples run on every slot before the model is ready (held open
with the fixture's gates, ModelReady, RepositoryIndex and GetModel say not ready meanwhile), a failing run fails
the load naming the sample and frees what was built, a shutdown stops a warmup, an ONNX model warms up and serves,
and GetModel and the `loaded` event report load and warmup seconds apart."""

from __future__ import annotations

import logging
import struct
import threading
import time

import numpy as np
import pytest

from engine.testing.fixture import Defect, FixtureBackend
from generated import management_pb2 as mpb
from generated import management_pb2_grpc as mpb_grpc
from service.testing import serve

from .._support import CALL_TIMEOUT, client_error, demo_subset, write_fixture_model

TENSORS = {"inputs": [("X", "FP32", [4])], "outputs": [("Y", "FP32", [4])]}

# Two samples: 1 + 2 runs per slot; batch sizes 2 and 3.
WARMUP = """
instance_group [ { count: 2 } ]
model_warmup [
  { name: "zeros" batch_size: 2 inputs [ { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } ] },
  { name: "noise" batch_size: 3 count: 2
    inputs [ { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } } ] }
]
"""
RUNS_PER_SLOT = 3


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "repository"
    write_fixture_model(root, "warm", **TENSORS, max_batch_size=4, extra=WARMUP)
    write_fixture_model(root, "cold", **TENSORS, max_batch_size=4)
    return root


def get_model(running, name: str) -> mpb.ModelStatus:
    """GetModel over a raw stub (the message, load_times included)."""
    return mpb_grpc.ModelManagementStub(running.client.channel).GetModel(
        mpb.GetModelRequest(model_id=name), timeout=CALL_TIMEOUT
    )


def index_state(running, name: str) -> tuple[str, str]:
    (model,) = [m for m in running.client.repository_index() if m.name == name]
    return model.state, model.reason


def in_thread(function, *args) -> tuple[threading.Thread, list]:
    """Run `function(*args)` on a thread; the list gets its result or its exception."""
    outcome: list = []

    def body() -> None:
        try:
            outcome.append(function(*args))
        except Exception as error:
            outcome.append(error)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, outcome


def serves(running, name: str) -> bool:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    return bool(np.array_equal(running.client.infer(name, {"X": x})["Y"], x))


def test_a_model_is_not_ready_until_its_warmup_ran_on_every_slot(repository, controls, caplog):
    caplog.set_level(logging.INFO, logger="service.core.lifecycle")
    backends = {"fixture": FixtureBackend(controls)}
    with serve(repository, backends=backends, parallel_jobs=2, allow_management=True, load_at_startup=False) as running:
        assert serves(running, "cold")  # loaded before: a warmup is part of a load (--max-concurrent-loads)
        gate = controls.gate("warm", "execute").hold()
        asked = time.perf_counter()
        loader, outcome = in_thread(running.client.load, "warm")
        gate.wait_blocked(1, timeout=30)
        arrived = time.perf_counter()
        # The first warmup run is held: the engine and both slots exist, but nothing is published.
        assert controls.live_contexts("warm") == 2
        assert running.client.model_ready("warm") is False
        assert index_state(running, "warm") == ("LOADING", "")
        assert "warm" not in [m.name for m in running.client.repository_index(ready_only=True)]
        status = get_model(running, "warm")
        assert (status.state, status.loaded, status.HasField("load_times")) == (mpb.MODEL_STATE_LOADING, False, False)
        assert running.client.health() == "SERVING"  # the server serves the others meanwhile
        assert serves(running, "cold")
        released = time.perf_counter()
        gate.release()
        loader.join(CALL_TIMEOUT)
        assert outcome == [None]
        assert running.client.model_ready("warm") is True and index_state(running, "warm") == ("READY", "")
        # Every sample, `count` times, on each of the two slots, with its batch dimension; nothing else ran.
        assert controls.count("warm", "execute") == 2 * RUNS_PER_SLOT
        assert controls.batches("warm") == [2, 3, 3] * 2
        status = get_model(running, "warm")
        times = status.load_times
        assert times.warmup_runs == 2 * RUNS_PER_SLOT
        assert times.warmup_seconds >= released - arrived  # it was held at least that long
        assert 0 < times.load_seconds <= arrived - asked  # the load ended before the warmup began
        # Warmup runs are not requests: the model's statistics count none.
        (statistics,) = running.client.statistics("warm")
        assert statistics.inference_count == 0 and statistics.execution_count == 0
        assert serves(running, "warm") and controls.count("warm", "execute") == 2 * RUNS_PER_SLOT + 1
    (loaded,) = [r for r in caplog.records if getattr(r, "event", None) == "loaded" and r.model == "warm"]
    assert loaded.event_fields["warmup_seconds"] == pytest.approx(times.warmup_seconds, abs=1e-6)
    assert loaded.event_fields["seconds"] == pytest.approx(times.load_seconds, abs=1e-6)
    assert "then warmed up in" in loaded.getMessage()


def test_a_lazy_load_warms_up_before_its_first_request_runs(repository, controls):
    backends = {"fixture": FixtureBackend(controls)}
    with serve(repository, backends=backends, parallel_jobs=2, load_at_startup=False) as running:
        gate = controls.gate("warm", "execute").hold()
        request, outcome = in_thread(serves, running, "warm")
        gate.wait_blocked(1, timeout=30)
        assert running.client.model_ready("warm") is False
        assert controls.count("warm", "execute") == 1  # a warmup run, not the request: it has a batch of 2
        assert controls.batches("warm") == [2]
        gate.release()
        request.join(CALL_TIMEOUT)
        assert outcome == [True]
        assert controls.count("warm", "execute") == 2 * RUNS_PER_SLOT + 1
        assert controls.batches("warm")[-1] == 2 and get_model(running, "warm").load_times.warmup_runs == 6


def test_a_model_without_warmup_reports_no_warmup(repository, controls):
    with serve(repository, backends={"fixture": FixtureBackend(controls)}) as running:
        times = get_model(running, "cold").load_times
        assert (times.warmup_runs, times.warmup_seconds) == (0, 0.0) and times.load_seconds > 0
        assert controls.count("cold", "execute") == 0


def test_a_failing_warmup_run_fails_the_load_naming_the_sample_and_frees_the_pool(repository, controls):
    backends = {"fixture": FixtureBackend(controls)}
    with serve(repository, backends=backends, parallel_jobs=2, allow_management=True, load_at_startup=False) as running:
        controls.gate("warm", "execute").fail_arrival(5, Defect("kernel exploded"))  # slot 1, "noise" run 1
        error = client_error(running.client.load, "warm")
        expected = "warmup sample 'noise' failed on slot 1 (run 1 of 2): kernel exploded"
        assert (error.code, error.reason) == ("FAILED_PRECONDITION", "load_failed"), error
        assert error.message.startswith("load failed for model 'warm': version 1 is at UNAVAILABLE state: "), error
        assert expected in error.message, error
        state, reason = index_state(running, "warm")
        assert state == "UNAVAILABLE" and expected in reason
        assert running.client.model_ready("warm") is False
        assert get_model(running, "warm").last_error.endswith(expected)
        assert (controls.live_contexts("warm"), controls.live_engines("warm")) == (0, 0)
        assert serves(running, "cold")  # nothing else disturbed
        running.client.load("warm")  # the fault is gone: it loads
        assert running.client.model_ready("warm") and serves(running, "warm")


def test_a_sample_that_does_not_fit_the_model_fails_the_load_naming_it(tmp_path, controls):
    # No declared inputs: the repository cannot check the sample; the loaded model (INPUT0) refuses it.
    root = tmp_path / "repository"
    directory = root / "undeclared"
    directory.mkdir(parents=True)
    (directory / "config.pbtxt").write_text(
        'name: "undeclared"\nbackend: "fixture"\nmodel_warmup [ { name: "guess" batch_size: 1 '
        'inputs [ { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } ] } ]\n'
    )
    with serve(root, backends={"fixture": FixtureBackend(controls)}, allow_management=True) as running:
        state, reason = index_state(running, "undeclared")
        assert state == "UNAVAILABLE" and "warmup sample 'guess' does not fit the model: unknown input 'X'" in reason
        error = client_error(running.client.load, "undeclared")
        assert (error.code, error.reason) == ("INVALID_ARGUMENT", "invalid_request_error"), error
        assert "warmup sample 'guess'" in error.message
        assert controls.count("undeclared", "execute") == 0 and controls.live_engines("undeclared") == 0


def test_a_shutdown_stops_a_warmup_held_by_a_first_request(repository, controls):
    backends = {"fixture": FixtureBackend(controls)}
    with serve(repository, backends=backends, parallel_jobs=2, load_at_startup=False) as running:
        controls.gate("warm", "execute").hold()
        request, outcome = in_thread(serves, running, "warm")
        controls.gate("warm", "execute").wait_blocked(1, timeout=30)
        report = running.server.shutdown(drain_seconds=0.0, grace=0.5, margin=10.0)
        request.join(CALL_TIMEOUT)
        assert report.abandoned_calls == 0 and report.abandoned_models == []
        assert outcome and outcome[0].reason == "shutting_down", outcome
        assert controls.count("warm", "execute") == 1  # the held run was interrupted, none followed
        assert (controls.live_contexts("warm"), controls.live_engines("warm")) == (0, 0)


def test_a_shutdown_stops_a_managers_warmup_before_its_next_run(repository, controls):
    backends = {"fixture": FixtureBackend(controls)}
    with serve(repository, backends=backends, parallel_jobs=2, allow_management=True, load_at_startup=False) as running:
        gate = controls.gate("warm", "execute").hold()
        loader, outcome = in_thread(running.client.load, "warm")
        gate.wait_blocked(1, timeout=30)
        stopper, report = in_thread(lambda: running.server.shutdown(drain_seconds=0.0, grace=0.5, margin=10.0))
        entry = running.server.registry.get("warm")
        deadline = time.monotonic() + 30
        while not entry.admission.statistics().closed:  # the grace ran out: shutdown closed admission
            assert time.monotonic() < deadline, "shutdown never closed admission"
            threading.Event().wait(0.01)
        gate.release()  # the held run ends; the warmup must not start another
        stopper.join(CALL_TIMEOUT)
        loader.join(CALL_TIMEOUT)
        assert report[0].abandoned_calls == 0 and report[0].abandoned_models == []
        assert controls.count("warm", "execute") == 1
        assert (controls.live_contexts("warm"), controls.live_engines("warm")) == (0, 0)
        assert "warmup stopped: the server is shutting down" in entry.status().last_error


def test_an_onnx_model_warms_up_from_a_file_and_serves(tmp_path):
    root = demo_subset(tmp_path / "repository", "simple")
    directory = root / "simple"
    (directory / "warmup").mkdir()
    (directory / "warmup" / "first").write_bytes(np.arange(16, dtype="<i4").tobytes())
    with open(directory / "config.pbtxt", "a") as config:
        config.write(
            'model_warmup [ { name: "from_file" batch_size: 8 count: 2 inputs [\n'
            '  { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 16 ] input_data_file: "first" } },\n'
            '  { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [ 16 ] random_data: true } } ] } ]\n'
        )
    with serve(root) as running:
        assert running.client.model_ready("simple")
        times = get_model(running, "simple").load_times
        assert times.warmup_runs == 2 and times.warmup_seconds > 0 and times.load_seconds > 0
        first = np.arange(32, dtype=np.int32).reshape(2, 16)
        second = np.ones((2, 16), dtype=np.int32)
        outputs = running.client.infer("simple", {"INPUT0": first, "INPUT1": second})
        np.testing.assert_array_equal(outputs["OUTPUT0"], first + second)
        (statistics,) = running.client.statistics("simple")
        assert statistics.inference_count == 2  # the request's two rows; warmup is not counted


def test_a_bytes_warmup_file_is_length_prefixed(tmp_path, controls):
    root = tmp_path / "repository"
    directory = write_fixture_model(
        root,
        "strings",
        inputs=[("S", "BYTES", [2])],
        outputs=[("T", "BYTES", [2])],
        extra='model_warmup [ { name: "words" batch_size: 1 inputs [\n'
        '  { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] input_data_file: "words" } } ] } ]\n',
    )
    (directory / "warmup").mkdir()
    (directory / "warmup" / "words").write_bytes(struct.pack("<I", 2) + b"hi" + struct.pack("<I", 0))
    with serve(root, backends={"fixture": FixtureBackend(controls)}) as running:
        assert running.client.model_ready("strings")
        assert controls.count("strings", "execute") == 1


def test_an_in_place_resize_warms_only_the_added_slots_and_a_failure_keeps_the_old_pool(repository, controls):
    backends = {"fixture": FixtureBackend(controls)}
    with serve(repository, backends=backends, parallel_jobs=2, allow_management=True) as running:
        assert controls.count("warm", "execute") == 2 * RUNS_PER_SLOT and controls.count("warm", "load") == 1
        running.management.register("warm", slots=3)  # same engine: resized in place, one slot added
        assert controls.count("warm", "load") == 1  # the engine stayed
        assert controls.count("warm", "execute") == 3 * RUNS_PER_SLOT
        times = get_model(running, "warm").load_times
        assert times.warmup_runs == RUNS_PER_SLOT and times.load_seconds > 0
        controls.gate("warm", "execute").fail_next(Defect("slot 4 is bad"))
        error = client_error(running.management.register, "warm", slots=4)
        assert "warmup sample 'zeros' failed on slot 3 (run 1 of 1): slot 4 is bad" in error.message, error
        status = get_model(running, "warm")
        assert (status.state, status.slots) == (mpb.MODEL_STATE_READY, 3)  # the old pool serves on
        assert controls.live_contexts("warm") == 3 and serves(running, "warm")


def test_a_model_warmed_up_at_startup_keeps_the_server_not_serving_until_it_is_done(repository, controls):
    from grpc_health.v1 import health_pb2

    from service.options import ServerOptions
    from service.server import Server

    settings = ServerOptions(
        model_repository=repository,
        host="127.0.0.1",
        port=0,
        parallel_jobs=2,
        enable_test_backends=True,
        extra_backends={"fixture": FixtureBackend(controls)},
    )
    server = Server(settings)
    gate = controls.gate("warm", "execute").hold()
    starter, outcome = in_thread(server.start)
    try:
        gate.wait_blocked(1, timeout=30)
        # (Check answers a registered service without touching its context.)
        health = server.health.Check(health_pb2.HealthCheckRequest(service=""), None)
        assert (server.state.ready, health.status) == (False, health_pb2.HealthCheckResponse.NOT_SERVING)
        assert server.registry.get("warm").status().state.value == "loading"
        gate.release()
        starter.join(CALL_TIMEOUT)
        assert outcome == [server.port]
        health = server.health.Check(health_pb2.HealthCheckRequest(service=""), None)
        assert (server.state.ready, health.status) == (True, health_pb2.HealthCheckResponse.SERVING)
        assert server.registry.get("warm").is_ready() and controls.count("warm", "execute") == 2 * RUNS_PER_SLOT
    finally:
        gate.release()
        starter.join(CALL_TIMEOUT)
        server.stop(grace=1.0)
