"""A stream's requests in flight: each is read as it arrives and run at once, several at a time, and their answers
are written in Triton's order.

ModelStreamInfer (service/servicers/inference.py) hands `StreamRequests` the stream's requests, each with its
`StreamPlacement` (`Dataplane.stream_placement`), and `run`, which runs one request and gives its messages (its
answers, or its error); the servicer writes what `messages()` yields. Nothing here knows gRPC or the requests'
contents. The rules:

* **Admitted as they arrive.** A request is handed to `run` as soon as it is read (unless its lane is full: see
  Lanes), so several requests of one stream are in flight together, each on the ordinary admission, batching and
  sequence path: requests sent together to a batching model queue together and run as one batch. Triton dispatches
  each request of a stream as it reads it in the same way.
* **Bounded.** At most `limit` requests of a stream are in flight (read and not finished; MAX_IN_FLIGHT unless the
  caller says otherwise). At the limit the stream is not read until one finishes: the client's further requests
  wait in the transport (HTTP/2 flow control pushes back on it), never in a queue or a thread here.
* **Answers in Triton's order.** The answers of a request placed `in_order` (a model that is not decoupled) are
  written after those of every earlier in-order request of the stream: Triton 2.51 writes a non-decoupled model's
  responses in the order of the requests ("put it in the context queue so that its response is sent in the same
  order as the request was received", src/grpc/stream_infer_handler.cc; tests/differential/
  test_stream_in_flight.py asks it). Any other request's answers (a decoupled model's) are written as they come.
  Every answer carries its request's id (`run`'s messages do).
* **Lanes.** Requests placed in the same `lane` run at most `width` at a time, in the order read: the next starts
  once an earlier one has finished. The requests of one sequence of a sequence model share a lane of width 1 (their
  turns are taken in arrival order); a model that neither batches nor takes sequences has a lane as wide as its
  slots (more of its requests at once would only wait in its queue, each holding a thread). Requests of other
  lanes, or of none (a batching model's: they queue together to form batches), run at once.
* **An answer is written before the next is made.** `run`'s next message is asked for only once its previous one
  was written (the writer resumed after yielding it), except after the request's last message: then its run ends
  at once (a request's tensor memory is given back and a streaming model's slot freed once its last answer is
  made, as ModelInfer's are before gRPC sends its answer), and the request stays counted in flight until that
  message is written. So a streaming model holds its slot until its last response is taken, and a client that
  stops reading stops the stream's runs too (until the write timeout cancels the call).

Threads: the stream's own. Requests run on "workers", started as needed, never more than `limit` + 1 (one per
request in flight, and a reader). The workers take turns reading the stream: the one that reads a request runs it
and leaves the reading to an idle worker (a new one if none is idle), so a request waits for no hand-off to another
thread. A request read while nothing else is in flight, whose answers keep their place, is run by the thread that
calls `messages()` (the gRPC handler, which otherwise only writes), and the worker that read it reads on: a client
that waits for each answer before sending its next request has its answers written by the thread that made them,
and no worker woken to read for each request; what is read meanwhile runs on workers, and their answers are
written once that run is done (a decoupled model's too, the one exception to "as they come"). `messages()` starts
the first worker and, however it ends, stops them all: it cancels every request still in flight (each has its own
CancelToken, cancelled with the stream's token too, with its reason), wakes every waiting worker, and joins them for
at most STOP_SECONDS; a worker still in a run that ignores cancellation after that is logged and left to finish by
itself (its request releases its lease and tensor memory as it ends, as any request does).

Waits: every wait is on a condition of `_lock`, timed (RECHECK_SECONDS at most) and re-checked, woken by the event
it waits for: a message to write, a finished request, the end of the reading, the stream's cancellation, the stop.
The writer waits in `blocking_wait` (a gRPC runner thread must not be held by an open stream); the workers are no
runner's. A worker idle for IDLE_SECONDS ends when another worker is left to read.

Lock: `_lock` guards every field of `StreamRequests`, and every `_Flight`'s `message`, `pending` and `ended`. It is
a leaf: cancelling a token, starting or joining a thread, and running or reading happen with it released.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from engine.interface import CancelToken

from .core.blocking import blocking_wait

_LOG = logging.getLogger(__name__)

# Requests of one stream in flight at most: what one stream can put into a batch at once, and its threads. Past
# it the stream is read on as its requests finish.
MAX_IN_FLIGHT = 16
# How long a stream that ended waits for its workers after cancelling their requests, before it leaves them to end
# by themselves (under service.server's SHUTDOWN_MARGIN minus the stream's own SHUTDOWN_STREAM_SECONDS).
STOP_SECONDS = 0.9
IDLE_SECONDS = 5.0  # a worker with nothing to do ends after this, unless it is the one left to read the stream
RECHECK_SECONDS = 2.0  # the longest a wait goes without looking at the state again

_READ = object()  # a worker's job: read the stream (see `_next_job`)

Q = TypeVar("Q")  # a request, as the caller reads it
M = TypeVar("M")  # a message to write


@dataclass(frozen=True)
class StreamPlacement:
    """Where a request goes among its stream's others (see the module docstring)."""

    in_order: bool = True  # its answers keep its place among the in-order requests' answers
    lane: Hashable | None = None  # requests of an equal lane run at most `width` at once, in arrival order
    width: int = 1


@dataclass(frozen=True)
class StreamStatistics:
    in_flight: int  # read and not finished (running, its answer waiting to be written, or waiting in its lane)
    workers: int  # threads of the stream alive (or starting)
    idle: int  # workers waiting for a turn to read
    reading: bool  # a worker is reading the stream now
    paused: bool  # nobody reads: the limit is reached
    read_over: bool  # the stream's requests have ended


class _Lane(Generic[Q, M]):
    """The requests of one lane in flight: how many run, and those waiting for a place, oldest first."""

    __slots__ = ("running", "waiting")

    def __init__(self) -> None:
        self.running = 0
        self.waiting: collections.deque[_Flight[Q, M]] = collections.deque()


class _Flight(Generic[Q, M]):
    """One request from its reading to the end of its run."""

    __slots__ = ("request", "placement", "token", "written", "message", "pending", "ended", "in_order")

    def __init__(self, request: Q, placement: StreamPlacement, token: CancelToken, written: threading.Condition):
        self.request = request
        self.placement = placement
        self.token = token  # its own: the dataplane puts what the request says about itself on it
        self.written = written  # its worker waits here for its message to be written
        self.message: M | None = None
        self.pending = False  # `message` waits to be written
        self.ended = False  # its run is over (its last message may still wait to be written)
        self.in_order = placement.in_order  # until it answers more than once (see `_post`)


class StreamRequests(Generic[Q, M]):
    """The requests of one stream in flight (see the module docstring). Iterate `messages()` once, from the thread
    that writes the stream; it starts and stops everything else.

    Longer than the house's ~300 lines for a reason: reading, running, ordering and ending share one lock and one
    state (the requests in flight, their order, the reading turn, the worker threads), and each method is one move
    of that state; split apart, the moves of one race would sit in different classes."""

    def __init__(
        self,
        requests: Iterator[tuple[Q, StreamPlacement]],
        run: Callable[[Q, CancelToken], Iterator[tuple[M, bool]]],
        cancel: CancelToken,
        *,
        limit: int = MAX_IN_FLIGHT,
        name: str = "stream-request",
    ) -> None:
        """`requests` gives each request with its placement, blocking until the next one is read; it ends with the
        stream (an exception from it ends the reading, and is raised by `messages()` once the requests read
        before it are answered). `run(request, token)` gives the request's messages, each as (message, last):
        `last` says that no message of the request follows, so that its run may end without waiting for it to be
        written (the request is still counted in flight until it is). It must answer a failed request with a
        message, not an exception (an exception is taken for a defect and ends the stream with it).
        `cancel` is the stream's token: when it fires every request in flight, and every request read later, is
        cancelled with its reason."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self._requests = requests
        self._run_one = run
        self._cancel = cancel
        self._limit = limit
        self._name = name
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()  # guards: every field below, and each _Flight's message, pending and ended
        self._to_read = threading.Condition(self._lock)  # idle workers wait here for their turn to read
        self._to_write = threading.Condition(self._lock)  # the writer waits here for a message to write
        self._flights: set[_Flight[Q, M]] = set()  # read and not finished
        self._order: collections.deque[_Flight[Q, M]] = collections.deque()  # in-order ones, in reading order
        self._ready: collections.deque[_Flight[Q, M]] = collections.deque()  # a message to write now, in order
        self._lanes: dict[Hashable, _Lane[Q, M]] = {}  # lane -> its running count and its requests waiting
        self._threads: set[threading.Thread] = set()
        self._handed: _Flight[Q, M] | None = None  # read while nothing else was in flight: the writer runs it
        self._runnable: collections.deque[_Flight[Q, M]] = collections.deque()  # for the next free worker
        self._idle = 0
        self._reading = False
        self._reader: threading.Thread | None = None  # the worker in a read now (it ends when the call does)
        self._read_over = False
        self._read_error: BaseException | None = None
        self._failure: BaseException | None = None  # a defect in `run`: the stream ends with it
        self._stopped = False

    # ---- the writer -----------------------------------------------------------------------------------------

    def messages(self) -> Iterator[M]:
        """Every message of the stream's requests, in the order to write them; the next one is taken only after
        the caller came back from the previous (it was written). Ends once the stream's requests have ended and
        every request read was answered; then raises the reading's exception, if it ended with one, or a run's
        defect. Blocks (stepping aside from the gRPC runners) while there is nothing to write. However it ends
        (closed by the caller too), every request still in flight is cancelled and the workers are joined for at
        most STOP_SECONDS."""
        self._cancel.add_callback(self._on_cancel)
        try:
            self._start_worker()
            while (flight := self._next_to_write()) is not None:
                if flight.pending:
                    yield flight.message  # type: ignore[misc]  # pending: its message is set
                    self._written(flight)
                else:  # handed over to run here
                    yield from self._run_here(flight)
            if self._failure is not None:
                raise self._failure
            if self._read_error is not None:
                raise self._read_error
        finally:
            self._cancel.remove_callback(self._on_cancel)
            self._stop()

    def _next_to_write(self) -> _Flight[Q, M] | None:
        """The flight whose message goes next, or one handed over to run on this thread; None when the stream is
        done (or failed)."""
        with self._lock:
            if (flight := self._next_locked()) is not None or self._done_locked():
                return flight
        with blocking_wait, self._lock:
            while (flight := self._next_locked()) is None:
                if self._done_locked():
                    return None
                self._to_write.wait(RECHECK_SECONDS)
            return flight

    def _next_locked(self) -> _Flight[Q, M] | None:
        if self._ready:
            return self._ready.popleft()
        flight, self._handed = self._handed, None
        return flight

    def _run_here(self, flight: _Flight[Q, M]) -> Iterator[M]:
        """Run a request handed over (it came alone: nothing else was in flight) on the writer's own thread and
        write its messages as they come, without a hand-off between threads: a stream whose client waits for each
        answer before its next request (ping-pong) costs what it cost when the handler ran its requests itself.
        The worker that read it reads on, and any request read meanwhile runs on a worker; their answers are
        written once this run is done (an in-order one's would wait for this request's anyway). A request that
        waited in its lane goes to a worker: it may have later requests before it in the order."""
        messages = self._run_one(flight.request, flight.token)
        try:
            for message, _last in messages:
                yield message
        finally:
            close = getattr(messages, "close", None)
            if close is not None:
                close()
        successor = self._finish(flight)
        if successor is not None:
            self._to_a_worker(successor)

    def _to_a_worker(self, flight: _Flight[Q, M]) -> None:
        """Have a worker run `flight` (an idle one, else a new one: the thread bound leaves room for one per
        request in flight besides the reader)."""
        another = None
        with self._lock:
            self._runnable.append(flight)
            if self._idle:
                self._to_read.notify()
            elif len(self._threads) <= self._limit:
                another = self._new_worker_locked()
        if another is not None:
            self._launch(another)

    def _done_locked(self) -> bool:
        return self._failure is not None or (self._read_over and not self._flights and self._handed is None)

    def _written(self, flight: _Flight[Q, M]) -> None:
        with self._lock:
            flight.message, flight.pending = None, False
            if flight.ended:  # its run did not wait for its last message: it ends here
                self._retire_locked(flight)
            else:
                flight.written.notify()

    # ---- the workers ----------------------------------------------------------------------------------------

    def _start_worker(self) -> None:
        """Start the first worker."""
        with self._lock:
            thread = self._new_worker_locked()
        self._launch(thread)

    def _new_worker_locked(self) -> threading.Thread:
        """A worker counted among the stream's threads (so that the limit holds before it starts); `_launch` it
        once the lock is released."""
        thread = threading.Thread(target=self._work, name=f"{self._name}-{next(self._numbers)}", daemon=True)
        self._threads.add(thread)
        return thread

    def _launch(self, thread: threading.Thread) -> None:
        try:
            thread.start()
        except RuntimeError as error:  # the operating system refused a thread: the others read on
            with self._lock:
                self._threads.discard(thread)
                alone = not self._threads
            if alone:  # nobody would read the stream, nor answer it: end it with the error
                self._fail(error)
            else:
                _LOG.warning("could not start a thread for a stream's requests (%s); its other threads go on", error)

    def _work(self) -> None:
        """A worker's loop: take a turn to read, run what it read (and the requests that waited in its lane), again;
        until the stream's requests end, the stream stops, or it has been idle long enough."""
        try:
            while (flight := self._take()) is not None:
                while flight is not None:
                    self._run(flight)
                    flight = self._finish(flight)
        except BaseException as error:  # a defect (in `run`, or here): the stream ends with it
            self._fail(error)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())
                self._to_read.notify()
                self._to_write.notify()

    def _take(self) -> _Flight[Q, M] | None:
        """The next request for this worker to run: one handed to the workers, else the next one it reads that is
        to run now (not one that waits in its lane, nor one the writer takes). None when this worker is to end."""
        while True:
            job, reader = self._next_job()
            if reader is not None:
                self._launch(reader)
            if job is not _READ:
                return job  # type: ignore[return-value]  # a flight to run, or None
            try:
                read: tuple[Q, StreamPlacement] | None = next(self._requests, None)
            except BaseException as error:  # the stream failed (a cancelled call raises here): reading ends
                read = None
                with self._lock:
                    self._read_error = error
            another: threading.Thread | None = None
            with self._lock:
                self._reading, self._reader = False, None
                if read is None:
                    self._read_over = True
                    self._to_read.notify_all()
                    self._to_write.notify()
                    return None
                if self._stopped:
                    return None
                flight, run_now = self._admit_locked(*read)
                if run_now and len(self._flights) == 1 and flight.in_order:
                    self._handed, run_now = flight, False  # alone: the writer runs it; this worker reads on
                    self._to_write.notify()
                elif not run_now:
                    pass  # it waits in its lane; this worker reads on
                elif self._idle:
                    self._to_read.notify()  # an idle worker reads the next one
                elif len(self._threads) <= self._limit:
                    # To read on while this one runs what it read (at the limit: once a request finishes; the
                    # writer's own run may be the one, and it does not come back to read).
                    another = self._new_worker_locked()
            if self._cancel.cancelled:  # (after the lock: `_on_cancel` either saw this flight or runs after this)
                flight.token.cancel(self._cancel.reason)
            if another is not None:
                self._launch(another)
            if run_now:
                return flight

    def _next_job(self) -> tuple[_Flight[Q, M] | object | None, threading.Thread | None]:
        """Wait for this worker's next job: a flight handed to the workers, or its turn to read (_READ: nobody else
        reads, and the limit leaves room); with a worker to launch, to read while this one runs a flight handed
        over, if nobody else would. The job is None when this worker is to end instead: the stream stopped or
        failed, the reading is over and nothing is left to run, or it was idle IDLE_SECONDS while another worker
        reads or waits to (so that a request finishing on the writer's thread always finds a reader)."""
        idle_until = time.monotonic() + IDLE_SECONDS
        with self._lock:
            while True:
                if self._stopped or self._failure is not None:
                    return None, None
                if self._runnable:
                    flight = self._runnable.popleft()
                    wanted = not self._read_over and not self._reading and not self._idle
                    if wanted and self._in_flight_locked() < self._limit and len(self._threads) <= self._limit:
                        return flight, self._new_worker_locked()
                    return flight, None
                if self._read_over:
                    return None, None
                if not self._reading and self._in_flight_locked() < self._limit:
                    self._reading, self._reader = True, threading.current_thread()
                    return _READ, None
                left = idle_until - time.monotonic()
                if left <= 0 and (self._reading or self._idle > 0):  # another one reads, or will
                    return None, None
                self._idle += 1
                try:
                    self._to_read.wait(min(left, RECHECK_SECONDS) if left > 0 else RECHECK_SECONDS)
                finally:
                    self._idle -= 1

    def _in_flight_locked(self) -> int:
        return len(self._flights)

    def _admit_locked(self, request: Q, placement: StreamPlacement) -> tuple[_Flight[Q, M], bool]:
        """Count a request read in flight, in its place. Returns it, and whether it runs now (False: its lane is
        full; it waits there)."""
        flight: _Flight[Q, M] = _Flight(request, placement, CancelToken(), threading.Condition(self._lock))
        self._flights.add(flight)
        if flight.in_order:
            self._order.append(flight)
        if placement.lane is None:
            return flight, True
        lane = self._lanes.get(placement.lane)
        if lane is None:
            lane = self._lanes[placement.lane] = _Lane()
        if lane.running < placement.width and not lane.waiting:
            lane.running += 1
            return flight, True
        lane.waiting.append(flight)
        return flight, False

    def _run(self, flight: _Flight[Q, M]) -> None:
        """Run one request and hand each of its messages to the writer, the next only once the previous was
        written (its last one: without waiting for it). Stops asking for messages (and closes the run, which
        releases what it holds) when the stream stopped."""
        messages = self._run_one(flight.request, flight.token)
        try:
            for message, last in messages:
                if not self._post(flight, message, last):
                    return
        finally:
            close = getattr(messages, "close", None)  # a generator's; a plain iterator has nothing to close
            if close is not None:
                close()

    def _post(self, flight: _Flight[Q, M], message: M, last: bool) -> bool:
        """Hand `message` to the writer and wait until it is written, unless it is the request's `last` (a message
        after a last one waits for that one first). False: the stream stopped; not written."""
        with self._lock:
            while flight.pending and not self._stopped:
                flight.written.wait(RECHECK_SECONDS)
            if self._stopped:
                return False
            if not last and flight.in_order:
                self._out_of_order_locked(flight)
            flight.message, flight.pending = message, True
            if not flight.in_order or self._order[0] is flight:
                self._ready.append(flight)
                self._to_write.notify()
            if last:
                return True
            while flight.pending and not self._stopped:
                flight.written.wait(RECHECK_SECONDS)
            return not flight.pending

    def _out_of_order_locked(self, flight: _Flight[Q, M]) -> None:
        """A request placed in order answers more than once (a streaming model that is not decoupled: the test
        backend's, never one of Triton's, which answer once): from now on its answers are written as they come.
        Kept in order, it could hold its slot waiting for an earlier request's answer while that request waits for
        the slot."""
        self._leave_order_locked(flight)
        flight.in_order = False

    def _leave_order_locked(self, flight: _Flight[Q, M]) -> None:
        was_first = self._order[0] is flight
        self._order.remove(flight)
        if was_first and self._order and self._order[0].pending:
            self._ready.append(self._order[0])
            self._to_write.notify()

    def _finish(self, flight: _Flight[Q, M]) -> _Flight[Q, M] | None:
        """The request's run has ended: it leaves the stream's count and order now, or once its last message is
        written (`_written`). Returns the oldest request waiting in its lane, which takes its place there, to run
        now on this worker (None if none, or the stream stopped): it need not wait for this one's answer to be
        written, which keeps its place in the order anyway."""
        with self._lock:
            flight.ended = True
            if not flight.pending:
                self._retire_locked(flight)
            key = flight.placement.lane
            if key is None:
                return None
            lane = self._lanes[key]
            if lane.waiting and not self._stopped:
                return lane.waiting.popleft()
            lane.running -= 1
            if not lane.running and not lane.waiting:
                del self._lanes[key]
            return None

    def _retire_locked(self, flight: _Flight[Q, M]) -> None:
        """A request is over (run ended, messages written): out of the count, and of the order (the next in-order
        request's message may go now)."""
        at_limit = len(self._flights) >= self._limit
        self._flights.discard(flight)
        if flight.in_order:
            self._leave_order_locked(flight)
        if at_limit:
            self._to_read.notify()  # room under the limit again
        self._to_write.notify()  # maybe the stream's end, or a message to write

    def _fail(self, error: BaseException) -> None:
        _LOG.error("a stream's request thread failed; the stream ends", exc_info=error)
        with self._lock:
            if self._failure is None:
                self._failure = error
            self._to_write.notify()
            self._to_read.notify_all()

    # ---- cancellation and stop --------------------------------------------------------------------------------

    def _on_cancel(self) -> None:
        """The stream's token fired (client gone, deadline, shutdown): cancel every request in flight with its
        reason. Requests read later are cancelled as they are read. Idempotent; never blocks for long."""
        with self._lock:
            tokens = [flight.token for flight in self._flights]
        for token in tokens:
            token.cancel(self._cancel.reason)

    def _stop(self) -> None:
        """The writer is done (or closed): cancel what is in flight, wake every worker, and join them for at most
        STOP_SECONDS. A worker still in a read is not waited for: the read ends when the call does (gRPC ends it
        once this handler returns or raises), and the worker with it, having read nothing it would run."""
        with self._lock:
            self._stopped = True
            flights = list(self._flights)
            threads = [thread for thread in self._threads if thread is not self._reader]
            for flight in flights:
                flight.written.notify()
            self._to_read.notify_all()
        for flight in flights:
            flight.token.cancel(self._cancel.reason)
        deadline = time.monotonic() + STOP_SECONDS
        for thread in threads:
            if thread.ident is not None:  # (one counted but not started yet sees the stop as it starts)
                thread.join(max(0.0, deadline - time.monotonic()))
        left = [thread.name for thread in threads if thread.is_alive()]
        if left:
            _LOG.warning(
                "a stream ended with %d thread(s) still in a request %.1f s after it was cancelled (%s); they end "
                "by themselves",
                len(left),
                STOP_SECONDS,
                ", ".join(left),
            )

    def statistics(self) -> StreamStatistics:
        with self._lock:
            return StreamStatistics(
                in_flight=len(self._flights),
                workers=len(self._threads),
                idle=self._idle,
                reading=self._reading,
                paused=not self._reading and len(self._flights) >= self._limit and not self._read_over,
                read_over=self._read_over,
            )


__all__ = ["MAX_IN_FLIGHT", "StreamPlacement", "StreamRequests", "StreamStatistics"]
