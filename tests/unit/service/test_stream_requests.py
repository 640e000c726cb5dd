"""service/stream_requests.py without gRPC: a stream's requests run at once up to the limit (then the reading
pauses), answers in Triton's order (in-order ones in the order read, the others as they come), requests of one
lane one after another, cancellation of every request in flight, the stop and its threads, and what a
defect or a failed reading does. Events and statistics order everything; nothing sleeps to order them."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from engine.interface import CancelToken
from service.stream_requests import StreamPlacement, StreamRequests

WAIT = 30.0
IN_ORDER = StreamPlacement()
AS_THEY_COME = StreamPlacement(in_order=False)


def eventually(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)  # ordering-free: re-checks an observable state until a deadline


class Requests:
    """What the stream reads: the test puts (request, placement) pairs, then None to end it. Counts the reads."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.asked = 0

    def put(self, request: str, placement: StreamPlacement = IN_ORDER) -> None:
        self._queue.put((request, placement))

    def end(self) -> None:
        self._queue.put(None)

    def fail(self, error: BaseException) -> None:
        self._queue.put(error)

    def __iter__(self):
        while True:
            self.asked += 1
            item = self._queue.get(timeout=WAIT)
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


class Runs:
    """`run` for the stream: request "x" answers "x" (and "x+" for "x*2", its first answer not its last); a request
    with a gate waits for it (or for its token) first. Records starts, answers made ("ran") and ends, and each
    request's token."""

    def __init__(self) -> None:
        self.gates: dict[str, threading.Event] = {}
        self.events: list[str] = []
        self.tokens: dict[str, CancelToken] = {}
        self.threads: dict[str, str] = {}  # request -> the thread that ran it
        self._lock = threading.Lock()

    def gate(self, request: str) -> threading.Event:
        return self.gates.setdefault(request, threading.Event())

    def note(self, event: str) -> None:
        with self._lock:
            self.events.append(event)

    def __call__(self, request: str, token: CancelToken):
        self.tokens[request] = token
        self.threads[request] = threading.current_thread().name
        self.note(f"start {request}")
        gate = self.gates.get(request)
        if gate is not None:
            token.add_callback(gate.set)
            assert gate.wait(WAIT)
        if token.cancelled:
            self.note(f"end {request}")
            yield f"{request} cancelled: {token.reason}", True
            return
        self.note(f"ran {request}")  # its answer is made; it is written (and the run goes on) in its turn
        twice = request.endswith("*2")
        yield request, not twice
        if twice:
            yield request + "+", True
        self.note(f"end {request}")


class Writer:
    """Iterates `messages()` on a thread of its own, as the gRPC handler would; `written` lists the messages."""

    def __init__(self, stream: StreamRequests) -> None:
        self.written: list[str] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._write, args=(stream,), name="writer", daemon=True)
        self._thread.start()

    def _write(self, stream: StreamRequests) -> None:
        try:
            for message in stream.messages():
                self.written.append(message)
        except BaseException as error:  # inspected by the test
            self.error = error

    def join(self) -> list[str]:
        self._thread.join(WAIT)
        assert not self._thread.is_alive()
        return self.written


def stream_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("stream-request")]


def start(requests: Requests, runs: Runs, limit: int = 16, cancel: CancelToken | None = None):
    stream = StreamRequests(iter(requests), runs, cancel or CancelToken(), limit=limit)
    return stream, Writer(stream)


def test_an_in_order_request_done_early_is_written_after_the_earlier_ones():
    requests, runs = Requests(), Runs()
    first = runs.gate("a")
    stream, writer = start(requests, runs)
    requests.put("a")
    requests.put("b")
    eventually(lambda: "ran b" in runs.events, "b run while a is held")
    assert writer.written == []
    first.set()
    requests.end()
    assert writer.join() == ["a", "b"] and writer.error is None
    assert not stream_threads()


def test_requests_placed_as_they_come_are_written_as_they_come():
    requests, runs = Requests(), Runs()
    first = runs.gate("a")
    stream, writer = start(requests, runs)
    requests.put("a", AS_THEY_COME)
    requests.put("b", AS_THEY_COME)
    eventually(lambda: writer.written == ["b"], "b written while a is held")
    first.set()
    requests.end()
    assert writer.join() == ["b", "a"]


def test_every_answer_of_the_first_in_order_request_comes_before_the_next_ones():
    requests, runs = Requests(), Runs()
    stream, writer = start(requests, runs)
    runs.gate("a*2")
    requests.put("a*2")
    requests.put("b")
    eventually(lambda: "ran b" in runs.events, "b run")
    runs.gates["a*2"].set()
    requests.end()
    assert writer.join() == ["a*2", "a*2+", "b"]


def test_requests_of_one_lane_run_one_after_another_and_others_run_meanwhile():
    requests, runs = Requests(), Runs()
    first = runs.gate("a1")
    stream, writer = start(requests, runs)
    key_a, key_c = StreamPlacement(lane="a"), StreamPlacement(lane="c")
    requests.put("a1", key_a)
    requests.put("a2", key_a)
    requests.put("c1", key_c)
    eventually(lambda: "ran c1" in runs.events, "another lane's request run while a1 is held")
    eventually(lambda: stream.statistics().in_flight == 3, "the three read")
    assert "start a2" not in runs.events  # it waits behind a1
    first.set()
    requests.end()
    assert writer.join() == ["a1", "a2", "c1"]
    assert runs.events.index("start a2") > runs.events.index("end a1")


def test_at_the_limit_the_stream_is_not_read_until_a_request_finishes():
    requests, runs = Requests(), Runs()
    gates = [runs.gate(name) for name in ("a", "b", "c")]
    stream, writer = start(requests, runs, limit=2)
    for name in ("a", "b", "c", "d"):
        requests.put(name)
    eventually(lambda: "start b" in runs.events, "two requests running")
    eventually(lambda: stream.statistics().paused, "the reading paused at the limit")
    assert requests.asked == 2 and stream.statistics().in_flight == 2
    assert stream.statistics().workers <= 2
    gates[0].set()
    eventually(lambda: "start c" in runs.events, "the third read once the first finished")
    gates[1].set()
    gates[2].set()
    requests.end()
    assert writer.join() == ["a", "b", "c", "d"]


def test_the_streams_cancellation_cancels_every_request_in_flight_and_those_read_after_with_its_reason():
    requests, runs = Requests(), Runs()
    cancel = CancelToken()
    for name in ("a", "b"):
        runs.gate(name)
    stream, writer = start(requests, runs, cancel=cancel)
    requests.put("a", AS_THEY_COME)
    requests.put("b", AS_THEY_COME)
    eventually(lambda: "start b" in runs.events, "both running")
    cancel.cancel("shutdown")
    requests.put("c")
    requests.end()
    assert sorted(writer.join()) == ["a cancelled: shutdown", "b cancelled: shutdown", "c cancelled: shutdown"]
    assert len({id(token) for token in runs.tokens.values()}) == 3  # each request its own token


def test_closing_the_writer_cancels_what_runs_and_joins_the_threads_that_run_it():
    requests, runs = Requests(), Runs()
    runs.gate("b")
    stream = StreamRequests(iter(requests), runs, CancelToken())
    messages = stream.messages()
    requests.put("a", AS_THEY_COME)
    requests.put("b", AS_THEY_COME)
    assert next(messages) == "a"
    eventually(lambda: "start b" in runs.events, "b running")
    messages.close()  # the call ended at a write: gRPC closes the generator
    assert runs.tokens["b"].cancelled and runs.tokens["a"].cancelled
    assert "end b" in runs.events  # its worker was joined: its run saw the cancel and ended
    requests.end()  # the reading ends with the call (the reader is not waited for)
    eventually(lambda: not stream_threads(), "the reader gone too")


def test_a_defect_in_a_run_ends_the_stream_with_it():
    requests = Requests()

    def run(request: str, token: CancelToken):
        raise RuntimeError(f"defect in {request}")
        yield  # a generator

    stream = StreamRequests(iter(requests), run, CancelToken())
    writer = Writer(stream)
    requests.put("a")
    writer.join()
    assert isinstance(writer.error, RuntimeError) and "defect in a" in str(writer.error)
    requests.end()


def test_a_reading_that_fails_is_raised_after_the_requests_read_before_it_are_answered():
    requests, runs = Requests(), Runs()
    first = runs.gate("a")
    stream, writer = start(requests, runs)
    requests.put("a")
    requests.fail(ConnectionError("the call was cancelled"))
    eventually(lambda: stream.statistics().read_over, "the reading ended")
    first.set()
    assert writer.join() == ["a"]
    assert isinstance(writer.error, ConnectionError)


def test_the_limit_must_be_positive():
    with pytest.raises(ValueError):
        StreamRequests(iter(()), Runs(), CancelToken(), limit=0)


def test_a_request_whose_last_answer_waits_to_be_written_still_counts_against_the_limit():
    requests, runs = Requests(), Runs()
    first = runs.gate("a")
    stream, writer = start(requests, runs, limit=2)
    for name in ("a", "b", "c"):
        requests.put(name)
    eventually(lambda: "end b" in runs.events, "b's run ended (its answer waits behind a's)")
    eventually(lambda: stream.statistics().paused, "the reading paused at the limit")
    assert requests.asked == 2 and writer.written == []
    first.set()
    requests.end()
    assert writer.join() == ["a", "b", "c"]


def test_a_request_that_comes_alone_runs_on_the_writers_thread_and_the_reader_reads_on():
    """A client that waits for each answer before its next request (ping-pong): each request finds nothing else in
    flight and runs on the writer's thread (no hand-off of its answer); one worker reads them all."""
    requests, runs = Requests(), Runs()
    stream, writer = start(requests, runs)
    for n, name in enumerate(("a", "b", "c"), 1):
        requests.put(name)
        eventually(lambda n=n: len(writer.written) == n, f"answer {n}")
    assert set(runs.threads.values()) == {"writer"}
    assert stream.statistics().workers == 1
    requests.end()
    assert writer.join() == ["a", "b", "c"]


def test_the_next_request_of_a_lane_run_on_the_writers_thread_goes_to_a_worker_and_keeps_its_place():
    """a1 comes alone (the writer runs it), then b1 (another lane, on a worker) and a2 (behind a1): once a1 is done,
    a2 runs on a worker, and its answer waits for b1's, which came before it."""
    requests, runs = Requests(), Runs()
    first, other = runs.gate("a1"), runs.gate("b1")
    stream, writer = start(requests, runs)
    key_a, key_b = StreamPlacement(lane="a"), StreamPlacement(lane="b")
    requests.put("a1", key_a)
    eventually(lambda: "start a1" in runs.events, "a1 running")
    requests.put("b1", key_b)
    requests.put("a2", key_a)
    eventually(lambda: "start b1" in runs.events and stream.statistics().in_flight == 3, "b1 running, a2 waiting")
    first.set()
    eventually(lambda: "ran a2" in runs.events, "a2 run once a1 was done")
    assert writer.written == ["a1"]
    other.set()
    requests.end()
    assert writer.join() == ["a1", "b1", "a2"]
    assert runs.threads["a1"] == "writer" and runs.threads["a2"] != "writer"


def test_a_lane_runs_as_many_at_once_as_its_width_and_the_next_when_one_finishes():
    """A model of two slots that does not batch: its requests run two at a time; the third waits in the lane (not
    in the model's queue) until one of them has finished, then runs where it finished."""
    requests, runs = Requests(), Runs()
    first, second = runs.gate("a"), runs.gate("b")
    stream, writer = start(requests, runs)
    lane = StreamPlacement(lane="m", width=2)
    for name in ("a", "b", "c"):
        requests.put(name, lane)
    eventually(lambda: "start b" in runs.events and stream.statistics().in_flight == 3, "a and b running, c read")
    assert "start c" not in runs.events
    second.set()
    eventually(lambda: "start c" in runs.events, "c run once b finished")
    assert runs.threads["c"] == runs.threads["b"]
    first.set()
    requests.end()
    assert writer.join() == ["a", "b", "c"]
