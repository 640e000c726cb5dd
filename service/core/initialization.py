"""Lazy loading's one initializer: the first admitted request of an unloaded model loads it (ModelEntry's
`_ensure_pool`), and the requests admitted meanwhile wait for its outcome on its `InitAttempt`."""

from __future__ import annotations

import threading

from engine.errors import EngineError
from engine.interface import CancelToken

from .errors import BackendNotAvailable, ModelLoadFailed, RequestCancelled, ServiceError, UnsupportedSlotCount, own_copy
from .pool import SlotPool


class InitializerLeft(Exception):
    """Internal: the initializer's caller gave up before its load began; a waiter takes over."""


class InitAttempt:
    """One initialization by the one initializer; admitted requests wait for its outcome."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards: _done, _waiters, pool, error
        self._done = False
        self._waiters: list[threading.Event] = []
        self.pool: SlotPool | None = None
        self.error: BaseException | None = None

    def finish(self, pool: SlotPool | None, error: BaseException | None) -> None:
        with self._lock:
            self.pool, self.error, self._done = pool, error, True
            waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.set()

    def wait(self, cancel: CancelToken | None) -> SlotPool:
        """Block until the initializer finishes (no time limit: a load is not bounded by admission).
        Raises the load's error, or RequestCancelled if `cancel` fires first."""
        woken = threading.Event()
        with self._lock:
            if self._done:
                woken.set()
            else:
                self._waiters.append(woken)
        if cancel is not None:
            cancel.add_callback(woken.set)
        try:
            woken.wait()
        finally:
            if cancel is not None:
                cancel.remove_callback(woken.set)
        with self._lock:
            if not self._done:
                self._waiters.remove(woken)
                raise RequestCancelled("the caller gave up while the model was loading")
        if self.error is not None:
            raise own_copy(self.error)
        if self.pool is None:
            raise RuntimeError("the model's initialization ended with neither a pool nor an error")
        return self.pool


def as_request_error(name: str, error: BaseException) -> BaseException:
    """How a load failure reaches a request that needed the model: engine problems and unsupported slot
    counts and backends this server does not run become ModelLoadFailed; residency and memory refusals keep
    their own reason."""
    if isinstance(error, (EngineError, UnsupportedSlotCount, BackendNotAvailable)):
        return ModelLoadFailed(name, error)
    if isinstance(error, ServiceError):
        return error
    return error


__all__ = ["InitAttempt", "InitializerLeft", "as_request_error"]
