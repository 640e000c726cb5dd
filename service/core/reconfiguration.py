"""Loading and reconfiguring a model under a manager's exclusive lease (`load_leased`, `reconfigure_leased`), and an
instance-count change while it serves, without the lease (`resize_in_service`), as Triton updates a model's
instances. Each validates before anything is torn down, builds with no lock held (service/core/loading.py) and
publishes under the model's lock through ModelRecord's steps (service/core/model_record.py).
"""

from __future__ import annotations

import dataclasses
import logging

from engine.config.files import hide_paths
from engine.config.specs import ModelSpec
from engine.interface import CancelToken, Context, LoadedModel

from .model_record import Committed, ModelRecord
from .model_state import ModelState
from .pool import LoadTimes, SlotPool, check_slot_count, close_contexts, close_primary
from .runtime import ModelSettings

_LOG = logging.getLogger("service.core.lifecycle")  # the model's events keep their logger


class Reconfigurable(ModelRecord):
    """A model that loads and changes its configuration (see the module docstring); ModelEntry is one."""

    def resize_in_service(
        self, spec: ModelSpec, settings: ModelSettings, deadline: float | None, cancel: CancelToken | None
    ) -> bool:
        """Apply a change of the slot count alone (the same files, options and settings otherwise) while the model
        serves, as Triton updates a model's instances: no exclusive lease, so neither the requests admitted
        before it nor those after it wait for it. Added slots are built and warmed beside the running ones, then
        published; removed ones leave the pool at once and each closes when its request ends (this waits for that
        until `deadline` or `cancel`, then returns anyway). Returns False, changing nothing, when it is no such
        change or the model is not READY with no manager holding or awaiting it: the caller reconfigures under
        the exclusive lease then. Raises UnsupportedSlotCount, the backend's errors building a slot, MemoryLimit,
        or ModelLoadError when an unload stopped it; the model serves on unchanged then."""
        with self._lock:
            pool = self._pool_for_count_change_locked(spec, settings)
        if pool is None:
            return False
        capacity = pool.capacity
        try:
            target = check_slot_count(spec, settings.slots, settings.explicit_slots, pool.max_parallel_slots)
            added, times = self._loader.added_slots(pool, spec, target - capacity)
        except BaseException as error:
            self._runtime.events.emit(_LOG, "reconfigure_refused", self.name, error=str(error) or type(error).__name__)
            raise
        with self._lock:
            current = self._pool_for_count_change_locked(spec, settings) is pool and pool.capacity == capacity
            leaving = self._commit_count_locked(spec, settings, pool, added, target, times) if current else []
        if not current:  # a manager or another change came first: start again behind it, under the lease
            self._loader.drop_added_slots(added)
            return False
        close_contexts(leaving, self.name)
        pool.wait_removed(deadline, cancel)
        self._runtime.events.emit(_LOG, "reconfigured", self.name, slots=target, in_place=True)
        return True

    def _pool_for_count_change_locked(self, spec: ModelSpec, settings: ModelSettings) -> SlotPool | None:
        """The served pool when `spec` and `settings` change its slot count alone and nothing else stands in the
        way (READY, no manager active or queued, no sequences pinned to slots); None otherwise."""
        pool, committed = self._pool, self._committed
        if pool is None or self._state is not ModelState.READY or spec.sequence is not None:
            return None
        admission = self.admission.statistics_locked()
        if admission.manager_active or admission.queued_managers:
            return None
        if not _only_the_count_differs(committed, spec, settings) or spec.session_key() != pool.spec.session_key():
            return None
        return pool

    def _commit_count_locked(
        self,
        spec: ModelSpec,
        settings: ModelSettings,
        pool: SlotPool,
        added: list[Context],
        target: int,
        times: LoadTimes,
    ) -> list[Context]:
        """Publish the new count: the committed configuration, the pool's contexts (added ones first, so that a
        lease the raised capacity grants finds one), admission's capacity and residency's bytes. Returns the
        removed contexts that are free now (the caller closes them outside the lock)."""
        self._commit_locked(Committed(spec, settings, self._committed.metadata))
        if added:
            pool.add(added)
        leaving = pool.remove(pool.capacity - target) if pool.capacity > target else []
        if times.warmup_runs:
            pool.times = dataclasses.replace(times, load_seconds=pool.times.load_seconds)
        self.admission.set_capacity_locked(pool.request_slots)
        if self._runtime.residency is not None:
            self._runtime.residency.on_published(self)  # the pool's bytes now; the reservation became them
        return leaving

    def load_leased(self) -> None:
        """Load the committed configuration if unloaded (caller holds the exclusive lease).
        Raises the load's error; the model then stays unloaded."""
        with self._lock:
            if self._pool is not None:
                return
            self._transition_locked(ModelState.LOADING)
            committed = self._committed
        try:
            pool = self._loader.load(committed.spec, committed.settings, cause="register")
        except BaseException as error:
            with self._lock:
                self._fail_load_locked(error)
            raise
        with self._lock:
            self._publish_locked(pool)

    def reconfigure_leased(self, spec: ModelSpec, settings: ModelSettings) -> None:
        """Replace the configuration and (re)load (caller holds the exclusive lease).

        Validates before anything is torn down. When the engine is unchanged (same files and options) the slot
        count is checked against the live capacity and the pool is resized in place (weights stay loaded).
        Otherwise the replacement's primary is loaded privately first, so bad files, a configuration that does
        not fit the model, or a slot count above its capacity are all found while the old pool still serves
        (this may briefly hold two copies of the weights; nothing is evicted for it). A failure before the
        commit keeps the old pool, settings, metadata and residency and raises. After the commit the old pool
        is retired first and the new one is built on the validated primary; a failure then (a context that
        cannot be created, residency or memory refusal) leaves the new configuration registered and unloaded.
        """
        with self._lock:
            old_pool, old_state = self._pool, self._state
            self._transition_locked(ModelState.RECONFIGURING if old_pool is not None else ModelState.LOADING)
        same_engine = old_pool is not None and old_pool.spec.session_key() == spec.session_key()
        try:
            replacement, probe = self._validate_replacement(spec, settings, old_pool, same_engine)
        except BaseException as error:
            with self._lock:
                self._transition_locked(old_state)  # pre-commit failure: back to where it was
                if old_pool is None:  # nothing serves: the model failed to load, and is listed with the reason
                    self._last_error = hide_paths(str(error) or type(error).__name__, self._committed.spec.roots)
            self._runtime.events.emit(_LOG, "reconfigure_refused", self.name, error=str(error) or type(error).__name__)
            raise
        if replacement is not None:
            assert old_pool is not None  # a resized pool is made only over the live one (same_engine)
            self._commit_resized(spec, settings, old_pool, replacement)
            return
        self._commit_replacement(spec, settings, old_pool, probe)

    def _validate_replacement(
        self, spec: ModelSpec, settings: ModelSettings, old_pool: SlotPool | None, same_engine: bool
    ) -> tuple[SlotPool | None, LoadedModel | None]:
        """Returns (resized pool over the live engine, None) or (None, the replacement's validated primary)."""
        if same_engine:
            assert old_pool is not None  # same_engine compares with the live pool's spec
            check_slot_count(spec, settings.slots, settings.explicit_slots, old_pool.max_parallel_slots)
            return self._loader.grown(old_pool, spec, min(settings.slots, old_pool.max_parallel_slots)), None
        primary = self._loader.load_primary(spec)
        try:
            check_slot_count(spec, settings.slots, settings.explicit_slots, primary.max_parallel_slots)
        except BaseException:
            close_primary(primary, self.name)
            raise
        return None, primary

    def _commit_resized(self, spec: ModelSpec, settings: ModelSettings, old_pool: SlotPool, resized: SlotPool) -> None:
        with self._lock:
            self._commit_locked(Committed(spec, settings, self._committed.metadata))
            self.sequences.end_all("its model was reconfigured")
            self._pool = None
            self._publish_locked(resized)
        old_pool.close_surplus(resized)
        self._runtime.events.emit(_LOG, "reconfigured", self.name, slots=resized.capacity, in_place=True)

    def _commit_replacement(
        self, spec: ModelSpec, settings: ModelSettings, old_pool: SlotPool | None, probe: LoadedModel | None
    ) -> None:
        with self._lock:
            retired = self._retire_locked(ModelState.RECONFIGURING) if old_pool is not None else None
            self._commit_locked(Committed(spec, settings, None))
            self.admission.set_capacity_locked(settings.slots)
        if retired is not None:
            retired.close()
        try:
            pool = self._loader.load(spec, settings, primary=probe, cause="reconfigure")
        except BaseException as error:
            with self._lock:
                self._fail_load_locked(error)
            raise
        with self._lock:
            self._publish_locked(pool)
        self._runtime.events.emit(_LOG, "reconfigured", self.name, slots=pool.capacity, in_place=False)


def _only_the_count_differs(committed: Committed, spec: ModelSpec, settings: ModelSettings) -> bool:
    """Whether `spec` and `settings` differ from the committed ones in the slot count alone (ModelSpec equality
    leaves out the ModelConfig message, whose instance_group says the count too)."""
    same_spec = dataclasses.replace(spec, instance_count=committed.spec.instance_count) == committed.spec
    current = committed.settings
    same_settings = dataclasses.replace(settings, slots=current.slots, explicit_slots=current.explicit_slots) == current
    return same_spec and same_settings
