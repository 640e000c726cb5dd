"""Contract, two-model situations: A full with queued requests; B ready (TWO.a-full-queued-b-ready.*).

One slot per model (--parallel-jobs 1): A's holder is held at A's execute gate and older requests queue behind
it. With one slot, `infer_logged`'s log is A's grant order.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.core.errors import AdmissionTimeout, ServerBusy
from service.core.lifecycle import ModelState
from tests.contract.harness import admission_stats, events_since, infer_logged, wait_admission

cell = pytest.mark.cell


def _echo(op, value: float) -> None:
    np.testing.assert_array_equal(op.result()["OUTPUT0"], np.full(2, value, np.float32))


def _a_full_queued_b_ready(lab_factory, queued: int = 2):
    lab = lab_factory({"a": {}, "b": {}}, parallel_jobs=1)
    execute = lab.gate("a", "execute").hold()
    log: list[str] = []
    ops = {"holder": infer_logged(lab, "a", log, "holder", 0.0)}
    execute.wait_blocked(1)
    for index in range(1, queued + 1):
        ops[f"q{index}"] = infer_logged(lab, "a", log, f"q{index}", float(index))
        wait_admission(lab, "a", lambda s, n=index: s.queued_requests == n, f"{index} queued on a")
    stats = admission_stats(lab, "a")
    assert stats.active_slots == stats.capacity == 1 and stats.queued_requests == queued
    assert lab.status("b").state is ModelState.READY
    return lab, execute, log, ops


def _values(ops) -> dict[str, float]:
    return {label: (0.0 if label == "holder" else float(label[1:])) for label in ops}


@cell("TWO.a-full-queued-b-ready.req-a")
def test_request_to_full_a_queues_fifo_behind_older_waiters(lab_factory):
    lab, execute, log, ops = _a_full_queued_b_ready(lab_factory)
    expected = list(ops) + ["newest"]
    newest = infer_logged(lab, "a", log, "newest", 9.0)
    wait_admission(lab, "a", lambda s: s.queued_requests == len(ops), "newest queued")
    assert log == ["holder"]
    execute.release()
    for label, value in _values(ops).items():
        _echo(ops[label], value)
    _echo(newest, 9.0)
    assert log == expected  # granted strictly in arrival order
    status = lab.status("a")
    assert status.state is ModelState.READY and status.active_slots == 0 and status.queued_requests == 0


@cell("TWO.a-full-queued-b-ready.req-a")
def test_request_to_full_a_times_out_with_server_busy_and_leaves_the_queue(lab_factory):
    lab, execute, log, ops = _a_full_queued_b_ready(lab_factory)
    before = admission_stats(lab, "a")
    late = lab.infer("a", 9.0, timeout=0.2, name="late")
    error = late.error()
    assert isinstance(error, AdmissionTimeout) and isinstance(error, ServerBusy)
    assert "server_busy" in str(error)
    after = admission_stats(lab, "a")
    # its queued ownership was removed; the older waiters and the holder are untouched
    assert after.queued_requests == before.queued_requests and after.active_slots == before.active_slots
    assert after.expired_total == before.expired_total + 1
    execute.release()
    for label, value in _values(ops).items():
        _echo(ops[label], value)
    assert log == list(ops)
    assert lab.status("a").state is ModelState.READY


@cell("TWO.a-full-queued-b-ready.req-b")
def test_request_to_b_runs_independently_of_full_queued_a(lab_factory):
    lab, execute, log, ops = _a_full_queued_b_ready(lab_factory)
    before = admission_stats(lab, "a")
    _echo(lab.infer("b", 5.0), 5.0)
    after = admission_stats(lab, "a")
    assert (after.active_slots, after.queued_requests) == (before.active_slots, before.queued_requests)
    assert log == ["holder"] and lab.status("b").state is ModelState.READY
    execute.release()
    for label, value in _values(ops).items():
        _echo(ops[label], value)


@cell("TWO.a-full-queued-b-ready.reconf-a")
def test_reconfigure_full_a_lets_older_queued_requests_run_first(lab_factory):
    lab, execute, log, ops = _a_full_queued_b_ready(lab_factory)
    loads, closed = lab.controls.count("a", "load"), lab.controls.count("a", "close_engine")
    reconfigure = lab.register("a", options={"tag": "v2"}, name="reconfigure")
    wait_admission(lab, "a", lambda s: s.queued_managers == 1, "reconfigure queued")
    later = infer_logged(lab, "a", log, "later", 8.0)
    wait_admission(lab, "a", lambda s: s.queued_requests == len(ops), "later request queued")
    mark = len(lab.controls.events)
    execute.release()
    for label, value in _values(ops).items():
        _echo(ops[label], value)
    assert reconfigure.result() is not None
    _echo(later, 8.0)
    assert log == list(ops) + ["later"]
    events = events_since(lab, "a", mark)
    executes = [i for i, event in enumerate(events) if event == "execute"]
    replacement = events.index("load")
    older_queued = len(ops) - 1  # the holder's execute was recorded before the mark
    assert len(executes) == older_queued + 1
    retired = events.index("close_engine")
    # older queued requests ran on the old pool; the manager then retired it and loaded the replacement (in
    # either order); the later request ran on the replacement
    assert max(executes[:older_queued]) < min(retired, replacement)
    assert max(retired, replacement) < executes[-1]
    assert lab.controls.count("a", "load") == loads + 1 and lab.controls.count("a", "close_engine") == closed + 1
    assert lab.registry.get("a").spec.parameter("tag") == "v2"
    assert lab.status("a").state is ModelState.READY


@cell("TWO.a-full-queued-b-ready.unload-a")
def test_unload_full_a_lets_older_work_run_first(lab_factory):
    lab, execute, log, ops = _a_full_queued_b_ready(lab_factory)
    closed = lab.controls.count("a", "close_engine")
    unload = lab.unload("a", name="unload")
    wait_admission(lab, "a", lambda s: s.queued_managers == 1, "unload queued")
    assert not unload.done() and lab.controls.count("a", "close_engine") == closed
    mark = len(lab.controls.events)
    execute.release()
    for label, value in _values(ops).items():
        _echo(ops[label], value)
    assert unload.result().loaded is False
    assert log == list(ops)
    events = events_since(lab, "a", mark)
    assert events.count("execute") == len(ops) - 1
    assert max(i for i, e in enumerate(events) if e == "execute") < events.index("close_engine")
    assert lab.controls.count("a", "close_engine") == closed + 1
    status = lab.status("a")
    assert status.state is ModelState.UNLOADED and not status.loaded


@cell("TWO.a-full-queued-b-ready.unload-ab")
def test_bulk_unload_publishes_both_barriers_frees_idle_b_and_drains_a(lab_factory):
    lab, execute, log, ops = _a_full_queued_b_ready(lab_factory)
    closed_a, closed_b = lab.controls.count("a", "close_engine"), lab.controls.count("b", "close_engine")
    bulk = lab.unload_many(["a", "b"])
    lab.wait_state("b", ModelState.UNLOADED)
    assert lab.controls.count("b", "close_engine") == closed_b + 1
    stats = admission_stats(lab, "a")
    assert stats.queued_managers == 1 and stats.queued_requests == len(ops) - 1 and stats.active_slots == 1
    assert lab.status("a").loaded and not bulk.done()
    mark = len(lab.controls.events)
    execute.release()
    for label, value in _values(ops).items():
        _echo(ops[label], value)
    assert bulk.result() == (["a", "b"], [])
    events = events_since(lab, "a", mark)
    assert max(i for i, e in enumerate(events) if e == "execute") < events.index("close_engine")
    for model in "ab":
        assert lab.status(model).state is ModelState.UNLOADED
    assert lab.controls.count("a", "close_engine") == closed_a + 1
