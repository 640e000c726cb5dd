"""A registered model's state, under one lock: its lifecycle state (service/core/model_state.py lists the states and
their transitions), its committed configuration, its published pool, its last error, its admission; read as one
(`status`, `view`) and changed only by the steps here (`_transition_locked`, `_commit_locked`, `_publish_locked`,
`_fail_load_locked`, `_retire_locked`), each called with the lock held.

`ModelRecord` is the floor the model's other parts stand on: `Reconfigurable` (service/core/reconfiguration.py)
adds loading and reconfiguring under a manager's lease, and `ModelEntry` (service/core/lifecycle.py) the leases,
the requests' door and the unloads. Locking as lifecycle.py says: `_lock` guards the state, the committed spec and
settings, the published pool, the pending initialization and the admission core; no lock is held across loading,
inference, teardown or any wait.
"""

from __future__ import annotations

import dataclasses
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from engine.config.files import hide_paths
from engine.config.specs import ModelSpec
from engine.interface import ModelMetadata

from .admission import AdmissionController
from .batching import batch_rule
from .loading import ModelLoader
from .model_state import ModelState, ModelStatus, ModelView, check_transition, status_of, with_memory
from .paths import RequestPath
from .pool import SlotPool
from .runtime import ModelSettings, SharedRuntime
from .sequences import SequenceTable
from .statistics import InferenceStatistics


@dataclass
class Committed:
    """The committed configuration: replaced as a whole, so readers never see a mix."""

    spec: ModelSpec
    settings: ModelSettings
    metadata: ModelMetadata | None = None  # last published metadata (kept after unload for ModelMetadata RPCs)


class ModelRecord(ABC):
    """One registered model's state and the locked steps that change it (see the module docstring)."""

    path: RequestPath  # how its requests run (service/core/paths.py): chosen as its configuration is committed
    _loader: ModelLoader  # its loads, which an unload or the shutdown stops (made by ModelEntry)

    def __init__(self, spec: ModelSpec, settings: ModelSettings, runtime: SharedRuntime) -> None:
        self.name = spec.name
        self._runtime = runtime
        self._clock = runtime.clock
        self._lock = threading.Lock()  # guards: _state, _committed, _pool, _init, _last_error, _retired, admission core
        self._state = ModelState.UNLOADED
        self._retired = False  # a version its policy no longer serves: never loaded again (retire_leased)
        self._committed = Committed(spec, settings)
        self._pool: SlotPool | None = None
        self._last_error = ""
        self.last_used = self._clock()  # for LRU eviction; written without the lock (a float store)
        self.admission = AdmissionController(
            spec.name, settings.slots, self._lock, self._clock, batch_rule(spec.batching, spec.max_batch_size)
        )
        self.statistics = InferenceStatistics()
        self.sequences = SequenceTable(spec.name, self._clock)  # open sequences (service/core/sequences.py)

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

    # ---- loading and publication (callers hold a lease; no lock held while building) ------------------------

    def _shutting_down(self) -> bool:
        """Whether shutdown closed this model's admission (a warmup stops before its next run then)."""
        return self.admission.statistics().closed

    def _publish_locked(self, pool: SlotPool) -> None:
        self._pool = pool
        self.last_used = self._clock()  # a fresh pool is not idle since long ago
        self._committed = Committed(self._committed.spec, self._committed.settings, pool.metadata)
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

    def _commit_locked(self, committed: Committed) -> None:
        """Replace the committed configuration, and the batching rule admission applies with it."""
        self._committed = committed
        self.path = self._path_for(committed.spec)
        self.admission.set_batching_locked(batch_rule(committed.spec.batching, committed.spec.max_batch_size))

    def _lease_ended(self) -> None:
        """Any lease ended: the model may be idle now, so the idle reaper must look at it again. This is what
        keeps idle retirement from being lost: the reaper drops a model it finds not READY (loading,
        reconfiguring, unloading), and whichever lease made it so ends here."""
        residency = self._runtime.residency
        if residency is not None and (residency.reaper is not None or residency.watch is not None):
            residency.on_lease_end(self)  # and the memory watch re-reads what the run kept

    def resident_bytes(self) -> int:
        """Bytes the published pool reports (0 when none). Reads the pool reference without the lock (one
        atomic read), so residency may call it while this model's lock is held (on_published)."""
        pool = self._pool
        return pool.memory_bytes() if pool is not None else 0

    @abstractmethod
    def _path_for(self, spec: ModelSpec) -> RequestPath:
        """The request path of `spec` for this model (service/core/paths.py path_for)."""

    @abstractmethod
    def retire_if_idle(self, event: str, **fields: Any) -> bool:
        """Unload the model if it is ready, idle and queue-free now (residency's ResidentModel)."""
