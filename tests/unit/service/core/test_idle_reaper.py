"""Idle retirement is never lost, and never holds up a shutdown (issue 12, items 2 and 6). A fake clock moves
time; the reaper's own counters order the events."""

from __future__ import annotations

import threading

import pytest

from service.core.lifecycle import ModelState
from tests.contract.harness import WAIT, FakeClock, Lab


@pytest.fixture
def lab(tmp_path):
    clock = FakeClock()
    lab = Lab(tmp_path, {"a": {"capacity": 2}}, idle_unload=30.0, clock=clock)
    yield lab
    lab.close()


def _reaper_check(lab: Lab) -> None:
    """Let the reaper examine what is due now, and wait until it has."""
    reaper = lab.residency.reaper
    assert reaper is not None  # the lab sets an idle unload
    checks = reaper.checks
    reaper.poke()
    lab.wait_until(lambda: reaper.checks > checks, "the reaper's check")


def test_a_reconfiguration_refused_before_commit_while_the_reaper_looked_keeps_idle_retirement(lab):
    """The reaper finds the model RECONFIGURING and drops it; the reconfiguration (a slot count above the
    model's capacity) is refused before commit and the model is READY again: it must still retire once idle."""
    reaper = lab.residency.reaper
    entry = lab.registry.get("a")
    held = entry.exclusive(None)  # a manager holds the model ...
    with entry._lock:
        entry._transition_locked(ModelState.RECONFIGURING)  # ... as a reconfiguration does, before validating
    lab.clock.now += 31
    _reaper_check(lab)  # due, but not READY: dropped
    assert lab.status("a").loaded and reaper.retired == 0
    with entry._lock:
        entry._transition_locked(ModelState.READY)  # refused before commit: back to READY ...
    held.release()  # ... and the manager's lease ends: idle for 31 s, it retires now
    lab.wait_until(lambda: reaper.retired == 1, "the idle model retired")
    assert lab.status("a").state is ModelState.UNLOADED


def test_a_replacement_that_fails_to_load_before_commit_while_the_reaper_looked_keeps_idle_retirement(lab):
    """The same through the registry: a reconfiguration to files that fail to load is validated privately
    (its primary loads while the old pool serves); the reaper looks while it is RECONFIGURING; the load fails,
    the old pool stays and the model is READY again. Once idle, it must retire."""
    reaper = lab.residency.reaper
    load = lab.gate("a", "load").hold()
    bad = lab.register("a", options={"fail_load": "bad files"})
    load.wait_blocked(1)
    assert lab.status("a").state is ModelState.RECONFIGURING
    lab.clock.now += 31
    _reaper_check(lab)  # due, but not READY: dropped
    load.release()
    assert "bad files" in str(bad.error())  # refused before commit: the old pool stayed, READY again
    lab.wait_until(lambda: reaper.retired == 1, "the idle model retired")
    assert lab.status("a").state is ModelState.UNLOADED and lab.controls.live_engines("a") == 0


def test_stopping_the_residency_does_not_wait_for_a_reaper_stuck_in_a_teardown(lab):
    """A reaper retiring a model whose engine teardown is slow: stop() returns within its timeout instead of
    joining the reaper; the teardown finishes later on its own."""
    teardown = lab.gate("a", "teardown").hold()
    lab.clock.now += 31
    lab.residency.reaper.poke()
    teardown.wait_blocked(1)
    stopped = threading.Event()
    threading.Thread(target=lambda: (lab.residency.stop(timeout=0.2), stopped.set()), daemon=True).start()
    assert stopped.wait(WAIT), "stop() waited for the teardown"
    assert lab.status("a").state is ModelState.UNLOADING
    teardown.release()
    lab.wait_state("a", ModelState.UNLOADED)
