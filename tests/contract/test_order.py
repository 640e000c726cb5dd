"""Contract: arrival order and operation interactions (ORDER.01-08)."""

from __future__ import annotations

import pytest

from engine.interface import CancelToken
from service.core.errors import RequestCancelled
from service.core.lifecycle import ModelState

cell = pytest.mark.cell


@cell("ORDER.01")
def test_requests_fill_spare_slots_then_queue_fifo_sharing_one_initialization(lab_factory):
    lab = lab_factory({"a": {"capacity": 2}}, load=False)
    load = lab.gate("a", "load").hold()
    execute = lab.gate("a", "execute").hold()
    first = lab.infer("a", 1.0, name="first")
    load.wait_blocked(1)
    second = lab.infer("a", 2.0, name="second")
    # Both are admitted into the two slots while the one initializer loads; the second waits for its outcome.
    lab.wait_active("a", 2)
    third = lab.infer("a", 3.0, name="third")
    lab.wait_queued("a", requests=1)
    fourth = lab.infer("a", 4.0, name="fourth")
    lab.wait_queued("a", requests=2)
    load.release()
    execute.wait_blocked(2)
    assert lab.controls.count("a", "load") == 1  # initialization was shared
    assert lab.controls.count("a", "clone") == 2  # each admitted request owns its own context
    execute.release()
    assert first.result()["OUTPUT0"][0] == 1.0
    assert second.result()["OUTPUT0"][0] == 2.0
    assert third.result()["OUTPUT0"][0] == 3.0
    assert fourth.result()["OUTPUT0"][0] == 4.0
    assert lab.controls.events.count(("a", "execute")) == 4


@cell("ORDER.01")
def test_queued_requests_are_granted_in_arrival_order(lab_factory):
    lab = lab_factory({"a": {"capacity": 1}}, parallel_jobs=1)
    grants = lab.record_grants("a")  # one slot: the log is the grant order
    execute = lab.gate("a", "execute").hold()
    blocker = lab.infer("a", 0.0, name="blocker")
    execute.wait_blocked(1)
    waiters = []
    for index in range(5):
        waiters.append(lab.infer("a", float(index + 1), name=f"w{index}"))
        lab.wait_queued("a", requests=index + 1)
    prepare = lab.gate("a", "prepare")
    execute.release()
    assert blocker.result()["OUTPUT0"][0] == 0.0
    for index, op in enumerate(waiters):
        assert op.result()["OUTPUT0"][0] == float(index + 1)
    assert grants == ["blocker", "w0", "w1", "w2", "w3", "w4"]
    assert prepare.arrivals == 6


@cell("ORDER.02")
def test_manager_waits_for_older_requests_and_later_requests_cannot_use_spare_slots(lab_factory):
    lab = lab_factory({"a": {"capacity": 3}}, parallel_jobs=3)
    execute = lab.gate("a", "execute").hold()
    older = lab.infer("a", name="older")
    execute.wait_blocked(1)
    manager = lab.unload("a", name="manager")
    lab.wait_queued("a", managers=1)
    later = lab.infer("a", name="later")
    lab.wait_queued("a", requests=1, managers=1)
    # Two slots are free, yet the later request waits behind the manager.
    status = lab.status("a")
    assert status.active_slots == 1 and status.slots == 3
    assert not manager.done() and not later.done()
    execute.release()
    older.result()
    assert manager.result().loaded is False
    later.result()
    # the later request ran only after the manager's unload: it had to load the model again
    events = [event for model, event in lab.controls.events if model == "a"]
    assert events.count("load") == 2
    assert events.index("close_engine") < len(events) - 1 - events[::-1].index("load")


@cell("ORDER.03")
def test_request_after_manager_binds_the_new_configuration(lab_factory):
    lab = lab_factory({"a": {"capacity": 4}}, parallel_jobs=1)
    execute = lab.gate("a", "execute").hold()
    older = lab.infer("a", name="older")
    execute.wait_blocked(1)
    manager = lab.register("a", slots=3, name="manager")
    lab.wait_queued("a", managers=1)
    later = lab.infer("a", name="later")
    lab.wait_queued("a", requests=1, managers=1)
    execute.release()
    older.result()
    assert manager.result().slots == 3
    later.result()
    assert lab.status("a").max_parallel_slots == 4 and lab.status("a").slots == 3


@cell("ORDER.03")
def test_request_behind_manager_times_out_without_a_lease(lab_factory):
    lab = lab_factory({"a": {"capacity": 1}}, parallel_jobs=1)
    teardown = lab.gate("a", "teardown").hold()
    manager = lab.unload("a", name="manager")
    teardown.wait_blocked(1)
    late = lab.infer("a", timeout=0.2, name="late")
    error = late.error()
    assert "server_busy" in str(error)
    status = lab.status("a")
    assert status.queued_requests == 0 and status.active_slots == 0
    teardown.release()
    manager.result()


@cell("ORDER.04")
def test_managers_queue_in_order_and_later_unload_retires_the_replacement(lab_factory):
    lab = lab_factory({"a": {"capacity": 4}}, parallel_jobs=1)
    grants = lab.record_grants("a")  # managers are exclusive: the log is the grant order
    execute = lab.gate("a", "execute").hold()
    holder = lab.infer("a", name="holder")
    execute.wait_blocked(1)
    reconfigure = lab.register("a", slots=2, name="reconfigure")
    lab.wait_queued("a", managers=1)
    unload = lab.unload("a", name="unload")
    lab.wait_queued("a", managers=2)
    reload = lab.register("a", slots=3, name="reload")
    lab.wait_queued("a", managers=3)
    execute.release()
    holder.result()
    assert reconfigure.result().slots == 2
    assert unload.result().loaded is False
    final = reload.result()
    assert final.loaded and final.slots == 3
    assert grants == ["holder", "reconfigure", "unload", "reload"]
    # the reconfiguration grew the pool to two contexts, the unload closed both and the engine, and the reload
    # built a new engine with three
    events = [event for model, event in lab.controls.events if model == "a"]
    assert events[events.index("execute") + 1 :] == [
        "clone",
        "close_context",
        "close_context",
        "close_engine",
        "load",
        "clone",
        "clone",
        "clone",
    ]


@cell("ORDER.05")
def test_warm_work_on_another_model_progresses_while_one_model_loads_and_unloads(lab_factory):
    lab = lab_factory({"a": {}, "b": {}}, load=False)
    b_ready = lab.infer("b")
    b_ready.result()
    load_a = lab.gate("a", "load").hold()
    cold = lab.infer("a", name="cold-a")
    load_a.wait_blocked(1)
    warm = lab.infer("b", name="warm-b")
    assert warm.result()["OUTPUT0"][0] == 1.0
    load_a.release()
    cold.result()
    teardown_a = lab.gate("a", "teardown").hold()
    unload = lab.unload("a")
    teardown_a.wait_blocked(1)
    assert lab.infer("b", name="warm-b-2").result()["OUTPUT0"][0] == 1.0
    assert lab.registry.statuses()  # the registry answers while A's teardown runs
    teardown_a.release()
    unload.result()


@cell("ORDER.06")
def test_overlapping_bulk_unloads_in_reverse_order_do_not_deadlock(lab_factory):
    lab = lab_factory({"a": {}, "b": {}, "c": {}})
    execute_a = lab.gate("a", "execute").hold()
    execute_c = lab.gate("c", "execute").hold()
    busy_a = lab.infer("a")
    busy_c = lab.infer("c")
    execute_a.wait_blocked(1)
    execute_c.wait_blocked(1)
    first = lab.unload_many(["a", "b", "c"], name="first")
    lab.wait_queued("a", managers=1)  # the first bulk's barrier
    second = lab.unload_many(["c", "b", "a"], name="second")
    lab.wait_queued("a", managers=2)  # and the second's
    lab.wait_queued("c", managers=2)  # both barriers on c
    # a warm request to a model outside both selections is not affected by the bulk mutex
    execute_a.release()
    execute_c.release()
    busy_a.result()
    busy_c.result()
    assert first.result() == (["a", "b", "c"], [])
    assert second.result() == (["c", "b", "a"], [])
    for model in "abc":
        assert lab.status(model).state is ModelState.UNLOADED


@cell("ORDER.07")
def test_bulk_snapshot_misses_later_registrations_and_per_model_order_governs(lab_factory, tmp_path):
    lab = lab_factory({"a": {}, "b": {}})
    execute_a = lab.gate("a", "execute").hold()
    busy = lab.infer("a", name="busy")
    execute_a.wait_blocked(1)
    bulk = lab.start("bulk-all", lambda: lab.registry.unload_many(all_models=True))
    lab.wait_queued("a", managers=1)  # the bulk's barrier
    single = lab.register("a", name="single-after-bulk")
    lab.wait_queued("a", managers=2)
    # a registration published after the bulk's snapshot is not part of it
    from tests.contract.harness import write_fixture_model

    write_fixture_model(lab.root, "c")
    registered_c = lab.register("c").result()
    assert registered_c.loaded
    execute_a.release()
    busy.result()
    unloaded, not_found = bulk.result()
    assert unloaded == ["a", "b"] and not_found == []
    assert single.result().loaded  # per-model order: the bulk's unload first, then the registration
    assert lab.status("c").loaded


@cell("ORDER.08")
def test_cancelled_bulk_unwinds_pending_barriers_and_keeps_completed_unloads(lab_factory):
    lab = lab_factory({"a": {}, "b": {}})
    execute_a = lab.gate("a", "execute").hold()
    busy = lab.infer("a")
    execute_a.wait_blocked(1)
    cancel = CancelToken()
    bulk = lab.unload_many(["b", "a"], cancel=cancel)
    lab.wait_state("b", ModelState.UNLOADED)  # the idle model was freed at once
    lab.wait_queued("a", managers=1)  # the bulk's barrier
    cancel.cancel()
    assert isinstance(bulk.error(), RequestCancelled)
    status = lab.status("a")
    assert lab.queue("a") == (0, 0) and status.loaded  # the pending barrier was withdrawn
    assert lab.status("b").state is ModelState.UNLOADED  # the completed unload is not rolled back
    execute_a.release()
    busy.result()
    assert lab.infer("a").result()["OUTPUT0"][0] == 1.0  # no stranded management ownership
