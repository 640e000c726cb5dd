"""A pool larger than the whole --memory-budget is refused before anyone is evicted (issue 26): evicting idle models
could never make room for it, so doing so would only throw their engines away."""

from __future__ import annotations

import pytest

from service.core.errors import MemoryLimit
from service.core.lifecycle import ModelState

from .harness import FakeClock


@pytest.mark.parametrize("how", ["request", "registration"])
def test_a_pool_larger_than_the_whole_budget_is_refused_and_nobody_is_evicted(lab_factory, how):
    clock = FakeClock()
    lab = lab_factory(
        {"small": {"memory_bytes": 60}, "huge": {"memory_bytes": 150}}, load=False, memory_budget=100, clock=clock
    )
    lab.infer("small").result()  # resident, idle, least recently used: the eviction victim a budget would take
    clock.now += 1
    refused = (lab.infer("huge") if how == "request" else lab.register("huge")).error()
    assert isinstance(refused, MemoryLimit), refused
    assert lab.status("small").state is ModelState.READY and lab.residency.evictions == 0
    assert "needs 150 bytes, more than the whole 100-byte budget" in str(refused)
    assert lab.controls.count("small", "close_engine") == 0  # its engine was never torn down
    assert lab.residency.resident_names() == ["small"] and lab.residency.memory_in_use() == 60
    huge = lab.status("huge")
    assert not huge.loaded and lab.controls.live_engines("huge") == 0 and lab.controls.live_contexts("huge") == 0
    assert lab.infer("small", 2.0).result()["OUTPUT0"][0] == 2.0  # the warm model serves on, no reload
    assert lab.controls.count("small", "load") == 1


def test_a_resize_larger_than_the_whole_budget_is_refused_and_nobody_is_evicted(lab_factory):
    # m costs 100 + 10 per slot: 110 at one slot, 140 at four, which the 120-byte budget can never hold.
    lab = lab_factory(
        {"m": {"memory_bytes": 100, "slot_memory_bytes": 10, "capacity": 4}, "idle": {"memory_bytes": 10}},
        parallel_jobs=1,
        memory_budget=120,
    )
    assert lab.residency.memory_in_use() == 120
    before = lab.status("m")
    refused = lab.register("m", slots=4).error()
    assert isinstance(refused, MemoryLimit), refused
    assert lab.status("idle").loaded and lab.residency.evictions == 0
    assert "needs 140 bytes, more than the whole 120-byte budget" in str(refused)
    assert lab.status("m") == before  # READY, one slot: the old pool keeps serving
    assert lab.controls.live_contexts("m") == 1
