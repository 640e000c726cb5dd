"""Residency: which models hold engines in memory, eviction, idle retirement, the memory budget, and the guard
on simultaneous cold loads.

* `ColdLoadGuard` bounds how many models load at once (--max-concurrent-loads), each for one turn at most
  (COLD_LOAD_TURN_SECONDS): a load past its turn goes on without holding a place. Warm requests never touch it:
  only the one initializer of an unloaded model, and a manager's load, take it.
* `Residency` keeps the set of models that are resident or reserved (loading). Before a load it makes room
  under --max-resident-models by retiring the least recently used model that is ready, idle and queue-free;
  after a pool is built it checks --memory-budget the same way. Eviction **try-acquires**: it takes a victim's
  exclusive lease only if nobody holds or waits for that model, so it never queues behind a busy, loading,
  reconfiguring or unloading model (and a model already retiring is not resident, so it is never a victim).
* `IdleReaper` retires models idle and queue-free for --idle-unload seconds: one thread sleeping until the
  nearest expiry (a heap with at most one entry per model), not a timer per model and not a polling loop.
* `MemoryWatch` (with --memory-budget) re-reads what each resident model holds, because a model's memory changes
  after its load (a python model's workers grow with what their requests keep): one thread, every
  MEMORY_CHECK_SECONDS and soon after a lease ends (at most every MEMORY_CHECK_GAP_SECONDS), measuring each model
  with no lock held, then retiring least recently used idle models while the total is over the budget
  (`Residency.check_memory`). A busy model is never retired: the budget stays exceeded until it is idle.
* An ensemble holds no engine (its steps are models of their own, resident and counted on their own): it is never
  counted under either limit, never makes room and is never an eviction victim (ENGINELESS_BACKENDS); the idle
  reaper retires it like any model.

Models are seen through the `ResidentModel` protocol (service/core/lifecycle.py's ModelEntry is the one
implementation): this module never touches a model's lock, pool or admission.

Locking: `Residency._lock` guards only its bookkeeping and is never held while taking a model lock, measuring a
model's memory or tearing anything down; model code calls `on_published` / `on_retired` under its own model lock,
so the order is model lock -> residency lock, and residency code calls into models (which take their locks) only
with its own lock released.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from engine.config.specs import ModelSpec
from engine.interface import CancelToken

from .errors import MemoryLimit, RequestCancelled, ResidencyLimit, never_retried

_LOG = logging.getLogger(__name__)

# Backends whose pools hold no engine: an ensemble's slots hold nothing and its steps are models of their own,
# resident and counted on their own. Counting an ensemble made its steps evict each other at every call (busy
# with its own request, the ensemble was the one model no eviction could take: issue 35).
ENGINELESS_BACKENDS = frozenset({"ensemble"})
# The memory watch's period, and the shortest time between two of its passes (a lease's end wakes it early).
MEMORY_CHECK_SECONDS = 1.0
MEMORY_CHECK_GAP_SECONDS = 0.1


class ResidentModel(Protocol):
    """What residency needs of a model (implemented by ModelEntry)."""

    name: str
    last_used: float  # monotonic seconds of its last lease's end: the LRU order and the idle clock

    @property
    def spec(self) -> ModelSpec: ...

    def is_ready(self) -> bool: ...

    def resident_bytes(self) -> int:
        """Bytes its published pool reports now (0 when none); must not take the model's lock (called under it).
        May measure (a python model reads its workers' memory): residency calls it with its own lock released."""
        ...

    def retire_if_idle(self, event: str, **fields: object) -> bool:
        """Unload it if ready, idle and queue-free now (never queues); whether it was retired."""
        ...


# How long a cold load holds its place in the guard before the next waiting load may start beside it. A load past
# its turn goes on (it is not interrupted) but no longer counts against --max-concurrent-loads: a hung load (a
# python model's initialize waiting for something that never comes) delays the cold loads queued behind it by one
# turn, instead of for its own bound (initialize_timeout_seconds, 600 s by default). Long enough for the loads the
# guard is for (an ONNX or TensorRT engine built on every core, a few seconds), short enough that a few hung loads
# ahead cost seconds, not minutes; a slow load past it only overlaps the next one.
COLD_LOAD_TURN_SECONDS = 10.0


@dataclass(frozen=True)
class ColdLoadStatistics:
    running: int  # cold loads holding a place
    waiting: int  # cold loads queued for one
    overdue: int = 0  # cold loads still running past their turn, no longer holding a place


class ColdLoadTurn:
    """One cold load's place in the guard: `acquire` returns it, `release` takes it back."""

    __slots__ = ("ends", "overdue", "released")

    def __init__(self, ends: float) -> None:
        self.ends = ends  # monotonic seconds when it stops holding later loads up (inf: never)
        self.overdue = False  # its turn ran out: it holds no place any more (its load goes on)
        self.released = False


class _GuardWaiter:
    __slots__ = ("lock", "granted", "turn")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.granted = False
        self.turn: ColdLoadTurn | None = None


class ColdLoadGuard:
    """A counting guard over cold loads, granted in arrival order, each place held for one turn at most.

    `acquire` waits without a time limit of its own (a load is not bounded by the admission timeout) and holds no
    other lock; a waiter whose `cancel` token fires leaves the queue at once (RequestCancelled). A load that has
    held its place for `turn_seconds` (COLD_LOAD_TURN_SECONDS by default; 0: no limit) stops counting: the oldest
    waiter gets a place beside it, so no load, hung or slow, holds the others up for longer than its turn.
    """

    def __init__(self, limit: int, turn_seconds: float | None = None) -> None:
        if limit < 1:
            raise ValueError(f"--max-concurrent-loads must be >= 1, got {limit}")
        self.limit = limit
        self.turn_seconds = COLD_LOAD_TURN_SECONDS if turn_seconds is None else turn_seconds
        self._lock = threading.Lock()  # guards: _turns, _waiting, _overdue, every waiter's granted and turn
        self._turns: list[ColdLoadTurn] = []  # places held, oldest first
        self._waiting: list[_GuardWaiter] = []
        self._overdue = 0

    def acquire(self, cancel: CancelToken | None = None) -> ColdLoadTurn:
        """A place for one cold load (give it back with `release`). Blocks while every place is held, until one
        is released or its turn runs out, or until `cancel` fires (RequestCancelled)."""
        with self._lock:
            now = time.monotonic()
            self._end_overdue_turns_locked(now)
            if len(self._turns) < self.limit and not self._waiting:
                return self._new_turn_locked(now)
            waiter = _GuardWaiter()
            self._waiting.append(waiter)
        if cancel is not None:

            def leave() -> None:  # idempotent, as token callbacks must be
                with self._lock:
                    if waiter in self._waiting:
                        self._waiting.remove(waiter)
                        waiter.lock.release()

            cancel.add_callback(leave)
        try:
            while not self._wait_for_place(waiter):
                pass
        except BaseException:
            # Interrupted (KeyboardInterrupt, an async exception): never keep a place, nor a grant, that nobody
            # will use, or the guard would count a load that never ends.
            self._abandon(waiter)
            raise
        finally:
            if cancel is not None:
                cancel.remove_callback(leave)
        if not waiter.granted:
            raise RequestCancelled("the caller gave up while waiting for another model's cold load")
        assert waiter.turn is not None  # set with granted
        return waiter.turn

    def _wait_for_place(self, waiter: _GuardWaiter) -> bool:
        """Wait until `waiter` is granted or has left (True), or until the oldest place's turn runs out (False:
        the overdue turns are ended, which may grant `waiter`; the caller waits again)."""
        with self._lock:
            oldest = self._turns[0].ends if self._turns else float("inf")
        remaining = oldest - time.monotonic()
        if remaining == float("inf") or remaining > threading.TIMEOUT_MAX:
            waiter.lock.acquire()  # released by a grant (`release` or the end of a turn) or by `leave`
            return True
        if waiter.lock.acquire(timeout=max(0.0, remaining)):
            return True
        with self._lock:
            self._end_overdue_turns_locked(time.monotonic())
        return False

    def _new_turn_locked(self, now: float) -> ColdLoadTurn:
        turn = ColdLoadTurn(now + self.turn_seconds if self.turn_seconds > 0 else float("inf"))
        self._turns.append(turn)
        return turn

    def _grant_waiters_locked(self, now: float) -> None:
        """Hand free places to the oldest waiters (a newcomer never takes one first: it queues behind them)."""
        while self._waiting and len(self._turns) < self.limit:
            waiter = self._waiting.pop(0)
            waiter.turn = self._new_turn_locked(now)
            waiter.granted = True
            waiter.lock.release()

    def _end_overdue_turns_locked(self, now: float) -> None:
        """Places whose turn ran out stop counting (their loads go on); the waiters get them."""
        while self._turns and self._turns[0].ends <= now:
            self._turns.pop(0).overdue = True
            self._overdue += 1
        self._grant_waiters_locked(now)

    def _abandon(self, waiter: _GuardWaiter) -> None:
        with self._lock:
            if waiter in self._waiting:
                self._waiting.remove(waiter)
                return
            turn = waiter.turn if waiter.granted else None
        if turn is not None:
            self.release(turn)  # the place was handed over already: pass it on

    def release(self, turn: ColdLoadTurn | None = None) -> None:
        """Give a place back (`turn`, as `acquire` returned it; None: the oldest place held, for a caller that
        holds one place at a time). A place whose turn ran out is only forgotten: it holds nobody up any more."""
        with self._lock:
            if turn is None:
                if not self._turns:
                    return
                turn = self._turns[0]
            if turn.released:
                return
            turn.released = True
            if turn.overdue:
                self._overdue -= 1
            else:
                self._turns.remove(turn)
            self._grant_waiters_locked(time.monotonic())

    def statistics(self) -> ColdLoadStatistics:
        with self._lock:
            return ColdLoadStatistics(running=len(self._turns), waiting=len(self._waiting), overdue=self._overdue)


def holds_engine(entry: ResidentModel) -> bool:
    """Whether `entry`'s pool holds an engine of its own, so that residency counts it (not an ensemble)."""
    return entry.spec.backend not in ENGINELESS_BACKENDS


@dataclass(frozen=True)
class MemoryCheck:
    """What one `Residency.check_memory` pass found and did."""

    in_use: int  # bytes the published pools and the reservations hold, after the pass
    evicted: tuple[str, ...]  # models it retired, in order
    over_budget: bool  # still over the budget after it (every model over it busy, loading or in a sequence)


class Residency:
    """The resident-model limit and the memory budget."""

    def __init__(
        self,
        *,
        max_resident_models: int = 0,
        memory_budget: int = 0,
        idle_unload: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        memory_check_seconds: float = MEMORY_CHECK_SECONDS,
    ) -> None:
        """`memory_check_seconds` is the memory watch's period with a budget (0: no watch thread; the budget is
        then re-checked only by calling `check_memory`, as tests do)."""
        self.max_resident_models = max_resident_models
        self.memory_budget = memory_budget
        self._clock = clock
        # guards: _held, _memory, _published, _reserved, _departures, _over_budget, _unreadable, evictions
        self._lock = threading.Lock()
        self._held: set[ResidentModel] = set()  # entries resident or reserved for a load in progress
        self._memory: dict[ResidentModel, int] = {}  # entry -> bytes its published pool reported when last read
        # entry -> the number of its publication: a measurement taken of an earlier pool is never recorded for a
        # later one (the watch measures with no lock held, while the model may be retired and loaded again).
        self._published: dict[ResidentModel, int] = {}
        self._publications = itertools.count(1)
        self._over_budget = False  # the last memory check ended over the budget (logged once per episode)
        self._unreadable: set[ResidentModel] = set()  # models whose last measurement raised (logged once)
        # entry -> bytes of a pool that passed the budget and is not published yet. Without it two loads could
        # both pass a budget that only one fits: the first's pool is built and checked, but counted only once
        # published, and the cold-load guard is released before that.
        self._reserved: dict[ResidentModel, int] = {}
        # Counts models leaving residency. An eviction round that retired nobody re-checks when it moved: the
        # room it looked for may have been freed meanwhile by an unload it did not make.
        self._departures = 0
        self.evictions = 0
        self.reaper = IdleReaper(idle_unload, clock) if idle_unload > 0 else None
        watching = memory_budget > 0 and memory_check_seconds > 0
        self.watch = MemoryWatch(self.check_memory, memory_check_seconds) if watching else None

    # ---- before and after a load (called by the loading entry, holding its lease, no lock) ------------------

    def make_room(self, entry: ResidentModel) -> None:
        """Reserve residency for `entry`, retiring LRU idle models if the limit is reached.
        Raises ResidencyLimit when no model can be retired; the reservation is then not taken. An ensemble
        (ENGINELESS_BACKENDS) takes no residency: it returns at once."""
        if not holds_engine(entry):
            return
        while True:
            with self._lock:
                others = self._held - {entry}
                if self.max_resident_models <= 0 or len(others) < self.max_resident_models:
                    self._held.add(entry)
                    return
                candidates = self._victims_locked(exclude=entry)
                departures = self._departures
            if not self._evict_one(candidates, "max_resident_models", entry.name) and not self._moved(departures):
                raise ResidencyLimit(
                    f"residency_limit: {self.max_resident_models} model(s) are resident and none is idle; "
                    f"model '{entry.name}' was not loaded"
                )

    def check_budget(self, entry: ResidentModel, pool: _SizedPool) -> None:
        """After a pool is built: fit it under --memory-budget, retiring LRU idle models if needed, and reserve
        its bytes until it is published (`on_published`) or its load fails (`cancel`).
        Raises MemoryLimit (the caller frees the pool and publishes nothing); at once, evicting nobody, for a
        pool larger than the whole budget, which no eviction could make room for. Measures the pool with no lock
        held; the models already resident count with what they held when last read (`check_memory`)."""
        if self.memory_budget <= 0 or not holds_engine(entry):
            return
        needed = pool.memory_bytes()
        if needed > self.memory_budget:
            raise never_retried(
                MemoryLimit(
                    f"memory_limit: model '{entry.name}' needs {needed} bytes, more than the whole "
                    f"{self.memory_budget}-byte budget (--memory-budget); no model was evicted for it"
                )
            )
        while True:
            with self._lock:
                used = self._bytes_held_locked(exclude=entry)
                if used + needed <= self.memory_budget:
                    self._reserved[entry] = needed
                    return
                candidates = self._victims_locked(exclude=entry)
                departures = self._departures
            if not self._evict_one(candidates, "memory_budget", entry.name) and not self._moved(departures):
                raise MemoryLimit(
                    f"memory_limit: model '{entry.name}' needs {needed} bytes; {used} of the "
                    f"{self.memory_budget}-byte budget are held by models that are loading or not idle"
                )

    def _bytes_held_locked(self, exclude: ResidentModel | None) -> int:
        """Bytes of published pools and reservations, `exclude`'s own left out (it is being replaced)."""
        published = sum(size for other, size in self._memory.items() if other is not exclude)
        return published + sum(size for other, size in self._reserved.items() if other is not exclude)

    def cancel(self, entry: ResidentModel) -> None:
        """A reserved load failed: give the reservations (residency, bytes) back."""
        with self._lock:
            self._reserved.pop(entry, None)
            if entry not in self._memory and entry in self._held:
                self._held.discard(entry)
                self._departures += 1

    def _moved(self, departures: int) -> bool:
        """Whether a model left residency since `departures` was read (then the caller looks again)."""
        with self._lock:
            return self._departures != departures

    def _victims_locked(self, exclude: ResidentModel | None) -> list[ResidentModel]:
        resident = [e for e in self._held if e is not exclude and e in self._memory]
        return sorted(resident, key=lambda e: e.last_used)

    def _evict_one(self, candidates: list[ResidentModel], reason: str, for_model: str = "") -> ResidentModel | None:
        """Retire the first candidate that is ready, idle and queue-free right now, to make room for model
        `for_model` under the limit named by `reason` (max_resident_models, memory_budget), or, for reason
        memory_growth, because the resident models grew past the budget. Never waits for one. Returns the
        model retired, None when none could be."""
        for victim in candidates:
            if victim.retire_if_idle("evicted", reason=reason, for_model=for_model):
                with self._lock:
                    self.evictions += 1
                return victim
        return None

    # ---- the memory budget over time (the watch's thread, or a test) --------------------------------------------

    def check_memory(self) -> MemoryCheck:
        """Re-read what every resident model holds, then, while the total (with the loads' reservations) is over
        --memory-budget, retire the least recently used model that is ready, idle and queue-free, the grown model
        itself included (a model that alone holds more than the budget is retired as soon as it is idle; its
        next request loads it again). Busy models are never retired nor waited for: the pass then ends over the
        budget, logged once until a pass ends within it, and the next pass (a lease's end wakes the watch) tries
        again. Measures with no lock held; teardowns run on the calling thread. A model whose measurement raises
        keeps its last figure (logged)."""
        with self._lock:
            published = list(self._published.items())
        measured: list[tuple[ResidentModel, int, int]] = []
        failed: list[tuple[ResidentModel, Exception]] = []
        for entry, publication in published:
            try:
                measured.append((entry, publication, entry.resident_bytes()))
            except Exception as error:  # a backend's measurement must not stop the watch: the old figure stays
                failed.append((entry, error))
        with self._lock:
            for entry, publication, size in measured:
                self._unreadable.discard(entry)
                if self._published.get(entry) == publication:  # still the pool that was measured
                    self._memory[entry] = size
            newly = [(entry, failure) for entry, failure in failed if entry not in self._unreadable]
            self._unreadable.update(entry for entry, _ in failed)
        for entry, failure in newly:  # logged once until it reads again, not every second
            _LOG.error("model '%s': could not read its memory; its last figure stays", entry.name, exc_info=failure)
        return self._fit_budget()

    def _fit_budget(self) -> MemoryCheck:
        evicted: list[str] = []
        while True:
            with self._lock:
                used = self._bytes_held_locked(exclude=None)
                if self.memory_budget <= 0 or used <= self.memory_budget:
                    self._over_budget = False
                    return MemoryCheck(used, tuple(evicted), False)
                candidates = self._victims_locked(exclude=None)
                departures = self._departures
            victim = self._evict_one(candidates, "memory_growth")
            if victim is not None:
                evicted.append(victim.name)
            elif not self._moved(departures):
                return self._over_budget_now(used, evicted)

    def _over_budget_now(self, used: int, evicted: list[str]) -> MemoryCheck:
        with self._lock:
            first, self._over_budget = not self._over_budget, True
            busiest = sorted(self._memory.items(), key=lambda item: -item[1])[:3]
        if first:
            _LOG.warning(
                "resident models hold %d bytes, over the %d-byte budget (--memory-budget), and none of them is "
                "idle; the largest: %s. They are retired as they become idle",
                used,
                self.memory_budget,
                ", ".join(f"'{entry.name}' {size} bytes" for entry, size in busiest),
            )
        return MemoryCheck(used, tuple(evicted), True)

    # ---- notifications from entries (under the entry's lock: must not block or take model locks) ------------

    def on_published(self, entry: ResidentModel) -> None:
        """`entry` published a pool: it counts with the bytes its budget check reserved (measured then, with no
        lock held), or, without a budget, with what it reports now. An ensemble is not counted (only its idle
        retirement is scheduled)."""
        if holds_engine(entry):
            self._count(entry)
        if self.reaper is not None:
            self.reaper.schedule(entry)

    def _count(self, entry: ResidentModel) -> None:
        with self._lock:
            reserved = self._reserved.pop(entry, None)
            if reserved is not None:  # in the same step, or a load checking the budget meanwhile would see neither
                self._count_locked(entry, reserved)
        if reserved is None:
            size = entry.resident_bytes()
            with self._lock:
                self._count_locked(entry, size)

    def _count_locked(self, entry: ResidentModel, size: int) -> None:
        self._held.add(entry)
        self._memory[entry] = size
        self._published[entry] = next(self._publications)

    def on_retired(self, entry: ResidentModel) -> None:
        with self._lock:
            if entry not in self._held:
                return  # an ensemble: never counted
            self._held.discard(entry)
            self._memory.pop(entry, None)
            self._published.pop(entry, None)
            self._unreadable.discard(entry)
            self._departures += 1

    def on_lease_end(self, entry: ResidentModel) -> None:
        """A request or manager lease of `entry` ended: have the reaper look at it again (cheap when it is
        already scheduled), and the memory watch re-read the models soon (what the run kept shows now)."""
        if self.reaper is not None:
            self.reaper.schedule(entry)
        if self.watch is not None:
            self.watch.nudge()

    # ---- observation ----------------------------------------------------------------------------------------

    def resident_names(self) -> list[str]:
        with self._lock:
            return sorted(e.name for e in self._memory)

    def memory_in_use(self) -> int:
        with self._lock:
            return sum(self._memory.values())

    def start(self) -> None:
        if self.reaper is not None:
            self.reaper.start()
        if self.watch is not None:
            self.watch.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the idle reaper and the memory watch; wait at most `timeout` seconds in all (None: without limit)
        for a retirement either is in the middle of (a teardown can be slow or hang). Returns whether both have
        stopped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        stopped = True
        for thread in (self.reaper, self.watch):
            if thread is not None:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                stopped = thread.stop(left) and stopped
        return stopped


class _SizedPool(Protocol):
    def memory_bytes(self) -> int: ...


class MemoryWatch:
    """One thread that calls `check` every `period` seconds, and soon after `nudge` (a lease's end), but never
    twice within MEMORY_CHECK_GAP_SECONDS: what a python model's run kept is seen at its lease's end, and a
    server busy with many requests still measures at most ten times a second."""

    def __init__(self, check: Callable[[], object], period: float) -> None:
        self._check = check
        self.period = period
        self._cond = threading.Condition()  # guards: _nudged, _stopping, passes
        self._nudged = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.passes = 0  # checks completed (tests wait on it)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="memory-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop, waiting at most `timeout` seconds (None: without limit) for a pass under way (its evictions'
        teardowns can be slow). Returns whether the thread has ended. Idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def nudge(self) -> None:
        """Ask for a pass soon. Cheap: a flag read without the lock first; a nudge already pending covers this
        one (the flag is cleared before the pass it wakes begins measuring)."""
        if self._nudged:
            return
        with self._cond:
            self._nudged = True
            self._cond.notify_all()

    def _wait(self, seconds: float, until_nudged: bool) -> bool:
        """Wait `seconds` (or, with `until_nudged`, until a nudge comes first); False once stopping."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while not self._stopping and not (until_nudged and self._nudged):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if until_nudged:
                self._nudged = False  # a nudge that comes during the gap is kept: the next wait ends at once
            return not self._stopping

    def _run(self) -> None:
        while self._wait(self.period, until_nudged=True):
            try:
                self._check()
            except Exception:  # the watch must survive a failing teardown
                _LOG.exception("the memory budget's check failed")
            with self._cond:
                self.passes += 1
                self._cond.notify_all()
            if not self._wait(MEMORY_CHECK_GAP_SECONDS, until_nudged=False):
                return


class IdleReaper:
    """One thread that retires models idle for `idle_seconds`, waking at the nearest expiry."""

    def __init__(self, idle_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_seconds = idle_seconds
        self._clock = clock
        self._cond = threading.Condition()  # guards: _heap, _scheduled, _stopping
        self._heap: list[tuple[float, int, ResidentModel]] = []
        self._scheduled: set[ResidentModel] = set()  # at most one heap item per entry
        self._order = itertools.count()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.retired = 0
        self.checks = 0  # due items examined (tests wait on it)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="idle-reaper", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop taking work and wait at most `timeout` seconds (None: without limit) for the thread to end; it
        may be inside a slow teardown. Returns whether it has ended. Idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def poke(self) -> None:
        """Re-examine the nearest expiry now (after an injected clock moved)."""
        with self._cond:
            self._cond.notify_all()

    def schedule(self, entry: ResidentModel, at: float | None = None) -> None:
        """Make sure `entry` is checked when its idle time may have run out. Cheap when already scheduled."""
        if entry in self._scheduled:  # a set read without the lock: a stale answer only delays by one check
            return
        expiry = at if at is not None else entry.last_used + self.idle_seconds
        with self._cond:
            if entry in self._scheduled or self._stopping:
                return
            self._scheduled.add(entry)
            heapq.heappush(self._heap, (expiry, next(self._order), entry))
            if self._heap[0][2] is entry:
                self._cond.notify()

    def _next_due(self) -> ResidentModel | None:
        """Block until the earliest item is due (or stop). Returns the entry, or None when stopping."""
        with self._cond:
            while not self._stopping:
                if not self._heap:
                    self._cond.wait()
                    continue
                expiry, _, entry = self._heap[0]
                remaining = expiry - self._clock()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                heapq.heappop(self._heap)
                self._scheduled.discard(entry)
                return entry
            return None

    def _run(self) -> None:
        while (entry := self._next_due()) is not None:
            try:
                self._check(entry)
            except Exception:  # the reaper must survive a failing teardown
                _LOG.exception("model '%s': idle retirement failed", entry.name)
            finally:
                with self._cond:
                    self.checks += 1
                    self._cond.notify_all()

    def _check(self, entry: ResidentModel) -> None:
        if not entry.is_ready():
            # Not resident, or changing under a manager's lease: scheduled again when that lease ends
            # (ModelEntry._lease_ended) or the model is published.
            return
        due = entry.last_used + self.idle_seconds
        now = self._clock()
        if due > now:
            self.schedule(entry, due)  # used since it was scheduled
        elif entry.retire_if_idle("idle_retired", idle_seconds=self.idle_seconds):
            self.retired += 1
        else:
            self.schedule(entry, now + self.idle_seconds)  # busy or queued now: not idle
