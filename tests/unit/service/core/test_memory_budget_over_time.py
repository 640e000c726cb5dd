"""The memory budget counts each model's memory over time (issue 33, item 12): a model's memory is re-read after
its load (`Residency.check_memory`, run by the memory watch every second and soon after a lease ends), and
--memory-budget is enforced with what it holds now: least recently used idle models are retired while the total
is over, a busy model never is, and a model that alone holds more than the budget is retired once idle. Before,
the figure read at load stayed for the pool's life: a python model whose workers grew past the budget evicted
nothing.

The fixture backend reports what the test sets (`FixtureControls.set_memory`), so every figure is deterministic;
fake clocks order the LRU, the fixture's gates and the watch's own counters order the events (no sleeps)."""

from __future__ import annotations

import logging
import threading

import pytest

from service.core.lifecycle import ModelState
from service.core.residency import MemoryCheck
from tests.contract.harness import WAIT, FakeClock, Lab

MODELS = {**{name: {"memory_bytes": 100, "capacity": 1} for name in ("a", "b", "c")}, "d": {"memory_bytes": 600}}


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def lab(tmp_path, clock):
    """a, b and c resident (100 bytes each) under a 1000-byte budget, used in that order (a least recently); d
    (600 bytes) registered, not loaded."""
    lab = Lab(tmp_path, MODELS, load=False, memory_budget=1000, clock=clock)
    for name in "abc":
        clock.now += 1
        lab.infer(name).result()
    yield lab
    lab.close()


def test_a_model_that_grew_past_the_budget_retires_the_least_recently_used_idle_models(lab, caplog):
    assert lab.residency.memory_in_use() == 300
    lab.controls.set_memory("c", 850)  # c's run kept 750 bytes more: 1050 in all
    assert lab.residency.memory_in_use() == 300  # not seen until re-read
    with caplog.at_level(logging.INFO, logger="service.core.lifecycle"):
        check = lab.residency.check_memory()
    assert check == MemoryCheck(in_use=950, evicted=("a",), over_budget=False)  # a alone was enough
    assert lab.residency.resident_names() == ["b", "c"] and lab.residency.memory_in_use() == 950
    assert lab.status("a").state is ModelState.UNLOADED and lab.controls.live_engines("a") == 0
    assert lab.residency.evictions == 1
    assert "model 'a': evicted: the resident models' memory grew past the budget" in caplog.text
    # the next load sees what c holds now: a (100) no longer fits beside b and c (950), so b, idle, goes
    lab.clock.now += 1
    lab.infer("a").result()
    assert lab.residency.resident_names() == ["a", "c"] and lab.residency.memory_in_use() == 950


def test_a_model_that_shrank_makes_room_for_a_load_that_did_not_fit(lab, clock):
    lab.controls.set_memory("b", 800)
    assert lab.residency.check_memory() == MemoryCheck(in_use=1000, evicted=(), over_budget=False)
    lab.controls.set_memory("b", 100)  # b gave its memory back
    lab.residency.check_memory()
    assert lab.residency.memory_in_use() == 300
    clock.now += 1
    lab.infer("d").result()  # fits beside all three: nobody evicted
    assert lab.residency.evictions == 0 and lab.residency.memory_in_use() == 900


def test_a_busy_model_is_never_retired_and_the_budget_is_enforced_once_it_is_idle(lab, caplog):
    """Only a is over the budget, alone, while it runs: nothing busy is retired (the pass ends over the budget,
    logged once); the pass after its lease ended retires it, and its next request loads it afresh."""
    execute = lab.gate("a", "execute").hold()
    running = lab.infer("a")
    execute.wait_blocked(1)
    lab.controls.set_memory("a", 1500)
    with caplog.at_level(logging.WARNING, logger="service.core.residency"):
        first = lab.residency.check_memory()
        again = lab.residency.check_memory()
    # b and c were idle and least recently used: retired, and a alone still does not fit
    assert first == MemoryCheck(in_use=1500, evicted=("b", "c"), over_budget=True)
    assert again == MemoryCheck(in_use=1500, evicted=(), over_budget=True)
    assert lab.status("a").state is ModelState.READY and lab.status("a").active_slots == 1
    warnings = [r.getMessage() for r in caplog.records if "over the 1000-byte budget" in r.getMessage()]
    assert len(warnings) == 1 and "'a' 1500 bytes" in warnings[0], warnings  # once per episode
    execute.release()
    running.result()
    assert lab.residency.check_memory() == MemoryCheck(in_use=0, evicted=("a",), over_budget=False)
    assert lab.residency.resident_names() == [] and lab.controls.live_engines("a") == 0
    lab.controls.set_memory("a", None)  # a fresh pool holds its 100 bytes again
    lab.infer("a").result()
    assert lab.residency.resident_names() == ["a"] and lab.residency.memory_in_use() == 100


def test_measuring_holds_no_lock_of_residency_nor_of_another_model(lab):
    """A slow measurement (a python model reading its workers' memory) blocks neither residency's bookkeeping
    nor requests and loads of other models."""
    measure = lab.gate("b", "measure").hold()
    check: dict[str, MemoryCheck] = {}
    pass_ = threading.Thread(target=lambda: check.update(result=lab.residency.check_memory()), daemon=True)
    pass_.start()
    measure.wait_blocked(1)
    assert lab.residency.memory_in_use() == 300  # residency's lock is free
    assert lab.infer("c", 7.0).result()["OUTPUT0"][0] == 7.0  # c's model lock and its lease are free
    lab.unload("c").result()  # an unload takes c's lock and residency's: not blocked either
    assert lab.residency.resident_names() == ["a", "b"]
    measure.release()
    pass_.join(WAIT)
    assert check["result"] == MemoryCheck(in_use=200, evicted=(), over_budget=False)


def test_a_measurement_of_a_retired_pool_is_never_recorded(lab):
    """The pass measured b, then b was unloaded before the figure was recorded: b must not come back as a
    phantom resident model (its bytes would count against the budget for ever)."""
    measure = lab.gate("b", "measure").hold()
    lab.controls.set_memory("b", 700)
    pass_ = threading.Thread(target=lab.residency.check_memory, daemon=True)
    pass_.start()
    measure.wait_blocked(1)
    lab.unload("b").result()
    measure.release()
    pass_.join(WAIT)
    assert lab.residency.resident_names() == ["a", "c"] and lab.residency.memory_in_use() == 200


def test_a_lease_end_wakes_the_memory_watch(tmp_path, clock):
    """The watch's period is an hour here: only a lease's end can make it look, and it does."""
    lab = Lab(tmp_path, MODELS, load=False, memory_budget=1000, clock=clock, memory_check_seconds=3600)
    try:
        watch = lab.residency.watch
        assert watch is not None
        for name in "abc":
            clock.now += 1
            lab.infer(name).result()
        lab.wait_until(lambda: watch.passes >= 1, "the watch's pass after the first lease ended")
        lab.controls.set_memory("c", 950)
        passes = watch.passes
        clock.now += 1
        lab.infer("c").result()  # its lease's end wakes the watch: a and b (idle, older) go
        lab.wait_until(lambda: watch.passes > passes and lab.residency.evictions == 2, "the pass after c's lease")
        assert lab.residency.resident_names() == ["c"] and lab.residency.memory_in_use() == 950
    finally:
        lab.close()
    assert not watch._thread.is_alive()  # stopped with the residency


def test_stopping_the_residency_does_not_wait_for_a_watch_stuck_in_a_teardown(tmp_path, clock):
    lab = Lab(tmp_path, MODELS, load=False, memory_budget=1000, clock=clock, memory_check_seconds=3600)
    try:
        lab.infer("a").result()
        teardown = lab.gate("a", "teardown").hold()
        lab.controls.set_memory("a", 2000)
        lab.residency.watch.nudge()
        teardown.wait_blocked(1)
        assert lab.residency.stop(timeout=0.2) is False  # returned within its bound, the teardown still running
        teardown.release()
        lab.wait_state("a", ModelState.UNLOADED)
        assert lab.residency.stop(timeout=WAIT) is True
    finally:
        lab.close()


def test_without_a_budget_there_is_no_watch(tmp_path):
    lab = Lab(tmp_path, MODELS, memory_check_seconds=1.0)
    try:
        assert lab.residency.watch is None
        assert lab.residency.check_memory() == MemoryCheck(in_use=900, evicted=(), over_budget=False)
    finally:
        lab.close()


def test_a_measurement_that_raises_keeps_the_last_figure_and_is_logged_once(lab, caplog):
    measure = lab.gate("b", "measure")
    measure.fail_next(RuntimeError("worker gone"), times=2)
    lab.controls.set_memory("b", 300)
    with caplog.at_level(logging.ERROR, logger="service.core.residency"):
        assert lab.residency.check_memory().in_use == 300  # b keeps its 100
        assert lab.residency.check_memory().in_use == 300
    assert [r.getMessage() for r in caplog.records] == ["model 'b': could not read its memory; its last figure stays"]
    assert lab.residency.check_memory().in_use == 500  # it reads again: its figure now


def test_reading_a_models_status_measures_its_memory_outside_the_model_lock(lab):
    """GetModel, RepositoryIndex and the metrics read a model's status; its memory is measured then (a python
    model reads its workers in /proc). That measurement must not hold the model's lock: requests to the model
    (admission takes that lock) go on while a status is being read."""
    measure = lab.gate("b", "measure").hold()
    seen = {}
    reader = threading.Thread(target=lambda: seen.update(status=lab.status("b")), daemon=True)
    reader.start()
    measure.wait_blocked(1)
    assert lab.infer("b", 3.0).result(timeout=WAIT)["OUTPUT0"][0] == 3.0  # b's lock is free meanwhile
    measure.release()
    reader.join(WAIT)
    assert seen["status"].memory_bytes == 100 and seen["status"].loaded
