"""Contract, two-model situations: A running with spare slots; B ready (TWO.a-spare-b-ready.*).

A has three slots; requests held at A's execute gate occupy some of them and leave at least one spare.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from service.core.lifecycle import ModelState
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
    assert max(events.index("close_engine"), events.index("load")) < events.index("execute")
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
    # the barrier retired the old pool and loaded the replacement (either order), then the later request ran
    assert max(events.index("close_engine"), events.index("load")) < events.index("execute")
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


def _pause_after_release(lab, model: str, thread_prefix: str, until, what: str) -> None:
    """Force one legal interleaving: when the operation running on the thread named `thread_prefix...` releases
    its exclusive lease on `model`, it pauses there until `until(status)` holds (the next owner has acted),
    before it builds its response. Observation only: wraps the entry's own method."""
    entry = lab.registry.get(model)
    original = entry._release_exclusive

    def release_exclusive(ticket):
        original(ticket)
        if threading.current_thread().name.startswith(thread_prefix):
            lab.wait_status(model, until, what)

    entry._release_exclusive = release_exclusive


@cell("TWO.a-spare-b-ready.unload-a")
def test_unload_response_reports_its_own_outcome_when_a_later_request_reloads_first(lab_factory):
    """The unload's 200 response says loaded=false (its outcome), whatever the next owner does after it."""
    lab, execute, older = _a_spare_b_ready(lab_factory, running=2)
    unload = lab.unload("a", name="unload")
    wait_admission(lab, "a", lambda s: s.queued_managers == 1, "unload queued")
    later = lab.infer("a", 8.0, name="later")
    wait_admission(lab, "a", lambda s: s.queued_requests == 1, "later request behind the barrier")
    _pause_after_release(lab, "a", "unload", lambda s: s.loaded, "the later request reloaded A")
    execute.release()
    for index, op in enumerate(older):
        _echo(op, float(index))
    _echo(later, 8.0)
    result = unload.result()
    assert result.loaded is False and result.state is ModelState.UNLOADED, result


@cell("TWO.a-spare-b-ready.reconf-a")
def test_reconfigure_response_reports_its_own_outcome_when_a_later_unload_follows_at_once(lab_factory):
    """The reconfiguration's 200 response says loaded/ready (its outcome), whatever the next manager does."""
    lab, execute, older = _a_spare_b_ready(lab_factory, running=2)
    reconfigure = lab.register("a", options={"tag": "v2"}, name="reconfigure")
    wait_admission(lab, "a", lambda s: s.queued_managers == 1, "reconfigure queued")
    unload = lab.unload("a", name="unload")
    wait_admission(lab, "a", lambda s: s.queued_managers == 2, "unload queued behind it")
    _pause_after_release(lab, "a", "reconfigure", lambda s: not s.loaded, "the later unload retired A")
    execute.release()
    for index, op in enumerate(older):
        _echo(op, float(index))
    result = reconfigure.result()
    assert unload.result().loaded is False
    assert result.loaded and result.state is ModelState.READY, result
