"""Contract, two-model situations: A reconfiguring; B running (TWO.a-reconf-b-running.*).

A's reconfiguration (a changed option, so a new engine) holds its exclusive lease and is held while it retires
the old pool (at A's teardown gate): whether the replacement's primary is loaded privately before that
retirement or after it, A is reconfiguring, logically unloaded, with its manager active. B has a request held at
B's execute gate on one of its two slots. `base` holds A's fixture counters from before the reconfiguration.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.core.lifecycle import ModelState
from tests.contract.harness import admission_stats, events_since, wait_admission

cell = pytest.mark.cell


def _echo(op, value: float) -> None:
    np.testing.assert_array_equal(op.result()["OUTPUT0"], np.full(2, value, np.float32))


def _a_reconf_b_running(lab_factory):
    lab = lab_factory({"a": {}, "b": {}}, parallel_jobs=2)
    b_execute = lab.gate("b", "execute").hold()
    b_running = lab.infer("b", 1.0, name="b-running")
    b_execute.wait_blocked(1)
    base = {
        "load": lab.controls.count("a", "load"),
        "close_engine": lab.controls.count("a", "close_engine"),
        "mark": len(lab.controls.events),
    }
    a_teardown = lab.gate("a", "teardown").hold()
    reconfigure = lab.register("a", options={"tag": "v2"}, name="reconfigure")
    a_teardown.wait_blocked(1)
    a = lab.status("a")
    assert a.state is ModelState.RECONFIGURING and a.manager_active and not a.loaded
    b = lab.status("b")
    assert b.state is ModelState.READY and b.active_slots == 1 < b.slots
    return lab, a_teardown, reconfigure, b_execute, b_running, base


def _last(events: list[str], event: str) -> int:
    return max(i for i, e in enumerate(events) if e == event)


@cell("TWO.a-reconf-b-running.req-a")
def test_request_to_reconfiguring_a_waits_for_the_manager_and_binds_the_new_config(lab_factory):
    lab, a_teardown, reconfigure, b_execute, b_running, base = _a_reconf_b_running(lab_factory)
    request = lab.infer("a", 4.0, name="request")
    wait_admission(lab, "a", lambda s: s.queued_requests == 1, "request queued behind the manager")
    assert not request.done() and lab.status("a").active_slots == 0
    a_teardown.release()
    assert reconfigure.result() is not None
    _echo(request, 4.0)
    events = events_since(lab, "a", base["mark"])
    # it ran after the old pool was retired and the replacement loaded: on the new configuration
    assert max(events.index("load"), events.index("close_engine")) < events.index("execute")
    assert lab.controls.count("a", "load") == base["load"] + 1  # and started no load of its own
    assert lab.registry.get("a").spec.parameter("tag") == "v2"
    assert lab.status("a").state is ModelState.READY
    assert b_execute.blocked == 1 and not b_running.done()  # B's work was never involved
    b_execute.release()
    _echo(b_running, 1.0)


@cell("TWO.a-reconf-b-running.req-b")
def test_request_to_running_b_uses_a_spare_slot_or_queues_while_a_reconfigures(lab_factory):
    lab, a_teardown, reconfigure, b_execute, b_running, base = _a_reconf_b_running(lab_factory)
    spare = lab.infer("b", 2.0, name="spare")
    b_execute.wait_blocked(2)  # the spare B slot runs it
    full = lab.infer("b", 3.0, name="full")
    wait_admission(lab, "b", lambda s: s.queued_requests == 1, "B full: request queued")
    b_execute.release()
    for op, value in ((b_running, 1.0), (spare, 2.0), (full, 3.0)):
        _echo(op, value)
    # all of B's work finished while A is still reconfiguring
    assert a_teardown.blocked == 1 and lab.status("a").state is ModelState.RECONFIGURING and not reconfigure.done()
    assert lab.status("b").state is ModelState.READY
    a_teardown.release()
    reconfigure.result()
    assert lab.status("a").state is ModelState.READY


@cell("TWO.a-reconf-b-running.reconf-a")
def test_second_reconfigure_queues_behind_the_a_manager_and_wins_last(lab_factory):
    lab, a_teardown, reconfigure, b_execute, b_running, base = _a_reconf_b_running(lab_factory)
    arrivals = a_teardown.arrivals
    second = lab.register("a", options={"tag": "v3"}, name="second")
    wait_admission(lab, "a", lambda s: s.queued_managers == 1, "second manager queued")
    assert a_teardown.arrivals == arrivals and not second.done()
    assert lab.registry.get("a").spec.parameter("tag") == "v2"  # the first manager's committed config
    a_teardown.release()
    assert reconfigure.result() is not None
    final = second.result()
    assert final.loaded and final.state is ModelState.READY
    assert lab.registry.get("a").spec.parameter("tag") == "v3"
    # the first manager's replacement, then the second's (a changed engine again: retire and load)
    assert lab.controls.count("a", "load") == base["load"] + 2
    assert lab.controls.count("a", "close_engine") == base["close_engine"] + 2
    b_execute.release()
    _echo(b_running, 1.0)


@cell("TWO.a-reconf-b-running.unload-a")
def test_unload_queues_behind_the_a_manager_then_unloads(lab_factory):
    lab, a_teardown, reconfigure, b_execute, b_running, base = _a_reconf_b_running(lab_factory)
    unload = lab.unload("a", name="unload")
    wait_admission(lab, "a", lambda s: s.queued_managers == 1, "unload queued")
    assert not unload.done()
    a_teardown.release()
    assert reconfigure.result() is not None
    assert unload.result().loaded is False
    events = events_since(lab, "a", base["mark"])
    assert _last(events, "load") < _last(events, "close_engine")  # the replacement was published, then retired
    assert lab.controls.count("a", "load") == base["load"] + 1
    assert lab.controls.count("a", "close_engine") == base["close_engine"] + 2  # old pool, then replacement
    status = lab.status("a")
    assert status.state is ModelState.UNLOADED and status.max_parallel_slots is None
    assert lab.registry.get("a").spec.parameter("tag") == "v2"  # the new metadata stays registered
    b_execute.release()
    _echo(b_running, 1.0)


@cell("TWO.a-reconf-b-running.unload-ab")
def test_bulk_unload_barrier_on_a_waits_the_manager_and_on_b_the_older_request(lab_factory):
    lab, a_teardown, reconfigure, b_execute, b_running, base = _a_reconf_b_running(lab_factory)
    closed_b = lab.controls.count("b", "close_engine")
    bulk = lab.unload_many(["a", "b"])
    wait_admission(lab, "a", lambda s: s.queued_managers == 1, "barrier on a behind the manager")
    wait_admission(lab, "b", lambda s: s.queued_managers == 1, "barrier on b behind the running request")
    b_execute.release()
    _echo(b_running, 1.0)
    lab.wait_state("b", ModelState.UNLOADED)  # B is freed while A's manager still holds A
    assert lab.controls.count("b", "close_engine") == closed_b + 1
    assert lab.status("a").state is ModelState.RECONFIGURING and not bulk.done()
    a_teardown.release()
    assert reconfigure.result() is not None
    assert bulk.result() == (["a", "b"], [])
    for model in "ab":
        assert lab.status(model).state is ModelState.UNLOADED
    assert lab.controls.count("a", "load") == base["load"] + 1
    assert lab.controls.count("a", "close_engine") == base["close_engine"] + 2  # old pool, then replacement
    assert admission_stats(lab, "a").queued == 0 and not admission_stats(lab, "a").manager_active
