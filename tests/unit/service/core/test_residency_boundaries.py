"""Edges of service/core/residency.py that a mutation run found untested (`make mutate`, issue 26): each test here
fails with one of the bugs it planted. Fixture models in a real registry (tests/contract/harness.py), fake clocks
and the models' own counters; a hook on one entry forces the one interleaving that needs it."""

from __future__ import annotations

import threading
import time

import pytest

from service.core.errors import MemoryLimit
from service.core.lifecycle import ModelState
from service.core.residency import ColdLoadGuard, Residency
from tests.contract.harness import FakeClock, Lab


def test_a_cold_load_limit_below_one_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--max-concurrent-loads must be >= 1, got 0"):
        ColdLoadGuard(0)


def test_an_idle_unload_under_a_second_still_has_a_reaper():
    assert Residency(idle_unload=0.5).reaper is not None
    assert Residency().reaper is None


@pytest.fixture
def lab(tmp_path):
    made = []

    def make(models, **options) -> Lab:
        made.append(Lab(tmp_path / str(len(made)), models, **options))
        return made[-1]

    yield make
    for each in made:
        each.close()


def test_without_a_budget_a_pool_of_any_size_loads(lab):
    lab = lab({"big": {"memory_bytes": 10**12}}, load=False)
    assert lab.infer("big").result()["OUTPUT0"][0] == 1.0
    assert lab.residency.memory_in_use() == 10**12


def test_a_one_byte_budget_is_a_budget(lab):
    lab = lab({"two": {"memory_bytes": 2}}, load=False, memory_budget=1)
    assert isinstance(lab.infer("two").error(), MemoryLimit)


def test_a_pool_of_exactly_the_budget_loads_evicting_what_it_must(lab):
    clock = FakeClock()
    lab = lab(
        {"small": {"memory_bytes": 30}, "whole": {"memory_bytes": 100}}, load=False, memory_budget=100, clock=clock
    )
    lab.infer("small").result()
    clock.now += 1
    assert lab.infer("whole").result()["OUTPUT0"][0] == 1.0  # 100 of 100 bytes: it fits, once small is evicted
    assert lab.status("small").state is ModelState.UNLOADED and lab.residency.evictions == 1
    assert lab.residency.memory_in_use() == 100


def test_a_budget_round_that_finds_no_idle_victim_looks_again_when_a_model_left_meanwhile(lab):
    """Budget 100: a (40, busy, least recently used) and b (40, idle) are resident; c (40) needs room. The round
    tries a (busy) and meanwhile b is unloaded by an operator, so b is no victim any more but there is room: c
    must load, not get memory_limit."""
    clock = FakeClock()
    lab = lab({name: {"memory_bytes": 40} for name in "abc"}, load=False, memory_budget=100, clock=clock)
    lab.infer("a").result()
    clock.now += 1
    lab.infer("b").result()
    clock.now += 1
    execute = lab.gate("a", "execute").hold()
    busy = lab.infer("a")
    execute.wait_blocked(1)
    entry_a = lab.registry.get("a")
    try_a = entry_a._try_acquire_idle_exclusive

    def a_is_busy_and_meanwhile_b_leaves():
        lab.unload("b").result()
        return try_a()

    entry_a._try_acquire_idle_exclusive = a_is_busy_and_meanwhile_b_leaves
    assert lab.infer("c", 5.0).result()["OUTPUT0"][0] == 5.0
    assert lab.residency.resident_names() == ["a", "c"] and lab.residency.evictions == 0
    execute.release()
    busy.result()


# ---- the idle reaper --------------------------------------------------------------------------------------

IDLE = 30.0


def _reaper_lab(lab, **options) -> Lab:
    return lab({"a": {}}, idle_unload=IDLE, clock=FakeClock(), **options)


def _poke_and_wait(lab: Lab, checks: int) -> None:
    """Let the reaper look at what is due now, and wait until it has examined `checks` items in all."""
    reaper = lab.residency.reaper
    assert reaper is not None  # the lab sets an idle unload
    reaper.poke()
    lab.wait_until(lambda: reaper.checks >= checks, f"{checks} reaper check(s)")


def _no_more_checks_within(lab: Lab, seconds: float = 0.3) -> None:
    """A window for a reaper that spins to show itself (the real one sleeps until the next expiry, so it cannot
    fail this): no check happens while the fake clock stands still."""
    reaper = lab.residency.reaper
    assert reaper is not None  # the lab sets an idle unload
    checks = reaper.checks
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert reaper.checks == checks, f"the reaper kept checking ({reaper.checks - checks} more) with nothing due"
        time.sleep(0.01)  # ordering-free: an observation window, not an ordering: see the docstring


def test_the_reaper_retires_a_model_at_exactly_its_expiry(lab):
    lab = _reaper_lab(lab)
    reaper = lab.residency.reaper
    lab.clock.now = lab.registry.get("a").last_used + IDLE  # exactly due
    _poke_and_wait(lab, 1)
    lab.wait_until(lambda: reaper.retired == 1, "a retired at its expiry")
    assert lab.status("a").state is ModelState.UNLOADED


def test_a_model_used_since_it_was_scheduled_is_retired_only_once_idle_for_the_whole_time(lab):
    lab = _reaper_lab(lab)
    reaper = lab.residency.reaper
    entry = lab.registry.get("a")
    loaded_at = entry.last_used
    lab.clock.now = loaded_at + 20
    lab.infer("a").result()  # used at +20: idle until +50
    lab.clock.now = loaded_at + 31  # its first expiry: used since
    _poke_and_wait(lab, 1)
    assert reaper.retired == 0 and lab.status("a").loaded
    _no_more_checks_within(lab)  # rescheduled at +50, not looked at again meanwhile
    lab.clock.now = loaded_at + 50  # exactly idle for 30 s
    _poke_and_wait(lab, 2)
    lab.wait_until(lambda: reaper.retired == 1, "a retired once idle for the whole time")


def test_the_reaper_does_not_look_before_the_expiry(lab):
    lab = _reaper_lab(lab)
    lab.clock.now = lab.registry.get("a").last_used + IDLE - 0.5  # half a second early
    lab.residency.reaper.poke()
    _no_more_checks_within(lab)
    assert lab.residency.reaper.checks == 0 and lab.status("a").loaded


def test_a_model_busy_at_its_expiry_is_looked_at_once_and_then_when_due_again(lab):
    lab = _reaper_lab(lab)
    reaper = lab.residency.reaper
    execute = lab.gate("a", "execute").hold()
    busy = lab.infer("a")
    execute.wait_blocked(1)
    lab.clock.now += IDLE + 1
    _poke_and_wait(lab, 1)
    _no_more_checks_within(lab)  # busy: rescheduled an idle time ahead, no spinning meanwhile
    assert reaper.retired == 0
    execute.release()
    busy.result()  # the lease end schedules it again: idle from now
    lab.clock.now += IDLE
    _poke_and_wait(lab, 2)
    lab.wait_until(lambda: reaper.retired == 1, "a retired once idle")


def test_the_reaper_keeps_at_most_one_item_per_model(lab):
    """The module's promise (a heap with at most one entry per model): every lease end asks to schedule the
    model, which must stay cheap and add nothing while it is scheduled (read from the heap itself)."""
    lab = _reaper_lab(lab)
    for _ in range(5):
        lab.infer("a").result()
    assert len(lab.residency.reaper._heap) == 1


def test_the_reaper_thread_is_a_daemon_and_stop_reports_whether_it_ended(lab):
    """A reaper inside a teardown that does not return: stop() gives up after its timeout and says so (the
    shutdown logs it); the thread, a daemon, cannot keep the process alive. Once the teardown returns, stop()
    waits for the thread and reports it ended."""
    lab = _reaper_lab(lab)
    reaper = lab.residency.reaper
    threads = [thread for thread in threading.enumerate() if thread.name == "idle-reaper"]
    assert threads and all(thread.daemon for thread in threads)
    teardown = lab.gate("a", "teardown").hold()
    lab.clock.now += IDLE + 1
    reaper.poke()
    teardown.wait_blocked(1)
    assert lab.residency.stop(timeout=0.05) is False
    stopping = lab.start("stop", lambda: lab.residency.stop(timeout=30.0))
    lab.wait_until(lambda: reaper._stopping, "stop() called")
    teardown.release()
    assert stopping.result() is True
    assert lab.residency.stop(timeout=0.0) is True  # idempotent
    assert Residency().stop() is True  # no reaper: nothing to wait for
    never_started = Residency(idle_unload=1.0)
    assert never_started.stop(timeout=0.0) is True
