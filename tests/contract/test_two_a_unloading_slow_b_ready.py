"""Contract, two-model situations: A unloading slowly; B ready (TWO.a-unloading-slow-b-ready.*).

A's unload holds its exclusive lease while its teardown is held at A's teardown gate.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.core.lifecycle import ModelState
from tests.contract.harness import admission_stats, events_since, wait_admission

cell = pytest.mark.cell


def _echo(op, value: float) -> None:
    np.testing.assert_array_equal(op.result()["OUTPUT0"], np.full(2, value, np.float32))


def _a_unloading_slow_b_ready(lab_factory):
    lab = lab_factory({"a": {}, "b": {}})
    teardown = lab.gate("a", "teardown").hold()
    unload = lab.unload("a", name="slow-unload")
    teardown.wait_blocked(1)
    a = lab.status("a")
    # logical residency is cleared first while the physical teardown continues
    assert a.state is ModelState.UNLOADING and not a.loaded and a.max_parallel_slots is None and a.manager_active
    assert lab.status("b").state is ModelState.READY
    return lab, teardown, unload


@cell("TWO.a-unloading-slow-b-ready.req-a")
def test_request_to_unloading_a_waits_then_reloads_and_runs(lab_factory):
    lab, teardown, unload = _a_unloading_slow_b_ready(lab_factory)
    loads = lab.controls.count("a", "load")
    request = lab.infer("a", 3.0, name="request")
    wait_admission(lab, "a", lambda s: s.queued_requests == 1, "request queued behind the unload")
    assert not request.done() and lab.controls.count("a", "load") == loads
    mark = len(lab.controls.events)
    teardown.release()
    assert unload.result() is not None
    _echo(request, 3.0)
    events = events_since(lab, "a", mark)
    assert events.index("close_engine") < events.index("load") < events.index("execute")
    assert lab.controls.count("a", "load") == loads + 1
    status = lab.status("a")
    assert status.state is ModelState.READY and status.loaded


@cell("TWO.a-unloading-slow-b-ready.req-b")
def test_warm_b_runs_without_waiting_for_a_destructor(lab_factory):
    lab, teardown, unload = _a_unloading_slow_b_ready(lab_factory)
    b_loads = lab.controls.count("b", "load")
    _echo(lab.infer("b", 2.0), 2.0)
    # the registry answers too (no registry lock across A's teardown); bounded, so a regression fails, not hangs
    statuses = {status.name: status for status in lab.start("list-models", lab.registry.statuses).result()}
    assert statuses["a"].state is ModelState.UNLOADING and statuses["b"].state is ModelState.READY
    assert teardown.blocked == 1 and not unload.done()
    assert lab.controls.count("b", "load") == b_loads and lab.status("b").state is ModelState.READY
    teardown.release()
    assert unload.result().loaded is False


@cell("TWO.a-unloading-slow-b-ready.reconf-a")
def test_reconfigure_unloading_a_waits_for_teardown_then_loads(lab_factory):
    lab, teardown, unload = _a_unloading_slow_b_ready(lab_factory)
    loads = lab.controls.count("a", "load")
    reconfigure = lab.register("a", options={"tag": "v2"}, name="reconfigure")
    wait_admission(lab, "a", lambda s: s.queued_managers == 1, "reconfigure queued behind the unload")
    assert not reconfigure.done() and lab.controls.count("a", "load") == loads
    mark = len(lab.controls.events)
    teardown.release()
    assert unload.result() is not None
    result = reconfigure.result()
    assert result.loaded and result.state is ModelState.READY
    events = events_since(lab, "a", mark)
    assert events.index("close_engine") < events.index("load")
    assert lab.controls.count("a", "load") == loads + 1
    assert lab.registry.get("a").spec.parameter("tag") == "v2"


@cell("TWO.a-unloading-slow-b-ready.unload-a")
def test_second_unload_waits_then_is_idempotent(lab_factory):
    lab, teardown, unload = _a_unloading_slow_b_ready(lab_factory)
    closed = lab.controls.count("a", "close_engine")
    arrivals = teardown.arrivals
    second = lab.unload("a", name="second")
    wait_admission(lab, "a", lambda s: s.queued_managers == 1, "second unload queued")
    assert not second.done()
    teardown.release()
    assert unload.result().loaded is False
    result = second.result()
    assert result.loaded is False and result.state is ModelState.UNLOADED
    assert teardown.arrivals == arrivals  # torn down once
    assert lab.controls.count("a", "close_engine") == closed + 1
    assert admission_stats(lab, "a").queued == 0 and not admission_stats(lab, "a").manager_active


@cell("TWO.a-unloading-slow-b-ready.unload-ab")
def test_bulk_unload_frees_ready_idle_b_before_waiting_for_a(lab_factory):
    lab, teardown, unload = _a_unloading_slow_b_ready(lab_factory)
    closed_a, closed_b = lab.controls.count("a", "close_engine"), lab.controls.count("b", "close_engine")
    bulk = lab.unload_many(["a", "b"])
    lab.wait_state("b", ModelState.UNLOADED)
    assert lab.controls.count("b", "close_engine") == closed_b + 1
    assert teardown.blocked == 1 and admission_stats(lab, "a").queued_managers == 1 and not bulk.done()
    teardown.release()
    assert unload.result() is not None
    assert bulk.result() == (["a", "b"], [])
    for model in "ab":
        assert lab.status(model).state is ModelState.UNLOADED
    assert lab.controls.count("a", "close_engine") == closed_a + 1  # the slow unload's teardown only
