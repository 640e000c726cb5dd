"""The gRPC server's handler threads: every call gets a thread at once; the usual number of threads is kept.

Why not `concurrent.futures.ThreadPoolExecutor`: grpcio's sync server submits each call to its executor when the
call arrives, and the pool thread then waits for the call's request message (`grpc._server._unary_request`: a
unary request is read on the handler thread, before any of slotserve's code runs, with no timeout). In a fixed
pool, calls that send their headers and never their message (a stalled client, a hostile one, or one sending a
large message slowly) hold every thread, and every later call, health probes included, waits behind them.

`HandlerThreads` never queues a call: `submit` hands it to an idle thread or starts a new one. Threads beyond
`keep` end once they have been idle for `linger` seconds, so a burst of stalled calls costs one mostly idle
thread each while it lasts and nothing after. What bounds the threads is the gRPC server's
`maximum_concurrent_rpcs` (a call beyond it is refused with RESOURCE_EXHAUSTED before it reaches an executor) and
the per-connection stream limit; see `service/server.py` and docs/operations.md. The work inside a handler
(inference, management) is bounded by `servicers/common.CallTracker`, not here.

If the operating system refuses a thread (memory or a pids limit), the call waits in a backlog for the next
thread that finishes its call, as it would in a fixed pool, and the refusal is logged and counted: the server
never stops accepting calls because a thread could not start.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
from concurrent import futures
from dataclasses import dataclass

_LOG = logging.getLogger(__name__)

LINGER_SECONDS = 5.0  # how long a thread beyond `keep` stays idle before it ends


@dataclass(frozen=True)
class HandlerThreadStatistics:
    threads: int  # alive
    busy: int  # running a call (for grpcio: reading its request or in a handler)
    idle: int  # waiting for a call
    peak: int  # most threads alive at once
    started: int  # threads started so far
    retired: int  # threads beyond `keep` that ended after `linger` idle seconds
    backlog: int  # calls waiting for a thread because one could not be started
    start_failures: int  # threads the operating system refused to start


class _Work:
    __slots__ = ("future", "fn", "args", "kwargs")

    def __init__(self, fn, args, kwargs) -> None:
        self.future: futures.Future = futures.Future()
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as error:  # the submitter reads it from the future, as with ThreadPoolExecutor
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


class _Waiter:
    """An idle thread: woken alone (its own condition on the pool's lock) when a call is handed to it."""

    __slots__ = ("wake", "work")

    def __init__(self, lock: threading.Lock) -> None:
        self.wake = threading.Condition(lock)
        self.work: _Work | None = None


class HandlerThreads(futures.Executor):
    """An executor that runs every submitted call at once on a thread of its own (see the module docstring).

    `submit` never blocks and never queues while threads can be started; it raises RuntimeError after
    `shutdown`, as ThreadPoolExecutor does. Threads are daemon threads, so a call abandoned at shutdown (hung in a
    backend) never holds up the interpreter's exit."""

    def __init__(self, keep: int, *, linger: float = LINGER_SECONDS, name: str = "grpc-handler") -> None:
        if keep < 0 or linger < 0:
            raise ValueError(f"keep ({keep}) and linger ({linger}) must be >= 0")
        self._keep = keep
        self._linger = linger
        self._name = name
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()  # guards: every field below and each _Waiter's work
        self._idle: list[_Waiter] = []  # the most recently idle last: reused first, so the oldest retire
        self._backlog: collections.deque[_Work] = collections.deque()  # only after a thread failed to start
        self._threads: set[threading.Thread] = set()
        self._busy = 0
        self._peak = 0
        self._started = 0
        self._retired = 0
        self._start_failures = 0
        self._closed = False

    def submit(self, fn, /, *args, **kwargs) -> futures.Future:
        work = _Work(fn, args, kwargs)
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after shutdown")
            self._busy += 1
            if self._hand_to_idle_locked(work):
                return work.future
            thread = threading.Thread(target=self._run, args=(work,), name=f"{self._name}-{next(self._numbers)}",
                                      daemon=True)
            self._threads.add(thread)
            self._started += 1
            self._peak = max(self._peak, len(self._threads))
        try:
            self._start(thread)
        except RuntimeError as error:  # "can't start new thread": out of memory or a pids limit
            with self._lock:
                self._threads.discard(thread)
                self._started -= 1
                self._start_failures += 1
                if not self._hand_to_idle_locked(work):  # a thread may have gone idle meanwhile
                    self._busy -= 1
                    self._backlog.append(work)
                backlog = len(self._backlog)
            _LOG.warning("could not start a gRPC handler thread (%s); %d call(s) wait for a busy thread",
                         error, backlog)
        return work.future

    def _start(self, thread: threading.Thread) -> None:
        thread.start()

    def _hand_to_idle_locked(self, work: _Work) -> bool:
        if not self._idle:
            return False
        waiter = self._idle.pop()
        waiter.work = work
        waiter.wake.notify()
        return True

    def _run(self, work: _Work | None) -> None:
        waiter = _Waiter(self._lock)
        while work is not None:
            work.run()
            work = None  # let go of the call's objects before waiting for the next call
            work = self._next_work(waiter)

    def _next_work(self, waiter: _Waiter) -> _Work | None:
        """The next call for this thread, or None when it is to end (shut down, or idle too long beyond `keep`)."""
        with self._lock:
            self._busy -= 1
            if self._backlog:
                self._busy += 1
                return self._backlog.popleft()
            if self._closed:
                return self._end_locked(waiter, idle=False)
            self._idle.append(waiter)
            while True:
                waiter.wake.wait(self._linger)
                if waiter.work is not None:  # handed a call (submit counted it busy)
                    work, waiter.work = waiter.work, None
                    return work
                if self._closed:
                    return self._end_locked(waiter, idle=True)
                if len(self._threads) > self._keep:
                    self._retired += 1
                    return self._end_locked(waiter, idle=True)

    def _end_locked(self, waiter: _Waiter, *, idle: bool) -> None:
        if idle:
            self._idle.remove(waiter)
        self._threads.discard(threading.current_thread())
        return None

    def statistics(self) -> HandlerThreadStatistics:
        with self._lock:
            return HandlerThreadStatistics(
                threads=len(self._threads), busy=self._busy, idle=len(self._idle), peak=self._peak,
                started=self._started, retired=self._retired, backlog=len(self._backlog),
                start_failures=self._start_failures)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new calls and end idle threads; busy threads end after their call. `cancel_futures` cancels the
        calls still in the backlog. `wait` joins every thread (without a timeout, like ThreadPoolExecutor)."""
        with self._lock:
            self._closed = True
            for waiter in self._idle:
                waiter.wake.notify()
            cancelled = list(self._backlog) if cancel_futures else []
            if cancel_futures:
                self._backlog.clear()
            threads = list(self._threads)
        for work in cancelled:
            work.future.cancel()
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()
