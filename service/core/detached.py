"""Management work that outlives its caller: a load whose client gave up goes on (issue 33).

A repository load or a registration may take as long as the model's load (a python model's `initialize`: up to
its initialize_timeout_seconds). Its RPC must not hold a management handler thread for all that time once its
client has gone (four such calls held every management thread: later loads and unloads, the hung model's own
included, were refused as server_busy). `DetachedWork.run` runs the work on a thread of its own and lets the caller
wait for it only until the caller's token fires (the RPC ended: the client's deadline, a cancel, a disconnect).
The work goes on and finishes as it would have: its outcome shows where every load's does (the model's state,
ModelReady, RepositoryIndex, the last error; its failure is logged).

Each thread ends when its work does; `DetachedWork` (the registry's) counts them so that the shutdown waits for
them, bounded, before it closes the models. Every wait in the work is bounded (the
caller's token, which fired, still ends its queue waits: a registration waiting for its exclusive lease leaves
with nothing changed; the model's admission timeout), and a load is bounded by the backend's own limit and
stopped by an unload of that model or by the shutdown (service/core/load_stops.py). Nothing here takes a lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from engine.interface import CancelToken

from .blocking import blocking_wait
from .errors import RequestCancelled

_LOG = logging.getLogger(__name__)

T = TypeVar("T")


class _Handoff(Generic[T]):
    """The work's outcome, handed to its caller unless the caller left first (then the work logs its error)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards: finished, caller_left, value, error
        self.woken = threading.Event()  # the work finished, or the caller's token fired
        self.finished = False
        self.caller_left = False
        self.value: T | None = None
        self.error: BaseException | None = None

    def finish(self, value: T | None, error: BaseException | None, what: str) -> None:
        with self._lock:
            self.value, self.error, self.finished = value, error, True
            left = self.caller_left
        self.woken.set()
        if left and error is not None:
            _LOG.warning("the %s, which its caller no longer waited for, failed: %s", what, error)

    def take(self, what: str) -> T:
        """The outcome, once `woken`; RequestCancelled when the work has not finished (the caller leaves)."""
        with self._lock:
            if not self.finished:
                self.caller_left = True
                raise RequestCancelled(
                    f"the caller gave up; the {what} goes on, and its outcome shows in the model's state"
                )
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]  # the work's own result (None when it returns None)


class DetachedWork:
    """The management work of one server that runs detached from its callers (`run`); its owner, the registry,
    lets the shutdown wait for it (`wait_idle`) before the models are closed, as it waits for handlers.

    Locking: `_cond` guards `_running` only (a leaf)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())  # guards: _running
        self._running = 0

    def run(self, work: Callable[[], T], cancel: CancelToken | None, what: str) -> T:
        """Run `work` and return its result, or raise its error. Without `cancel`, on the calling thread. With
        it, on a thread of its own: blocks until the work ends or `cancel` fires, whichever comes first; then
        raises RequestCancelled (the work goes on; an error it raises later is logged with `what`, e.g.
        "repository load of 'm'")."""
        if cancel is None:
            return work()
        handoff: _Handoff[T] = _Handoff()
        with self._cond:
            self._running += 1
        name = f"detached {what}"[:60]
        threading.Thread(target=self._work, args=(work, handoff, what), name=name, daemon=True).start()
        cancel.add_callback(handoff.woken.set)
        try:
            with blocking_wait:  # the handler thread only waits: its pool may run other calls meanwhile
                handoff.woken.wait()
        finally:
            cancel.remove_callback(handoff.woken.set)
        return handoff.take(what)

    def _work(self, work: Callable[[], T], handoff: _Handoff[T], what: str) -> None:
        try:
            try:
                value = work()
            except BaseException as error:  # handed to the caller, or logged when it has gone
                handoff.finish(None, error, what)
            else:
                handoff.finish(value, None, what)
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    @property
    def running(self) -> int:
        with self._cond:
            return self._running

    def wait_idle(self, timeout: float | None) -> bool:
        """Block until no detached work runs, at most `timeout` seconds (None: no limit). Returns whether none
        does."""
        with self._cond:
            return self._cond.wait_for(lambda: self._running == 0, timeout)
