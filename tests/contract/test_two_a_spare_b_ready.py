"""Contract, two-model situations: A running with spare slots; B ready (TWO.a-spare-b-ready.*).

A has three slots; requests held at A's execute gate occupy some of them and leave at least one spare.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.lifecycle import ModelState
from tests.contract.harness import admission_stats, events_since, wait_admission

cell = pytest.mark.cell


def _echo(op, value: float) -> None:
    np.testing.assert_array_equal(op.result()["OUTPUT0"], np.full(2, value, np.float32))


def _a_spare_b_ready(lab_factory, running: int = 1):
    lab = lab_factory({"a": {}, "b": {}}, parallel_jobs=3)
    execute = lab.gate("a", "execute").hold()
    ops = []
    for index in range(running):
        ops.append(lab.infer("a", float(index), name=f"older{index}"))
        execute.wait_blocked(index + 1)
    status = lab.status("a")
    assert status.state is ModelState.READY and status.active_slots == running < status.slots
    assert lab.status("b").state is ModelState.READY
    return lab, execute, ops


@cell("TWO.a-spare-b-ready.req-a")
def test_request_to_a_is_admitted_into_a_spare_slot(lab_factory):
    lab, execute, (older,) = _a_spare_b_ready(lab_factory)
    newer = lab.infer("a", 7.0)
    execute.wait_blocked(2)  # it is executing beside the older one: admitted, not queued
    assert lab.status("a").active_slots == 2 and admission_stats(lab, "a").queued == 0
    execute.release()
    _echo(older, 0.0)
    _echo(newer, 7.0)
    assert lab.status("a").state is ModelState.READY


@cell("TWO.a-spare-b-ready.req-a")
def test_request_to_a_queues_behind_an_older_barrier_despite_spare_slots(lab_factory):
    lab, execute, (older,) = _a_spare_b_ready(lab_factory)
    loads = lab.controls.count("a", "load")
    barrier = lab.register("a", options={"tag": "v2"}, name="barrier")
    wait_admission(lab, "a", lambda s: s.queued_managers == 1, "barrier queued")
    newer = lab.infer("a", 7.0)
    stats = wait_admission(lab, "a", lambda s: s.queued_requests == 1, "request queued behind the barrier")
    assert stats.active_slots == 1 < stats.capacity  # spare slots exist, yet it waits
    assert execute.blocked == 1
    mark = len(lab.controls.events)
    execute.release()
    _echo(older, 0.0)
    barrier.result()
    _echo(newer, 7.0)
    # the newer request bound the configuration the older barrier published
    events = events_since(lab, "a", mark)
    replacement_load = events.index("load")
    assert events.index("execute") > replacement_load
    assert lab.controls.count("a", "load") == loads + 1
    assert lab.registry.get("a").spec.parameter("tag") == "v2"


@cell("TWO.a-spare-b-ready.req-b")
def test_request_to_b_runs_independently_of_running_a(lab_factory):
    lab, execute, (older,) = _a_spare_b_ready(lab_factory)
    b_loads = lab.controls.count("b", "load")
    _echo(lab.infer("b", 6.0), 6.0)  # completes while A's request is still executing
    assert execute.blocked == 1 and lab.status("a").active_slots == 1 and not older.done()
    assert lab.status("b").state is ModelState.READY and lab.controls.count("b", "load") == b_loads
    execute.release()
    _echo(older, 0.0)


@cell("TWO.a-spare-b-ready.reconf-a")
def test_reconfigure_barrier_waits_for_all_older_a_work_despite_spare_slots(lab_factory):
    lab, execute, older = _a_spare_b_ready(lab_factory, running=2)
    loads, closed = lab.controls.count("a", "load"), lab.controls.count("a", "close_engine")
    reconfigure = lab.register("a", options={"tag": "v2"}, name="reconfigure")
    wait_admission(lab, "a", lambda s: s.queued_managers == 1, "reconfigure queued")
    later = lab.infer("a", 8.0, name="later")
    stats = wait_admission(lab, "a", lambda s: s.queued_requests == 1, "later request behind the barrier")
    assert stats.active_slots == 2 < stats.capacity
    # nothing was torn down or loaded while older work runs
    assert lab.controls.count("a", "close_engine") == closed and lab.controls.count("a", "load") == loads
    assert not reconfigure.done() and lab.status("a").state is ModelState.READY
    mark = len(lab.controls.events)
    execute.release()
    for index, op in enumerate(older):
        _echo(op, float(index))
    assert reconfigure.result() is not None
    _echo(later, 8.0)
    status = lab.status("a")
    assert status.state is ModelState.READY and status.loaded
    assert lab.registry.get("a").spec.parameter("tag") == "v2"
    assert lab.controls.count("a", "load") == loads + 1
    assert lab.controls.count("a", "close_engine") == closed + 1
    events = events_since(lab, "a", mark)
    # old pool retired, replacement loaded, then the later request ran on it
    assert events.index("close_engine") < events.index("load") < events.index("execute")
    assert lab.status("b").state is ModelState.READY


@cell("TWO.a-spare-b-ready.unload-a")
def test_unload_barrier_waits_for_all_older_a_work_despite_spare_slots(lab_factory):
    lab, execute, older = _a_spare_b_ready(lab_factory, running=2)
    closed = lab.controls.count("a", "close_engine")
    unload = lab.unload("a", name="unload")
    wait_admission(lab, "a", lambda s: s.queued_managers == 1, "unload queued")
    later = lab.infer("a", 8.0, name="later")
    stats = wait_admission(lab, "a", lambda s: s.queued_requests == 1, "later request behind the barrier")
    assert stats.active_slots == 2 < stats.capacity
    assert lab.controls.count("a", "close_engine") == closed and not unload.done()
    load = lab.gate("a", "load").hold()  # keeps the later request's reload visible
    execute.release()
    for index, op in enumerate(older):
        _echo(op, float(index))
    assert unload.result().loaded is False
    assert lab.controls.count("a", "close_engine") == closed + 1
    load.wait_blocked(1)  # the later request reloads only after the unload
    assert lab.status("a").state is ModelState.LOADING
    load.release()
    _echo(later, 8.0)


@cell("TWO.a-spare-b-ready.unload-ab")
def test_bulk_unload_retires_idle_b_first_then_drains_a(lab_factory):
    lab, execute, (older,) = _a_spare_b_ready(lab_factory)
    closed_a, closed_b = lab.controls.count("a", "close_engine"), lab.controls.count("b", "close_engine")
    bulk = lab.unload_many(["a", "b"])
    lab.wait_state("b", ModelState.UNLOADED)
    assert lab.controls.count("b", "close_engine") == closed_b + 1
    status = lab.status("a")
    assert status.loaded and status.active_slots == 1 and admission_stats(lab, "a").queued_managers == 1
    assert lab.controls.count("a", "close_engine") == closed_a and not bulk.done()
    execute.release()
    _echo(older, 0.0)
    assert bulk.result() == (["a", "b"], [])
    for model in "ab":
        assert lab.status(model).state is ModelState.UNLOADED
    assert lab.controls.count("a", "close_engine") == closed_a + 1
