"""A registered model: its lifecycle state, its published pool and its admission, under one lock.

States (contract "States and ownership") and their transitions:

    UNLOADED      -> LOADING        first request (the one initializer) or an explicit load
    LOADING       -> READY          the complete pool is published
    LOADING       -> UNLOADED       the load failed; a later request or load may retry
    READY         -> RECONFIGURING  a manager's exclusive lease, after every earlier lease drained
    READY         -> UNLOADING      likewise, for an unload, eviction, idle retirement or a failed device
    RECONFIGURING -> READY          replacement published, or a pre-commit failure kept the old pool
    RECONFIGURING -> UNLOADED       the replacement failed after the old pool was retired
    UNLOADING     -> UNLOADED       teardown finished

Locking: `ModelEntry._lock` guards the state, the committed spec and settings, the published pool, the pending
initialization and the admission core. Order: the registry lock before a model lock, never the reverse. No
lock is held across loading, inference, teardown or any wait; those run with only a lease held.

Ownership: a request holds one slot (a REQUEST ticket) from admission until its `Lease` is released; a manager
holds the whole model (a MANAGER ticket) for the body of `with entry.exclusive(...)` (an `ExclusiveLease`). Only a
holder of a lease changes the pool, so the pool a request runs on can never be torn down under it.

`ModelEntry` is the only way into a model: no other module takes its lock, reads its pool or calls its admission
controller's `*_locked` methods. The registry publishes new entries with `claim_new` and posts bulk-unload
barriers with `post_barrier`; residency sees entries through its `ResidentModel` protocol.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.errors import DeviceFailedError
from engine.interface import CancelToken, Context, LoadedModel, ModelMetadata, ModelSpec
from engine.repository import hide_paths

from .admission import AdmissionController, Ticket, TicketKind, TicketState
from .batching import BatchItem, EveryoneGaveUp, batch_rule, run_batch
from .errors import ModelNotFound, ModelNotLoadedByControl, RequestCancelled, ServiceError
from .initialization import InitAttempt, InitializerLeft, as_request_error
from .lease import Barrier as Barrier
from .lease import ExclusiveLease as ExclusiveLease
from .lease import Lease as Lease
from .loading import ModelLoader
from .model_state import ModelState as ModelState
from .model_state import ModelStatus as ModelStatus
from .model_state import ModelView as ModelView
from .model_state import check_transition, status_of, with_memory
from .paths import RequestPath, path_for
from .pool import LoadTimes, SlotPool, check_slot_count, close_contexts, close_primary
from .runtime import ModelSettings as ModelSettings
from .runtime import SharedRuntime as SharedRuntime
from .sequences import SequenceTable
from .statistics import InferenceStatistics

_LOG = logging.getLogger(__name__)


# What ended a model's open sequences, by the unload's event (their next request is told).
_ENDED_BY = {
    "evicted": "evicted",
    "idle_retired": "retired as idle",
    "closed_at_shutdown": "closed at shutdown",
    "device_failed": "unloaded after its device failed",
}


@dataclass
class _Committed:
    """The committed configuration: replaced as a whole, so readers never see a mix."""

    spec: ModelSpec
    settings: ModelSettings
    metadata: ModelMetadata | None = None  # last published metadata (kept after unload for ModelMetadata RPCs)


class ModelEntry:
    """One registered model. Entries are never removed from the registry: workers may hold them."""

    def __init__(self, spec: ModelSpec, settings: ModelSettings, runtime: SharedRuntime) -> None:
        self.name = spec.name
        self._runtime = runtime
        self._clock = runtime.clock
        self._lock = threading.Lock()  # guards: _state, _committed, _pool, _init, _last_error, _retired, admission core
        self._state = ModelState.UNLOADED
        self._retired = False  # a version its policy no longer serves: never loaded again (retire_leased)
        self._committed = _Committed(spec, settings)
        self._pool: SlotPool | None = None
        self._init: InitAttempt | None = None
        self._last_error = ""
        self.last_used = self._clock()  # for LRU eviction; written without the lock (a float store)
        self.admission = AdmissionController(
            spec.name, settings.slots, self._lock, self._clock, batch_rule(spec.batching, spec.max_batch_size)
        )
        self.statistics = InferenceStatistics()
        self.sequences = SequenceTable(spec.name, self._clock)  # open sequences (service/core/sequences.py)
        # How its requests run (service/core/paths.py): chosen with the committed configuration, read without the lock.
        self.path: RequestPath = path_for(self, spec)
        # Its loads (building, warming, a replacement's probe, added slots), which an unload or the shutdown stops.
        self._loader = ModelLoader(spec.name, runtime, self, self._shutting_down)

    # ---- observation ----------------------------------------------------------------------------------------

    @property
    def state(self) -> ModelState:
        return self._state

    @property
    def spec(self) -> ModelSpec:
        return self._committed.spec

    @property
    def settings(self) -> ModelSettings:
        return self._committed.settings

    def known_metadata(self) -> ModelMetadata | None:
        """The published metadata, else the last published one, else None."""
        with self._lock:
            if self._pool is not None:
                return self._pool.metadata
            return self._committed.metadata

    def status(self) -> ModelStatus:
        with self._lock:
            status, pool = self._status_locked(), self._pool
        return with_memory(status, pool)

    def view(self) -> ModelView:
        """The committed spec, the known metadata and the status, read in one step: a reply built from it never
        mixes the configurations before and after a reconfiguration (a new config with the old slot count, a
        new version with the old inputs)."""
        with self._lock:
            pool = self._pool
            metadata = pool.metadata if pool is not None else self._committed.metadata
            view = ModelView(self._committed.spec, metadata, self._status_locked())
        return dataclasses.replace(view, status=with_memory(view.status, pool))

    def _status_locked(self) -> ModelStatus:
        committed = self._committed
        admission = self.admission.statistics_locked()
        return status_of(
            self.name, self._state, committed.spec, committed.settings, self._pool, self._last_error, admission
        )

    def is_ready(self) -> bool:
        return self._state is ModelState.READY

    def readiness(self) -> tuple[ModelState, str]:
        """The state and the last load error, read together (no memory measured: ServerReady asks often)."""
        with self._lock:
            return self._state, self._last_error

    def _transition_locked(self, new: ModelState) -> None:
        check_transition(self.name, self._state, new)
        self._state = new

    # ---- requests -------------------------------------------------------------------------------------------

    def acquire_lease(
        self, deadline: float | None, cancel: CancelToken | None = None, context_index: int | None = None
    ) -> Lease:
        """Admit a request (FIFO, until `deadline`), make sure the pool exists, and lend it a context (the one
        at `context_index`: a sequence's slot, waiting for it if another lease has it; SlotGone past the pool).

        Blocks while queued (bounded by `deadline`) and while the model loads (unbounded; cancellable).
        Raises ServerBusy subclasses, RequestCancelled, ModelLoadFailed, ResidencyLimit or MemoryLimit; on
        every error the caller holds nothing.
        """
        arrived = time.perf_counter_ns()
        settings = self._committed.settings
        ticket = self.admission.acquire(
            TicketKind.REQUEST,
            deadline,
            overdue_after=settings.admission_timeout,
            max_queue=self._max_queue(settings),
            cancel=cancel,
        )
        try:
            pool = self._ensure_pool(cancel)
            context = pool.take(context_index)
        except BaseException:
            self.end_lease(ticket)
            raise
        return Lease(self, ticket, pool, context, time.perf_counter_ns() - arrived)

    def request_slots(self) -> int:
        """How many of its requests the model runs at once: its published pool's request slots (an instance of a
        python model whose decoupled `async def execute` overlaps takes several), else its configured slot count.
        Reads without the lock (a reference and a number)."""
        pool = self._pool
        return pool.request_slots if pool is not None else self._committed.settings.slots

    def sequence_capacity(self) -> int:
        """How many sequences may be open at once, per slot of the published pool (else of the configured count),
        as Triton's per instance: `oldest`'s max_candidate_sequences, else (direct) max(1, max_batch_size)."""
        spec = self._committed.spec
        pool = self._pool
        slots = pool.capacity if pool is not None else self._committed.settings.slots
        if spec.sequence is not None and spec.sequence.max_candidates:
            return slots * spec.sequence.max_candidates
        return slots * max(1, spec.max_batch_size)

    def _max_queue(self, settings: ModelSettings) -> int:
        return self._runtime.max_queue if settings.max_queue is None else settings.max_queue

    @property
    def batches(self) -> bool:
        """Whether requests of this model go through `run_batched` (its committed spec has dynamic batching)."""
        return self._committed.spec.batching is not None

    def run_batched(self, item: BatchItem, deadline: float | None, cancel: CancelToken) -> BatchItem:
        """Admit a request of a batching model and see it run, alone or in a batch. Returns `item` with its
        outcome posted (`item.outcome()` gives the outputs or raises the error).

        Blocks while queued (bounded by `deadline`), then: the leader of a batch (its first request) makes sure
        the pool exists, runs the batch and releases its slot; any other member waits, without a time limit,
        for the leader. Raises the admission errors (ServerBusy subclasses, RequestCancelled when the caller
        gives up while queued or while its batch runs); on every error the caller holds nothing.
        """
        settings = self._committed.settings
        ticket: Ticket[BatchItem] = self.admission.acquire(
            TicketKind.REQUEST,
            deadline,
            overdue_after=settings.admission_timeout,
            max_queue=self._max_queue(settings),
            cancel=cancel,
            rows=item.rows,
            key=item.key,
            payload=item,
        )
        if ticket.is_member:
            return item  # released by its leader: the outcome is posted
        # (No members: the model's batching was reconfigured away while this request arrived; it runs alone.)
        # Every ticket of a batch was acquired here, with its BatchItem as the payload.
        items = [member.payload for member in ticket.members or [ticket]]
        # A batch of one is cancelled with its request (the common case when idle: no extra token).
        run_cancel = cancel if len(items) == 1 else EveryoneGaveUp([member.cancel for member in items])
        try:
            try:
                pool = self._ensure_pool(run_cancel)
                context = pool.take()
            except BaseException as error:
                for member in items:
                    member.fail(as_request_error(self.name, error))
                self.end_lease(ticket)
                raise
            lease = Lease(self, ticket, pool, context, 0)  # its release ends every member's lease
            handed_over = False
            try:
                handed_over = run_batch(lease, items, run_cancel, self.statistics)
                if handed_over:  # each member reads its own stream now; the last one to end releases the lease
                    self.admission.post_to_members(ticket)
            finally:
                if not handed_over:  # (a streaming batch's members' streams release it when the last one ends)
                    lease.release()
        finally:
            if run_cancel is not cancel:
                assert isinstance(run_cancel, EveryoneGaveUp)  # made above for a batch of several
                run_cancel.detach()
        if cancel.cancelled and item.error is None:
            item.error = RequestCancelled("the caller gave up while its batch ran")
        return item

    def end_lease(self, ticket: Ticket[Any]) -> None:
        self.last_used = self._clock()
        self.admission.release(ticket)
        self._lease_ended()

    def _lease_ended(self) -> None:
        """Any lease ended: the model may be idle now, so the idle reaper must look at it again. This is what
        keeps idle retirement from being lost: the reaper drops a model it finds not READY (loading,
        reconfiguring, unloading), and whichever lease made it so ends here."""
        residency = self._runtime.residency
        if residency is not None and (residency.reaper is not None or residency.watch is not None):
            residency.on_lease_end(self)  # and the memory watch re-reads what the run kept

    def _ensure_pool(self, cancel: CancelToken | None) -> SlotPool:
        """The published pool; the first admitted request of an unloaded model builds it (the one
        initializer) while later admitted requests wait for that outcome."""
        pool = self._pool
        if pool is not None:
            # Safe without the lock: the caller holds a request lease, and only an exclusive lease (which waits
            # for every request lease) ever retires the pool.
            return pool
        while True:
            with self._lock:
                if self._pool is not None:
                    return self._pool
                attempt = self._init
                if attempt is None and self._retired:
                    # A request that found this version before a reload dropped it.
                    raise ModelNotFound(self.name, self._committed.spec.version)
                if attempt is None and self._runtime.lazy_load_refusal:
                    raise ModelNotLoadedByControl(self.name, self._runtime.lazy_load_refusal)
                if attempt is None:
                    attempt = self._init = InitAttempt()
                    self._transition_locked(ModelState.LOADING)
                    committed = self._committed
                    initializer = True
                else:
                    initializer = False
            if initializer:
                return self._initialize(attempt, committed, cancel)
            try:
                return attempt.wait(cancel)
            except InitializerLeft:
                continue  # the initializer's caller left before its load began: the next waiter loads

    def _initialize(self, attempt: InitAttempt, committed: _Committed, cancel: CancelToken | None) -> SlotPool:
        """The one initializer's load; admitted requests waiting on `attempt` share its outcome."""
        try:
            pool = self._loader.load(committed.spec, committed.settings, cause="first_request", cancel=cancel)
        except RequestCancelled:
            # Cancelled while waiting for the cold-load guard: nothing was loaded, nothing failed.
            with self._lock:
                self._init = None
                self._transition_locked(ModelState.UNLOADED)
            attempt.finish(None, InitializerLeft())
            raise
        except BaseException as error:
            failure = as_request_error(self.name, error)
            with self._lock:
                self._init = None
                self._fail_load_locked(error)
            attempt.finish(None, failure)
            if failure is error:
                raise
            raise failure from error
        with self._lock:
            self._init = None
            self._publish_locked(pool)
        attempt.finish(pool, None)
        return pool

    # ---- loading and publication (callers hold a lease; no lock held while building) ------------------------

    def _shutting_down(self) -> bool:
        """Whether shutdown closed this model's admission (a warmup stops before its next run then)."""
        return self.admission.statistics().closed

    def _publish_locked(self, pool: SlotPool) -> None:
        self._pool = pool
        self.last_used = self._clock()  # a fresh pool is not idle since long ago
        self._committed = _Committed(self._committed.spec, self._committed.settings, pool.metadata)
        self._last_error = ""
        self._transition_locked(ModelState.READY)
        self.admission.set_capacity_locked(pool.request_slots)
        if self._runtime.residency is not None:
            self._runtime.residency.on_published(self)

    def _fail_load_locked(self, error: BaseException) -> None:
        # Clients read it (GetModel, RepositoryIndex): whatever raised it, no absolute path of the server's.
        self._last_error = hide_paths(str(error) or type(error).__name__, self._committed.spec.roots)
        self._transition_locked(ModelState.UNLOADED)
        self.admission.set_capacity_locked(self._committed.settings.slots)
        # Logged by _load (load_failed), outside this lock.

    def _retire_locked(self, next_state: ModelState, why: str = "its model was reconfigured") -> SlotPool | None:
        """Clear logical residency first (status shows unloaded at once); the caller tears the pool down
        outside the lock. Open sequences end (`why` tells their next request)."""
        self.sequences.end_all(why)
        pool = self._pool
        self._pool = None
        if next_state is not self._state:
            self._transition_locked(next_state)
        if pool is not None and self._runtime.residency is not None:
            self._runtime.residency.on_retired(self)
        return pool

    # ---- management (exclusive leases) ----------------------------------------------------------------------

    def exclusive(self, deadline: float | None, cancel: CancelToken | None = None) -> ExclusiveLease:
        """A manager's exclusive lease, after every earlier lease (FIFO); use it as `with entry.exclusive(...):`.
        Blocks while queued, until `deadline` (None: no limit). Raises like acquire_lease's admission step
        (ServerBusy subclasses, RequestCancelled, ShuttingDown), holding nothing then."""
        return ExclusiveLease(self, self._acquire_exclusive(deadline, cancel))

    def _acquire_exclusive(self, deadline: float | None, cancel: CancelToken | None) -> Ticket[Any]:
        settings = self._committed.settings
        return self.admission.acquire(
            TicketKind.MANAGER,
            deadline,
            overdue_after=settings.admission_timeout if deadline is not None else 0.0,
            cancel=cancel,
        )

    def release_exclusive(self, ticket: Ticket[Any]) -> None:
        """A manager's lease (or a granted barrier) ended (ExclusiveLease.release, Barrier.withdraw)."""
        self._release_exclusive(ticket)

    def _release_exclusive(self, ticket: Ticket[Any]) -> None:  # (tests wrap it to steer an interleaving)
        self.admission.release(ticket)
        self._lease_ended()

    def claim_new(self) -> ExclusiveLease:
        """The first exclusive lease of an entry nobody else has seen yet (granted at once: nothing can be
        queued). The registry calls it under its own lock before publishing the entry, so that concurrent
        registrations of the same id queue behind it (registry lock -> model lock: the stated order)."""
        with self._lock:
            ticket = self.admission.arrive_locked(TicketKind.MANAGER, None)
        if ticket.state is not TicketState.GRANTED:
            raise RuntimeError(f"model '{self.name}': a new entry's first lease was not granted ({ticket.state})")
        return ExclusiveLease(self, ticket)

    def post_barrier(self, on_change: Callable[[Barrier[ModelEntry]], None]) -> Barrier[ModelEntry]:
        """Queue a bulk unload's exclusive barrier without waiting. `on_change(barrier)` is called, under this
        model's lock (it must not block), when the barrier is granted, refused or withdrawn later; a barrier
        decided at once (`decided`) is not reported by it. The caller must `withdraw` the barrier, or unload
        under it and `withdraw` it, in every case."""
        barrier: Barrier[ModelEntry] = Barrier(self)
        with self._lock:
            barrier.attach(
                self.admission.arrive_locked(TicketKind.MANAGER, None, on_change=lambda _ticket: on_change(barrier))
            )
        return barrier

    # ---- stopping its loads (an unload, the shutdown) ----------------------------------------------------------

    def stop_loads(self, reason: str) -> Callable[[], None]:
        """Stop this model's loads in progress and make those that start before the returned `resume` is called
        fail at once (ModelLoadError naming `reason`). An unload stops them while it waits for its exclusive
        lease and resumes once granted, so that a load (a python model's hung initialize) cannot hold it back for
        the load's whole bound, nor a request admitted before it start the load again. A backend that cannot stop
        finishes its load (published as usual). Never blocks (the loads end on their own threads)."""
        return self._loader.stop(reason)

    def stop_loads_for_good(self, reason: str) -> None:
        """As `stop_loads`, with no end (the shutdown: no engine may open after it closed the models)."""
        self._loader.stop_for_good(reason)

    # ---- an instance-count change while the model serves ------------------------------------------------------

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
        self._commit_locked(_Committed(spec, settings, self._committed.metadata))
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

    def _commit_locked(self, committed: _Committed) -> None:
        """Replace the committed configuration, and the batching rule admission applies with it."""
        self._committed = committed
        self.path = path_for(self, committed.spec)
        self.admission.set_batching_locked(batch_rule(committed.spec.batching, committed.spec.max_batch_size))

    def _commit_resized(self, spec: ModelSpec, settings: ModelSettings, old_pool: SlotPool, resized: SlotPool) -> None:
        with self._lock:
            self._commit_locked(_Committed(spec, settings, self._committed.metadata))
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
            self._commit_locked(_Committed(spec, settings, None))
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

    def unload_leased(self, event: str = "unloaded", *, last_error: str = "", **fields: Any) -> bool:
        """Retire and tear down the pool (caller holds the exclusive lease). Idempotent: returns False when
        there was nothing to unload. Teardown runs outside the lock and may be slow; the model counts as
        unloaded from its first step. `last_error`, when given, is the reason the model is listed with after it
        (an ensemble unloaded because a step model failed). Emits `event` (unloaded, evicted, idle_retired,
        closed_at_shutdown) with `fields` and the teardown's seconds, once the teardown is done. (`fields` are
        typed Any: of type object, mypy would take them for Events.emit's keyword-only exc_info as well.)"""
        with self._lock:
            if self._pool is None:
                return False
            pool = self._retire_locked(ModelState.UNLOADING, f"its model was {_ENDED_BY.get(event, 'unloaded')}")
        started = time.perf_counter()
        try:
            pool.close()  # type: ignore[union-attr]
        finally:
            with self._lock:
                self._transition_locked(ModelState.UNLOADED)
                if last_error:
                    self._last_error = last_error
        self._runtime.events.emit(_LOG, event, self.name, **fields, seconds=time.perf_counter() - started)
        return True

    @property
    def retired(self) -> bool:
        """Whether a reload dropped this version (retire_leased): the registry no longer lists it."""
        return self._retired

    def retire_leased(self) -> None:
        """Unload this version for good (caller holds the exclusive lease): its policy no longer serves it. A
        request still holding the entry is refused with ModelNotFound naming the version; nothing loads it
        again. Teardown as in unload_leased."""
        with self._lock:
            self._retired = True
        self.unload_leased()

    # ---- a backend reported its device unusable (engine.errors.DeviceFailedError) ---------------------------------

    def retire_failed_pool(self, pool: SlotPool, error: DeviceFailedError) -> None:
        """Take `pool` out of service after its device failed under a request: once the leases admitted before
        this call are done (they fail fast with the same error), the pool is torn down as by an unload, the model
        is UNLOADED with the error as its last error, and `device_failed` is logged; the next request or an
        operator's load rebuilds it. A pool already retired or replaced is left alone. Blocks the calling request
        (after its slot and ticket were released) for that drain; during shutdown it does nothing."""
        try:
            lease = self.exclusive(deadline=None)
        except ServiceError as refusal:  # shutting down: the shutdown closes the pool anyway
            _LOG.warning("model '%s': not retiring the pool after its device failed: %s", self.name, refusal)
            return
        with lease:
            with self._lock:
                current = self._pool is pool
            if current:
                self.unload_leased(event="device_failed", error=str(error))
                with self._lock:
                    self._last_error = str(error)

    def retire_if_idle(self, event: str, **fields: Any) -> bool:
        """Unload this model if it is ready, idle and queue-free now (try-acquire; never queues): eviction,
        idle retirement and the shutdown's close. Returns whether it was retired. Teardown runs on the calling
        thread, after the model already counts as unloaded. The unload is logged (and counted) as `event` with
        `fields`: evicted, idle_retired or closed_at_shutdown."""
        if event != "closed_at_shutdown" and self.sequences.open_count():
            return False  # open sequences keep their state on it: in use, except to the shutdown's close
        ticket = self._try_acquire_idle_exclusive()
        if ticket is None:
            return False
        with ExclusiveLease(self, ticket):
            return self.unload_leased(event, **fields)

    def _try_acquire_idle_exclusive(self) -> Ticket[Any] | None:
        """An exclusive lease only if the model is ready, idle and queue-free right now; never queues.
        Returns None otherwise."""
        with self._lock:
            if self._state is not ModelState.READY:
                return None
            return self.admission.try_exclusive_locked()

    def resident_bytes(self) -> int:
        """Bytes the published pool reports (0 when none). Reads the pool reference without the lock (one
        atomic read), so residency may call it while this model's lock is held (on_published)."""
        pool = self._pool
        return pool.memory_bytes() if pool is not None else 0


def _only_the_count_differs(committed: _Committed, spec: ModelSpec, settings: ModelSettings) -> bool:
    """Whether `spec` and `settings` differ from the committed ones in the slot count alone (ModelSpec equality
    leaves out the ModelConfig message, whose instance_group says the count too)."""
    same_spec = dataclasses.replace(spec, instance_count=committed.spec.instance_count) == committed.spec
    current = committed.settings
    same_settings = dataclasses.replace(settings, slots=current.slots, explicit_slots=current.explicit_slots) == current
    return same_spec and same_settings
