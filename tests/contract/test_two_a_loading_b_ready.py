"""Contract, two-model situations: A loading; B ready (TWO.a-loading-b-ready.*).

A is loading because its first request is the one initializer, held at A's load gate while it holds the only
cold-load permit (--max-concurrent-loads 1).
"""

from __future__ import annotations

import numpy as np
import pytest

from service.core.lifecycle import ModelState
from service.core.residency import ColdLoadStatistics
from tests.contract.harness import admission_stats, events_since, wait_admission

cell = pytest.mark.cell


def _echo(op, value: float) -> None:
    np.testing.assert_array_equal(op.result()["OUTPUT0"], np.full(2, value, np.float32))


def _a_loading_b_ready(lab_factory):
    lab = lab_factory({"a": {}, "b": {}}, max_concurrent_loads=1)
    lab.unload("a").result()
    load = lab.gate("a", "load").hold()
    first = lab.infer("a", 1.0, name="a-first")
    load.wait_blocked(1)
    status = lab.status("a")
    assert status.state is ModelState.LOADING and not status.loaded and status.active_slots == 1
    assert lab.status("b").state is ModelState.READY
    assert lab.runtime.cold_loads.statistics() == ColdLoadStatistics(
        running=1, waiting=0
    )  # A's initializer holds the only cold-load permit
    return lab, load, first


@cell("TWO.a-loading-b-ready.req-a")
def test_request_to_loading_a_is_admitted_to_wait_for_initialization_or_queues(lab_factory):
    lab, load, first = _a_loading_b_ready(lab_factory)
    loads = lab.controls.count("a", "load")
    slots = lab.status("a").slots
    waiting = []
    for index in range(1, slots):  # spare slots admit and wait on the one initialization
        waiting.append(lab.infer("a", float(index + 1)))
        lab.wait_active("a", index + 1)
    queued = lab.infer("a", 9.0)  # the pool is full: this one queues
    wait_admission(lab, "a", lambda s: s.queued_requests == 1, "request queued on a full loading A")
    assert load.blocked == 1 and lab.controls.count("a", "load") == loads  # nobody started a second load
    assert lab.status("a").state is ModelState.LOADING
    load.release()
    _echo(first, 1.0)
    for index, op in enumerate(waiting, start=1):
        _echo(op, float(index + 1))
    _echo(queued, 9.0)
    assert lab.controls.count("a", "load") == loads + 1  # one initialization, shared
    status = lab.status("a")
    assert status.state is ModelState.READY and status.loaded and status.active_slots == 0
    assert lab.controls.events.count(("a", "execute")) >= slots + 1


@cell("TWO.a-loading-b-ready.req-b")
def test_warm_b_bypasses_a_initialization_and_the_cold_load_guard(lab_factory):
    lab, load, first = _a_loading_b_ready(lab_factory)
    b_loads = lab.controls.count("b", "load")
    warm = lab.infer("b", 4.0)
    _echo(warm, 4.0)  # completes while A's load is held and the single cold-load permit is taken
    assert load.blocked == 1 and lab.status("a").state is ModelState.LOADING
    assert lab.runtime.cold_loads.statistics() == ColdLoadStatistics(
        running=1, waiting=0
    )  # B never queued on the guard
    assert lab.controls.count("b", "load") == b_loads
    assert lab.status("b").state is ModelState.READY
    assert not first.done()
    load.release()
    _echo(first, 1.0)
    assert lab.status("a").state is ModelState.READY


@cell("TWO.a-loading-b-ready.reconf-a")
def test_reconfigure_loading_a_waits_for_older_leases_then_publishes_the_replacement(lab_factory):
    lab, load, first = _a_loading_b_ready(lab_factory)
    loads, closed = lab.controls.count("a", "load"), lab.controls.count("a", "close_engine")
    arrivals = load.arrivals
    reconfigure = lab.register("a", options={"tag": "v2"})
    wait_admission(lab, "a", lambda s: s.queued_managers == 1, "manager queued behind the loading request")
    assert not reconfigure.done() and load.arrivals == arrivals and lab.status("a").state is ModelState.LOADING
    mark = len(lab.controls.events)
    load.release()
    _echo(first, 1.0)
    assert reconfigure.result().loaded
    status = lab.status("a")
    assert status.state is ModelState.READY and status.loaded
    assert lab.registry.get("a").spec.parameter("tag") == "v2"
    assert lab.controls.count("a", "load") == loads + 2  # the first load, then the replacement
    assert lab.controls.count("a", "close_engine") == closed + 1  # the first pool was retired
    events = events_since(lab, "a", mark)
    # the older request ran on the first pool before that pool was retired and the replacement loaded
    first_load, replacement_load = [i for i, event in enumerate(events) if event == "load"]
    assert first_load < events.index("execute") < min(events.index("close_engine"), replacement_load)
    assert lab.status("b").state is ModelState.READY


@cell("TWO.a-loading-b-ready.unload-a")
def test_unload_loading_a_waits_for_the_first_load_and_older_work(lab_factory):
    lab, load, first = _a_loading_b_ready(lab_factory)
    loads, closed = lab.controls.count("a", "load"), lab.controls.count("a", "close_engine")
    unload = lab.unload("a")
    wait_admission(lab, "a", lambda s: s.queued_managers == 1, "unload queued behind the loading request")
    assert not unload.done() and lab.controls.count("a", "close_engine") == closed
    mark = len(lab.controls.events)
    load.release()
    _echo(first, 1.0)
    assert unload.result().loaded is False
    status = lab.status("a")
    assert status.state is ModelState.UNLOADED and not status.loaded and status.max_parallel_slots is None
    assert lab.controls.count("a", "load") == loads + 1
    assert lab.controls.count("a", "close_engine") == closed + 1
    events = events_since(lab, "a", mark)
    assert events.index("load") < events.index("execute") < events.index("close_engine")
    assert lab.status("b").state is ModelState.READY


@cell("TWO.a-loading-b-ready.unload-ab")
def test_bulk_unload_frees_idle_b_before_loading_a_finishes(lab_factory):
    lab, load, first = _a_loading_b_ready(lab_factory)
    closed_a, closed_b = lab.controls.count("a", "close_engine"), lab.controls.count("b", "close_engine")
    bulk = lab.unload_many(["a", "b"])  # A first in the selection: a sequential unload would block on it
    lab.wait_state("b", ModelState.UNLOADED)
    assert lab.controls.count("b", "close_engine") == closed_b + 1
    # A is still loading with the bulk's barrier queued behind its first request
    assert load.blocked == 1 and lab.status("a").state is ModelState.LOADING
    assert admission_stats(lab, "a").queued_managers == 1 and not bulk.done()
    load.release()
    _echo(first, 1.0)
    assert bulk.result() == (["a", "b"], [])
    for model in "ab":
        assert lab.status(model).state is ModelState.UNLOADED
    assert lab.controls.count("a", "close_engine") == closed_a + 1
