"""Contract: failure boundaries and recovery (FAIL.01-07, 09, 10; FAIL.08 is with residency)."""

from __future__ import annotations

import pytest

from engine.errors import ExecutionError, ModelConfigError, OutOfDeviceMemoryError
from engine.testing.fixture import Defect
from service.core.errors import ModelLoadFailed, ModelNotFound, UnsupportedSlotCount
from service.core.lifecycle import ModelState

cell = pytest.mark.cell


def _loads(lab, model="a"):
    return lab.controls.count(model, "load")


@cell("FAIL.01")
def test_invalid_replacement_is_rejected_before_any_live_change(lab_factory):
    lab = lab_factory({"a": {"capacity": 4}}, parallel_jobs=2)
    before = lab.status("a")
    loads = _loads(lab)
    with pytest.raises(ModelConfigError):
        lab.register("a", config_json='{"max_batch_size": "many"}').result()
    with pytest.raises(ModelConfigError):
        lab.register("a", backend="no-such-backend").result()
    after = lab.status("a")
    assert after == before  # configuration, pool, count and residency unchanged
    assert _loads(lab) == loads
    assert lab.infer("a", 5.0).result()["OUTPUT0"][0] == 5.0


@cell("FAIL.01")
def test_slot_schema_is_rejected_before_a_new_entry_is_published(lab_factory):
    lab = lab_factory({"a": {}}, parallel_jobs=2)
    from tests.contract.harness import write_fixture_model

    write_fixture_model(lab.root, "fresh")
    for slots in (0, 17):
        with pytest.raises(UnsupportedSlotCount, match="1..16"):
            lab.register("fresh", slots=slots).result()
    with pytest.raises(ModelNotFound):
        lab.registry.get("fresh")
    assert _loads(lab, "fresh") == 0


@cell("FAIL.02")
def test_unsupported_capacity_on_existing_registration_keeps_everything(lab_factory):
    lab = lab_factory({"a": {"capacity": 4}}, parallel_jobs=2)
    before = lab.status("a")
    contexts = lab.controls.live_contexts("a")
    with pytest.raises(UnsupportedSlotCount, match="at most 4") as refused:
        lab.register("a", slots=5).result()
    from service.transport.status_codes import describe

    code, _message, reason = describe(refused.value)
    assert code.name == "INVALID_ARGUMENT" and reason == "invalid_request_error"
    after = lab.status("a")
    assert after == before and after.max_parallel_slots == 4 and after.slots == 2
    assert lab.controls.live_contexts("a") == contexts and _loads(lab) == 1
    assert after.active_slots == 0 and after.queued_requests == 0  # the manager's lease was released
    assert lab.infer("a", 2.0).result()["OUTPUT0"][0] == 2.0
    resized = lab.register("a", slots=4).result()
    assert resized.slots == 4 and resized.loaded
    assert _loads(lab) == 1  # resized over the live engine: weights loaded once
    assert lab.controls.live_contexts("a") == 4


@cell("FAIL.03")
def test_unchanged_engine_reuses_live_capacity_without_a_probe(lab_factory):
    lab = lab_factory({"a": {"capacity": 3}}, parallel_jobs=1)
    assert lab.register("a", slots=3).result().slots == 3
    assert _loads(lab) == 1  # no private primary was built


@cell("FAIL.03")
def test_changed_replacement_probes_capacity_privately_and_keeps_old_state_on_refusal(lab_factory):
    lab = lab_factory({"a": {"capacity": 4}}, parallel_jobs=2)
    before = lab.status("a")
    with pytest.raises(UnsupportedSlotCount, match="at most 2"):
        lab.register("a", slots=3, options={"capacity": "2"}).result()
    assert _loads(lab) == 2  # the probe built a private primary...
    assert lab.controls.live_engines("a") == 1  # ...and freed it; the old engine stays
    assert lab.status("a") == before
    assert lab.infer("a").result()["OUTPUT0"][0] == 1.0
    # a failing probe (the backend itself fails) also leaves the old state
    lab.gate("a", "load").fail_next(Defect)
    with pytest.raises(Defect):
        lab.register("a", slots=3, options={"capacity": "8"}).result()
    assert lab.status("a") == before and lab.controls.live_engines("a") == 1
    # a probe that admits the count is reused as the new primary (no third load for the commit)
    loads = _loads(lab)
    assert lab.register("a", slots=3, options={"capacity": "8"}).result().max_parallel_slots == 8
    assert _loads(lab) == loads + 1 and lab.controls.live_engines("a") == 1


@cell("FAIL.04")
def test_failure_after_commit_leaves_new_config_registered_and_unloaded(lab_factory):
    lab = lab_factory({"a": {"capacity": 4}}, parallel_jobs=1)
    clones = lab.controls.count("a", "clone")
    lab.gate("a", "clone").fail_arrival(clones + 1, OutOfDeviceMemoryError("no memory for the context"))
    with pytest.raises(OutOfDeviceMemoryError):
        lab.register("a", options={"capacity": "2"}).result()  # changed engine: validated, committed, then fails
    status = lab.status("a")
    assert status.state is ModelState.UNLOADED and not status.loaded and status.max_parallel_slots is None
    assert lab.registry.get("a").spec.parameter("capacity") == "2"  # the new configuration stays
    assert lab.controls.live_engines("a") == 0 and lab.controls.live_contexts("a") == 0  # old pool not restored
    assert lab.infer("a").result()["OUTPUT0"][0] == 1.0  # the next request retries with the new config
    assert lab.status("a").max_parallel_slots == 2


@cell("FAIL.01")
def test_replacement_that_does_not_load_is_found_before_the_old_pool_is_touched(lab_factory):
    lab = lab_factory({"a": {"capacity": 4}}, parallel_jobs=1)
    before = lab.status("a")
    lab.gate("a", "load").fail_next(Defect)
    with pytest.raises(Defect):
        lab.register("a", options={"capacity": "2"}).result()  # one slot, changed engine: still validated first
    assert lab.status("a") == before
    assert lab.controls.live_engines("a") == 1 and lab.registry.get("a").spec.parameter("capacity") == "4"
    assert lab.infer("a").result()["OUTPUT0"][0] == 1.0


@cell("FAIL.04")
def test_clone_failure_after_successful_probe_publishes_no_partial_pool(lab_factory):
    lab = lab_factory({"a": {"capacity": 4}}, parallel_jobs=1)
    clones = lab.controls.count("a", "clone")
    lab.gate("a", "clone").fail_arrival(clones + 2)  # the second clone of the new pool fails
    with pytest.raises(Defect):
        lab.register("a", slots=3, options={"capacity": "3"}).result()
    status = lab.status("a")
    assert status.state is ModelState.UNLOADED and status.slots == 3 and status.max_parallel_slots is None
    assert lab.controls.live_contexts("a") == 0 and lab.controls.live_engines("a") == 0
    assert lab.infer("a").result()["OUTPUT0"][0] == 1.0
    assert lab.status("a").max_parallel_slots == 3


@cell("FAIL.05")
def test_partial_clone_failure_on_first_load_frees_contexts_before_weights_and_allows_retry(lab_factory):
    lab = lab_factory({"a": {"capacity": 3}}, parallel_jobs=3, load=False)
    load = lab.gate("a", "load").hold()
    lab.gate("a", "clone").fail_arrival(2, OutOfDeviceMemoryError("no memory for a second context"))
    first = lab.infer("a", name="initializer")
    load.wait_blocked(1)
    second = lab.infer("a", name="admitted-cold")
    lab.wait_active("a", 2)
    load.release()
    for op in (first, second):
        error = op.error()
        assert isinstance(error, ModelLoadFailed) and isinstance(error.cause, OutOfDeviceMemoryError)
    events = [event for model, event in lab.controls.events if model == "a"]
    assert events == ["load", "clone", "close_context", "close_engine"]  # the context died before the weights
    status = lab.status("a")
    assert status.state is ModelState.UNLOADED and status.max_parallel_slots is None
    assert status.active_slots == 0 and "no memory for a second context" in status.last_error
    assert lab.infer("a", 7.0).result()["OUTPUT0"][0] == 7.0  # retry allowed
    assert lab.status("a").loaded


@cell("FAIL.06")
def test_preparation_and_execution_failures_release_the_lease_in_order(lab_factory):
    lab = lab_factory({"a": {"capacity": 1}}, parallel_jobs=1)
    execute = lab.gate("a", "execute").hold()
    lab.gate("a", "prepare").fail_arrival(1, ExecutionError("prepare failed"))
    failing = lab.infer("a", name="fails-in-prepare")
    assert isinstance(failing.error(), ExecutionError)
    lab.gate("a", "execute").fail_arrival(1, ExecutionError("execute failed"))
    holder = lab.infer("a", name="fails-in-execute")
    execute.wait_blocked(1)
    queued = lab.infer("a", 3.0, name="queued")
    lab.wait_queued("a", requests=1)
    execute.release()
    assert isinstance(holder.error(), ExecutionError)
    assert queued.result()["OUTPUT0"][0] == 3.0  # the failed lease passed the slot on
    status = lab.status("a")
    assert status.active_slots == 0 and status.loaded


@cell("FAIL.06")
def test_streaming_failure_after_first_response_releases_the_lease(lab_factory):
    import numpy as np

    from engine.interface import CancelToken

    lab = lab_factory({"s": {"capacity": 1, "stream_responses": 3}}, parallel_jobs=1)
    lab.gate("s", "stream").fail_arrival(2, ExecutionError("stream broke"))
    entry = lab.registry.get("s")
    received = []
    with pytest.raises(ExecutionError):
        with entry.acquire_lease(None, CancelToken()) as lease:
            for outputs in lease.execute_stream({"INPUT0": np.ones(2, np.float32)}, [], CancelToken()):
                received.append(outputs)
    assert len(received) == 1  # the error came after a response was already sent
    assert lab.status("s").active_slots == 0


@cell("FAIL.07")
def test_failed_publication_leaves_no_dangling_entry(lab_factory, monkeypatch):
    lab = lab_factory({"a": {}})
    from tests.contract.harness import write_fixture_model

    write_fixture_model(lab.root, "fresh")
    import service.core.registry as registry_module

    def failing_entry(*args, **kwargs):
        raise MemoryError("allocation failed")

    monkeypatch.setattr(registry_module, "ModelEntry", failing_entry)
    with pytest.raises(MemoryError):
        lab.register("fresh").result()
    monkeypatch.undo()
    with pytest.raises(ModelNotFound):
        lab.registry.get("fresh")
    assert [s.name for s in lab.registry.statuses()] == ["a"]
    assert lab.register("fresh").result().loaded  # staged ownership unwound: a later registration works


@cell("FAIL.09")
def test_slow_teardown_keeps_ownership_clears_residency_first_and_lets_other_models_run(lab_factory):
    lab = lab_factory({"a": {}, "b": {}})
    teardown = lab.gate("a", "teardown").hold()
    unload = lab.unload("a")
    teardown.wait_blocked(1)
    status = lab.status("a")
    assert status.state is ModelState.UNLOADING and not status.loaded and status.max_parallel_slots is None
    waiting = lab.infer("a", name="waits-for-teardown")
    lab.wait_queued("a", requests=1)
    assert lab.infer("b", 4.0).result()["OUTPUT0"][0] == 4.0  # unrelated warm work runs
    assert not waiting.done()  # exclusive ownership kept
    teardown.release()
    assert unload.result().loaded is False
    assert waiting.result()["OUTPUT0"][0] == 1.0


@cell("FAIL.01")
def test_failed_source_replacement_keeps_the_consistent_old_pair(lab_factory):
    """A registration naming a source that does not exist is refused before any live change. (Once the
    stand-in for FAIL.10, the UI's models-root replacement, which slotserve does not have: see cells.tsv.)"""
    lab = lab_factory({"a": {}})
    before = lab.status("a")
    spec_before = lab.registry.get("a").spec
    with pytest.raises(ModelConfigError, match="no model directory"):
        lab.register("a", source="nonexistent/models/a").result()
    assert lab.status("a") == before
    assert lab.registry.get("a").spec is spec_before
    assert lab.infer("a").result()["OUTPUT0"][0] == 1.0
