"""Contract, two-model situations: A unloaded; B ready (TWO.a-unloaded-b-ready.*)."""

from __future__ import annotations

import numpy as np
import pytest

from service.core.lifecycle import ModelState
from tests.contract.harness import admission_stats, wait_admission

cell = pytest.mark.cell


def _echo(op, value: float) -> None:
    np.testing.assert_array_equal(op.result()["OUTPUT0"], np.full(2, value, np.float32))


def _a_unloaded_b_ready(lab_factory, **options):
    lab = lab_factory({"a": {}, "b": {}}, **options)
    assert lab.unload("a").result().loaded is False
    a, b = lab.status("a"), lab.status("b")
    assert a.state is ModelState.UNLOADED and not a.loaded and a.max_parallel_slots is None
    assert b.state is ModelState.READY and b.loaded
    return lab


@cell("TWO.a-unloaded-b-ready.req-a")
def test_request_to_unloaded_a_initializes_and_runs_while_b_stays_ready(lab_factory):
    lab = _a_unloaded_b_ready(lab_factory)
    a_loads, a_clones = lab.controls.count("a", "load"), lab.controls.count("a", "clone")
    b_loads = lab.controls.count("b", "load")
    load = lab.gate("a", "load").hold()
    request = lab.infer("a", 3.0)
    load.wait_blocked(1)
    # Admitted (owns a slot, counts as active) and initializing: the one initializer is at the load.
    loading = lab.status("a")
    assert loading.state is ModelState.LOADING and loading.active_slots == 1 and not loading.loaded
    assert lab.status("b").state is ModelState.READY
    load.release()
    _echo(request, 3.0)
    ready = lab.status("a")
    assert ready.state is ModelState.READY and ready.loaded and ready.active_slots == 0
    assert lab.controls.count("a", "load") == a_loads + 1
    assert lab.controls.count("a", "clone") == a_clones + min(ready.slots, ready.max_parallel_slots)
    assert lab.controls.count("b", "load") == b_loads  # B untouched
    assert lab.status("b").state is ModelState.READY


@cell("TWO.a-unloaded-b-ready.req-b")
def test_request_to_ready_b_runs_on_a_spare_slot_and_a_stays_unloaded(lab_factory):
    lab = _a_unloaded_b_ready(lab_factory)
    a_loads, b_loads = lab.controls.count("a", "load"), lab.controls.count("b", "load")
    slots = lab.status("b").slots
    assert slots >= 2
    execute = lab.gate("b", "execute").hold()
    ops = []
    for index in range(slots):
        ops.append(lab.infer("b", float(index)))
        execute.wait_blocked(index + 1)  # each one ran on a spare slot, none queued
    status = lab.status("b")
    assert status.active_slots == slots and admission_stats(lab, "b").queued == 0
    execute.release()
    for index, op in enumerate(ops):
        _echo(op, float(index))
    assert lab.status("b").state is ModelState.READY
    assert lab.controls.count("b", "load") == b_loads  # warm: no reload
    assert lab.controls.count("a", "load") == a_loads
    assert lab.status("a").state is ModelState.UNLOADED


@cell("TWO.a-unloaded-b-ready.reconf-a")
def test_reconfigure_unloaded_a_validates_and_loads_exclusively(lab_factory):
    lab = _a_unloaded_b_ready(lab_factory)
    a_loads, b_loads = lab.controls.count("a", "load"), lab.controls.count("b", "load")
    load = lab.gate("a", "load").hold()
    arrivals = load.arrivals
    reconfigure = lab.register("a", options={"tag": "v2"})
    load.wait_blocked(1)
    status = lab.status("a")
    assert status.state is ModelState.LOADING and status.manager_active and status.active_slots == 0
    # Exclusive: a request arriving meanwhile queues behind the manager and does not start its own load.
    request = lab.infer("a", 5.0)
    wait_admission(lab, "a", lambda s: s.queued_requests == 1, "request queued behind the manager")
    assert load.arrivals == arrivals + 1 and not reconfigure.done()
    load.release()
    result = reconfigure.result()
    assert result.loaded  # a later request never unloads, so the status the call returns shows its load
    _echo(request, 5.0)
    assert lab.status("a").state is ModelState.READY
    assert lab.registry.get("a").spec.parameter("tag") == "v2"
    assert lab.controls.count("a", "load") == a_loads + 1  # one load: the manager's, shared by the request
    assert lab.controls.count("b", "load") == b_loads and lab.status("b").state is ModelState.READY


@cell("TWO.a-unloaded-b-ready.unload-a")
def test_unload_unloaded_a_is_idempotent_and_b_stays_ready(lab_factory):
    lab = _a_unloaded_b_ready(lab_factory)
    closed_a, closed_b = lab.controls.count("a", "close_engine"), lab.controls.count("b", "close_engine")
    teardown = lab.gate("a", "teardown").hold()  # an unload that tore anything down would hang here
    arrivals = teardown.arrivals
    result = lab.unload("a").result()
    assert result.loaded is False and result.state is ModelState.UNLOADED and result.max_parallel_slots is None
    assert teardown.arrivals == arrivals and lab.controls.count("a", "close_engine") == closed_a
    assert lab.controls.count("b", "close_engine") == closed_b
    b = lab.status("b")
    assert b.state is ModelState.READY and b.loaded


@cell("TWO.a-unloaded-b-ready.unload-ab")
def test_bulk_unload_frees_ready_idle_b_and_drains_unloaded_a(lab_factory):
    lab = _a_unloaded_b_ready(lab_factory)
    closed_a, closed_b = lab.controls.count("a", "close_engine"), lab.controls.count("b", "close_engine")
    unloaded, not_found = lab.unload_many(["a", "b"]).result()
    assert unloaded == ["a", "b"] and not_found == []  # each once, unloaded A included
    for model in "ab":
        status = lab.status(model)
        assert status.state is ModelState.UNLOADED and not status.loaded and status.max_parallel_slots is None
        assert admission_stats(lab, model).queued == 0 and not admission_stats(lab, model).manager_active
    assert lab.controls.count("b", "close_engine") == closed_b + 1
    assert lab.controls.count("a", "close_engine") == closed_a  # nothing left to tear down
