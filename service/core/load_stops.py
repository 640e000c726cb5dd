"""Stopping a model's loads: an unload or the shutdown gives up the loads of a model that are in progress (issue
33: a python model whose `initialize` hangs must not hold its own unload for its whole bound).

Each load (a first request's, a manager's, a replacement's private probe, the slots an instance-count change
adds) runs inside `LoadStops.running()`, which hands it a CancelToken; the backend reads it
(`Backend.load_cancellable`, `LoadedModel.create_context_cancellable`: a python model's worker is killed when it
fires; so does its wait for the cold-load guard). `stop(reason)` fires the tokens of every load in progress
and makes every request's load that starts before its `resume` fail at once: an unload stops them while it waits
for its exclusive lease (and resumes once granted: nothing loads under that lease), so that no request admitted
before it starts the load again. `stop_for_good` (shutdown) never resumes, and refuses every later load.

Only a backend that can stop its work stops: one that cannot (ONNX Runtime, TensorRT) finishes its load, which is
published as usual, and the unload then waits for it and for the work admitted before it.

Locking: `LoadStops._lock` guards its token set and counters only (a leaf: nothing is taken under it, and tokens
are fired after it is released).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from engine.interface import CancelToken


class LoadStops:
    """The loads of one model in progress, and whether they are being stopped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards: _running, _stopping, _for_good, _reason
        self._running: set[CancelToken] = set()
        self._stopping = 0  # unloads waiting for their lease (and the shutdown)
        self._for_good = False  # the shutdown: every later load is refused
        self._reason = ""

    @contextlib.contextmanager
    def running(self, *, refused_while_stopped: bool) -> Iterator[CancelToken]:
        """A load in progress: yields its token. It starts cancelled after `stop_for_good`, and while a `stop`
        lasts when `refused_while_stopped` (a request's load: the request was admitted before the unload, which
        stopped the load it waited for). A manager's load is not refused: it is the next step of the operation
        the unload waits for (a probe that finished, then the pool built on it), stopped only if in progress."""
        token = CancelToken()
        with self._lock:
            self._running.add(token)
            refused = self._for_good or (refused_while_stopped and self._stopping)
            reason = self._reason
        if refused:
            token.cancel(reason)
        try:
            yield token
        finally:
            with self._lock:
                self._running.discard(token)

    def stop(self, reason: str) -> Callable[[], None]:
        """Cancel the loads in progress (with `reason`) and refuse those that start until the returned `resume`
        is called (idempotent). Never blocks: the loads end on their own threads."""
        self._stop(reason)
        resumed = threading.Event()  # makes `resume` idempotent

        def resume() -> None:
            with self._lock:
                if resumed.is_set():
                    return
                resumed.set()
                self._stopping -= 1

        return resume

    def stop_for_good(self, reason: str) -> None:
        """As `stop`, with no end, and every later load refused (the shutdown)."""
        with self._lock:
            self._for_good = True
        self._stop(reason)

    def _stop(self, reason: str) -> None:
        with self._lock:
            self._stopping += 1
            self._reason = reason
            tokens = list(self._running)
        for token in tokens:
            token.cancel(reason)


@contextlib.contextmanager
def either(first: CancelToken | None, second: CancelToken) -> Iterator[CancelToken]:
    """A token that fires when `first` (None: never) or `second` does, for one wait."""
    if first is None:
        yield second
        return
    joint = CancelToken()

    def from_first() -> None:
        joint.cancel(first.reason)

    def from_second() -> None:
        joint.cancel(second.reason)

    first.add_callback(from_first)
    second.add_callback(from_second)
    try:
        yield joint
    finally:
        first.remove_callback(from_first)
        second.remove_callback(from_second)
