"""One thread that runs callbacks at their due time (write timeouts of streams).

`arm` is O(log n) and `Timer.cancel` O(1) amortized; neither blocks on a callback. A cancelled timer lets go
of its callback at once (a stream's callback holds its gRPC context), and cancelled entries are dropped from the
heap as soon as they are more than half of it: a busy stream arms and cancels one timer per message with a
30 s timeout, which would otherwise keep rate x 30 s dead entries. Callbacks run on the timer thread and must not
block.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

_LOG = logging.getLogger(__name__)

# Cancelled entries are compacted away once there are more than this many and they are over half the heap.
_COMPACT_AFTER = 64


class Timer:
    """An armed callback. `cancel` is idempotent and safe from any thread; a timer that already fired ignores it."""

    __slots__ = ("callback", "cancelled", "fired", "_queue")

    def __init__(self, callback: Callable[[], object], queue: TimerQueue) -> None:
        self.callback: Callable[[], object] | None = callback
        self.cancelled = False
        self.fired = False
        self._queue = queue

    def cancel(self) -> None:
        self._queue._cancel(self)


@dataclass(frozen=True)
class TimerStatistics:
    armed: int  # timers waiting to fire
    cancelled_in_heap: int  # cancelled entries not yet dropped from the heap


class TimerQueue:
    def __init__(self, name: str = "timers", clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cond = threading.Condition()  # guards: _heap, _cancelled, _closed, every Timer's state
        self._heap: list[tuple[float, int, Timer]] = []
        self._cancelled = 0  # cancelled timers still in _heap
        self._order = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def arm(self, delay: float, callback: Callable[[], object]) -> Timer:
        """Run `callback` on the timer thread in `delay` seconds, unless the returned timer is cancelled."""
        timer = Timer(callback, self)
        with self._cond:
            heapq.heappush(self._heap, (self._clock() + delay, next(self._order), timer))
            if self._heap[0][2] is timer:
                self._cond.notify()
        return timer

    def _cancel(self, timer: Timer) -> None:
        with self._cond:
            if timer.cancelled or timer.fired:
                return
            timer.cancelled = True
            timer.callback = None
            self._cancelled += 1
            if self._cancelled > _COMPACT_AFTER and 2 * self._cancelled > len(self._heap):
                self._heap = [item for item in self._heap if not item[2].cancelled]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def statistics(self) -> TimerStatistics:
        with self._cond:
            return TimerStatistics(armed=len(self._heap) - self._cancelled, cancelled_in_heap=self._cancelled)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _next_due(self) -> Callable[[], object] | None:
        """Block until a live timer is due; returns its callback, or None once closed."""
        with self._cond:
            while not self._closed:
                if not self._heap:
                    self._cond.wait()
                    continue
                due, _, timer = self._heap[0]
                if timer.cancelled:
                    heapq.heappop(self._heap)
                    self._cancelled -= 1
                    continue
                remaining = due - self._clock()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                heapq.heappop(self._heap)
                timer.fired = True
                callback, timer.callback = timer.callback, None
                return callback
            return None

    def _run(self) -> None:
        while (callback := self._next_due()) is not None:
            try:
                callback()
            except Exception:  # a failing callback must not stop the others
                _LOG.exception("timer callback failed")
