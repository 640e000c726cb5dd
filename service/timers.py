"""One thread that runs callbacks at their due time (write timeouts of streams).

`arm` and `Timer.cancel` are O(log n) / O(1) and never block on the callback; a cancelled timer's heap item is
skipped when it comes due. Callbacks run on the timer thread and must not block.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

_LOG = logging.getLogger(__name__)


class Timer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class TimerQueue:
    def __init__(self, name: str = "timers", clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cond = threading.Condition()  # guards: _heap, _closed
        self._heap: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def arm(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(callback)
        with self._cond:
            heapq.heappush(self._heap, (self._clock() + delay, next(self._order), timer))
            if self._heap[0][2] is timer:
                self._cond.notify()
        return timer

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    if not self._heap:
                        self._cond.wait()
                        continue
                    due, _, timer = self._heap[0]
                    remaining = due - self._clock()
                    if remaining > 0:
                        self._cond.wait(remaining)
                        continue
                    heapq.heappop(self._heap)
                    break
                else:
                    return
            if not timer.cancelled:
                try:
                    timer.callback()
                except Exception:  # a failing callback must not stop the others
                    _LOG.exception("timer callback failed")
