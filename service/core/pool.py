"""A model's pool: one shared engine (the primary) and one execution context per slot.

Only a complete pool is ever published: `build_pool` either returns a pool with every context built, or frees
what it built (contexts first, then the engine) and raises. Nothing here takes a model lock; building and
closing block for as long as the backend needs, so callers run them outside every lock.
"""

from __future__ import annotations

import logging
import threading

from engine.interface import Backend, Context, LoadedModel, ModelSpec

from .errors import InvalidRequest, UnsupportedSlotCount
from .warmup import LoadTimes

_LOG = logging.getLogger(__name__)


class SlotGone(InvalidRequest):
    """A sequence's slot is past the pool's capacity (the pool was built with fewer slots than configured)."""


class SlotPool:
    """A published engine with `capacity` contexts. Contexts are lent to leases and given back.

    `take` normally finds a free context at once, because admission never grants more leases than the pool's
    capacity. The one exception is the first load of a model whose default slot count the engine could not
    fully support: leases admitted before the load then wait here, in FIFO order, for a context.
    """

    def __init__(self, spec: ModelSpec, primary: LoadedModel, contexts: list[Context]) -> None:
        self.spec = spec
        self.primary = primary
        self.metadata = primary.metadata.name_model(spec.name)  # its refusals name the model, as Triton's do
        self.max_parallel_slots = primary.max_parallel_slots
        self._contexts = list(contexts)
        self._freed = threading.Condition(threading.Lock())  # guards: _free
        self._free: list[Context] = list(contexts)  # oldest given back first
        self.times = LoadTimes()  # set by the load that built it (service/core/warmup.py)

    @property
    def capacity(self) -> int:
        return len(self._contexts)

    def memory_bytes(self) -> int:
        return self.primary.memory_bytes(self.capacity)

    def take(self, index: int | None = None) -> Context:
        """A free context, or the one at `index` (a sequence's slot). Blocks only in the transient described in
        the class docstring, or while another lease has context `index`. Raises SlotGone for an index past the
        pool's capacity (a sequence whose slot the pool no longer has)."""
        with self._freed:
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
                self._freed.wait()

    def give_back(self, context: Context) -> None:
        with self._freed:
            self._free.append(context)
            self._freed.notify_all()

    def grown(self, slots: int) -> SlotPool:
        """A pool over the same engine with `slots` contexts: existing contexts are kept, new ones built,
        surplus ones closed. Only valid while no context is lent (the caller holds the exclusive lease).
        Raises what create_context raises, after closing the contexts it built."""
        kept = self._contexts[:slots]
        built: list[Context] = []
        try:
            while len(kept) + len(built) < slots:
                built.append(self.primary.create_context())
        except BaseException:
            close_contexts(built, self.spec.name)
            raise
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
    backend: Backend, spec: ModelSpec, slots: int, explicit: bool, primary: LoadedModel | None = None
) -> SlotPool:
    """Load (or take over `primary`) and build `slots` contexts. Blocks for the whole build.

    Raises the backend's errors or UnsupportedSlotCount; on any failure everything built is freed, contexts
    before the engine, including a `primary` that was handed in.
    """
    primary = primary if primary is not None else backend.load(spec)
    contexts: list[Context] = []
    try:
        count = check_slot_count(spec, slots, explicit, primary.max_parallel_slots)
        for _ in range(count):
            contexts.append(primary.create_context())
    except BaseException:
        close_contexts(contexts, spec.name)
        close_primary(primary, spec.name)
        raise
    return SlotPool(spec, primary, contexts)
