"""A registered model (`ModelEntry`): its lifecycle, its leases, its requests' door, its unloads.

States (contract "States and ownership"; service/core/model_state.py lists them with their transitions): UNLOADED,
LOADING, READY, RECONFIGURING, UNLOADING, each change checked against the list.

Its parts, each in a file of its own:

    model_record.py     ModelRecord: the state, committed configuration, published pool and admission under one
                        lock, and the locked steps that change them (transition, commit, publish, fail, retire)
    reconfiguration.py  Reconfigurable: load and reconfigure under a manager's lease; an instance-count change
                        while serving
    loading.py          ModelLoader: building pools (cold-load guard, residency, warmup, stops)
    model_state.py      the states, their transitions, the status a reading gives
    lease.py            Lease, ExclusiveLease, Barrier
    paths.py            the request path chosen with the committed configuration (`ModelEntry.path`)
    batching.py         a batching request's admission and its batch's run (`run_batched`)

Locking: `ModelEntry._lock` (ModelRecord's) guards the state, the committed spec and settings, the published pool,
the pending initialization (ModelEntry's `_init`) and the admission core. Order: the registry lock before a model
lock, never the reverse. No lock is held across loading, inference, teardown or any wait; those run with only a
lease held.

Ownership: a request holds one slot (a REQUEST ticket) from admission until its `Lease` is released; a manager
holds the whole model (a MANAGER ticket) for the body of `with entry.exclusive(...)` (an `ExclusiveLease`). Only a
holder of a lease changes the pool, so the pool a request runs on can never be torn down under it.

`ModelEntry` is the only way into a model: no other module takes its lock, reads its pool or calls its admission
controller's `*_locked` methods. The registry publishes new entries with `claim_new` and posts bulk-unload
barriers with `post_barrier`; residency sees entries through its `ResidentModel` protocol, leases through
`LeaseOwner`, paths through `ServedModel`, the batching entry through `BatchingModel`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from engine.config.specs import ModelSpec
from engine.errors import DeviceFailedError
from engine.interface import CancelToken, Context

from .admission import Ticket, TicketKind, TicketState
from .batching import BatchItem, run_batched
from .errors import ModelNotFound, ModelNotLoadedByControl, RequestCancelled, ServiceError, own_copy
from .lease import Barrier as Barrier
from .lease import ExclusiveLease as ExclusiveLease
from .lease import Lease as Lease
from .loading import ModelLoader
from .model_record import Committed
from .model_state import ModelState as ModelState
from .model_state import ModelStatus as ModelStatus
from .model_state import ModelView as ModelView
from .paths import RequestPath, path_for
from .pool import SlotPool
from .rate_limiter import ResourcePool, model_key
from .reconfiguration import Reconfigurable
from .request_errors import as_request_error
from .runtime import ModelSettings as ModelSettings
from .runtime import SharedRuntime as SharedRuntime
from .service_rate import refuse_if_wait_exceeds

_LOG = logging.getLogger(__name__)


# What ended a model's open sequences, by the unload's event (their next request is told).
_ENDED_BY = {
    "evicted": "evicted",
    "idle_retired": "retired as idle",
    "closed_at_shutdown": "closed at shutdown",
    "device_failed": "unloaded after its device failed",
}


class _InitializerLeft(Exception):
    """Internal: the initializer's caller gave up before its load began; a waiter takes over."""


class _InitAttempt:
    """One initialization by the one initializer; admitted requests wait for its outcome."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards: _done, _waiters, pool, error
        self._done = False
        self._waiters: list[threading.Event] = []
        self.pool: SlotPool | None = None
        self.error: BaseException | None = None

    def finish(self, pool: SlotPool | None, error: BaseException | None) -> None:
        with self._lock:
            self.pool, self.error, self._done = pool, error, True
            waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.set()

    def wait(self, cancel: CancelToken | None) -> SlotPool:
        """Block until the initializer finishes (no time limit: a load is not bounded by admission).
        Raises the load's error, or RequestCancelled if `cancel` fires first."""
        woken = threading.Event()
        with self._lock:
            if self._done:
                woken.set()
            else:
                self._waiters.append(woken)
        if cancel is not None:
            cancel.add_callback(woken.set)
        try:
            woken.wait()
        finally:
            if cancel is not None:
                cancel.remove_callback(woken.set)
        with self._lock:
            if not self._done:
                self._waiters.remove(woken)
                raise RequestCancelled("the caller gave up while the model was loading")
        if self.error is not None:
            raise own_copy(self.error)
        if self.pool is None:
            raise RuntimeError("the model's initialization ended with neither a pool nor an error")
        return self.pool


class ModelEntry(Reconfigurable):
    """One registered model. Entries are never removed from the registry: workers may hold them."""

    def __init__(self, spec: ModelSpec, settings: ModelSettings, runtime: SharedRuntime) -> None:
        super().__init__(spec, settings, runtime)
        self._init: _InitAttempt | None = None  # lazy loading's attempt under way (guarded by _lock)
        self._loader = ModelLoader(spec.name, runtime, self, self._shutting_down)
        self.path = path_for(self, spec)

    def _path_for(self, spec: ModelSpec) -> RequestPath:
        return path_for(self, spec)

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
        if self._runtime.refuse_predicted_wait:  # raises WaitExceedsDeadline (service/core/service_rate.py)
            refuse_if_wait_exceeds(self, deadline)
        ticket = self.admission.acquire(
            TicketKind.REQUEST,
            deadline,
            overdue_after=settings.admission_timeout,
            max_queue=self._runtime.max_queue if settings.max_queue is None else settings.max_queue,
            cancel=cancel,
        )
        try:
            pool = self._ensure_pool(cancel)
            context = pool.take(context_index)
        except BaseException:
            self.end_lease(ticket)
            raise
        lease = Lease(self, ticket, pool, context, 0)
        if self._runtime.rate_limiter is not None:  # (without a limiter, take_resources has nothing to take)
            try:  # the rate limiter's resources: the slot stays busy while it waits for them (counted as queueing)
                lease.take_resources(deadline, cancel)
            except BaseException:
                lease.release()
                raise
        lease.queue_ns = time.perf_counter_ns() - arrived
        return lease

    @property
    def resources(self) -> ResourcePool | None:
        """The server's rate limiter, which a lease takes its run's resources from (None: `--rate-limit off`)."""
        return self._runtime.rate_limiter

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
        """Admit a request of a batching model and see it run, alone or in a batch (service/core/batching.py
        `run_batched` says how, and what it raises). Returns `item` with its outcome posted."""
        return run_batched(self, item, deadline, cancel)

    def admit_batch_item(self, item: BatchItem, deadline: float | None, cancel: CancelToken) -> Ticket[BatchItem]:
        """A batching request's ticket: a granted leader's, or a member's its leader released, queued on its
        `priority`'s level on a model with priorities. Blocks and raises as AdmissionController.acquire."""
        settings = self._committed.settings
        if self._runtime.refuse_predicted_wait:  # raises WaitExceedsDeadline (service/core/service_rate.py)
            refuse_if_wait_exceeds(self, deadline)
        return self.admission.acquire(
            TicketKind.REQUEST,
            deadline,
            overdue_after=settings.admission_timeout,
            max_queue=self._max_queue(settings),
            cancel=cancel,
            rows=item.rows,
            key=item.key,
            payload=item,
            priority=item.priority,
            timeout_us=item.timeout_us,
        )

    def lend_context(self, cancel: CancelToken | None) -> tuple[SlotPool, Context]:
        """For a granted batch's leader: the published pool (loaded first if need be, as `acquire_lease` does) and a
        context of it. Raises the load's errors; the caller still holds its ticket then."""
        pool = self._ensure_pool(cancel)
        return pool, pool.take()

    def end_lease(self, ticket: Ticket[Any]) -> None:
        self.last_used = self._clock()
        self.admission.release(ticket)
        self._lease_ended()

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
                    attempt = self._init = _InitAttempt()
                    self._transition_locked(ModelState.LOADING)
                    committed = self._committed
                    initializer = True
                else:
                    initializer = False
            if initializer:
                return self._initialize(attempt, committed, cancel)
            try:
                return attempt.wait(cancel)
            except _InitializerLeft:
                continue  # the initializer's caller left before its load began: the next waiter loads

    def _initialize(self, attempt: _InitAttempt, committed: Committed, cancel: CancelToken | None) -> SlotPool:
        """The one initializer's load; admitted requests waiting on `attempt` share its outcome."""
        try:
            pool = self._loader.load(committed.spec, committed.settings, cause="first_request", cancel=cancel)
        except RequestCancelled:
            # Cancelled while waiting for the cold-load guard: nothing was loaded, nothing failed.
            with self._lock:
                self._init = None
                self._transition_locked(ModelState.UNLOADED)
            attempt.finish(None, _InitializerLeft())
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
        if self._runtime.rate_limiter is not None:  # its needs no longer set a resource's default availability
            self._runtime.rate_limiter.unregister(model_key(self.name, self._committed.spec.version))
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
