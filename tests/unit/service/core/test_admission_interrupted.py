"""An asynchronous exception (KeyboardInterrupt) in `AdmissionController.acquire` leaves nothing behind (issue 26):
interrupted while queued, the caller's place leaves the queue; interrupted right after its grant, the slot is
passed on. The interrupt is forced through the waiter's own lock (a hook on the one thread, no sleeps)."""

from __future__ import annotations

import threading
import types

import pytest

import service.core.admission as admission_module
from service.core.admission import AdmissionController, TicketKind, TicketState
from tests.unit.service.core._callers import Caller, wait_queued

REQUEST, MANAGER = TicketKind.REQUEST, TicketKind.MANAGER


def _interrupting_threading(victim: str, after_grant: bool):
    """A stand-in for the admission module's `threading`: the waker lock of the thread named `victim` raises
    KeyboardInterrupt when its waiter blocks on it (at once, or once it was released: right after the grant)."""

    class InterruptingLock:
        def __init__(self) -> None:
            self._lock = threading.Lock()

        def locked(self) -> bool:
            return self._lock.locked()

        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            if self._lock.acquire(blocking=False):
                return True  # the constructor's own acquire
            if after_grant:
                self._lock.acquire()  # the grant releases it ...
            raise KeyboardInterrupt  # ... and the interrupt arrives as the waiter wakes (or at once)

        def release(self) -> None:
            self._lock.release()

    def lock():
        return InterruptingLock() if threading.current_thread().name == victim else threading.Lock()

    return types.SimpleNamespace(Lock=lock, TIMEOUT_MAX=threading.TIMEOUT_MAX)


@pytest.mark.parametrize("kind", [REQUEST, MANAGER])
@pytest.mark.parametrize("after_grant", [False, True], ids=["while-queued", "right-after-the-grant"])
def test_an_interrupted_acquire_keeps_no_place_and_no_slot(monkeypatch, kind, after_grant):
    controller = AdmissionController("m", 1)
    holder = controller.acquire(REQUEST, None)
    monkeypatch.setattr(admission_module, "threading", _interrupting_threading("victim", after_grant))
    victim = Caller(controller, kind=kind, name="victim")
    if after_grant:
        wait_queued(controller, 1)
        controller.release(holder)  # the slot is handed to the victim, which is interrupted as it wakes
    assert isinstance(victim.wait("the interrupted caller never returned"), KeyboardInterrupt)
    stats = controller.statistics()
    assert (stats.queued, stats.manager_active) == (0, False), stats
    if not after_grant:
        assert stats.active_slots == 1 and stats.cancelled_total == 1  # only the holder's slot
        controller.release(holder)
    assert controller.statistics().active_slots == 0
    monkeypatch.undo()
    # The model still admits: a later caller is granted at once and nothing else is held.
    later = controller.acquire(MANAGER, None)
    assert later.state is TicketState.GRANTED
    controller.release(later)
    assert controller.core.idle
