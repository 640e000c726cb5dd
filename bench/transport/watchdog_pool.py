"""A handler pool for grpcio's sync server that runs calls on a few threads and still never lets stalled calls
silence the server: `runners` threads take calls in arrival order; when calls wait and no call has finished for
`stall_s` seconds (every runner is stuck: a client that sent its headers and not its message, a call waiting for
a slot), a watchdog starts one more thread for each call waiting then, which ends after that call.

Design 3c of the transport section. What it keeps of service/process/handler_threads.py: a call is never left waiting
behind stalled calls for much longer than `stall_s` (two ticks at most). What it changes: under load
calls wait in this queue instead of each holding a thread, so at most `runners` threads compete for the GIL.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from concurrent import futures


class WatchdogPool(futures.Executor):
    def __init__(self, runners: int, stall_s: float = 0.02) -> None:
        self._stall_s = stall_s
        self._queue: collections.deque = collections.deque()  # (future, fn, args, kwargs)
        self._cond = threading.Condition(threading.Lock())  # guards: _queue, _progress, _closed, extra_threads
        self._progress = time.monotonic()  # when a call last finished (or the queue was last empty)
        self._closed = False
        self.extra_threads = 0  # started by the watchdog so far
        for number in range(runners):
            threading.Thread(target=self._runner, name=f"grpc-runner-{number}", daemon=True).start()
        threading.Thread(target=self._watchdog, name="grpc-watchdog", daemon=True).start()

    def submit(self, fn, /, *args, **kwargs) -> futures.Future:
        future: futures.Future = futures.Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after shutdown")
            if not self._queue:
                self._progress = time.monotonic()  # the stall clock starts when calls begin to wait
            self._queue.append((future, fn, args, kwargs))
            self._cond.notify()
        return future

    def _take(self, wait: bool):
        with self._cond:
            while wait and not self._queue and not self._closed:
                self._cond.wait()
            return self._queue.popleft() if self._queue else None

    def _run(self, work) -> None:
        future, fn, args, kwargs = work
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as error:
                future.set_exception(error)
        with self._cond:
            self._progress = time.monotonic()

    def _runner(self) -> None:
        while (work := self._take(wait=True)) is not None:
            self._run(work)

    def _watchdog(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                stalled = bool(self._queue) and time.monotonic() - self._progress > self._stall_s
                extra = len(self._queue) if stalled else 0
                self.extra_threads += extra
                if stalled:
                    self._progress = time.monotonic()  # the next extra threads one tick later at the earliest
            if extra:  # said on stderr, so that a run's log shows when it fired (the bench expects: only when stalled)
                print(f"{time.strftime('%H:%M:%S')} watchdog: no call finished for {self._stall_s * 1000:.0f} ms: "
                      f"{extra} more thread(s)",
                      file=sys.stderr, flush=True)  # fmt: skip
            for _ in range(extra):
                threading.Thread(target=self._extra, name="grpc-extra", daemon=True).start()
            time.sleep(self._stall_s)

    def _extra(self) -> None:
        work = self._take(wait=False)
        if work is not None:
            self._run(work)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._cond:
            self._closed = True
            if cancel_futures:
                while self._queue:
                    self._queue.popleft()[0].cancel()
            self._cond.notify_all()
