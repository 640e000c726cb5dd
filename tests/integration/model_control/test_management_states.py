"""Through a real server: what RepositoryIndex, ModelReady and the management GetModel report while a model is
loading, reconfiguring and unloading, and how RegisterModel / RepositoryModelLoad treat slot counts against a
model's capacity under --parallel-jobs.

Every server uses fixture-backend models written into tmp_path with the test's own FixtureControls, so each
transition is held at a fixture gate (load, clone, execute, teardown) and the counters say what was built.
Waits re-check a state predicate; nothing is ordered by sleeping.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator

import numpy as np
from google.protobuf import json_format

from engine.testing.fixture import FixtureBackend, FixtureControls
from generated import grpc_service_pb2 as pb
from service.testing import RunningServer, serve
from tests.contract.harness import write_fixture_model

from .._support import CALL_TIMEOUT, client_error, stub
from .._support import write_fixture_model as write_declared_model

WAIT = 10.0
INPUT = {"INPUT0": np.arange(4, dtype=np.float32)}


def _wait(predicate, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)  # ordering-free: re-checks a state predicate


class _Call:
    """A blocking client call on its own thread; `result()` returns its value or raises its exception."""

    def __init__(self, target) -> None:
        self._value = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(target,), daemon=True)
        self._thread.start()

    def _run(self, target) -> None:
        try:
            self._value = target()
        except BaseException as error:  # handed to the test by result()
            self._error = error

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = WAIT):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the call did not finish within {timeout} s"
        if self._error is not None:
            raise self._error
        return self._value


@contextlib.contextmanager
def _server(repository, controls: FixtureControls, **options) -> Iterator[RunningServer]:
    """A server with management over the test's fixture models. Every gate is released before it stops, so a
    failing test ends promptly instead of leaving a load or teardown held through the shutdown."""
    with serve(repository, backends={"fixture": FixtureBackend(controls)}, allow_management=True, **options) as running:
        try:
            yield running
        finally:
            controls.release_all()


def _index_entry(running, model: str) -> pb.RepositoryIndexResponse.ModelIndex:
    """The model's RepositoryIndex entry, through the raw generated stub (what stock Triton clients call)."""
    response = stub(running).RepositoryIndex(pb.RepositoryIndexRequest(), timeout=CALL_TIMEOUT)
    (entry,) = [m for m in response.models if m.name == model]
    return entry


def _ready_index_names(running) -> list[str]:
    response = stub(running).RepositoryIndex(pb.RepositoryIndexRequest(ready=True), timeout=CALL_TIMEOUT)
    return [m.name for m in response.models]


def _model_ready(running, model: str) -> bool:
    return stub(running).ModelReady(pb.ModelReadyRequest(name=model), timeout=CALL_TIMEOUT).ready


def _observe(running, model: str):
    """(RepositoryIndex state, its reason, ModelReady, GetModel status) of `model`, read one after another."""
    entry = _index_entry(running, model)
    return entry.state, entry.reason, _model_ready(running, model), running.management.get(model)


def _check_output(outputs) -> None:
    np.testing.assert_array_equal(outputs["OUTPUT0"], INPUT["INPUT0"])


# ---- 1. the three views agree in every transitional state ---------------------------------------------------


def test_index_model_ready_and_get_model_agree_while_a_model_is_loading(tmp_path):
    # While the first request's load is held at the fixture's load gate:
    #   RepositoryIndex  state "LOADING", reason ""  (a reason is given only for UNAVAILABLE models)
    #   ModelReady       false
    #   GetModel         state LOADING, loaded false, no max_parallel_slots / memory_bytes, active_slots 1
    #                    (the initializer's lease), slots = the --parallel-jobs default
    # and the ready-only index leaves the model out.
    write_fixture_model(tmp_path, "m", {"capacity": 4})
    controls = FixtureControls()
    load = controls.gate("m", "load").hold()
    with _server(tmp_path, controls, parallel_jobs=2, load_at_startup=False) as running:
        state, reason, ready, status = _observe(running, "m")
        assert (state, reason, ready) == ("UNAVAILABLE", "unloaded", False)  # registered, not loaded yet
        assert (status.state, status.loaded) == ("UNLOADED", False)

        first = _Call(lambda: running.client.infer("m", INPUT, timeout=30))
        load.wait_blocked(1)
        state, reason, ready, status = _observe(running, "m")
        assert (state, reason) == ("LOADING", "")
        assert ready is False
        assert (status.state, status.loaded, status.max_parallel_slots, status.memory_bytes) == (
            "LOADING",
            False,
            None,
            None,
        )
        assert (status.slots, status.active_slots, status.queued_requests) == (2, 1, 0)
        assert "m" not in _ready_index_names(running)

        load.release()
        _check_output(first.result())
        state, reason, ready, status = _observe(running, "m")
        assert (state, reason, ready) == ("READY", "", True)
        assert (status.state, status.loaded, status.max_parallel_slots) == ("READY", True, 4)
        assert _ready_index_names(running) == ["m"]
        assert controls.count("m", "load") == 1


def test_index_model_ready_and_get_model_agree_while_a_model_is_reconfiguring(tmp_path):
    # RegisterModel with a changed slot count (2 -> 3) while a request holds the model:
    #  * while the reconfiguration waits behind the request, nothing has changed yet: index "READY" (reason ""),
    #    ModelReady true, GetModel READY with the old slot count and the manager counted in queued_requests;
    #  * once it holds the model and grows the pool (held at the clone gate): index "LOADING" (RepositoryIndex
    #    has no reconfiguring state; _INDEX_STATE maps it to LOADING), reason "", ModelReady false, GetModel
    #    RECONFIGURING, still loaded with the old pool (slots 2, max_parallel_slots 4), nothing active or queued.
    write_fixture_model(tmp_path, "m", {"capacity": 4})
    controls = FixtureControls()
    execute = controls.gate("m", "execute").hold()
    with _server(tmp_path, controls, parallel_jobs=2) as running:
        busy = _Call(lambda: running.client.infer("m", INPUT, timeout=30))
        execute.wait_blocked(1)
        reconfigure = _Call(lambda: running.management.register("m", slots=3, timeout=30))
        _wait(lambda: running.management.get("m").queued_requests == 1, "the reconfiguration queued")
        state, reason, ready, status = _observe(running, "m")
        assert (state, reason, ready) == ("READY", "", True)
        assert (status.state, status.loaded, status.slots, status.active_slots) == ("READY", True, 2, 1)

        clone = controls.gate("m", "clone").hold()  # the two contexts of the first pool are already built
        execute.release()
        _check_output(busy.result())
        clone.wait_blocked(1)  # the manager holds the model and builds the third context
        state, reason, ready, status = _observe(running, "m")
        assert (state, reason) == ("LOADING", "")
        assert ready is False
        assert (status.state, status.loaded, status.slots, status.max_parallel_slots) == ("RECONFIGURING", True, 2, 4)
        assert (status.active_slots, status.queued_requests) == (0, 0)
        assert not reconfigure.done()

        clone.release()
        final = reconfigure.result()
        assert (final.state, final.loaded, final.slots) == ("READY", True, 3)
        state, reason, ready, status = _observe(running, "m")
        assert (state, reason, ready, status.state, status.slots) == ("READY", "", True, "READY", 3)
        assert controls.count("m", "load") == 1  # resized in place


def test_index_model_ready_and_get_model_agree_while_a_model_is_unloading(tmp_path):
    # RepositoryModelUnload while a request executes:
    #  * while the unload waits for the request: index "READY", ModelReady true, GetModel READY and loaded, the
    #    unload counted in queued_requests;
    #  * during the teardown (held at the teardown gate): index "UNLOADING", reason "", ModelReady false,
    #    GetModel UNLOADING with loaded false and no max_parallel_slots / memory_bytes (the model counts as
    #    unloaded from the first step of its retirement);
    #  * afterwards: index "UNAVAILABLE" with reason "unloaded", GetModel UNLOADED.
    write_fixture_model(tmp_path, "m", {"capacity": 2})
    controls = FixtureControls()
    execute = controls.gate("m", "execute").hold()
    with _server(tmp_path, controls, parallel_jobs=2) as running:
        busy = _Call(lambda: running.client.infer("m", INPUT, timeout=30))
        execute.wait_blocked(1)
        unload = _Call(lambda: running.client.unload("m", timeout=30))
        _wait(lambda: running.management.get("m").queued_requests == 1, "the unload queued")
        state, reason, ready, status = _observe(running, "m")
        assert (state, reason, ready) == ("READY", "", True)
        assert (status.state, status.loaded, status.active_slots) == ("READY", True, 1)

        teardown = controls.gate("m", "teardown").hold()
        execute.release()
        _check_output(busy.result())
        teardown.wait_blocked(1)
        state, reason, ready, status = _observe(running, "m")
        assert (state, reason) == ("UNLOADING", "")
        assert ready is False
        assert (status.state, status.loaded, status.max_parallel_slots, status.memory_bytes) == (
            "UNLOADING",
            False,
            None,
            None,
        )
        assert "m" not in _ready_index_names(running)
        assert not unload.done()

        teardown.release()
        unload.result()
        state, reason, ready, status = _observe(running, "m")
        assert (state, reason, ready) == ("UNAVAILABLE", "unloaded", False)
        assert (status.state, status.loaded) == ("UNLOADED", False)
        assert controls.live_engines("m") == 0 and controls.live_contexts("m") == 0


# ---- 2. two registrations of a brand-new id -----------------------------------------------------------------


def test_two_register_calls_for_a_new_id_register_and_load_it_once(tmp_path):
    write_fixture_model(tmp_path, "existing")
    controls = FixtureControls()
    load = controls.gate("fresh", "load").hold()
    with _server(tmp_path, controls, parallel_jobs=2) as running:
        write_fixture_model(tmp_path, "fresh", {"capacity": 4})  # appears after startup: a brand-new id
        first = _Call(lambda: running.management.register("fresh", timeout=30))
        load.wait_blocked(1)  # the first call published the entry and is loading it
        assert _index_entry(running, "fresh").state == "LOADING"
        second = _Call(lambda: running.management.register("fresh", timeout=30))
        _wait(lambda: running.management.get("fresh").queued_requests == 1, "the second registration queued")
        assert not first.done() and not second.done()

        load.release()
        statuses = [first.result(), second.result()]
        for status in statuses:
            assert (status.model_id, status.state, status.loaded) == ("fresh", "READY", True)
            assert (status.slots, status.max_parallel_slots) == (2, 4)
        assert controls.count("fresh", "load") == 1  # the second call found it loaded: nothing was rebuilt
        assert controls.live_engines("fresh") == 1 and controls.live_contexts("fresh") == 2
        assert [s.model_id for s in running.management.list()].count("fresh") == 1
        assert [m.name for m in running.client.repository_index()].count("fresh") == 1
        assert running.server.runtime.events.counts()[("registered", "fresh")] == 1
        _check_output(running.client.infer("fresh", INPUT, timeout=30))


# ---- 3. a new id with more slots than its capacity ----------------------------------------------------------


def test_register_new_id_with_slots_above_capacity_is_refused_and_leaves_it_registered_unloaded(tmp_path):
    # The capacity is only known from a loaded engine, so the server loads the primary once to learn it, then
    # frees it: no engine stays loaded and no context is ever built. The id stays registered (the entry was
    # published before the load) and UNLOADED with the refused explicit count, which every later load retries.
    write_fixture_model(tmp_path, "existing")
    controls = FixtureControls()
    with _server(tmp_path, controls, parallel_jobs=2) as running:
        write_fixture_model(tmp_path, "fresh", {"capacity": 2})
        error = client_error(running.management.register, "fresh", slots=3, timeout=30)
        assert (error.code, error.reason) == ("INVALID_ARGUMENT", "invalid_request_error")
        assert "supports at most 2 slots" in error.message and "3 were requested" in error.message

        assert controls.count("fresh", "load") == 1 and controls.count("fresh", "close_engine") == 1
        assert controls.live_engines("fresh") == 0 and controls.count("fresh", "clone") == 0
        status = running.management.get("fresh")
        assert (status.state, status.loaded, status.slots) == ("UNLOADED", False, 3)
        assert status.max_parallel_slots is None and status.memory_bytes is None
        assert "supports at most 2 slots" in status.last_error
        entry = _index_entry(running, "fresh")
        assert entry.state == "UNAVAILABLE" and "supports at most 2 slots" in entry.reason
        assert _model_ready(running, "fresh") is False

        # A request retries the load with the registered count and fails the same way.
        refused = client_error(running.client.infer, "fresh", INPUT, timeout=30)
        assert (refused.code, refused.reason) == ("FAILED_PRECONDITION", "load_failed")
        assert "supports at most 2 slots" in refused.message
        assert controls.live_engines("fresh") == 0 and controls.count("fresh", "clone") == 0
        # Registering it again within its capacity fixes it.
        fixed = running.management.register("fresh", slots=2, timeout=30)
        assert (fixed.state, fixed.loaded, fixed.slots, fixed.max_parallel_slots) == ("READY", True, 2, 2)
        _check_output(running.client.infer("fresh", INPUT, timeout=30))


# ---- 4. RepositoryModelLoad with an instance_group count override -------------------------------------------


def _held_requests_run_at_once(running, controls, model: str, slots: int) -> None:
    """`slots` requests execute at the same time and one more queues: the pool really has `slots` slots."""
    execute = controls.gate(model, "execute").hold()
    before = execute.arrivals
    calls = [_Call(lambda: running.client.infer(model, INPUT, timeout=30)) for _ in range(slots + 1)]
    _wait(
        lambda: execute.blocked == slots and running.management.get(model).queued_requests == 1,
        f"{slots} requests executing and one queued",
    )
    assert execute.arrivals - before == slots
    execute.release()
    for call in calls:
        _check_output(call.result())


def test_repository_load_count_override_resizes_in_place_within_capacity_and_refuses_above(tmp_path):
    write_declared_model(
        tmp_path,
        "m",
        inputs=[("INPUT0", "FP32", [-1])],
        outputs=[("OUTPUT0", "FP32", [-1])],
        extra='parameters { key: "capacity" value { string_value: "3" } }\n',
    )
    controls = FixtureControls()
    with _server(tmp_path, controls, parallel_jobs=2) as running:
        client = running.client
        assert running.management.get("m").slots == 2
        # A stock Triton client: read the model's configuration, change the instance count, load with it.
        config = json_format.MessageToDict(client.model_config("m"), preserving_proto_field_name=True)
        assert config["instance_group"][0]["count"] == 2
        config["instance_group"] = [{"count": 3}]
        client.load("m", json.dumps(config), timeout=30)
        status = running.management.get("m")
        assert (status.state, status.slots, status.max_parallel_slots) == ("READY", 3, 3)
        assert controls.count("m", "load") == 1  # in place: the engine was not loaded again
        assert controls.live_contexts("m") == 3
        assert client.model_config("m").instance_group[0].count == 3
        _held_requests_run_at_once(running, controls, "m", 3)

        config["instance_group"] = [{"count": 4}]
        error = client_error(client.load, "m", json.dumps(config), timeout=30)
        assert (error.code, error.reason) == ("INVALID_ARGUMENT", "invalid_request_error")
        assert "failed to load 'm'" in error.message and "supports at most 3 slots" in error.message
        status = running.management.get("m")
        assert (status.state, status.loaded, status.slots, status.max_parallel_slots) == ("READY", True, 3, 3)
        assert status.last_error == ""  # refused before commit: nothing failed on the serving model
        assert controls.count("m", "load") == 1 and controls.live_contexts("m") == 3
        assert client.model_config("m").instance_group[0].count == 3
        assert client.model_ready("m") is True
        _held_requests_run_at_once(running, controls, "m", 3)


# ---- 5. the --parallel-jobs default lowered to a smaller capacity -------------------------------------------


def test_default_slot_count_above_capacity_is_lowered_and_requests_run(tmp_path):
    # --parallel-jobs 4 for a model whose engine admits 2 slots. The load succeeds (a default count is lowered,
    # never refused) and 2 requests run at once while a third queues. The status calls report the lowered count:
    #   GetModel  slots 2, max_parallel_slots 2
    #   ModelConfig instance_group[0].count 2
    write_fixture_model(tmp_path, "m", {"capacity": 2})
    controls = FixtureControls()
    with _server(tmp_path, controls, parallel_jobs=4) as running:
        status = running.management.get("m")
        assert (status.state, status.loaded, status.last_error) == ("READY", True, "")
        assert (status.slots, status.max_parallel_slots) == (2, 2)
        assert running.client.model_config("m").instance_group[0].count == 2
        assert controls.live_contexts("m") == 2  # only two contexts were built
        _held_requests_run_at_once(running, controls, "m", 2)
        assert running.management.get("m").active_slots == 0
        _check_output(running.client.infer("m", INPUT, timeout=30))
