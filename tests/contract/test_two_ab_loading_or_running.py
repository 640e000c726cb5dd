"""Contract, two-model situations: A and B both loading or running (TWO.ab-loading-or-running.*).

"Loading" is a cold request held at the model's load gate (or waiting for the cold-load guard); "running" is a
request held at the model's execute gate.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.core.lifecycle import ModelState
from service.core.residency import ColdLoadStatistics
from tests.contract.harness import admission_stats, wait_admission

cell = pytest.mark.cell


def _echo(op, value: float) -> None:
    np.testing.assert_array_equal(op.result()["OUTPUT0"], np.full(2, value, np.float32))


def _both_running(lab_factory):
    lab = lab_factory({"a": {}, "b": {}})
    gates, ops = {}, {}
    for model in "ab":
        gates[model] = lab.gate(model, "execute").hold()
        ops[model] = lab.infer(model, 1.0, name=f"{model}-running")
        gates[model].wait_blocked(1)
        status = lab.status(model)
        assert status.state is ModelState.READY and status.active_slots == 1
    return lab, gates, ops


def _guard(lab):
    return lab.runtime.cold_loads


@cell("TWO.ab-loading-or-running.req-a")
def test_request_to_a_initializes_a_only_behind_the_global_cold_guard(lab_factory):
    lab = lab_factory({"a": {}, "b": {}}, load=False, max_concurrent_loads=1)
    b_load = lab.gate("b", "load").hold()
    b_cold = lab.infer("b", 1.0, name="b-cold")
    b_load.wait_blocked(1)  # B is loading and holds the only cold-load permit
    a_load = lab.gate("a", "load")
    a_arrivals = a_load.arrivals
    a_first = lab.infer("a", 2.0, name="a-first")
    lab.wait_until(
        lambda: _guard(lab).statistics() == ColdLoadStatistics(running=1, waiting=1),
        "A's initializer waiting for the cold-load guard",
    )
    assert lab.status("a").state is ModelState.LOADING and a_load.arrivals == a_arrivals
    slots = lab.status("a").slots
    a_more = [lab.infer("a", float(3 + index)) for index in range(slots - 1)]
    lab.wait_active("a", slots)  # admitted; waiting on A's one initialization
    a_queued = lab.infer("a", 9.0, name="a-queued")
    wait_admission(lab, "a", lambda s: s.queued_requests == 1, "A full: request queued on A")
    b_stats = admission_stats(lab, "b")
    assert b_stats.queued == 0 and b_stats.active_slots == 1  # A's queue is A's only
    b_load.release()
    _echo(b_cold, 1.0)
    _echo(a_first, 2.0)
    for index, op in enumerate(a_more):
        _echo(op, float(3 + index))
    _echo(a_queued, 9.0)
    assert lab.controls.count("a", "load") == 1 and lab.controls.count("b", "load") == 1
    for model in "ab":
        assert lab.status(model).state is ModelState.READY


@cell("TWO.ab-loading-or-running.req-a")
def test_request_to_a_loads_beside_loading_b_when_the_guard_allows_two(lab_factory):
    lab = lab_factory({"a": {}, "b": {}}, load=False, max_concurrent_loads=2)
    b_load = lab.gate("b", "load").hold()
    a_load = lab.gate("a", "load").hold()
    b_cold = lab.infer("b", 1.0, name="b-cold")
    b_load.wait_blocked(1)
    a_cold = lab.infer("a", 2.0, name="a-cold")
    a_load.wait_blocked(1)  # A's load runs while B's is still in progress
    assert _guard(lab).statistics() == ColdLoadStatistics(running=2, waiting=0)
    a_load.release()
    _echo(a_cold, 2.0)  # A finishes while B is still loading
    assert b_load.blocked == 1 and lab.status("b").state is ModelState.LOADING
    assert lab.status("a").state is ModelState.READY
    b_load.release()
    _echo(b_cold, 1.0)
    assert lab.status("b").state is ModelState.READY


@cell("TWO.ab-loading-or-running.req-b")
def test_request_to_b_initializes_b_only_behind_the_global_cold_guard(lab_factory):
    lab = lab_factory({"a": {}, "b": {}}, load=False, max_concurrent_loads=1)
    a_load = lab.gate("a", "load").hold()
    a_cold = lab.infer("a", 1.0, name="a-cold")
    a_load.wait_blocked(1)  # A is loading and holds the only cold-load permit
    b_load = lab.gate("b", "load")
    b_arrivals = b_load.arrivals
    b_cold = lab.infer("b", 2.0, name="b-cold")
    lab.wait_until(
        lambda: _guard(lab).statistics() == ColdLoadStatistics(running=1, waiting=1),
        "B's initializer waiting for the cold-load guard",
    )
    assert lab.status("b").state is ModelState.LOADING and b_load.arrivals == b_arrivals
    a_load.release()
    _echo(a_cold, 1.0)
    _echo(b_cold, 2.0)
    assert lab.controls.count("b", "load") == 1
    assert lab.status("b").state is ModelState.READY


@cell("TWO.ab-loading-or-running.req-b")
def test_request_to_b_waits_for_b_initialization_or_queues_on_b_while_a_runs(lab_factory):
    lab = lab_factory({"a": {}, "b": {}})
    a_execute = lab.gate("a", "execute").hold()
    a_running = lab.infer("a", 1.0, name="a-running")
    a_execute.wait_blocked(1)
    lab.unload("b").result()
    b_load = lab.gate("b", "load").hold()
    b_loads = lab.controls.count("b", "load")
    b_first = lab.infer("b", 2.0, name="b-first")
    b_load.wait_blocked(1)
    slots = lab.status("b").slots
    b_more = [lab.infer("b", float(3 + index)) for index in range(slots - 1)]
    lab.wait_active("b", slots)
    b_queued = lab.infer("b", 9.0, name="b-queued")
    wait_admission(lab, "b", lambda s: s.queued_requests == 1, "B full: request queued on B")
    a_stats = admission_stats(lab, "a")
    assert a_stats.queued == 0 and a_stats.active_slots == 1  # nothing of B's lands on A
    # warm A work still starts executing on A's spare slot while B loads
    a_warm = lab.infer("a", 5.0, name="a-warm")
    a_execute.wait_blocked(2)
    b_load.release()
    _echo(b_first, 2.0)
    for index, op in enumerate(b_more):
        _echo(op, float(3 + index))
    _echo(b_queued, 9.0)
    assert lab.controls.count("b", "load") == b_loads + 1  # one shared initialization
    assert lab.status("b").state is ModelState.READY
    assert a_execute.blocked == 2 and not a_running.done()
    a_execute.release()
    _echo(a_running, 1.0)
    _echo(a_warm, 5.0)


@cell("TWO.ab-loading-or-running.reconf-a")
def test_reconfigure_a_drains_a_only(lab_factory):
    lab, gates, ops = _both_running(lab_factory)
    loads = lab.controls.count("a", "load")
    reconfigure = lab.register("a", options={"tag": "v2"})
    wait_admission(lab, "a", lambda s: s.queued_managers == 1, "reconfigure queued behind A's request")
    assert admission_stats(lab, "b").queued == 0
    gates["a"].release()
    _echo(ops["a"], 1.0)
    result = reconfigure.result()  # completes while B's request is still running
    assert result.loaded and result.state is ModelState.READY
    assert lab.registry.get("a").spec.parameter("tag") == "v2"
    assert lab.controls.count("a", "load") == loads + 1
    assert gates["b"].blocked == 1 and not ops["b"].done() and lab.status("b").active_slots == 1
    gates["b"].release()
    _echo(ops["b"], 1.0)
    assert lab.status("b").state is ModelState.READY


@cell("TWO.ab-loading-or-running.unload-a")
def test_unload_a_drains_a_only(lab_factory):
    lab, gates, ops = _both_running(lab_factory)
    closed_a, closed_b = lab.controls.count("a", "close_engine"), lab.controls.count("b", "close_engine")
    unload = lab.unload("a")
    wait_admission(lab, "a", lambda s: s.queued_managers == 1, "unload queued behind A's request")
    gates["a"].release()
    _echo(ops["a"], 1.0)
    assert unload.result().loaded is False  # completes while B's request is still running
    assert lab.status("a").state is ModelState.UNLOADED
    assert lab.controls.count("a", "close_engine") == closed_a + 1
    assert gates["b"].blocked == 1 and not ops["b"].done()
    assert lab.status("b").loaded and lab.controls.count("b", "close_engine") == closed_b
    gates["b"].release()
    _echo(ops["b"], 1.0)
    assert lab.status("b").state is ModelState.READY


@cell("TWO.ab-loading-or-running.unload-ab")
def test_bulk_unload_of_running_a_and_b_publishes_both_barriers_before_waiting(lab_factory):
    lab, gates, ops = _both_running(lab_factory)
    closed_a, closed_b = lab.controls.count("a", "close_engine"), lab.controls.count("b", "close_engine")
    bulk = lab.unload_many(["a", "b"])
    for model in "ab":  # both barriers are published while both models are still busy
        wait_admission(lab, model, lambda s: s.queued_managers == 1, f"barrier on {model}")
    later = lab.infer("b", 7.0, name="later-b")  # later work queues behind B's barrier despite a spare slot
    wait_admission(lab, "b", lambda s: s.queued_requests == 1, "later B request behind the barrier")
    b_load = lab.gate("b", "load").hold()
    gates["b"].release()  # B drains first although it is second in the selection
    _echo(ops["b"], 1.0)
    b_load.wait_blocked(1)  # the bulk unloaded B, and the later request is reloading it
    assert lab.controls.count("b", "close_engine") == closed_b + 1
    assert lab.controls.count("a", "close_engine") == closed_a
    assert gates["a"].blocked == 1 and lab.status("a").loaded and not bulk.done()
    gates["a"].release()
    _echo(ops["a"], 1.0)
    assert bulk.result() == (["a", "b"], [])
    assert lab.status("a").state is ModelState.UNLOADED
    assert lab.controls.count("a", "close_engine") == closed_a + 1
    b_load.release()
    _echo(later, 7.0)
    assert lab.status("b").state is ModelState.READY


@cell("TWO.ab-loading-or-running.unload-ab")
def test_bulk_unload_of_loading_a_and_b_waits_for_earlier_work_then_unloads_both(lab_factory):
    lab = lab_factory({"a": {}, "b": {}}, load=False, max_concurrent_loads=1)
    a_load = lab.gate("a", "load").hold()
    a_cold = lab.infer("a", 1.0, name="a-cold")
    a_load.wait_blocked(1)
    b_cold = lab.infer("b", 2.0, name="b-cold")
    lab.wait_until(
        lambda: _guard(lab).statistics() == ColdLoadStatistics(running=1, waiting=1),
        "B waiting for the cold-load guard",
    )
    bulk = lab.unload_many(["a", "b"])
    for model in "ab":  # barriers published before either pool exists
        wait_admission(lab, model, lambda s: s.queued_managers == 1, f"barrier on {model}")
        assert lab.status(model).state is ModelState.LOADING
    a_load.release()
    _echo(a_cold, 1.0)
    _echo(b_cold, 2.0)
    assert bulk.result() == (["a", "b"], [])
    for model in "ab":
        assert lab.status(model).state is ModelState.UNLOADED
        assert lab.controls.count(model, "load") == 1 and lab.controls.count(model, "close_engine") == 1
