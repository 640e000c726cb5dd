"""A model's pool: one shared engine (the primary) and one execution context per slot.

Only a complete pool is ever published: `build_pool` either returns a pool with every context built, or frees
what it built (contexts first, then the engine) and raises. Nothing here takes a model lock; building and
closing block for as long as the backend needs, so callers run them outside every lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass

from engine.config.specs import ModelSpec
from engine.interface import Backend, CancelToken, Context, LoadedModel

from .errors import InvalidRequest, UnsupportedSlotCount

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadTimes:
    """How long a published pool took: building it (eviction, engine, slots) and warming it up, apart
    (service/core/warmup.py times the warmup)."""

    load_seconds: float = 0.0
    warmup_seconds: float = 0.0  # 0 for a model without warmup
    warmup_runs: int = 0  # runs done: samples x count x slots warmed


class SlotGone(InvalidRequest):
    """A sequence's slot is past the pool's capacity (the pool was built with fewer slots than configured)."""


class SlotPool:
    """A published engine with `capacity` contexts. Contexts are lent to leases and given back; a context is lent to
    up to `requests_per_context` leases at once (the engine's: 1 but for a python model that overlaps its calls), so
    the pool runs `request_slots` requests at once, which is what admission grants.

    `take` normally finds a free context at once, because admission never grants more leases than the pool's
    request slots. The one exception is the first load of a model whose default slot count the engine could not
    fully support: leases admitted before the load then wait here, in FIFO order, for a context.
    """

    def __init__(self, spec: ModelSpec, primary: LoadedModel, contexts: list[Context]) -> None:
        self.spec = spec
        self.primary = primary
        self.metadata = primary.metadata.name_model(spec.name)  # its refusals name the model, as Triton's do
        self.max_parallel_slots = primary.max_parallel_slots
        self.requests_per_context = max(1, primary.requests_per_context)
        self._contexts = list(contexts)
        # guards: _contexts, _free, _leaving, _waiting. take and give_back (once each a request) hold the lock itself:
        # a Condition's own __enter__/__exit__ are two Python calls more; holding its lock is holding it.
        self._freed_lock = threading.Lock()
        self._freed = threading.Condition(self._freed_lock)
        self._free: list[Context] = self._lendings(contexts)  # oldest given back first
        # Contexts `remove` took out while lent (by id): how many of their lendings are still out; each is closed when
        # its last one is given back.
        self._leaving: dict[int, int] = {}
        self._waiting = 0  # threads in `take` waiting on _freed (guarded by it): give_back notifies only then
        self.times = LoadTimes()  # set by the load that built it (service/core/lifecycle.py)

    @property
    def capacity(self) -> int:
        """The pool's contexts (the model's instances)."""
        return len(self._contexts)

    @property
    def request_slots(self) -> int:
        """The requests the pool runs at once: each context as many times as it takes requests."""
        return len(self._contexts) * self.requests_per_context

    def _lendings(self, contexts: list[Context]) -> list[Context]:
        """Each of `contexts` once per request it takes at once, round robin: every context is lent once before
        any is lent twice."""
        return [context for _ in range(self.requests_per_context) for context in contexts]

    def memory_bytes(self) -> int:
        return self.primary.memory_bytes(self.capacity)

    def take(self, index: int | None = None) -> Context:
        """A free context, or the one at `index` (a sequence's slot). Blocks only in the transient described in
        the class docstring, or while another lease has context `index`. Raises SlotGone for an index past the
        pool's capacity (a sequence whose slot the pool no longer has)."""
        with self._freed_lock:
            if index is not None and index >= len(self._contexts):
                raise SlotGone(f"model '{self.spec.name}' has {len(self._contexts)} slots now; slot {index} is gone")
            while True:
                if index is None and self._free:
                    return self._free.pop(0)
                if index is not None:
                    wanted = self._contexts[index]
                    for position, context in enumerate(self._free):
                        if context is wanted:
                            return self._free.pop(position)
                self._waiting += 1
                try:
                    self._freed.wait()
                finally:
                    self._waiting -= 1

    def give_back(self, context: Context) -> None:
        """A lease's context comes back; one that `remove` took out meanwhile is closed here, on the lease's
        thread, outside the pool's lock."""
        with self._freed_lock:
            lent = self._leaving.get(id(context))
            if lent is None:
                self._free.append(context)
                if self._waiting:  # (a Condition's notify_all costs three Python calls even with nobody waiting)
                    self._freed.notify_all()
                return
            if lent > 1:  # other leases still hold it: the last one closes it
                self._leaving[id(context)] = lent - 1
                return
        close_contexts([context], self.spec.name)
        with self._freed:
            self._leaving.pop(id(context), None)
            self._freed.notify_all()

    # ---- an instance-count change while the model serves (ModelEntry.resize_in_service) -------------------------

    def add(self, contexts: list[Context]) -> None:
        """Publish `contexts` (built beside the running ones) as free slots. Admission must not grant more leases
        than the capacity before this returns (the caller raises it after, under the model lock)."""
        with self._freed:
            self._contexts.extend(contexts)
            self._free.extend(self._lendings(contexts))
            self._freed.notify_all()

    def remove(self, count: int) -> list[Context]:
        """Take the last `count` contexts out of the pool: returns those that are free (the caller closes them);
        each lent one is closed when its lease gives it back. Admission must have lowered the capacity first (the
        caller does both under the model lock), so no lease is granted that would find no context."""
        with self._freed:
            kept = len(self._contexts) - count
            removed, self._contexts = self._contexts[kept:], self._contexts[:kept]
            gone = {id(context) for context in removed}
            free = Counter(id(context) for context in self._free if id(context) in gone)
            self._free = [context for context in self._free if id(context) not in gone]
            for context in removed:
                lent = self.requests_per_context - free[id(context)]
                if lent > 0:
                    self._leaving[id(context)] = lent
            return [context for context in removed if id(context) not in self._leaving]

    def wait_removed(self, deadline: float | None, cancel: CancelToken | None) -> bool:
        """Block until every context `remove` took out while lent was given back and closed, until `deadline`
        (monotonic; None: no limit) or until `cancel` fires. Returns whether they all were (the rest close when
        their leases end, whatever this returns)."""

        def wake() -> None:
            with self._freed:
                self._freed.notify_all()

        if cancel is not None:
            cancel.add_callback(wake)
        try:
            with self._freed:
                while self._leaving and not (cancel is not None and cancel.cancelled):
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        break
                    self._freed.wait(remaining)
                return not self._leaving
        finally:
            if cancel is not None:
                cancel.remove_callback(wake)

    def grown(self, slots: int, stop: CancelToken | None = None) -> SlotPool:
        """A pool over the same engine with `slots` contexts: existing contexts are kept, new ones built,
        surplus ones closed. Only valid while no context is lent (the caller holds the exclusive lease).
        Raises what create_context raises (`stop` gives a build up), after closing the contexts it built."""
        kept = self._contexts[:slots]
        built = build_contexts(self.primary, slots - len(kept), self.spec, stop)
        return SlotPool(self.spec, self.primary, kept + built)

    def contexts(self) -> list[Context]:
        """Every context, lent or not (for warmup: only valid while none is lent)."""
        return list(self._contexts)

    def added_to(self, original: SlotPool) -> list[Context]:
        """The contexts this pool (made by `original.grown`) built beyond `original`'s."""
        kept = {id(c) for c in original._contexts}
        return [c for c in self._contexts if id(c) not in kept]

    def close_added(self, original: SlotPool) -> None:
        """Close the contexts this pool (made by `original.grown`) built beyond `original`'s."""
        close_contexts(self.added_to(original), self.spec.name)

    def close_surplus(self, successor: SlotPool) -> None:
        """Close the contexts of this pool that `successor` (made by `grown`) did not keep."""
        kept = {id(c) for c in successor._contexts}
        close_contexts([c for c in self._contexts if id(c) not in kept], self.spec.name)

    def close(self) -> None:
        """Free every context, then the engine. Errors are logged, never raised: teardown must complete."""
        close_contexts(self._contexts, self.spec.name)
        self._contexts = []
        close_primary(self.primary, self.spec.name)


def build_contexts(primary: LoadedModel, count: int, spec: ModelSpec, stop: CancelToken | None) -> list[Context]:
    """`count` new contexts of `primary` (none for 0 or less), each given up when `stop` fires. Raises what
    create_context raises, after closing the contexts it built."""
    built: list[Context] = []
    try:
        while len(built) < count:
            built.append(primary.create_context() if stop is None else primary.create_context_cancellable(stop))
    except BaseException:
        close_contexts(built, spec.name)
        raise
    return built


def close_contexts(contexts: list[Context], model: str) -> None:
    for context in reversed(contexts):
        try:
            context.close()
        except Exception:
            _LOG.exception("model '%s': closing a slot context failed", model)


def close_primary(primary: LoadedModel, model: str) -> None:
    try:
        primary.close()
    except Exception:
        _LOG.exception("model '%s': closing the engine failed", model)


def check_slot_count(spec: ModelSpec, slots: int, explicit: bool, capacity: int) -> int:
    """The slot count to build: `slots` if the engine supports it; a default count is lowered to the
    capacity, an explicit one raises UnsupportedSlotCount."""
    if slots <= capacity:
        return slots
    if explicit:
        raise UnsupportedSlotCount(
            f"model '{spec.name}' supports at most {capacity} slot{'s' if capacity != 1 else ''} "
            f"on the {spec.backend} backend; {slots} were requested"
        )
    return capacity


def build_pool(
    backend: Backend,
    spec: ModelSpec,
    slots: int,
    explicit: bool,
    primary: LoadedModel | None = None,
    stop: CancelToken | None = None,
) -> SlotPool:
    """Load (or take over `primary`) and build `slots` contexts. Blocks for the whole build; `stop` firing gives
    it up (a backend that can stop does: Backend.load_cancellable).

    Raises the backend's errors or UnsupportedSlotCount; on any failure everything built is freed, contexts
    before the engine, including a `primary` that was handed in.
    """
    if primary is None:
        primary = backend.load(spec) if stop is None else backend.load_cancellable(spec, stop)
    try:
        count = check_slot_count(spec, slots, explicit, primary.max_parallel_slots)
        contexts = build_contexts(primary, count, spec, stop)
    except BaseException:
        close_primary(primary, spec.name)
        raise
    return SlotPool(spec, primary, contexts)
