"""Contract, residency continued: a refused cold load answers every request waiting on it, a resize is held to
--memory-budget like a load, and a load over the budget evicts the least recently used idle model."""

from __future__ import annotations

import pytest

from service.core.errors import MemoryLimit, ResidencyLimit
from service.core.lifecycle import ModelState
from service.core.residency import ColdLoadStatistics
from service.status_codes import describe

from .harness import FakeClock

cell = pytest.mark.cell


def _reason(error: BaseException) -> tuple[str, str | None]:
    code, _message, reason = describe(error)
    return code.name, reason


# ---- 6. a request waiting on a refused cold load ------------------------------------------------------------


@cell("FAIL.08")
def test_a_request_waiting_on_a_cold_load_refused_for_the_residency_limit_gets_residency_limit_too(lab_factory):
    lab = lab_factory(
        {"m": {"capacity": 1}, "y": {"capacity": 2}},
        parallel_jobs=2,
        load=False,
        max_resident_models=1,
        max_concurrent_loads=1,
    )
    # m takes the only cold-load place (held at its load gate) and will then stay busy executing, so it is
    # resident and never idle when y's load asks for room.
    m_execute = lab.gate("m", "execute").hold()
    m_load = lab.gate("m", "load").hold()
    busy = lab.infer("m", name="m-busy")
    m_load.wait_blocked(1)
    initializer = lab.infer("y", 1.0, name="y-initializer")
    lab.wait_until(
        lambda: lab.runtime.cold_loads.statistics() == ColdLoadStatistics(running=1, waiting=1),
        "y's initializer waiting for the guard",
    )
    follower = lab.infer("y", 2.0, name="y-follower")
    lab.wait_active("y", 2)  # admitted to the second slot: it waits for the initializer's outcome
    assert lab.status("y").state is ModelState.LOADING

    m_load.release()
    m_execute.wait_blocked(1)  # m is resident and busy
    first, second = initializer.error(), follower.error()
    assert isinstance(first, ResidencyLimit) and "residency_limit" in str(first)
    assert isinstance(second, ResidencyLimit) and "residency_limit" in str(second)
    assert _reason(first) == _reason(second) == ("UNAVAILABLE", "residency_limit")

    status = lab.status("y")
    assert status.state is ModelState.UNLOADED and not status.loaded and status.max_parallel_slots is None
    assert "residency_limit" in status.last_error
    assert status.active_slots == 0 and status.queued_requests == 0  # both leases were given back
    assert lab.controls.count("y", "load") == 0  # refused before anything was built
    assert lab.residency.resident_names() == ["m"] and lab.status("m").loaded

    m_execute.release()
    busy.result()
    # m is idle now: the next request to y evicts it and loads y.
    assert lab.infer("y", 3.0).result()["OUTPUT0"][0] == 3.0
    assert lab.residency.resident_names() == ["y"]


# ---- 7. a resize held to the memory budget ------------------------------------------------------------------


@cell("OPS.ready.evict")
def test_a_resize_over_the_memory_budget_evicts_an_idle_model(lab_factory):
    # m costs 100 + 10 per slot; at 1 slot (110) it fits beside the idle model (50) in 180, at 4 slots (140) it
    # does not: the idle model is evicted and the resize goes through in place.
    lab = lab_factory(
        {"m": {"memory_bytes": 100, "slot_memory_bytes": 10, "capacity": 4}, "idle": {"memory_bytes": 50}},
        parallel_jobs=1,
        memory_budget=180,
    )
    assert lab.residency.memory_in_use() == 160
    status = lab.register("m", slots=4).result()
    assert (status.state, status.slots, status.max_parallel_slots, status.memory_bytes) == (ModelState.READY, 4, 4, 140)
    assert lab.controls.count("m", "load") == 1  # resized over the live engine
    assert lab.controls.live_contexts("m") == 4
    idle = lab.status("idle")
    assert idle.state is ModelState.UNLOADED and not idle.loaded and idle.memory_bytes is None
    assert lab.residency.evictions == 1 and lab.residency.memory_in_use() == 140
    assert lab.runtime.events.counts()[("evicted", "idle")] == 1
    assert lab.infer("m", 4.0).result()["OUTPUT0"][0] == 4.0


@cell("FAIL.08")
def test_a_resize_over_the_memory_budget_without_an_idle_victim_fails_and_the_old_pool_keeps_serving(lab_factory):
    lab = lab_factory(
        {
            "m": {"memory_bytes": 100, "slot_memory_bytes": 10, "capacity": 4},
            "busy": {"memory_bytes": 50, "capacity": 1},
        },
        parallel_jobs=1,
        memory_budget=180,
    )
    execute = lab.gate("busy", "execute").hold()
    holder = lab.infer("busy")
    execute.wait_blocked(1)  # the only other model is busy: nothing can be evicted
    before = lab.status("m")
    assert (before.slots, before.memory_bytes) == (1, 110)

    refused = lab.register("m", slots=4)
    error = refused.error()
    assert isinstance(error, MemoryLimit) and "memory_limit" in str(error)
    assert _reason(error) == ("UNAVAILABLE", "memory_limit")

    after = lab.status("m")
    assert after == before  # READY, loaded, 1 slot, 110 bytes, no error recorded: refused before commit
    assert lab.controls.live_contexts("m") == 1  # the contexts built for the resize were closed
    assert lab.controls.count("m", "load") == 1 and lab.controls.live_engines("m") == 1
    assert lab.registry.get("m").admission.statistics().capacity == 1
    assert lab.status("busy").loaded and lab.residency.evictions == 0
    assert lab.residency.memory_in_use() == 160
    assert lab.infer("m", 5.0).result()["OUTPUT0"][0] == 5.0
    execute.release()
    holder.result()


# ---- 8. a load over the memory budget evicts the least recently used idle model -----------------------------


@cell("OPS.ready.evict")
def test_a_load_over_the_memory_budget_evicts_the_least_recently_used_idle_model(lab_factory):
    clock = FakeClock()
    lab = lab_factory(
        {"a": {"memory_bytes": 100}, "b": {"memory_bytes": 100}, "c": {"memory_bytes": 150}},
        parallel_jobs=1,
        load=False,
        memory_budget=250,
        clock=clock,
    )
    lab.infer("a").result()
    clock.now += 1
    lab.infer("b").result()
    clock.now += 1
    lab.infer("a").result()  # a is now more recently used than b
    clock.now += 1
    assert lab.residency.memory_in_use() == 200

    assert lab.infer("c", 6.0).result()["OUTPUT0"][0] == 6.0  # 200 + 150 > 250: one idle model must go
    b = lab.status("b")
    assert b.state is ModelState.UNLOADED and not b.loaded
    assert b.max_parallel_slots is None and b.memory_bytes is None  # the eviction shows in b's status
    a = lab.status("a")
    assert a.state is ModelState.READY and a.memory_bytes == 100  # freeing b was enough: a stays
    assert lab.status("c").memory_bytes == 150
    assert lab.residency.resident_names() == ["a", "c"] and lab.residency.memory_in_use() == 250
    assert lab.residency.evictions == 1
    assert lab.runtime.events.counts()[("evicted", "b")] == 1
    assert ("evicted", "a") not in lab.runtime.events.counts()
