"""Contract: admission timeouts (TIME.01-03). Disconnect and shutdown cells (TIME.04-10) are elsewhere."""

from __future__ import annotations

import time

import pytest

from service.core.errors import AdmissionTimeout, OverdueBlockers
from service.core.lifecycle import ModelState
from service.request_path.dataplane import Dataplane

from .harness import FakeClock

cell = pytest.mark.cell


@cell("TIME.01")
def test_request_times_out_at_its_deadline_with_server_busy_and_leaves_the_queue(lab_factory):
    lab = lab_factory({"a": {"capacity": 1}}, parallel_jobs=1, admission_timeout=0.25)
    execute = lab.gate("a", "execute").hold()
    holder = lab.infer("a", name="holder")
    execute.wait_blocked(1)
    started = time.monotonic()
    waiter = lab.infer("a", name="waiter")
    error = waiter.error()
    elapsed = time.monotonic() - started
    assert isinstance(error, AdmissionTimeout) and "server_busy" in str(error)
    assert 0.25 <= elapsed < 2.0  # at the deadline, while the slot was still busy
    status = lab.status("a")
    assert status.queued_requests == 0 and status.active_slots == 1  # queued ownership removed
    assert not holder.done()  # existing work continues
    execute.release()
    holder.result()


@cell("TIME.01")
def test_targeted_manager_times_out_and_later_requests_are_not_blocked_by_it(lab_factory):
    lab = lab_factory({"a": {"capacity": 2}}, parallel_jobs=2, admission_timeout=0.25)
    execute = lab.gate("a", "execute").hold()
    holder = lab.infer("a", name="holder")
    execute.wait_blocked(1)
    manager = lab.unload("a", name="manager")
    assert isinstance(manager.error(), AdmissionTimeout)
    assert lab.status("a").queued_requests == 0
    execute.release()
    holder.result()
    assert lab.status("a").loaded  # the timed-out unload changed nothing
    assert lab.infer("a").result()["OUTPUT0"][0] == 1.0


@cell("TIME.01")
def test_request_timeout_parameter_can_only_shorten_the_model_ceiling(lab_factory):
    lab = lab_factory({"a": {}}, parallel_jobs=1, admission_timeout=10.0)
    clock = FakeClock()
    dataplane = Dataplane(lab.registry, clock=clock)
    entry = lab.registry.get("a")
    assert dataplane.admission_deadline(entry, 0, None) == clock.now + 10.0
    assert dataplane.admission_deadline(entry, 2_000_000, None) == clock.now + 2.0  # 2 s shortens 10 s
    assert dataplane.admission_deadline(entry, 60_000_000, None) == clock.now + 10.0  # 60 s cannot lengthen
    assert dataplane.admission_deadline(entry, 0, clock.now + 1.0) == clock.now + 1.0  # client deadline
    # the per-model value is capped by the server ceiling
    assert lab.registry.effective_timeout(30.0) == 10.0
    assert lab.registry.effective_timeout(0.0) == 10.0
    assert lab.registry.effective_timeout(3.0) == 3.0


@cell("TIME.02")
def test_healthy_blocker_permits_bounded_waiting_but_all_overdue_blockers_fail_fast(lab_factory):
    clock = FakeClock()
    lab = lab_factory({"a": {"capacity": 2}}, parallel_jobs=2, admission_timeout=5.0, clock=clock)
    execute = lab.gate("a", "execute").hold()
    first = lab.infer("a", name="first")
    execute.wait_blocked(1)
    clock.now += 6.0  # the first slot is now overdue
    second = lab.infer("a", name="second")  # spare capacity: admitted at once
    execute.wait_blocked(2)
    # one overdue and one healthy blocker: a newcomer may wait
    waiter = lab.infer("a", timeout=30.0, name="waits")
    lab.wait_queued("a", requests=1)
    clock.now += 6.0  # now both occupied slots are overdue
    refused = lab.infer("a", timeout=30.0, name="refused")
    assert isinstance(refused.error(), OverdueBlockers)
    assert "server_busy" in str(refused.error())
    assert lab.status("a").queued_requests == 1
    execute.release()
    for op in (first, second, waiter):
        op.result()


@cell("TIME.02")
def test_older_manager_prevents_barging_and_overdue_blockers_fail_fast_behind_it(lab_factory):
    clock = FakeClock()
    lab = lab_factory({"a": {"capacity": 3}}, parallel_jobs=3, admission_timeout=5.0, clock=clock)
    execute = lab.gate("a", "execute").hold()
    holder = lab.infer("a", name="holder")
    execute.wait_blocked(1)
    manager = lab.start("manager", lambda: lab.registry.unload("a"))
    lab.wait_queued("a", managers=1)
    behind = lab.infer("a", timeout=30.0, name="behind-manager")
    lab.wait_queued("a", requests=1, managers=1)  # two slots are spare, yet it waits behind the manager
    clock.now += 6.0
    refused = lab.infer("a", timeout=30.0, name="refused")
    assert isinstance(refused.error(), OverdueBlockers)
    execute.release()
    holder.result()
    manager.result()
    behind.result()
    assert lab.status("a").loaded


@cell("TIME.03")
def test_zero_timeout_waits_without_limit_and_bulk_ignores_the_model_timeout(lab_factory):
    lab = lab_factory({"a": {"capacity": 1}, "b": {"capacity": 1}}, parallel_jobs=1)
    assert lab.status("a").admission_timeout == 0.0
    execute = lab.gate("a", "execute").hold()
    holder = lab.infer("a", name="holder")
    execute.wait_blocked(1)
    unbounded = lab.infer("a", name="unbounded")
    lab.wait_queued("a", requests=1)
    # model b has a short timeout; a bulk unload of b still waits past it
    lab.register("b", admission_timeout=0.2).result()
    execute_b = lab.gate("b", "execute").hold()
    busy_b = lab.infer("b", name="busy-b")
    execute_b.wait_blocked(1)
    bulk = lab.unload_many(["b"])
    lab.wait_queued("b", managers=1)
    single = lab.unload("b", name="single-unload")
    assert isinstance(single.error(), AdmissionTimeout)  # 0.2 s have passed for the targeted manager
    assert not bulk.done()  # the bulk barrier is still waiting
    execute_b.release()
    busy_b.result()
    assert bulk.result() == (["b"], [])
    assert lab.status("b").state is ModelState.UNLOADED
    assert not unbounded.done()
    execute.release()
    holder.result()
    assert unbounded.result()["OUTPUT0"][0] == 1.0
