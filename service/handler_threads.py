"""The gRPC server's handler threads: a few runner threads take calls in arrival order, and no call waits for a
thread longer than a bound, however many calls are stuck.

Why not `concurrent.futures.ThreadPoolExecutor`: grpcio's sync server submits each call to its executor when the
call arrives, and the pool thread then waits for the call's request message (`grpc._server._unary_request`: a
unary request is read on the handler thread, before any of slotserve's code runs, with no timeout). In a fixed
pool, calls that send their headers and never their message (a stalled client, a hostile one, or one sending a
large message slowly) hold every thread, and every later call, health probes included, waits behind them.

Why not a thread per call at once (`runners=0`, the rule before): sixteen clients then mean sixteen threads
taking turns on the GIL, and a quarter to half of the GIL's time went to waking them (docs/speed.md, "Front
ends": a few runners served the same small requests up to 1.4x faster).

The rules, with `runners` R > 0 and `stall` S (STALL_SECONDS):

* At most R threads run calls at once, not counting threads that wait on work done elsewhere: the engine's run
  of a model with several slots, a stream's next message, and a model's admission queue once the wait there
  has lasted a millisecond (service/core/blocking.py marks those waits; a model with many slots gets as many
  calls into its engine as it has slots, and a slow model's queue does not hold the runners). The others wait
  here, first come first served.
* A call that has waited S gets a thread of its own at once (an idle one or a new one), past R: the watchdog
  thread sees to it. That bounds what stuck runners cost (calls still sending their message, long runs of
  one-slot models, long management calls): a health probe or a call to another model waits at most S
  (plus the time to start a thread) behind them, never for them to end.
* `runners=0`: every call gets a thread at once (no queue, no watchdog).

Threads beyond `keep` end once idle `linger` seconds, so a burst of stalled calls costs one mostly idle thread
each while it lasts and nothing after. What bounds the threads is the gRPC server's `maximum_concurrent_rpcs` (a
call beyond it is refused with RESOURCE_EXHAUSTED before it reaches an executor); see `service/server.py` and
docs/operations.md. The work inside a handler (inference, management) is bounded by `servicers/common.CallTracker`,
not here.

Threads keep the default stack size: only the pages a thread touches are resident (a stalled call measured about
45 KiB), `threading.stack_size` would change every thread the process starts afterwards, and handler threads run
engines (ONNX Runtime computes part of a graph on the calling thread) whose native stack use is not ours to bound.

If the operating system refuses a thread (memory or a pids limit), the call waits in the queue for the next
thread that finishes its call, and the refusal is logged and counted: the server never stops accepting calls
because a thread could not start.

Lock: `_lock` guards every field of the pool (the conditions `_work` and `_watch` share it). It is never held
while a call runs, while a thread starts, or while logging.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar

from .core.blocking import lend_current_thread

_LOG = logging.getLogger(__name__)

LINGER_SECONDS = 5.0  # how long a thread beyond `keep` stays idle before it ends
STALL_SECONDS = 0.02  # how long a call may wait for a runner before it gets a thread of its own
DEFAULT_RUNNERS = 2  # what the bench measured best on 2 cores; more runners bring the GIL's turns back


@dataclass(frozen=True)
class HandlerThreadStatistics:
    threads: int  # alive
    busy: int  # running a call (for grpcio: reading its request or in a handler), aside or not
    idle: int  # waiting for a call
    peak: int  # most threads alive at once
    started: int  # threads started so far
    retired: int  # threads beyond `keep` that ended after `linger` idle seconds
    backlog: int  # calls waiting for a thread (for a runner, or because a thread could not be started)
    start_failures: int  # threads the operating system refused to start
    aside: int = 0  # busy threads waiting on work elsewhere (service/core/blocking.py): not counted as runners
    overdue: int = 0  # calls that waited `stall` seconds and were given a thread past the runners, so far


P = ParamSpec("P")
T = TypeVar("T")


class _Work(Generic[T]):
    __slots__ = ("future", "fn", "args", "kwargs", "queued_at")

    def __init__(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any], queued_at: float) -> None:
        self.future: futures.Future[T] = futures.Future()
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.queued_at = queued_at

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
    """An executor for grpcio's sync server that follows the rules of the module docstring.

    `submit` never blocks; it raises RuntimeError after `shutdown`, as ThreadPoolExecutor does. Threads are
    daemon threads, so a call abandoned at shutdown (hung in a backend) never holds up the interpreter's exit.

    How a queued call finds its thread: `_dispatch_locked` either wakes an idle thread (counted in `_wakeups`:
    whichever idle thread wakes first takes the head of the queue, so a wake-up that races a waiter's linger
    timeout is never lost) or makes a new thread for the head. A thread that finishes a call takes the next one
    itself when the rules allow. The runner count (`_running`) is taken when a call is handed on, before the
    thread that will run it is awake, so a burst never hands out more than the runners."""

    def __init__(
        self,
        keep: int,
        *,
        runners: int = 0,
        linger: float = LINGER_SECONDS,
        stall: float = STALL_SECONDS,
        name: str = "grpc-handler",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if keep < 0 or linger < 0 or runners < 0 or stall <= 0:
            raise ValueError(
                f"keep ({keep}), linger ({linger}) and runners ({runners}) must be >= 0, stall ({stall}) > 0"
            )
        self._keep = keep
        self._runners = runners  # 0: every call at once on a thread of its own
        self._linger = linger
        self._stall = stall
        self._name = name
        self._clock = clock
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()  # guards: every field below (see the module docstring)
        self._work = threading.Condition(self._lock)  # idle threads wait here for a call to take
        self._watch = threading.Condition(self._lock)  # the watchdog waits here for a call to come due
        self._queue: collections.deque[_Work[Any]] = collections.deque()  # calls without a thread, oldest first
        self._threads: set[threading.Thread] = set()
        self._idle = 0  # threads waiting on `_work`
        self._wakeups = 0  # queued calls handed to idle threads that have not woken yet (the first ones queued)
        self._running = 0  # threads in a call and not aside (what `runners` bounds), or about to be
        self._aside = 0  # threads in a call, waiting on work elsewhere
        self._passes = 0  # queued calls the watchdog let past the runners
        self._peak = 0
        self._started = 0
        self._retired = 0
        self._start_failures = 0
        self._overdue = 0
        self._watchdog_idle = False  # the watchdog waits for a call to wait (not for one to come due)
        self._retry_at = 0.0  # after a thread the OS refused, the watchdog passes no call before this
        self._closed = False
        if runners:
            watchdog = threading.Thread(target=self._watch_calls, name=f"{name}-watchdog", daemon=True)
            watchdog.start()

    # ---- submitting and handing on -----------------------------------------------------------------------

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> futures.Future[T]:
        work = _Work(fn, args, kwargs, self._clock())
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after shutdown")
            self._queue.append(work)
            starts = self._dispatch_locked()
            # It waits: the watchdog must know when it comes due, unless it waits for an older call already (one
            # wake-up a request under load would cost what the runners save).
            if self._watchdog_idle and len(self._queue) > self._wakeups:
                self._watch.notify()
        self._start_all(starts)
        return work.future

    def _may_run_another_locked(self) -> bool:
        return not self._runners or self._running < self._runners or self._passes > 0

    def _count_run_locked(self) -> None:
        """A queued call is handed on: count its runner (a watchdog's pass if every runner is taken)."""
        if self._runners and self._running >= self._runners:
            self._passes -= 1
        self._running += 1

    def _dispatch_locked(self) -> list[tuple[threading.Thread, _Work[Any]]]:
        """Hand queued calls on while the rules allow: to idle threads first, else to new threads (returned, to
        be started once the lock is released)."""
        starts = []
        while len(self._queue) > self._wakeups and self._may_run_another_locked():
            self._count_run_locked()
            if self._idle > self._wakeups:
                self._wakeups += 1
                self._work.notify()
                continue
            work = self._queue.popleft()
            thread = threading.Thread(
                target=self._run, args=(work,), name=f"{self._name}-{next(self._numbers)}", daemon=True
            )
            self._threads.add(thread)
            self._started += 1
            self._peak = max(self._peak, len(self._threads))
            starts.append((thread, work))
        if len(self._queue) == self._wakeups:
            self._passes = 0  # nothing left waiting: a pass must not outlive the calls it was for
        return starts

    def _start_all(self, starts: list[tuple[threading.Thread, _Work[Any]]]) -> None:
        for thread, work in starts:
            try:
                self._start(thread)
            except RuntimeError as error:  # "can't start new thread": out of memory or a pids limit
                self._start_failed(thread, work, error)

    def _start(self, thread: threading.Thread) -> None:
        thread.start()

    def _start_failed(self, thread: threading.Thread, work: _Work[Any], error: RuntimeError) -> None:
        """Put the call back at the head of the queue, for the next thread that finishes its own, and say so."""
        with self._lock:
            self._threads.discard(thread)
            self._started -= 1
            self._start_failures += 1
            self._running -= 1
            self._retry_at = self._clock() + self._stall  # no hot loop of refused threads from the watchdog
            if self._closed:  # shut down meanwhile: no thread will take it
                work.future.cancel()
                return
            self._queue.appendleft(work)
            backlog = len(self._queue)
        _LOG.warning("could not start a gRPC handler thread (%s); %d call(s) wait for a busy thread", error, backlog)

    # ---- the threads ---------------------------------------------------------------------------------------

    def _run(self, work: _Work[Any] | None) -> None:
        me = threading.current_thread()
        lend_current_thread(self if self._runners else None)  # without runners there is nothing to step aside from
        while work is not None:
            work.run()
            work = None  # let go of the call's objects before waiting for the next call
            work = self._next_work(me)

    def _next_work(self, me: threading.Thread) -> _Work[Any] | None:
        """The next call for this thread, which has just finished one; None when it is to end (shut down and
        nothing it may take, or idle `linger` seconds while more than `keep` threads are alive). A thread that
        ends has left `_threads` already."""
        with self._lock:
            self._running -= 1
            while True:
                if len(self._queue) > self._wakeups and self._may_run_another_locked():
                    self._count_run_locked()
                    return self._queue.popleft()
                if self._closed:
                    self._threads.discard(me)
                    return None
                surplus = len(self._threads) > self._keep
                self._idle += 1
                notified = self._work.wait(self._linger if surplus else None)
                self._idle -= 1
                if self._wakeups:  # a call handed to an idle thread: whichever wakes first takes it
                    self._wakeups -= 1
                    return self._queue.popleft()  # its runner was counted when it was handed on
                if not notified and len(self._threads) > self._keep and not self._closed:
                    self._threads.discard(me)
                    self._retired += 1
                    return None

    # ---- waits elsewhere (service/core/blocking.py) ----------------------------------------------------------

    def step_aside(self) -> None:
        """The calling pool thread waits on work elsewhere: it no longer counts as a runner."""
        with self._lock:
            self._running -= 1
            self._aside += 1
            starts = self._dispatch_locked() if len(self._queue) > self._wakeups else []
        self._start_all(starts)

    def step_back(self) -> None:
        """The calling pool thread's wait ended: it runs its call on, as a runner (over the count for a while, if
        others were handed calls meanwhile: what it runs now is the rest of a call already begun)."""
        with self._lock:
            self._running += 1
            self._aside -= 1

    # ---- the watchdog ---------------------------------------------------------------------------------------

    def _watch_calls(self) -> None:
        """The watchdog's loop (only with runners): sleeps while no call waits; gives each call that has waited
        `stall` seconds a pass past the runners."""
        while True:
            with self._lock:
                starts = self._next_overdue_locked()
            if starts is None:
                return
            self._start_all(starts)

    def _next_overdue_locked(self) -> list[tuple[threading.Thread, _Work[Any]]] | None:
        """Wait until the oldest waiting call has waited `stall` (or the pool closes: None), then pass every call
        that has, and hand them on."""
        while not self._closed:
            waiting = len(self._queue) - self._wakeups
            if waiting <= 0:
                self._watchdog_idle = True
                self._watch.wait()
                self._watchdog_idle = False
                continue
            now = self._clock()
            due = self._queue[self._wakeups].queued_at + self._stall  # the oldest call not yet handed on
            due = max(due, self._retry_at)
            if now < due:
                self._watch.wait(due - now)
                continue
            overdue = 0
            for index in range(self._wakeups, len(self._queue)):
                if self._queue[index].queued_at + self._stall > now:
                    break
                overdue += 1
            self._passes = max(self._passes, overdue)
            self._overdue += overdue
            return self._dispatch_locked()
        return None

    # ---- statistics and shutdown ----------------------------------------------------------------------------

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
                backlog=len(self._queue),
                start_failures=self._start_failures,
                aside=self._aside,
                overdue=self._overdue,
            )

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new calls and end idle threads; busy threads end after their call and the queued calls they may
        take. `cancel_futures` cancels the calls queued but not yet taken by a thread. `wait` joins every thread
        (without a timeout, like ThreadPoolExecutor). Idempotent."""
        with self._lock:
            self._closed = True
            if cancel_futures:
                while self._queue:
                    self._queue.popleft().future.cancel()
                self._wakeups = 0
            threads = list(self._threads)
            self._work.notify_all()
            self._watch.notify_all()
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()
