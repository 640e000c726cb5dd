"""The cold-load guard's turns (issue 33, item 6): a load that holds its place past its turn no longer holds up
the loads waiting behind it; waiters still get places in arrival order, and a place is never counted twice."""

from __future__ import annotations

import threading

import pytest

from engine.interface import CancelToken
from service.core.errors import RequestCancelled
from service.core.residency import ColdLoadGuard, ColdLoadStatistics
from tests.unit.service.core._callers import WAIT, wait_until


class _Acquirer:
    """`guard.acquire()` on its own thread; `turn` is what it returned, `error` what it raised."""

    def __init__(self, guard: ColdLoadGuard, name: str, cancel: CancelToken | None = None) -> None:
        self.turn = None
        self.error: BaseException | None = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.turn = guard.acquire(cancel)
            except BaseException as error:  # the test inspects it
                self.error = error
            finally:
                self.done.set()

        self.thread = threading.Thread(target=run, name=name, daemon=True)
        self.thread.start()

    def granted(self) -> bool:
        return self.done.is_set() and self.turn is not None


def test_a_load_past_its_turn_lets_the_next_waiting_load_start_beside_it():
    guard = ColdLoadGuard(1, turn_seconds=0.2)
    hung = guard.acquire()  # a load that never ends by itself
    waiting = _Acquirer(guard, "next")
    assert waiting.done.wait(WAIT), "the next load waited for the hung one beyond its turn"
    assert waiting.turn is not None and waiting.error is None
    assert guard.statistics() == ColdLoadStatistics(running=1, waiting=0, overdue=1)
    guard.release(hung)  # the hung load ends at last: it held no place any more, so none is freed twice
    assert guard.statistics() == ColdLoadStatistics(running=1, waiting=0, overdue=0)
    guard.release(hung)  # idempotent
    guard.release(waiting.turn)
    assert guard.statistics() == ColdLoadStatistics(running=0, waiting=0, overdue=0)


def test_turns_that_run_out_hand_places_to_the_waiters_in_arrival_order():
    guard = ColdLoadGuard(1, turn_seconds=0.2)
    guard.acquire()  # hung: never released
    first = _Acquirer(guard, "first")
    wait_until(lambda: guard.statistics().waiting == 1, "first queued")
    second = _Acquirer(guard, "second")
    wait_until(lambda: guard.statistics().waiting == 2 or first.done.is_set(), "second queued")
    assert first.done.wait(WAIT) and second.done.wait(WAIT), "a turn that ran out did not free its place"
    assert first.turn is not None and second.turn is not None
    assert first.turn.ends < second.turn.ends  # one place (limit 1): second got it only after first's turn
    assert guard.statistics() == ColdLoadStatistics(running=1, waiting=0, overdue=2)


def test_a_waiter_whose_caller_gives_up_leaves_the_queue():
    guard = ColdLoadGuard(1, turn_seconds=60.0)
    guard.acquire()
    leave = CancelToken()
    waiter = _Acquirer(guard, "waiter", cancel=leave)
    wait_until(lambda: guard.statistics().waiting == 1, "queued")
    leave.cancel()
    assert waiter.done.wait(WAIT) and isinstance(waiter.error, RequestCancelled)
    assert guard.statistics() == ColdLoadStatistics(running=1, waiting=0)


def test_without_a_turn_limit_a_load_holds_its_place_until_released():
    guard = ColdLoadGuard(1, turn_seconds=0)
    held = guard.acquire()
    waiting = _Acquirer(guard, "waiting", cancel=(leave := CancelToken()))
    wait_until(lambda: guard.statistics() == ColdLoadStatistics(running=1, waiting=1), "queued")
    guard.release(held)
    assert waiting.done.wait(WAIT) and waiting.turn is not None
    guard.release(waiting.turn)
    assert guard.statistics() == ColdLoadStatistics(running=0, waiting=0)
    leave.cancel()


@pytest.mark.parametrize("limit", [1, 2])
def test_a_released_place_is_handed_to_the_oldest_waiter_before_any_newcomer(limit):
    guard = ColdLoadGuard(limit, turn_seconds=60.0)
    held = [guard.acquire() for _ in range(limit)]
    waiter = _Acquirer(guard, "waiter")
    wait_until(lambda: guard.statistics().waiting == 1, "waiter queued")
    guard.release(held[0])
    assert waiter.done.wait(WAIT) and waiter.turn is not None
    assert guard.statistics() == ColdLoadStatistics(running=limit, waiting=0)
