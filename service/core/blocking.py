"""Where a request's thread blocks on work done elsewhere, so that the pool that lent the thread may lend another.

The gRPC server runs calls on a few runner threads (service/process/handler_threads.py): fewer threads taking turns on
the GIL make small requests cheaper. A call whose thread waits for an engine (ONNX Runtime or TensorRT computing
with the GIL released, a python model's worker process, an ensemble's steps) or for a stream's next message is
not using its runner's turn, and a model with many slots needs as many calls in its engine at once. Such waits
are wrapped in `blocking_wait`; while one lasts, the thread does not count as a runner and the pool may start the
next queued call on another thread. A wait in a model's admission queue steps aside only once it has lasted
STEP_ASIDE_SECONDS (`StepAsideLater`): see there why.

Both are entered with no model lock held (the lender takes its own lock, a leaf of the lock order).

The core knows nothing of the pool: a thread that is no pool's (a test's, a batch member's, the step watcher's)
has no lender, and `blocking_wait` does nothing. Waits are counted per thread, so nesting (an ensemble's step
run inside the ensemble's own run) steps aside once. Never blocks, never raises.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Lender(Protocol):
    """What lent the current thread (service/process/handler_threads.py): told when the thread begins and ends a
    wait."""

    def step_aside(self) -> None: ...

    def step_back(self) -> None: ...


# How long a wait in a model's admission queue (service/core/admission.py) keeps its thread's runner: the next slot
# of a busy model of small requests comes within a millisecond or so, and a runner that keeps its place takes it
# without a thread hand-off; a longer wait (a slow model's queue) steps aside, so that the runners serve the calls
# of other models meanwhile rather than leave them to the handler pool's 20 ms watchdog.
STEP_ASIDE_SECONDS = 0.001

_lent = threading.local()


def lend_current_thread(lender: Lender | None) -> None:
    """Called by a pool on each of its threads as it starts (None: the thread is no pool's any more)."""
    _lent.lender = lender
    _lent.depth = 0


class _BlockingWait:
    """`with blocking_wait:` around a wait on other work (see the module docstring). Reusable and shared: the
    state it keeps is the thread's own."""

    __slots__ = ()

    def __enter__(self) -> None:
        lender = getattr(_lent, "lender", None)
        if lender is None:
            return
        _lent.depth += 1
        if _lent.depth == 1:
            lender.step_aside()

    def __exit__(self, *exc: object) -> None:
        lender = getattr(_lent, "lender", None)
        if lender is None or _lent.depth == 0:  # an exit without its enter (lent after it) changes nothing
            return
        _lent.depth -= 1
        if _lent.depth == 0:
            lender.step_back()


blocking_wait = _BlockingWait()


class StepAsideLater:
    """A wait that keeps its thread's runner for `after` seconds (STEP_ASIDE_SECONDS by default; real time: it is
    about scheduling, not about any deadline of the contract) and then steps aside for the rest of it. The waiter
    shortens each timed wait with `bound` and calls `end` once the wait is over, on every path. Never blocks, never
    raises."""

    __slots__ = ("_due", "_pending", "_aside")

    def __init__(self, after: float = STEP_ASIDE_SECONDS) -> None:
        self._due = time.monotonic() + after
        # A thread no pool lent has nothing to step aside from, and its wait gets no extra wake-up: a waiter that
        # woke early would read the admission clock once more (a test's fake clock, moved meanwhile).
        self._pending = getattr(_lent, "lender", None) is not None
        self._aside = False

    def bound(self, timeout: float | None) -> float | None:
        """`timeout` (None: no limit), cut short to end when the thread is to step aside; once that time has
        come, steps aside and returns `timeout` unchanged."""
        if not self._pending:
            return timeout
        left = self._due - time.monotonic()
        if left <= 0:
            self._pending = False
            blocking_wait.__enter__()
            self._aside = True
            return timeout
        return left if timeout is None or left < timeout else timeout

    def end(self) -> None:
        self._pending = False
        if self._aside:
            self._aside = False
            blocking_wait.__exit__(None, None, None)
