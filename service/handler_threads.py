"""The gRPC server's handler threads: every call gets a thread at once; the usual number of threads is kept.

Why not `concurrent.futures.ThreadPoolExecutor`: grpcio's sync server submits each call to its executor when the
call arrives, and the pool thread then waits for the call's request message (`grpc._server._unary_request`: a
unary request is read on the handler thread, before any of slotserve's code runs, with no timeout). In a fixed
pool, calls that send their headers and never their message (a stalled client, a hostile one, or one sending a
large message slowly) hold every thread, and every later call, health probes included, waits behind them.

`HandlerThreads` never queues a call: `submit` hands it to an idle thread or starts a new one. Threads beyond
`keep` end once they have been idle for `linger` seconds, so a burst of stalled calls costs one mostly idle
thread each while it lasts and nothing after. What bounds the threads is the gRPC server's
`maximum_concurrent_rpcs` (a call beyond it is refused with RESOURCE_EXHAUSTED before it reaches an executor);
see `service/server.py` and docs/operations.md. The work inside a handler (inference, management) is bounded by
`servicers/common.CallTracker`, not here.

Threads keep the default stack size: only the pages a thread touches are resident (a stalled call measured about
45 KiB), `threading.stack_size` would change every thread the process starts afterwards, and handler threads run
engines (ONNX Runtime computes part of a graph on the calling thread) whose native stack use is not ours to bound.

If the operating system refuses a thread (memory or a pids limit), the call waits in a backlog for the next
thread that finishes its call, as it would in a fixed pool, and the refusal is logged and counted: the server
never stops accepting calls because a thread could not start.
"""

from __future__ import annotations

import itertools
import logging
import queue
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


class HandlerThreads(futures.Executor):
    """An executor that runs every submitted call at once on a thread of its own (see the module docstring).

    `submit` never blocks and never queues while threads can be started; it raises RuntimeError after
    `shutdown`, as ThreadPoolExecutor does. Threads are daemon threads, so a call abandoned at shutdown (hung in a
    backend) never holds up the interpreter's exit.

    How a call finds its thread, as in ThreadPoolExecutor: calls go through one queue; a thread about to wait on
    it releases a token of `_idle_tokens`, and `submit` takes a token (never waiting) or else starts a thread.
    So every queued call has a waiting thread of its own. A thread beyond `keep` that waited `linger` seconds
    ends only if it can take a token back; otherwise a call is on its way to it."""

    def __init__(self, keep: int, *, linger: float = LINGER_SECONDS, name: str = "grpc-handler") -> None:
        if keep < 0 or linger < 0:
            raise ValueError(f"keep ({keep}) and linger ({linger}) must be >= 0")
        self._keep = keep
        self._linger = linger
        self._name = name
        self._numbers = itertools.count(1)
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()  # None: end (shutdown)
        self._idle_tokens = threading.Semaphore(0)  # one per waiting thread not yet claimed by a call
        self._lock = threading.Lock()  # guards: every field below
        self._threads: set[threading.Thread] = set()
        self._idle = 0  # threads waiting on the queue
        self._backlog = 0  # calls queued with no thread for them (a thread could not start)
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
            if self._idle_tokens.acquire(blocking=False):  # a waiting thread will take it
                self._queue.put(work)
                return work.future
            thread = threading.Thread(
                target=self._run, args=(work,), name=f"{self._name}-{next(self._numbers)}", daemon=True
            )
            self._threads.add(thread)
            self._started += 1
            self._peak = max(self._peak, len(self._threads))
        try:
            self._start(thread)
        except RuntimeError as error:  # "can't start new thread": out of memory or a pids limit
            self._start_failed(thread, work, error)
        return work.future

    def _start(self, thread: threading.Thread) -> None:
        thread.start()

    def _start_failed(self, thread: threading.Thread, work: _Work, error: RuntimeError) -> None:
        """Queue the call for the next thread that finishes its own (the backlog), and say so."""
        with self._lock:
            self._threads.discard(thread)
            self._started -= 1
            self._start_failures += 1
            if self._closed:  # shut down meanwhile: no thread will take it
                work.future.cancel()
                return
            self._backlog += 1
            self._queue.put(work)
            backlog = self._backlog
        _LOG.warning("could not start a gRPC handler thread (%s); %d call(s) wait for a busy thread", error, backlog)

    def _run(self, work: _Work | None) -> None:
        me = threading.current_thread()
        while work is not None:
            work.run()
            work = None  # let go of the call's objects before waiting for the next call
            work = self._next_work(me)

    def _next_work(self, me: threading.Thread) -> _Work | None:
        """The next call for this thread, or None when it is to end (shut down, or idle `linger` seconds while
        more than `keep` threads are alive); a thread that ends has left `_threads` already."""
        with self._lock:
            if self._closed:
                self._threads.discard(me)
                return None
            if self._backlog:  # a call no thread was started for: taken without a token
                self._backlog -= 1
                work = self._queue.get()  # never waits: the call is queued already
                if work is None:
                    self._threads.discard(me)
                return work
            self._idle += 1
            surplus = len(self._threads) > self._keep
        self._idle_tokens.release()
        while True:
            try:
                work = self._queue.get(timeout=self._linger) if surplus else self._queue.get()
            except queue.Empty:
                with self._lock:
                    # Ending needs a token back; without one a call is on its way here.
                    if len(self._threads) > self._keep and self._idle_tokens.acquire(blocking=False):
                        self._idle -= 1
                        self._threads.discard(me)
                        self._retired += 1
                        return None
                    surplus = len(self._threads) > self._keep
                continue
            with self._lock:
                self._idle -= 1
                if work is None:  # shutdown's end marker
                    self._threads.discard(me)
            return work

    def statistics(self) -> HandlerThreadStatistics:
        with self._lock:
            threads = len(self._threads)
            return HandlerThreadStatistics(
                threads=threads,
                busy=threads - self._idle,
                idle=self._idle,
                peak=self._peak,
                started=self._started,
                retired=self._retired,
                backlog=self._backlog,
                start_failures=self._start_failures,
            )

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new calls and end idle threads; busy threads end after their call. `cancel_futures` cancels the
        calls queued but not yet taken by a thread. `wait` joins every thread (without a timeout, like
        ThreadPoolExecutor). Idempotent."""
        with self._lock:
            if self._closed:
                threads = list(self._threads)
            else:
                self._closed = True
                threads = list(self._threads)
                if cancel_futures:
                    self._cancel_queued_locked()
                for _ in threads:  # one end marker per thread; a busy one reads it after its call
                    self._queue.put(None)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _cancel_queued_locked(self) -> None:
        while True:
            try:
                work = self._queue.get_nowait()
            except queue.Empty:
                break
            if work is not None:
                work.future.cancel()
        self._backlog = 0
