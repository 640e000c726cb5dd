"""Residency gaps a mutation run found (issue 26): the cold-load guard hands its place to the OLDEST waiter; a
retirement whose teardown raises still releases the model's exclusive lease; a failed load's reservation given
back counts as a departure (a concurrent eviction round looks again instead of refusing); a batch waiting out its
delay on a free slot is work, so neither eviction nor idle retirement takes its model. Fake clocks, fixture gates
and the components' own counters order the events (no sleeps)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from service.core.errors import ResidencyLimit
from service.core.lifecycle import ModelState
from service.core.residency import ColdLoadGuard, ColdLoadStatistics
from tests.contract.harness import WAIT, FakeClock, Lab
from tests.contract.test_batching import Batching, rows_of
from tests.unit.service.core._callers import wait_until

# ---- the cold-load guard ----------------------------------------------------------------------------------


def test_a_freed_cold_load_place_goes_to_the_oldest_waiter():
    guard = ColdLoadGuard(1)
    guard.acquire()  # a load runs
    order: list[str] = []
    done = {name: threading.Event() for name in ("first", "second")}

    def wait_for_a_place(name: str) -> None:
        guard.acquire()
        order.append(name)
        done[name].set()

    threads = []
    for count, name in enumerate(("first", "second"), start=1):
        threads.append(threading.Thread(target=wait_for_a_place, args=(name,), name=name, daemon=True))
        threads[-1].start()
        wait_until(
            lambda n=count: guard.statistics() == ColdLoadStatistics(running=1, waiting=n),
            f"{count} waiting for the guard",
        )
    guard.release()
    assert done["first"].wait(WAIT), f"the oldest waiter was passed over: {order}"
    assert order == ["first"] and guard.statistics() == ColdLoadStatistics(running=1, waiting=1)
    guard.release()
    assert done["second"].wait(WAIT)
    guard.release()
    assert order == ["first", "second"] and guard.statistics() == ColdLoadStatistics(running=0, waiting=0)
    for thread in threads:
        thread.join(WAIT)


# ---- a teardown that raises --------------------------------------------------------------------------------
# Engine errors of a teardown are logged and swallowed (pool.close); what escapes it is an asynchronous exception
# (KeyboardInterrupt, SystemExit) arriving on the retiring thread. The model's exclusive lease must still end.


class _Interrupt(BaseException):
    """Stands in for KeyboardInterrupt or another asynchronous exception during a teardown."""


def test_an_idle_retirement_whose_teardown_raises_still_releases_the_model(tmp_path, monkeypatch):
    escaped: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda hook: escaped.append(hook.exc_value))
    clock = FakeClock()
    lab = Lab(tmp_path, {"a": {}}, idle_unload=30.0, clock=clock)
    try:
        lab.gate("a", "teardown").fail_next(_Interrupt("interrupted during the teardown"))
        reaper = lab.residency.reaper
        checks = reaper.checks
        clock.now += 31
        reaper.poke()  # the reaper retires a; the teardown is interrupted (and ends the reaper's thread)
        lab.wait_until(lambda: reaper.checks > checks, "the reaper's check")
        lab.wait_until(lambda: bool(escaped), "the interrupt to reach the reaper thread's end")
        assert isinstance(escaped[0], _Interrupt)
        status = lab.status("a")
        assert (status.state, status.manager_active, status.loaded) == (ModelState.UNLOADED, False, False)
        assert lab.infer("a", 3.0).result()["OUTPUT0"][0] == 3.0  # not stuck behind a manager that never ends
        assert lab.status("a").loaded
    finally:
        lab.close()


def test_an_eviction_whose_teardown_raises_still_releases_the_victim(tmp_path):
    lab = Lab(tmp_path, {"a": {}, "b": {}}, load=False, max_resident_models=1)
    try:
        lab.infer("a").result()
        lab.gate("a", "teardown").fail_next(_Interrupt("interrupted during the teardown"))
        failed = lab.infer("b").error()  # b's load evicts a, whose teardown is interrupted: b's thread gets it
        assert isinstance(failed, _Interrupt)
        status = lab.status("a")
        assert (status.state, status.manager_active) == (ModelState.UNLOADED, False)
        assert lab.infer("a", 4.0).result()["OUTPUT0"][0] == 4.0  # a is usable again
        assert lab.infer("b", 2.0).result()["OUTPUT0"][0] == 2.0  # and b loads (evicting a, cleanly now)
    finally:
        lab.close()


# ---- a failed load's reservation -----------------------------------------------------------------------------


def test_a_load_that_fails_during_an_eviction_round_is_a_departure_and_the_round_looks_again(tmp_path):
    """Limit 2: a is resident and busy, b is loading (reserved). c's load needs room; its eviction round finds a
    busy, and meanwhile b's load fails and gives its reservation back. There is room now: c must load."""
    clock = FakeClock()
    lab = Lab(
        tmp_path, {"a": {}, "b": {}, "c": {}}, load=False, max_resident_models=2, max_concurrent_loads=2, clock=clock
    )
    try:
        lab.infer("a").result()
        execute = lab.gate("a", "execute").hold()
        busy = lab.infer("a")
        execute.wait_blocked(1)
        load_b = lab.gate("b", "load").hold().fail_next(RuntimeError("b's files are broken"))
        loading_b = lab.infer("b")
        load_b.wait_blocked(1)  # b holds its reservation
        entry_a = lab.registry.get("a")
        try_a = entry_a._try_acquire_idle_exclusive

        def a_is_busy_and_meanwhile_b_fails():
            load_b.release()
            loading_b.error()  # b's load has failed and given its reservation back
            return try_a()

        entry_a._try_acquire_idle_exclusive = a_is_busy_and_meanwhile_b_fails
        assert lab.infer("c", 5.0).result()["OUTPUT0"][0] == 5.0
        assert lab.residency.resident_names() == ["a", "c"]
        execute.release()
        busy.result()
    finally:
        lab.close()


# ---- a batch waiting out its delay on a free slot ------------------------------------------------------------


@pytest.fixture
def delayed(tmp_path):
    """A batching model m (up to 8 rows, 10 s delay, one slot) loaded by a full batch, and one request of one row
    waiting out the delay on the free slot; n another model. Options go to the Lab."""
    made = []

    def make(**options):
        env = Batching(tmp_path, {"m": {"delay_us": 10_000_000}, "n": {}}, load=False, **options)
        made.append(env)
        full = env.infer("m", rows_of(0.0, rows=8), name="full")  # a complete batch goes at once
        np.testing.assert_array_equal(full.result(), rows_of(0.0, rows=8))
        waiting = env.infer("m", rows_of(1.0), name="waiting")
        env.wait_queued_requests("m", 1)
        assert env.lab.status("m").active_slots == 0  # the slot is free: the batch waits for members
        return env, waiting

    yield make
    for env in made:
        env.close()


def _serve_the_waiting_batch(env: Batching, waiting) -> None:
    env.clock.now += 10.0
    env.poke("m")
    np.testing.assert_array_equal(waiting.result(), rows_of(1.0))
    assert env.controls.batches("m") == [8, 1]


def test_eviction_never_takes_a_model_whose_batch_waits_out_its_delay(delayed):
    env, waiting = delayed(max_resident_models=1)
    refused = env.infer("n", rows_of(5.0)).error()
    assert isinstance(refused, ResidencyLimit), refused  # m is not idle: it has a request
    assert env.lab.residency.resident_names() == ["m"] and env.controls.count("m", "close_engine") == 0
    _serve_the_waiting_batch(env, waiting)


def test_idle_retirement_never_takes_a_model_whose_batch_waits_out_its_delay(delayed):
    env, waiting = delayed(idle_unload=5.0)
    reaper = env.lab.residency.reaper
    env.clock.now += 6.0  # m's last use is 6 s ago, but a request waits on it
    checks = reaper.checks
    reaper.poke()
    env.lab.wait_until(lambda: reaper.checks > checks, "the reaper's check")
    assert reaper.retired == 0 and env.lab.status("m").loaded
    assert env.controls.count("m", "close_engine") == 0
    _serve_the_waiting_batch(env, waiting)
