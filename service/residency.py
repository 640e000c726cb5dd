"""Residency: which models hold engines in memory, and the guard on simultaneous cold loads.

`ColdLoadGuard` bounds how many models load at once (--max-concurrent-loads). Warm requests never touch it:
only the one initializer of an unloaded model, and a manager's load, take it.
"""

from __future__ import annotations

import threading


class ColdLoadGuard:
    """A counting guard over cold loads, granted in arrival order.

    `acquire` blocks without limit (a load is not bounded by the admission timeout) and holds no other lock.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"--max-concurrent-loads must be >= 1, got {limit}")
        self.limit = limit
        self._lock = threading.Lock()  # guards: _active, _waiting
        self._active = 0
        self._waiting: list[threading.Lock] = []

    def acquire(self) -> None:
        with self._lock:
            if self._active < self.limit and not self._waiting:
                self._active += 1
                return
            waker = threading.Lock()
            waker.acquire()
            self._waiting.append(waker)
        waker.acquire()  # released by `release`, which hands its place over (the count stays taken)

    def release(self) -> None:
        with self._lock:
            if self._waiting:
                self._waiting.pop(0).release()
            else:
                self._active -= 1

    def statistics(self) -> tuple[int, int]:
        """(loads running, loads waiting)"""
        with self._lock:
            return self._active, len(self._waiting)
