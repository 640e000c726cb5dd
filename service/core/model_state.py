"""A model's lifecycle states and the transitions between them (service/core/lifecycle.py ModelEntry moves through
them under its lock), and what an observation of a model reports (`ModelStatus`, `ModelView`, built by
`status_of` from one reading under that lock).

States and their transitions:

    UNLOADED      -> LOADING        first request (the one initializer) or an explicit load
    LOADING       -> READY          the complete pool is published
    LOADING       -> UNLOADED       the load failed; a later request or load may retry
    READY         -> RECONFIGURING  a manager's exclusive lease, after every earlier lease drained
    READY         -> UNLOADING      likewise, for an unload, eviction, idle retirement or a failed device
    RECONFIGURING -> READY          replacement published, or a pre-commit failure kept the old pool
    RECONFIGURING -> UNLOADED       the replacement failed after the old pool was retired
    UNLOADING     -> UNLOADED       teardown finished
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from engine.config.specs import BatchingSpec, ModelSpec
from engine.interface import ModelMetadata

from .admission import AdmissionStatistics
from .pool import LoadTimes, SlotPool
from .runtime import ModelSettings


class ModelState(enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    RECONFIGURING = "reconfiguring"
    UNLOADING = "unloading"


TRANSITIONS: dict[ModelState, frozenset[ModelState]] = {
    ModelState.UNLOADED: frozenset({ModelState.LOADING}),
    ModelState.LOADING: frozenset({ModelState.READY, ModelState.UNLOADED}),
    ModelState.READY: frozenset({ModelState.RECONFIGURING, ModelState.UNLOADING}),
    ModelState.RECONFIGURING: frozenset({ModelState.READY, ModelState.UNLOADED}),
    ModelState.UNLOADING: frozenset({ModelState.UNLOADED}),
}


class InvalidTransition(RuntimeError):
    pass


def check_transition(model: str, old: ModelState, new: ModelState) -> None:
    """Raises InvalidTransition unless `old` -> `new` is listed above."""
    if new not in TRANSITIONS[old]:
        raise InvalidTransition(f"model '{model}': {old.value} -> {new.value} is not allowed")


@dataclass(frozen=True)
class ModelStatus:
    """An observation of one model (GET /v1/models). Reserves nothing; never mixes old and new settings."""

    name: str
    state: ModelState
    loaded: bool
    slots: int
    active_slots: int
    queued_requests: int
    max_parallel_slots: int | None
    backend: str
    last_error: str
    source: str
    admission_timeout: float
    version: str
    memory_bytes: int | None
    manager_active: bool = False
    queued_managers: int = 0
    batching: BatchingSpec | None = None  # dynamic batching settings; None: one request per engine call
    max_batch_size: int = 0
    load_times: LoadTimes | None = None  # the published pool's load and warmup seconds; None when not loaded


@dataclass(frozen=True)
class ModelView:
    """One consistent reading of a model for a reply (see ModelEntry.view)."""

    spec: ModelSpec
    metadata: ModelMetadata | None  # the published metadata, else the last published one, else None
    status: ModelStatus


def status_of(
    name: str,
    state: ModelState,
    spec: ModelSpec,
    settings: ModelSettings,
    pool: SlotPool | None,
    last_error: str,
    admission: AdmissionStatistics,
) -> ModelStatus:
    """The status of one reading of a model (taken under its lock); its memory_bytes is filled in by `with_memory`
    after the lock is let go (a python model measures its workers in /proc: no reading of files under the model
    lock)."""
    return ModelStatus(
        name=name,
        state=state,
        loaded=pool is not None,
        # The built pool's count: a default count above the engine's capacity was lowered to it.
        slots=pool.capacity if pool is not None else settings.slots,
        active_slots=admission.active_slots,
        queued_requests=admission.queued,
        max_parallel_slots=pool.max_parallel_slots if pool is not None else None,
        backend=spec.backend,
        last_error=last_error,
        source=settings.source,
        admission_timeout=settings.admission_timeout,
        version=spec.version,
        memory_bytes=None,
        manager_active=admission.manager_active,
        queued_managers=admission.queued_managers,
        batching=spec.batching,
        max_batch_size=spec.max_batch_size,
        load_times=pool.times if pool is not None else None,
    )


def with_memory(status: ModelStatus, pool: SlotPool | None) -> ModelStatus:
    """`status` with the memory its pool reports now (measured without the model lock; a pool retired meanwhile
    still answers for itself). Unchanged when the status says nothing is loaded."""
    if pool is None or not status.loaded:
        return status
    return dataclasses.replace(status, memory_bytes=pool.memory_bytes())


__all__ = [
    "InvalidTransition",
    "ModelState",
    "ModelStatus",
    "ModelView",
    "check_transition",
    "status_of",
    "with_memory",
]
