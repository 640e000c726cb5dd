"""Building a model's pools: loads under the cold-load guard and residency, a replacement's private probe, a pool
grown in place, slots added while the model serves; each warmed up and logged, and each stopped by an unload or the
shutdown (`stop`, `stop_for_good`: service/core/load_stops.py).

A `ModelLoader` belongs to one model (service/core/lifecycle.py ModelEntry), which decides what to build and
publishes what it built under its lock: nothing here takes the model lock, reads its state or publishes. Every
method blocks for as long as the backend builds and warms, with no lock held, and frees what it built when it
raises.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.config.specs import ModelSpec
from engine.errors import ModelLoadError
from engine.interface import Backend, CancelToken, Context, LoadedModel

from .batching import describe_batching
from .errors import RequestCancelled
from .load_stops import LoadStops, either
from .outcomes import outcome_of
from .pool import LoadTimes, SlotPool, build_contexts, build_pool, close_contexts, close_primary
from .rate_limiter import ResourcePool, model_key
from .residency import ColdLoadTurn, ResidentModel
from .runtime import ModelSettings, SharedRuntime
from .warmup import warm_up, warm_up_pool

_LOG = logging.getLogger("service.core.lifecycle")  # the model's events keep their logger


class ModelLoader:
    """One model's loads. `model` is what residency counts (the model's entry); `shutting_down` says whether the
    shutdown closed the model's admission (a warmup stops before its next run then)."""

    def __init__(
        self, name: str, runtime: SharedRuntime, model: ResidentModel, shutting_down: Callable[[], bool]
    ) -> None:
        self.name = name
        self._runtime = runtime
        self._model = model
        self._shutting_down = shutting_down
        self._loads = LoadStops()  # its loads in progress, which an unload or the shutdown stops

    def stop(self, reason: str) -> Callable[[], None]:
        """Stop the loads in progress and refuse those that start before the returned `resume` is called
        (ModelEntry.stop_loads says when). Never blocks."""
        return self._loads.stop(reason)

    def stop_for_good(self, reason: str) -> None:
        """As `stop`, with no end (the shutdown)."""
        self._loads.stop_for_good(reason)

    def load(
        self,
        spec: ModelSpec,
        settings: ModelSettings,
        primary: LoadedModel | None = None,
        *,
        cause: str,
        cancel: CancelToken | None = None,
    ) -> SlotPool:
        """Build a complete pool under the cold-load guard, with residency reserved (evicting if needed) and the
        memory budget checked. `cause` says why, for the log. `cancel` (a first request's) lets a caller leave
        while it waits for the guard (RequestCancelled); a load under way is not interrupted by it, only stopped
        by an unload or the shutdown (`stop`: ModelLoadError). Raises the backend's errors,
        ResidencyLimit or MemoryLimit; on failure nothing stays reserved or built. Emits load_started, then loaded
        or load_failed (timed from load_started: eviction and building, not the wait for the guard)."""
        with self._loads.running(refused_while_stopped=cause == "first_request") as stop:
            try:
                turn = self._cold_load_turn(spec, cancel, stop)
            except BaseException:
                if primary is not None:
                    close_primary(primary, self.name)
                raise
            try:
                return self._build_logged(spec, settings, primary, cause, cancel, stop)
            finally:
                if turn is not None:
                    self._runtime.cold_loads.release(turn)  # type: ignore[union-attr]  # a turn comes from it

    def _cold_load_turn(self, spec: ModelSpec, cancel: CancelToken | None, stop: CancelToken) -> ColdLoadTurn | None:
        """A place in the cold-load guard (None without a guard), waited for until `cancel` fires
        (RequestCancelled). Raises ModelLoadError when `stop` was refused from the start (a request's load while an
        unload waits, or any load after the shutdown began), or fires during the wait of a load its backend could
        stop anyway (a python model's: `_stops_its_loads`); a backend that cannot stop waits on and loads."""
        _raise_if_stopped(self.name, stop)
        guard = self._runtime.cold_loads
        if guard is None:
            return None
        backend = self._runtime.backends.get(spec.backend)  # a missing one fails in the build, logged there
        if backend is None or not _stops_its_loads(backend):
            return guard.acquire(cancel)
        try:
            with either(cancel, stop) as leave:
                return guard.acquire(leave)
        except RequestCancelled:
            _raise_if_stopped(self.name, stop)
            raise

    def _build_logged(
        self,
        spec: ModelSpec,
        settings: ModelSettings,
        primary: LoadedModel | None,
        cause: str,
        cancel: CancelToken | None,
        stop: CancelToken,
    ) -> SlotPool:
        """_load's work once it holds its turn: build (see _build_reserved) and log it."""
        events = self._runtime.events
        events.emit(_LOG, "load_started", self.name, backend=spec.backend, slots=settings.slots, cause=cause)
        started = time.perf_counter()
        try:
            _register_resources(self._runtime.rate_limiter, spec)  # Triton's load-time errors, before building
            pool = self._build_reserved(spec, settings, primary, cancel, stop)
            pool.times = dataclasses.replace(  # the load's own time, warmup apart
                pool.times, load_seconds=time.perf_counter() - started - pool.times.warmup_seconds
            )
        except BaseException as error:
            reason = outcome_of(error)  # the reason a request for this model would be told
            # An error outside the table (a backend bug) is logged with its traceback; known ones need none.
            events.emit(
                _LOG,
                "load_failed",
                self.name,
                backend=spec.backend,
                reason=reason,
                seconds=time.perf_counter() - started,
                error=str(error) or type(error).__name__,
                exc_info=error if reason == "failed" else None,
            )
            raise
        events.emit(
            _LOG,
            "loaded",
            self.name,
            backend=spec.backend,
            slots=pool.capacity,
            seconds=pool.times.load_seconds,
            warmup_seconds=pool.times.warmup_seconds,
            memory_bytes=pool.memory_bytes(),
            batching=describe_batching(spec),
        )
        return pool

    def _build_reserved(
        self,
        spec: ModelSpec,
        settings: ModelSettings,
        primary: LoadedModel | None,
        cancel: CancelToken | None,
        stop: CancelToken,
    ) -> SlotPool:
        """_load's work under the guard: reserve residency, build (given up when `stop` fires), check the budget,
        warm up (stopped by a shutdown: service/core/warmup.py); undo all on failure."""
        residency = self._runtime.residency
        if residency is not None:
            try:
                residency.make_room(self._model)
            except BaseException:
                if primary is not None:
                    close_primary(primary, self.name)
                raise
        try:
            backend = self._runtime.backend(spec)
            pool = build_pool(backend, spec, settings.slots, settings.explicit_slots, primary, stop)
            try:
                if residency is not None:
                    residency.check_budget(self._model, pool)
                pool.times = warm_up_pool(pool, spec.warmup, cancel=cancel, stopping=self._shutting_down)
            except BaseException:
                pool.close()
                raise
        except BaseException:
            if residency is not None:
                residency.cancel(self._model)
            raise
        return pool

    def load_primary(self, spec: ModelSpec) -> LoadedModel:
        """Load a primary privately, under the cold-load guard (a probe is a cold load too); an unload or the
        shutdown stops it (ModelLoadError)."""
        with self._loads.running(refused_while_stopped=False) as stop:
            turn = self._cold_load_turn(spec, None, stop)
            try:
                return self._runtime.backend(spec).load_cancellable(spec, stop)
            finally:
                if turn is not None:
                    self._runtime.cold_loads.release(turn)  # type: ignore[union-attr]  # a turn comes from it

    def grown(self, old_pool: SlotPool, spec: ModelSpec, slots: int) -> SlotPool:
        """`old_pool`'s engine with `slots` contexts (a reconfiguration that keeps the engine), its new slots built
        (an unload stops it), the grown pool's memory held to the budget, its new slots warmed (every slot when the
        samples changed). Raises the backend's errors, MemoryLimit or the warmup's, having closed what it added."""
        with self._loads.running(refused_while_stopped=False) as stop:
            resized = old_pool.grown(slots, stop)
        residency = self._runtime.residency
        try:
            if residency is not None:
                residency.check_budget(self._model, resized)
            unwarmed = resized.added_to(old_pool) if spec.warmup == old_pool.spec.warmup else None
            warmed = warm_up_pool(resized, spec.warmup, unwarmed, stopping=self._shutting_down)
        except BaseException:
            resized.close_added(old_pool)
            raise
        resized.times = (
            old_pool.times
            if not warmed.warmup_runs
            else dataclasses.replace(warmed, load_seconds=old_pool.times.load_seconds)
        )
        return resized

    def added_slots(self, pool: SlotPool, spec: ModelSpec, count: int) -> tuple[list[Context], LoadTimes]:
        """`count` new contexts of `pool`'s engine, built (an unload stops it) and warmed outside every lock, the
        grown pool's memory held to the budget (reserved until the model publishes them or `drop_added_slots`).
        Nothing for 0 or less. Raises as ModelEntry.resize_in_service, having closed what it built."""
        if count <= 0:
            return [], LoadTimes()
        with self._loads.running(refused_while_stopped=False) as stop:
            added = build_contexts(pool.primary, count, spec, stop)
        residency = self._runtime.residency
        try:
            if residency is not None:
                residency.check_budget(self._model, _Sized(pool.primary.memory_bytes(pool.capacity + count)))
            numbers = list(range(pool.capacity, pool.capacity + count))  # the slot numbers they will have
            times = warm_up(
                self.name,
                pool.metadata,
                spec.warmup,
                added,
                numbers=numbers,
                streaming=pool.primary.streaming,
                stopping=self._shutting_down,
            )
        except BaseException:
            self.drop_added_slots(added)
            raise
        return added, times

    def drop_added_slots(self, added: list[Context]) -> None:
        close_contexts(added, self.name)
        if added and self._runtime.residency is not None:
            self._runtime.residency.cancel(self._model)  # the grown pool's reservation


@dataclass(frozen=True)
class _Sized:
    """What residency's budget check reads of a pool that is not built yet (a pool grown while it serves)."""

    bytes: int

    def memory_bytes(self) -> int:
        return self.bytes


def _stops_its_loads(backend: Backend) -> bool:
    """Whether `backend` gives a load up when its token fires (it overrides Backend.load_cancellable)."""
    return type(backend).load_cancellable is not Backend.load_cancellable


def _register_resources(limiter: ResourcePool | None, spec: ModelSpec) -> None:
    """Tell the rate limiter what the model's slots need (service/core/rate_limiter.py: ModelLoadError when the
    server cannot give it); nothing when the limiter is off or the model needs nothing."""
    if limiter is not None and spec.rate_limiter is not None:
        limiter.register(model_key(spec.name, spec.version), spec.rate_limiter)


def _raise_if_stopped(name: str, stop: CancelToken) -> None:
    """ModelLoadError when an unload or the shutdown stopped this load (LoadStops)."""
    if stop.cancelled:
        raise ModelLoadError(f"model '{name}': its load was stopped: {stop.reason or 'given up'}")


__all__ = ["ModelLoader"]
