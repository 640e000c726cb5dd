"""The smaller defects of issue 12, item 11, each forced through a hook (no sleeps): the cold-load guard never
keeps a place its waiter was interrupted out of; a queued registration that keeps the current source keeps the
one committed ahead of it; an eviction round that found no victim re-checks when a model left meanwhile."""

from __future__ import annotations

import threading
import time

import pytest

import service.core.residency as residency_module
from service.core.residency import ColdLoadGuard, ColdLoadStatistics
from tests.contract.harness import FakeClock, Lab

WAIT = 10.0


class _Interrupt(BaseException):
    """Stands in for KeyboardInterrupt or an asynchronous exception."""


def _interrupting_waiter(after_grant: bool):
    """A _GuardWaiter whose wait is interrupted: at once, or right after the place was handed to it."""

    class Lock:
        def __init__(self) -> None:
            self._lock = threading.Lock()

        def acquire(self, *args, **kwargs):
            if not self._lock.acquire(blocking=False):  # the constructor's acquire goes through
                if after_grant:
                    self._lock.acquire()  # the grant (release) arrives, then the interrupt
                raise _Interrupt()
            return True

        def release(self) -> None:
            self._lock.release()

    class Waiter(residency_module._GuardWaiter):
        def __init__(self) -> None:
            self.lock = Lock()  # type: ignore[assignment]  # a Lock that records its waits, in place of the real one
            self.lock.acquire()
            self.granted = False

    return Waiter


@pytest.mark.parametrize("after_grant", [False, True], ids=["while-queued", "right-after-the-grant"])
def test_an_interrupted_cold_load_waiter_keeps_no_place(monkeypatch, after_grant):
    guard = ColdLoadGuard(1)
    guard.acquire()  # a load runs
    monkeypatch.setattr(residency_module, "_GuardWaiter", _interrupting_waiter(after_grant))
    outcome: list = []
    waiter = threading.Thread(target=lambda: _catch(guard.acquire, outcome))
    waiter.start()
    if after_grant:
        _wait_until(lambda: guard.statistics() == ColdLoadStatistics(running=1, waiting=1))
        guard.release()  # the place goes to the waiter, which is interrupted as it wakes
    waiter.join(WAIT)
    assert isinstance(outcome[0], _Interrupt)
    if not after_grant:
        guard.release()
    assert guard.statistics() == ColdLoadStatistics(running=0, waiting=0), guard.statistics()
    monkeypatch.undo()
    guard.acquire()  # the guard still works: a later load gets it at once
    guard.release()


def _catch(function, box: list) -> None:
    try:
        box.append(function())
    except BaseException as error:  # the test inspects it
        box.append(error)


def _wait_until(predicate) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, "the guard never reached the state"
        time.sleep(0.0005)  # ordering-free: re-checks a state predicate


def test_a_queued_registration_keeping_the_source_keeps_the_one_committed_ahead_of_it(tmp_path):
    """R1 moves model a to a new source, R2 (queued behind R1, naming no source) changes only an option: a keeps
    R1's source. Read before R2's lease, the source would be the old one and R2 would revert R1."""
    lab = Lab(tmp_path / "repository", {"a": {"marker": "original"}})
    try:
        moved = tmp_path / "repository" / "sources" / "a"  # inside the repository, as a source must be
        moved.mkdir(parents=True)
        (moved / "config.pbtxt").write_text(
            'name: "a"\nbackend: "fixture"\nparameters { key: "marker" value { string_value: "moved" } }\n'
        )
        execute = lab.gate("a", "execute").hold()
        running = lab.infer("a")
        execute.wait_blocked(1)
        first = lab.register("a", source=str(moved))
        lab.wait_status("a", lambda s: s.queued_managers == 1, "R1 queued")
        second = lab.register("a", options={"colour": "blue"})
        lab.wait_status("a", lambda s: s.queued_managers == 2, "R2 queued behind R1")
        execute.release()
        running.result()
        first.result()
        status = second.result()
        assert status.source == str(moved)
        spec = lab.registry.get("a").spec
        assert spec.parameter("marker") == "moved" and spec.parameter("colour") == "blue"
    finally:
        lab.close()


def test_an_eviction_round_that_finds_no_idle_victim_looks_again_when_a_model_left_meanwhile(tmp_path):
    """Limit 2, a (busy, least recently used) and b resident. c's load tries a (busy); meanwhile b is unloaded
    by an operator, so there is room, and b itself is no longer a victim. c must load, not get residency_limit."""
    clock = FakeClock()
    lab = Lab(tmp_path, {"a": {}, "b": {}, "c": {}}, load=False, max_resident_models=2, clock=clock)
    try:
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
            unload = lab.unload("b")
            unload.result()
            return try_a()

        entry_a._try_acquire_idle_exclusive = a_is_busy_and_meanwhile_b_leaves
        assert lab.infer("c", 5.0).result()["OUTPUT0"][0] == 5.0
        assert lab.residency.resident_names() == ["a", "c"]
        execute.release()
        busy.result()
    finally:
        lab.close()
