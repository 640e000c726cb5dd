"""Helpers for the tests of issue 26: a caller of `AdmissionController.acquire` on its own thread, and a bounded
wait on an observable state. A caller that is never woken shows as an AssertionError naming the missing wake-up,
after WAIT seconds, instead of a hung test."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from engine.interface import CancelToken
from service.core.admission import AdmissionController, TicketKind

WAIT = 20.0  # seconds a caller may take to be woken before the test reports a missing wake-up (a busy machine)


class Caller:
    """One `acquire` on its own thread. `outcome` is the returned ticket or the exception it raised (any
    BaseException: KeyboardInterrupt included, which the test then inspects)."""

    def __init__(
        self,
        controller: AdmissionController,
        *,
        kind: TicketKind = TicketKind.REQUEST,
        deadline: float | None = None,
        name: str = "caller",
        **options,
    ) -> None:
        self.token = options.pop("cancel", None) or CancelToken()
        self.outcome: object = None
        self.done = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(controller, kind, deadline, options), name=name, daemon=True
        )
        self.thread.start()

    def _run(self, controller, kind, deadline, options) -> None:
        try:
            self.outcome = controller.acquire(kind, deadline, cancel=self.token, **options)
        except BaseException as error:  # the test inspects it
            self.outcome = error
        finally:
            self.done.set()

    def wait(self, what: str, timeout: float = WAIT):
        """The outcome once the call returned; AssertionError naming `what` if it was not woken in time."""
        if not self.done.wait(timeout):
            raise AssertionError(f"{self.thread.name} was not woken within {timeout} s: {what}")
        return self.outcome

    def result(self, what: str, timeout: float = WAIT):
        outcome = self.wait(what, timeout)
        if isinstance(outcome, BaseException):
            raise AssertionError(f"{self.thread.name} raised {outcome!r}") from outcome
        return outcome


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Re-check a state predicate until it holds (the order of events comes from the state, never the delay)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.0005)  # ordering-free: re-checks a state predicate


def wait_queued(controller: AdmissionController, count: int) -> None:
    wait_until(lambda: controller.statistics().queued == count, f"{count} queued on {controller.model}")
