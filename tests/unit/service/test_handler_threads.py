"""service.handler_threads: every call runs at once on a thread of its own; threads beyond `keep` end when idle;
nothing is left behind; a thread the OS refuses never loses a call."""

from __future__ import annotations

import threading
import time

import pytest

from service.handler_threads import HandlerThreads

WAIT = 30.0  # generous: "eventually" on a loaded machine


def _wait_for(predicate, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)  # ordering-free: re-checks an observable state; orders nothing


def _refuse_thread(thread: threading.Thread) -> None:
    raise RuntimeError("can't start new thread")


@pytest.fixture
def pool():
    threads = HandlerThreads(keep=2, linger=0.05, name="test-handler")
    yield threads
    threads.shutdown(wait=True)


def _blocked_calls(pool: HandlerThreads, count: int, gate: threading.Event) -> list:
    started = threading.Semaphore(0)

    def call():
        started.release()
        gate.wait(WAIT)
        return threading.current_thread().name

    submitted = [pool.submit(call) for _ in range(count)]
    for _ in range(count):
        assert started.acquire(timeout=WAIT), "a submitted call did not start while others were blocked"
    return submitted


def test_a_call_never_waits_behind_blocked_calls(pool):
    gate = threading.Event()
    blocked = _blocked_calls(pool, 20, gate)  # ten times `keep`, each blocked until the gate opens
    assert pool.submit(lambda: "answered").result(timeout=WAIT) == "answered"
    statistics = pool.statistics()
    assert statistics.busy == 20 and statistics.threads >= 20 and statistics.backlog == 0
    gate.set()
    names = {future.result(timeout=WAIT) for future in blocked}
    assert len(names) == 20  # each ran on a thread of its own


def test_threads_beyond_keep_end_after_linger_and_kept_threads_stay(pool):
    gate = threading.Event()
    blocked = _blocked_calls(pool, 10, gate)
    assert pool.statistics().threads == 10
    gate.set()
    for future in blocked:
        future.result(timeout=WAIT)
    _wait_for(lambda: pool.statistics().threads == 2, "the threads beyond keep=2 to end")
    statistics = pool.statistics()
    assert (statistics.busy, statistics.idle, statistics.retired, statistics.peak) == (0, 2, 8, 10)
    # The kept threads serve the next calls; no new thread starts for them.
    for value in range(5):
        assert pool.submit(lambda v=value: v).result(timeout=WAIT) == value
        _wait_for(lambda: pool.statistics().idle == 2, "both kept threads to be idle")
    assert pool.statistics().started == 10


def test_bursts_after_threads_retired_each_get_a_thread_per_call(pool):
    """The idle accounting stays exact across bursts, retirements and reuse: a later burst never waits for a
    thread that has ended."""
    for burst in (30, 5, 40):
        gate = threading.Event()
        blocked = _blocked_calls(pool, burst, gate)  # fails unless every call of the burst starts at once
        assert pool.submit(lambda: "still answered").result(timeout=WAIT) == "still answered"
        gate.set()
        for future in blocked:
            future.result(timeout=WAIT)
        _wait_for(lambda: pool.statistics().threads == 2, "the threads beyond keep=2 to end")
    statistics = pool.statistics()
    assert (statistics.busy, statistics.idle, statistics.backlog) == (0, 2, 0)


def test_an_idle_thread_is_reused_rather_than_a_new_one_started():
    threads = HandlerThreads(keep=1, linger=WAIT)
    try:
        for value in range(50):
            assert threads.submit(lambda v=value: v * 2).result(timeout=WAIT) == value * 2
            _wait_for(lambda: threads.statistics().idle == 1, "the thread to go idle")
        assert threads.statistics().started == 1
    finally:
        threads.shutdown(wait=True)


def test_exceptions_reach_the_future_and_the_thread_goes_on(pool):
    def fail():
        raise ValueError("bad call")

    with pytest.raises(ValueError, match="bad call"):
        pool.submit(fail).result(timeout=WAIT)
    assert pool.submit(lambda: 7).result(timeout=WAIT) == 7


def test_done_callbacks_run_once_the_call_returns(pool):
    done = threading.Event()
    future = pool.submit(lambda: 1)
    future.add_done_callback(lambda _: done.set())  # grpcio counts its calls this way
    assert done.wait(WAIT) and future.result() == 1


def test_shutdown_refuses_new_calls_ends_idle_threads_and_lets_busy_ones_finish():
    threads = HandlerThreads(keep=4, linger=WAIT)
    gate = threading.Event()
    busy = _blocked_calls(threads, 2, gate)
    for _ in range(2):
        threads.submit(lambda: None).result(timeout=WAIT)
    threads.shutdown(wait=False)
    with pytest.raises(RuntimeError, match="after shutdown"):
        threads.submit(lambda: None)
    gate.set()
    assert all(future.result(timeout=WAIT) for future in busy)
    _wait_for(lambda: threads.statistics().threads == 0, "every thread to end after shutdown")
    threads.shutdown(wait=True)  # idempotent


def test_a_thread_the_os_refuses_leaves_the_call_in_a_backlog_for_the_next_free_thread(caplog):
    threads = HandlerThreads(keep=1, linger=WAIT)
    gate = threading.Event()
    try:
        blocked = _blocked_calls(threads, 1, gate)

        threads._start = _refuse_thread  # the OS's refusal, for this instance only
        waiting = threads.submit(lambda: "ran later")
        statistics = threads.statistics()
        assert (statistics.backlog, statistics.start_failures, statistics.threads) == (1, 1, 1)
        assert "could not start a gRPC handler thread" in caplog.text
        assert not waiting.done()
        gate.set()  # the busy thread finishes its call and takes the waiting one
        assert waiting.result(timeout=WAIT) == "ran later"
        assert blocked[0].result(timeout=WAIT)
        assert threads.statistics().backlog == 0
    finally:
        gate.set()
        threads.shutdown(wait=True)


def test_shutdown_with_cancel_futures_cancels_the_backlog():
    threads = HandlerThreads(keep=1, linger=WAIT)
    gate = threading.Event()
    blocked = _blocked_calls(threads, 1, gate)
    threads._start = _refuse_thread
    waiting = threads.submit(lambda: "never")
    threads.shutdown(wait=False, cancel_futures=True)
    assert waiting.cancelled()
    gate.set()
    assert blocked[0].result(timeout=WAIT)
    threads.shutdown(wait=True)
    assert threads.statistics().threads == 0


def test_keep_and_linger_must_not_be_negative():
    with pytest.raises(ValueError, match="keep"):
        HandlerThreads(keep=-1)
    with pytest.raises(ValueError, match="linger"):
        HandlerThreads(keep=1, linger=-0.5)


# ---- runners: a few threads run calls, a call that waited `stall` gets its own (service/handler_threads.py) ----

from service.core.blocking import blocking_wait  # noqa: E402


@pytest.fixture
def runners():
    made = []

    def make(count: int, stall: float = WAIT * 10) -> HandlerThreads:  # a stall that never comes unless asked for
        made.append(HandlerThreads(keep=8, runners=count, stall=stall, linger=WAIT, name="test-runner"))
        return made[-1]

    yield make
    for threads in made:
        threads.shutdown(wait=True)


def _holding(pool: HandlerThreads, gate: threading.Event, *, aside: bool = False):
    """Submit a call that blocks on `gate` (inside blocking_wait when `aside`); returns it once it runs."""
    running = threading.Event()

    def call():
        running.set()
        if aside:
            with blocking_wait:
                gate.wait(WAIT)
        else:
            gate.wait(WAIT)
        return threading.current_thread().name

    future = pool.submit(call)
    assert running.wait(WAIT), "the call did not start"
    return future


def test_calls_beyond_the_runners_wait_their_turn_in_arrival_order(runners):
    pool = runners(2)
    gate = threading.Event()
    held = [_holding(pool, gate) for _ in range(2)]
    order: list[int] = []
    waiting = [pool.submit(order.append, index) for index in range(5)]
    statistics = pool.statistics()
    assert statistics.backlog == 5 and statistics.busy == 2 and statistics.overdue == 0  # decided in submit
    assert not any(future.done() for future in waiting)
    gate.set()
    for future in held + waiting:
        future.result(timeout=WAIT)
    assert order == [0, 1, 2, 3, 4]
    assert pool.statistics().started == 2  # the runners took the waiting calls themselves


def test_a_thread_waiting_elsewhere_lets_the_next_call_run(runners):
    """What a model with many slots needs: calls waiting on their engine do not hold the runners."""
    pool = runners(1)
    gate = threading.Event()
    in_engine = [_holding(pool, gate, aside=True) for _ in range(4)]  # each started while the others wait aside
    assert pool.submit(lambda: "answered").result(timeout=WAIT) == "answered"
    statistics = pool.statistics()
    assert statistics.aside == 4 and statistics.overdue == 0
    gate.set()
    assert len({future.result(timeout=WAIT) for future in in_engine}) == 4
    _wait_for(lambda: pool.statistics().aside == 0 and pool.statistics().busy == 0, "every call to end")


def test_a_call_that_waited_the_stall_gets_a_thread_of_its_own(runners):
    """Stuck runners (a call still sending its message, a call waiting for a slot) hold nobody for long."""
    pool = runners(2, stall=0.05)
    gate = threading.Event()
    try:
        stuck = [_holding(pool, gate) for _ in range(2)]
        probe = pool.submit(lambda: "probe answered")
        assert probe.result(timeout=WAIT) == "probe answered"  # while both runners are still stuck
        assert not any(future.done() for future in stuck)
        assert pool.statistics().overdue == 1
    finally:
        gate.set()
    for future in stuck:
        future.result(timeout=WAIT)


def test_a_stall_wait_bounds_how_long_the_runners_hold_a_call_back(runners):
    """The watchdog acts on the oldest waiting call, not on progress: calls that keep finishing on the runners
    do not keep a waiting call behind them past the stall."""
    pool = runners(1, stall=0.05)
    gate = threading.Event()
    try:
        stuck = _holding(pool, gate)
        later = [pool.submit(lambda i=i: i) for i in range(3)]
        assert [future.result(timeout=WAIT) for future in later] == [0, 1, 2]
        assert not stuck.done() and pool.statistics().overdue >= 1
    finally:
        gate.set()
    stuck.result(timeout=WAIT)


def test_runners_and_stall_are_checked():
    with pytest.raises(ValueError, match="runners"):
        HandlerThreads(keep=1, runners=-1)
    with pytest.raises(ValueError, match="stall"):
        HandlerThreads(keep=1, runners=1, stall=0)


def test_blocking_wait_outside_a_pool_thread_does_nothing():
    with blocking_wait:  # a test's thread has no lender
        with blocking_wait:
            pass


def test_the_watchdog_retries_a_thread_the_os_refuses_once_a_stall_not_in_a_hot_loop(runners, caplog):
    pool = runners(1, stall=0.05)
    gate = threading.Event()
    try:
        stuck = _holding(pool, gate)
        pool._start = _refuse_thread  # the OS's refusal, for this instance only
        waiting = pool.submit(lambda: "ran on the runner")
        watched_until = time.monotonic() + 0.5
        _wait_for(lambda: time.monotonic() > watched_until, "half a second of the watchdog's retries")
        failures = pool.statistics().start_failures
        assert 1 <= failures <= 0.5 / 0.05 + 2, failures  # about one a stall; a hot loop makes thousands
        assert not waiting.done() and pool.statistics().backlog == 1
    finally:
        gate.set()
    assert waiting.result(timeout=WAIT) == "ran on the runner"  # the freed runner took it
    assert stuck.result(timeout=WAIT)
