"""Contract: eviction and idle retirement (the OPS "Eviction / idle retirement" column), FAIL.08, and the
residency limit, memory budget and cold-load guard around them."""

from __future__ import annotations

import pytest

from service.core.errors import MemoryLimit, ModelLoadFailed, ResidencyLimit
from service.core.lifecycle import ModelState
from service.core.residency import ColdLoadStatistics
from service.transport.status_codes import describe

from .harness import FakeClock

cell = pytest.mark.cell


def _resident(lab) -> list[str]:
    return lab.residency.resident_names()


def _residency_refusal(op) -> ResidencyLimit:
    error = op.error()
    if isinstance(error, ModelLoadFailed):
        error = error.cause
    assert isinstance(error, ResidencyLimit), error
    return error


@cell("OPS.ready.evict")
def test_loading_at_the_limit_retires_the_least_recently_used_idle_model(lab_factory):
    clock = FakeClock()
    lab = lab_factory({"a": {}, "b": {}, "c": {}}, load=False, max_resident_models=2, clock=clock)
    lab.infer("a").result()
    clock.now += 1
    lab.infer("b").result()
    clock.now += 1
    lab.infer("a").result()  # a is now more recently used than b
    clock.now += 1
    assert _resident(lab) == ["a", "b"]
    assert lab.infer("c").result()["OUTPUT0"][0] == 1.0
    assert _resident(lab) == ["a", "c"]
    status = lab.status("b")
    assert status.state is ModelState.UNLOADED and status.max_parallel_slots is None
    assert lab.residency.evictions == 1


@cell("OPS.ready.evict")
def test_a_busy_or_queued_ready_model_is_never_evicted(lab_factory):
    clock = FakeClock()
    lab = lab_factory({"a": {"capacity": 1}, "b": {}}, parallel_jobs=1, load=False, max_resident_models=1, clock=clock)
    execute = lab.gate("a", "execute").hold()
    busy = lab.infer("a", name="busy")
    execute.wait_blocked(1)
    queued = lab.infer("a", name="queued")
    lab.wait_queued("a", requests=1)
    _residency_refusal(lab.infer("b", name="needs-room"))
    assert lab.status("a").loaded and lab.status("b").state is ModelState.UNLOADED
    execute.release()
    busy.result()
    queued.result()
    assert lab.infer("b").result()["OUTPUT0"][0] == 1.0  # once a is idle it can go
    assert _resident(lab) == ["b"]


@cell("OPS.unloaded.evict")
def test_an_unloaded_model_is_no_victim_and_stays_unloaded(lab_factory):
    lab = lab_factory({"m": {}, "busy": {"capacity": 1}, "new": {}}, parallel_jobs=1, load=False, max_resident_models=1)
    execute = lab.gate("busy", "execute").hold()
    holder = lab.infer("busy")
    execute.wait_blocked(1)
    refused = lab.infer("new")
    error = _residency_refusal(refused)
    assert "residency_limit" in str(error)
    assert lab.status("m").state is ModelState.UNLOADED and lab.controls.count("m", "load") == 0
    assert lab.controls.count("new", "load") == 0  # refused before anything was built
    execute.release()
    holder.result()


@cell("OPS.loading.evict")
def test_a_loading_model_is_skipped_and_keeps_loading(lab_factory):
    lab = lab_factory(
        {"m": {}, "idle": {}, "y": {}, "z": {}}, load=False, max_resident_models=2, max_concurrent_loads=3
    )
    lab.infer("idle").result()
    load_m = lab.gate("m", "load").hold()
    loading = lab.infer("m", name="m-loading")
    load_m.wait_blocked(1)
    assert lab.status("m").state is ModelState.LOADING
    # y needs room: m (loading) is skipped, the idle model is evicted
    assert lab.infer("y").result()["OUTPUT0"][0] == 1.0
    assert lab.status("idle").state is ModelState.UNLOADED
    # z needs room too: m is still loading and y is the only other candidate; y is idle, so it goes
    assert lab.infer("z").result()["OUTPUT0"][0] == 1.0
    assert lab.status("m").state is ModelState.LOADING
    load_m.release()
    loading.result()
    assert lab.status("m").state is ModelState.READY


@cell("OPS.loading.evict")
def test_with_only_a_loading_model_resident_a_new_load_gets_503(lab_factory):
    lab = lab_factory({"m": {}, "y": {}}, load=False, max_resident_models=1, max_concurrent_loads=2)
    load_m = lab.gate("m", "load").hold()
    loading = lab.infer("m")
    load_m.wait_blocked(1)
    error = _residency_refusal(lab.infer("y"))
    code, _message, reason = describe(error)
    assert code.name == "UNAVAILABLE" and reason == "residency_limit"
    load_m.release()
    loading.result()
    assert lab.status("m").loaded


@cell("OPS.reconfiguring.evict")
def test_a_reconfiguring_model_is_skipped_and_its_reconfiguration_continues(lab_factory):
    lab = lab_factory({"m": {"capacity": 4}, "y": {}}, parallel_jobs=1, load=False, max_resident_models=1)
    lab.infer("m").result()
    clone = lab.gate("m", "clone").hold()
    reconfigure = lab.register("m", slots=3)
    clone.wait_blocked(1)
    assert lab.status("m").state is ModelState.RECONFIGURING
    _residency_refusal(lab.infer("y"))
    clone.release()
    assert reconfigure.result().slots == 3
    assert lab.status("m").state is ModelState.READY


@cell("OPS.unloading.evict")
def test_a_retiring_model_is_not_a_victim_and_other_idle_models_are_considered(lab_factory):
    lab = lab_factory({"m": {}, "idle": {}, "y": {}}, load=False, max_resident_models=2)
    lab.infer("m").result()
    lab.infer("idle").result()
    teardown = lab.gate("m", "teardown").hold()
    unload = lab.unload("m")
    teardown.wait_blocked(1)
    assert lab.status("m").state is ModelState.UNLOADING
    assert _resident(lab) == ["idle"]  # m already counts as not resident
    assert lab.infer("y").result()["OUTPUT0"][0] == 1.0  # room was there without evicting anyone
    assert _resident(lab) == ["idle", "y"]
    teardown.release()
    unload.result()
    assert lab.controls.count("m", "close_engine") == 1  # torn down once, by its own unload


@cell("FAIL.08")
def test_residency_refusal_is_503_and_publishes_no_partial_pool(lab_factory):
    lab = lab_factory({"busy": {"capacity": 1}, "y": {}}, parallel_jobs=1, load=False, max_resident_models=1)
    execute = lab.gate("busy", "execute").hold()
    holder = lab.infer("busy")
    execute.wait_blocked(1)
    with pytest.raises(ResidencyLimit):
        lab.register("y").result()
    status = lab.status("y")
    assert status.state is ModelState.UNLOADED and not status.loaded
    assert lab.controls.live_engines("y") == 0 and lab.controls.live_contexts("y") == 0
    execute.release()
    holder.result()


@cell("FAIL.08")
def test_memory_refusal_keeps_the_eviction_it_already_made(lab_factory):
    clock = FakeClock()
    lab = lab_factory(
        {"v1": {"memory_bytes": 100}, "v2": {"memory_bytes": 100, "capacity": 1}, "y": {"memory_bytes": 200}},
        parallel_jobs=1,
        load=False,
        memory_budget=250,
        clock=clock,
    )
    lab.infer("v1").result()
    clock.now += 1
    lab.infer("v2").result()
    execute = lab.gate("v2", "execute").hold()
    busy = lab.infer("v2")
    execute.wait_blocked(1)
    refused = lab.register("y")
    error = refused.error()
    assert isinstance(error, MemoryLimit) and "memory_limit" in str(error)
    assert lab.status("v1").state is ModelState.UNLOADED  # evicted on the way, and not undone
    assert lab.status("v2").loaded
    y = lab.status("y")
    assert not y.loaded and y.memory_bytes is None
    assert lab.controls.live_engines("y") == 0 and lab.controls.live_contexts("y") == 0
    assert lab.residency.memory_in_use() == 100
    execute.release()
    busy.result()


@cell("OPS.ready.evict")
def test_idle_retirement_retires_an_idle_model_in_the_background(lab_factory):
    clock = FakeClock()
    lab = lab_factory({"a": {}, "b": {}}, idle_unload=30.0, clock=clock)
    reaper = lab.residency.reaper
    clock.now += 31
    checks = reaper.checks
    reaper.poke()
    lab.wait_until(lambda: reaper.checks >= checks + 2, "the reaper examined both models")
    for model in ("a", "b"):
        status = lab.status(model)
        assert status.state is ModelState.UNLOADED and status.max_parallel_slots is None
    assert reaper.retired == 2


@cell("OPS.ready.evict")
def test_idle_retirement_skips_a_model_with_a_queued_request(lab_factory):
    clock = FakeClock()
    lab = lab_factory({"a": {"capacity": 1}}, parallel_jobs=1, idle_unload=30.0, clock=clock)
    reaper = lab.residency.reaper
    execute = lab.gate("a", "execute").hold()
    running = lab.infer("a")
    execute.wait_blocked(1)
    queued = lab.infer("a")
    lab.wait_queued("a", requests=1)
    clock.now += 31
    checks = reaper.checks
    reaper.poke()
    lab.wait_until(lambda: reaper.checks >= checks + 1, "the reaper examined the model")
    assert lab.status("a").loaded and reaper.retired == 0
    execute.release()
    running.result()
    queued.result()


def test_idle_retirement_teardown_does_not_block_other_models(lab_factory):
    clock = FakeClock()
    lab = lab_factory({"a": {}, "b": {}}, idle_unload=30.0, clock=clock)
    teardown = lab.gate("a", "teardown").hold()
    lab.infer("b").result()
    clock.now += 31
    lab.registry.get("b").last_used = clock.now  # b was just used
    lab.residency.reaper.poke()
    teardown.wait_blocked(1)  # a is being torn down on the reaper thread
    assert lab.status("a").state is ModelState.UNLOADING and not lab.status("a").loaded
    assert lab.infer("b", 3.0).result()["OUTPUT0"][0] == 3.0  # warm requests do not wait on it
    teardown.release()
    lab.wait_state("a", ModelState.UNLOADED)


def test_cold_load_guard_serializes_cold_loads_but_not_warm_requests(lab_factory):
    lab = lab_factory({"a": {}, "b": {}, "warm": {}}, load=False, max_concurrent_loads=1)
    lab.infer("warm").result()
    load_a = lab.gate("a", "load").hold()
    cold_a = lab.infer("a")
    load_a.wait_blocked(1)
    cold_b = lab.infer("b")
    lab.wait_until(
        lambda: lab.runtime.cold_loads.statistics() == ColdLoadStatistics(running=1, waiting=1),
        "b waiting for the cold-load guard",
    )
    assert lab.gate("b", "load").arrivals == 0
    assert lab.infer("warm", 2.0).result()["OUTPUT0"][0] == 2.0
    load_a.release()
    cold_a.result()
    cold_b.result()
    assert lab.controls.count("a", "load") == 1 and lab.controls.count("b", "load") == 1


@cell("TIME.04")
def test_initializer_cancelled_while_waiting_for_the_cold_load_guard_leaves_and_a_waiter_takes_over(lab_factory):
    from engine.interface import CancelToken
    from service.core.errors import RequestCancelled

    lab = lab_factory({"a": {}, "b": {"capacity": 2}}, load=False, max_concurrent_loads=1)
    load_a = lab.gate("a", "load").hold()
    cold_a = lab.infer("a", name="cold-a")
    load_a.wait_blocked(1)  # a holds the only cold-load place
    token = CancelToken()
    initializer = lab.infer("b", 1.0, cancel=token, name="b-initializer")
    lab.wait_until(
        lambda: lab.runtime.cold_loads.statistics() == ColdLoadStatistics(running=1, waiting=1),
        "b's initializer waiting for the guard",
    )
    follower = lab.infer("b", 2.0, name="b-follower")
    lab.wait_active("b", 2)
    token.cancel()
    assert isinstance(initializer.error(), RequestCancelled)
    # the follower becomes the initializer and waits for the guard itself; nothing of b was loaded or failed
    lab.wait_until(
        lambda: lab.runtime.cold_loads.statistics() == ColdLoadStatistics(running=1, waiting=1),
        "the follower waiting for the guard",
    )
    status = lab.status("b")
    assert status.active_slots == 1 and status.last_error == "" and lab.controls.count("b", "load") == 0
    load_a.release()
    cold_a.result()
    assert follower.result()["OUTPUT0"][0] == 2.0
    assert lab.controls.count("b", "load") == 1
