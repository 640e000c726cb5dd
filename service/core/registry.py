"""The registry: model ids to entries, and the management operations over them (register, reconfigure,
unload, bulk unload). Management calls and Triton's repository load/unload RPCs both come here, so they share
one lifecycle code path.

Versions: a name maps to a `ModelVersions`, one ModelEntry per version its `version_policy` serves; each version
is a model of its own (slots, FIFO, leases, batching, residency, statistics). A request naming no version goes to
the highest READY version (the highest version when none is ready: its first request loads it, as any lazy
model). A reload adds the versions the new policy selects and retires those it drops (their entries leave the
group, then unload under their own exclusive lease and never load again); the versions it keeps are reconfigured
one by one under their own leases, as a single model is. Unload takes every version.

Locking: `_lock` guards `_entries` only and is held for dictionary work, never across a wait; it is taken before
any model lock, never after. `_bulk_lock` serializes the publication of bulk-unload barriers (a few
non-blocking enqueues), so two bulk operations over overlapping models order their barriers the same way on
every shared model and cannot wait on each other in a cycle. Ordinary requests never touch it.

Names are never removed, nor a version's entry except when a reload retires it: a worker may hold one at any
time. An unloaded entry costs a few objects.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.config.repository import ModelRepository, check_model_name, is_version_number
from engine.config.specs import ModelSpec
from engine.errors import EngineError, ExecutionCancelled, ModelConfigError
from engine.interface import CancelToken

from .detached import DetachedWork
from .errors import (
    InvalidRequest,
    ModelConfigFailed,
    ModelNotFound,
    RequestCancelled,
    UnsupportedSlotCount,
    own_copy,
)
from .lifecycle import Barrier, ExclusiveLease, ModelEntry, ModelSettings, ModelState, ModelStatus, SharedRuntime

_LOG = logging.getLogger(__name__)

MAX_SLOTS = 16
# An ensemble's slots hold nothing (service/request_path/ensemble.py): enough that its own admission never binds before
# the inference handler budget does; its steps' admissions throttle.
ENSEMBLE_SLOTS = 1024


@dataclass(frozen=True)
class RegistryPolicy:
    """Server-wide settings the registry applies to every registration."""

    parallel_jobs: int | None = None  # None: legacy mode, one slot per model, explicit counts refused
    admission_timeout: float = 0.0  # server ceiling and default, seconds; 0 = unbounded


@dataclass(frozen=True)
class Registration:
    """A request to register or reconfigure a model. It declares the whole configuration: what it leaves out
    comes from the model's files and the server defaults, except `source`, which defaults to the current one."""

    name: str
    source: str = ""
    backend: str = ""
    options: Mapping[str, str] = field(default_factory=dict)
    slots: int | None = None  # explicit slot count from the request
    admission_timeout: float | None = None
    config_json: str = ""
    # Triton's repository load (and poll mode): a change of the instance count alone is made while the model
    # serves (ModelEntry.resize_in_service), as Triton does. False (RegisterModel): under the exclusive lease,
    # after the work admitted before it, as every reconfiguration (the contract's OPS.ready.register, ORDER.03).
    resize_in_service: bool = False


@dataclass(frozen=True)
class ModelVersions:
    """The served versions of one model name, by version number (replaced whole under the registry lock, so a
    reader without it sees one consistent set)."""

    name: str
    by_version: Mapping[int, ModelEntry]

    def entries(self) -> list[ModelEntry]:
        """Every version's entry, lowest version first."""
        return [self.by_version[version] for version in sorted(self.by_version)]

    def highest(self) -> ModelEntry:
        return self.by_version[max(self.by_version)]

    def default(self) -> ModelEntry:
        """The version a request naming none gets: the highest READY one, else the highest."""
        if len(self.by_version) == 1:  # (the common model: its one version, READY or not)
            return next(iter(self.by_version.values()))
        ready = [version for version, entry in self.by_version.items() if entry.is_ready()]
        return self.by_version[max(ready)] if ready else self.highest()

    def ready_versions(self) -> list[str]:
        return [str(version) for version in sorted(self.by_version) if self.by_version[version].is_ready()]

    def find(self, version: str) -> ModelEntry:
        """The entry of `version` ("" for the default). Raises InvalidRequest for a version that is not a number
        (Triton's wording), ModelNotFound for one that is not served."""
        if not version:
            return self.default()
        if not is_version_number(version):
            # Triton's wording: tritonclient's explicit int8 example recognises the refusal by it.
            raise InvalidRequest(
                f"failed to get model version from specified version string '{version}': a model version is a number"
            )
        entry = self.by_version.get(int(version))
        if entry is None:
            raise ModelNotFound(self.name, version)
        return entry


class ModelRegistry:
    """Model ids to their served versions, and the management operations over them (see the module docstring).

    Longer than the house's ~300 lines for a reason: every operation here (register, reconfigure, unload, bulk
    unload, repository load/unload, reloads adding and retiring versions) takes the registry lock and then model
    leases in one stated order; kept in one class, that order is read in one place rather than across files."""

    def __init__(
        self, repository: ModelRepository, runtime: SharedRuntime, policy: RegistryPolicy | None = None
    ) -> None:
        self.repository = repository
        self.runtime = runtime
        self.policy = policy or RegistryPolicy()
        self._lock = threading.Lock()  # guards: _entries, _failed, _unloaded_with_step, _stopped_for_good
        self._entries: dict[str, ModelVersions] = {}
        # Ensembles unloaded because a step model was (Triton's rule); loaded again when that step model loads.
        self._unloaded_with_step: dict[str, set[str]] = {}
        # Repository models with no entry because their configuration could not be read or was refused: the
        # reason, until a registration of the name succeeds.
        self._failed: dict[str, str] = {}
        self._bulk_lock = threading.Lock()  # serializes bulk barrier publication only
        self._stopped_for_good = ""  # set by stop_loads (shutdown): new entries never load either
        # Management work whose callers may leave before it ends (RegisterModel, RepositoryModelLoad).
        self.detached = DetachedWork()

    # ---- lookup ---------------------------------------------------------------------------------------------

    def versions(self, name: str) -> ModelVersions:
        """The served versions of `name`. Raises ModelConfigFailed for a repository model whose configuration
        failed (with its reason), ModelNotFound for any other unknown name."""
        group = self._entries.get(name)  # a dict read is atomic; names are never removed
        if group is None:
            reason = self._failed.get(name)
            if reason is not None:
                raise ModelConfigFailed(name, reason)
            raise ModelNotFound(name)
        return group

    def get(self, name: str, version: str = "") -> ModelEntry:
        """The entry of `name`'s `version` ("": the highest ready version, else the highest). Raises as
        `versions` does, and as ModelVersions.find for the version."""
        return self.versions(name).find(version)

    def unregistered_reason(self, name: str) -> str:
        """Why repository model `name` has no entry: "failed to load: <reason>", or "not registered"."""
        reason = self._failed.get(name)
        return f"failed to load: {reason}" if reason is not None else "not registered"

    def _note_failure(self, name: str, error: Exception) -> None:
        """Remember why repository model `name` (no entry) could not be registered, its own name cut from the
        message (ModelConfigFailed names it)."""
        reason = re.sub(rf"^model '{re.escape(name)}'(?: \(([^)]*)\))?: ", r"\1: ", str(error)).removeprefix(": ")
        with self._lock:
            if name not in self._entries:
                self._failed[name] = reason

    def entries(self) -> list[ModelEntry]:
        """Every served version of every model, by name, then version (lowest first)."""
        with self._lock:
            groups = [self._entries[name] for name in sorted(self._entries)]
        return [entry for group in groups for entry in group.entries()]

    def not_ready_models(self) -> list[str]:
        """The models that keep a strictly ready server (--strict-readiness true) from being ready, as Triton counts
        them: a version loading, reloading or unloading, a version whose load failed, and a repository model that
        could not be registered. A version that is simply not loaded (lazy, or unloaded) does not count. Takes the
        registry's lock and each model's lock briefly; never blocks on a load."""
        waiting = set()
        for entry in self.entries():
            state, last_error = entry.readiness()
            if state is not ModelState.READY and not (state is ModelState.UNLOADED and not last_error):
                waiting.add(entry.name)
        with self._lock:
            waiting.update(self._failed)
        return sorted(waiting)

    def statuses(self) -> list[ModelStatus]:
        return [entry.status() for entry in self.entries()]

    # ---- settings -------------------------------------------------------------------------------------------

    def _read_specs(self, registration: Registration, current: ModelEntry | None) -> tuple[ModelSpec, ...]:
        source = registration.source or (current.settings.source if current is not None else "")
        specs = self.repository.read_versions(
            registration.name, source=source, config_json=registration.config_json, backend=registration.backend
        )
        if registration.options:
            specs = tuple(_with_options(spec, registration.options) for spec in specs)
        return specs

    def _validated(
        self, registration: Registration, current: ModelEntry | None
    ) -> dict[int, tuple[ModelSpec, ModelSettings]]:
        """The spec and settings `registration` asks for, per served version, a missing source taken from
        `current`'s committed one. Raises ModelConfigError, UnsupportedSlotCount or InvalidRequest naming the
        problem."""
        source = registration.source or (current.settings.source if current is not None else "")
        validated = {}
        for spec in self._read_specs(registration, current):
            settings = self.settings_for(spec, registration)
            validated[int(spec.version)] = (spec, dataclasses.replace(settings, source=source))
        return validated

    def settings_for(self, spec: ModelSpec, registration: Registration) -> ModelSettings:
        """Slot count and admission timeout of a registration. Raises UnsupportedSlotCount or
        InvalidRequest naming the problem."""
        requested = registration.slots
        if requested is None and registration.config_json and spec.instance_count is not None:
            # A count in a request's config override is the request's; without the parallel runtime a count of 1 is
            # the one slot every model has (the ModelConfig answer, sent back as a load's config, says it).
            if self.policy.parallel_jobs is not None or spec.instance_count != 1:
                requested = spec.instance_count
        slots, explicit = self._slot_count(spec, requested)
        timeout = registration.admission_timeout
        batching = spec.batching
        if timeout is None and batching is not None and batching.default_timeout_us > 0:
            timeout = batching.default_timeout_us / 1e6  # dynamic_batching's default_queue_policy
        return ModelSettings(
            slots=slots,
            explicit_slots=explicit,
            admission_timeout=self.effective_timeout(timeout),
            source=registration.source,
            max_queue=batching.max_queue_size if batching and batching.max_queue_size else None,
        )

    def _slot_count(self, spec: ModelSpec, requested: int | None) -> tuple[int, bool]:
        if spec.backend == "ensemble":
            return ENSEMBLE_SLOTS, False
        jobs = self.policy.parallel_jobs
        if jobs is None:
            if requested is not None:
                raise UnsupportedSlotCount(
                    f"model '{spec.name}': an explicit slot count ({requested}) needs the parallel runtime; "
                    "start the server with --parallel-jobs N"
                )
            if spec.instance_count not in (None, 1):
                _LOG.warning(
                    "model '%s': instance_group count %s ignored: without --parallel-jobs every model has one slot",
                    spec.name,
                    spec.instance_count,
                )
            return 1, False
        count = requested if requested is not None else spec.instance_count
        if count is None:
            return jobs, False
        if not 1 <= count <= MAX_SLOTS:
            raise UnsupportedSlotCount(f"model '{spec.name}': slot count must be 1..{MAX_SLOTS}, got {count}")
        return count, True

    def effective_timeout(self, requested: float | None) -> float:
        """The model's admission timeout: its own value capped by the server ceiling (0 = unbounded)."""
        ceiling = self.policy.admission_timeout
        if requested is None:
            return ceiling
        if not 0 <= requested < math.inf:  # NaN fails this too: min(nan, ceiling) would be NaN, no limit at all
            raise InvalidRequest(f"admission timeout must be a finite number of seconds >= 0, got {requested}")
        if ceiling > 0:
            return ceiling if requested == 0 else min(requested, ceiling)
        return requested

    def manager_deadline(self, entry: ModelEntry) -> float | None:
        timeout = entry.settings.admission_timeout
        return self.runtime.clock() + timeout if timeout > 0 else None

    # ---- register / reconfigure -----------------------------------------------------------------------------

    def register(
        self, registration: Registration, *, load: bool = True, cancel: CancelToken | None = None
    ) -> ModelStatus:
        """Register a new id or reconfigure an existing one, then load it (unless `load` is False for a new id).
        Returns the highest served version's status.

        Validation (files, configuration, slot count against the mode) happens before anything is published or
        changed, for every version the policy serves. A new id publishes one stable entry per version, each
        holding an exclusive lease, then loads them one by one; if a load fails that version stays registered
        and unloaded, the others are still loaded, and the first error is raised. An existing id reconfigures
        the versions it keeps, each after an exclusive lease in its own FIFO queue (bounded by its admission
        timeout; see ModelEntry.reconfigure_leased), adds and loads the versions the policy now selects, and
        retires those it no longer does (`_retire`). Raises ModelConfigError, UnsupportedSlotCount,
        InvalidRequest, ServerBusy, or a load's error.
        """
        check_model_name(registration.name)
        current = self._entries.get(registration.name)
        validated = self._validated(registration, current.highest() if current is not None else None)  # fails fast
        # Each operation answers with the status its own lease produced, taken before the lease is released: a
        # manager queued behind it may change the model the moment it is.
        if current is None:
            added, current = self._add_versions(registration.name, validated)
            if not added:  # a registration of the same name published it first: reconfigure it as ours
                return self._reconfigure(registration, current, validated, cancel)
            for entry, _claimed in added:
                spec, settings = validated[int(entry.spec.version)]
                self.runtime.events.emit(
                    _LOG, "registered", entry.name, backend=spec.backend, slots=settings.slots, source=settings.source
                )
            return self._load_claimed(added, load=load)
        return self._reconfigure(registration, current, validated, cancel)

    def _load_claimed(self, claimed: list[tuple[ModelEntry, ExclusiveLease]], *, load: bool) -> ModelStatus:
        """Load (when `load`) each newly published version under its first lease, highest first; every lease is
        released. Returns the highest one's status; raises the first load error once all were tried."""
        statuses: dict[int, ModelStatus] = {}
        failure: BaseException | None = None
        try:
            for entry, lease in sorted(claimed, key=lambda pair: -int(pair[0].spec.version)):
                with lease:
                    if load:
                        try:
                            entry.load_leased()
                        except Exception as error:  # the other versions still load
                            failure = failure or version_load_failed(entry.name, entry.spec.version, error)
                    statuses[int(entry.spec.version)] = entry.status()
        finally:  # leases not reached (an interrupted load) are released too: idempotent
            for _entry, lease in claimed:
                lease.release()
        if failure is not None:
            raise failure
        return statuses[max(statuses)]

    def _reconfigure(
        self,
        registration: Registration,
        group: ModelVersions,
        validated: dict[int, tuple[ModelSpec, ModelSettings]],
        cancel: CancelToken | None,
    ) -> ModelStatus:
        """An existing id: the kept versions reconfigured in place (each under its own exclusive lease, highest
        first), then the new versions added and loaded, then the dropped ones retired. A kept version's pool
        stays published throughout (an unchanged configuration keeps its engine), so it serves through the
        reload."""
        statuses: dict[int, ModelStatus] = {}
        for version in sorted(set(group.by_version) & set(validated), reverse=True):
            entry = group.by_version[version]
            try:
                if registration.resize_in_service and entry.resize_in_service(
                    *validated[version], self.manager_deadline(entry), cancel
                ):
                    statuses[version] = entry.status()
                    continue
                with entry.exclusive(self.manager_deadline(entry), cancel):
                    if entry.retired:
                        continue  # a concurrent reload dropped it: added again below
                    spec, settings = validated[version]
                    if not registration.source:
                        # "Keep the current source" means the one committed now: a manager ahead of this one in the
                        # queue may have changed it since the early validation read it.
                        spec, settings = self._validated(registration, entry).get(version, (spec, settings))
                    entry.reconfigure_leased(spec, settings)  # emits reconfigured or reconfigure_refused
                    statuses[version] = entry.status()
            except Exception as error:
                failed = version_load_failed(entry.name, entry.spec.version, error)
                if failed is error:
                    raise
                raise failed from error.__cause__
        added, group = self._add_versions(registration.name, validated)
        if added:
            statuses[max(int(e.spec.version) for e, _ in added)] = self._load_claimed(added, load=True)
        self._retire([entry for version, entry in group.by_version.items() if version not in validated])
        if not statuses:  # every kept version was retired by a concurrent reload, and none was added
            return group.highest().status()
        return statuses[max(statuses)]

    def _add_versions(
        self, name: str, validated: dict[int, tuple[ModelSpec, ModelSettings]]
    ) -> tuple[list[tuple[ModelEntry, ExclusiveLease]], ModelVersions]:
        """Publish an entry, already holding its first exclusive lease, for each version of `validated` that
        `name` does not serve yet (so requests and managers for it queue behind its load). Returns those and
        the group now published."""
        with self._lock:
            group = self._entries.get(name)
            by_version = dict(group.by_version) if group is not None else {}
            added = []
            for version, (spec, settings) in validated.items():
                if version in by_version and not by_version[version].retired:
                    continue
                entry = ModelEntry(spec, settings, self.runtime)
                if self._stopped_for_good:
                    entry.stop_loads_for_good(self._stopped_for_good)
                added.append((entry, entry.claim_new()))  # registry lock -> model lock: the stated order
                by_version[version] = entry
            group = ModelVersions(name, by_version)
            self._entries[name] = group
            self._failed.pop(name, None)  # its configuration is good now
            return added, group

    def _retire(self, dropped: list[ModelEntry]) -> None:
        """Take the versions a reload dropped out of their group at once (no new request finds them), then
        unload each for good under its exclusive lease, after the work admitted before it drains; a request
        that found the entry earlier and queues behind the retirement is refused with ModelNotFound naming the
        version. Not cancellable, and not bounded by the admission timeout: a dropped version left loaded
        would hold its engine with nothing listing it."""
        if not dropped:
            return
        with self._lock:
            group = self._entries[dropped[0].name]
            kept = {v: e for v, e in group.by_version.items() if all(e is not d for d in dropped)}
            self._entries[group.name] = ModelVersions(group.name, kept)
        for entry in dropped:
            with entry.exclusive(None):
                entry.retire_leased()

    def load(self, name: str, *, config_json: str = "", cancel: CancelToken | None = None) -> ModelStatus:
        """Triton's RepositoryModelLoad: (re)read the model from the repository, with an optional JSON config
        override, and load it through the same path as register. A repository model that has no entry and
        still fails keeps failing with the new reason."""
        try:
            registration = Registration(name=name, config_json=config_json, resize_in_service=True)
            status = self.register(registration, cancel=cancel)
        except (ModelConfigError, InvalidRequest) as error:
            if name not in self._entries and name in self.repository.names():
                self._note_failure(name, error)
            raise
        self.reload_ensembles_of(name, cancel)
        return status

    # ---- unload ---------------------------------------------------------------------------------------------

    def unload(self, name: str, cancel: CancelToken | None = None, *, reason: str = "") -> ModelStatus:
        """Unload every version of one model, highest first, each after its earlier leases drain (bounded by its
        admission timeout); `reason`, when given, is what it is listed with then (default "unloaded").
        Idempotent. Returns the highest version's status. Raises ModelNotFound or ServerBusy (the versions
        unloaded before it stay unloaded)."""
        statuses = []
        entries = list(reversed(self.versions(name).entries()))
        # A load in progress (a python model's hung initialize) is stopped, not waited for; each version's loads
        # stay stopped until its lease is granted (nothing loads under the lease).
        resumes = [entry.stop_loads(UNLOADED_WHILE_LOADING) for entry in entries]
        try:
            for entry, resume in zip(entries, resumes, strict=True):
                lease = entry.exclusive(self.manager_deadline(entry), cancel)
                resume()
                with lease:
                    entry.unload_leased(last_error=reason)
                    statuses.append(entry.status())
        finally:
            for resume in resumes:
                resume()
        self.unload_ensembles_of(name, cancel)
        return statuses[0]

    def _ensembles_of(self, step: str) -> list[ModelEntry]:
        """The registered ensembles that have a step running model `step`."""
        return [
            entry
            for entry in self.entries()
            if entry.spec.backend == "ensemble"
            and entry.spec.config is not None
            and step in _step_models(entry.spec.config)
        ]

    def unload_ensembles_of(
        self, step: str, cancel: CancelToken | None, reason_for: Callable[[ModelEntry], str] | None = None
    ) -> None:
        """Triton's rule: an ensemble whose step model was unloaded is unloaded too (after its running requests),
        and remembered, so that loading the step model loads it again. `reason_for(ensemble)`: what it is listed
        with then (service/request_path/ensemble.py names a failed step); None: "unloaded". A failure is logged, never
        raised."""
        for ensemble in self._ensembles_of(step):
            if not ensemble.status().loaded:
                continue
            with self._lock:
                self._unloaded_with_step.setdefault(step, set()).add(ensemble.name)
            try:
                self.unload(ensemble.name, cancel, reason=reason_for(ensemble) if reason_for is not None else "")
            except Exception as error:  # the step's unload succeeded; the ensemble's requests name the step
                _LOG.warning("ensemble '%s' not unloaded with its step '%s': %s", ensemble.name, step, error)

    def reload_ensembles_of(self, step: str, cancel: CancelToken | None) -> None:
        """Load again the ensembles unloaded with step model `step`, and those of its ensembles whose own load
        failed (a step model that had failed refuses it). A failure is logged, never raised."""
        with self._lock:  # a copy: a concurrent call (the load's own event) must find the names too
            names = set(self._unloaded_with_step.get(step, ()))
        names |= {e.name for e in self._ensembles_of(step) if not e.status().loaded and e.status().last_error}
        for name in sorted(names):
            try:
                self.load_registered(name, cancel)
            except Exception as error:  # the step loaded; the ensemble stays listed with its reason
                _LOG.warning("ensemble '%s' not loaded again with its step '%s': %s", name, step, error)
                continue
            with self._lock:
                self._unloaded_with_step.get(step, set()).discard(name)

    def load_registered(self, name: str, cancel: CancelToken | None) -> None:
        """Load, as committed, each version of `name` that is not loaded, under its exclusive lease (bounded by
        its admission timeout). Two callers doing this at once (the step watcher beside a RepositoryModelLoad of
        the step) load it once: the second waits for the lease and finds it loaded. Re-registering it instead
        reconfigured the loaded ensemble (RECONFIGURING: not ready) just after the client's load had answered.
        Raises the lease's or the load's error."""
        for entry in reversed(self.versions(name).entries()):
            if entry.status().loaded:
                continue
            with entry.exclusive(self.manager_deadline(entry), cancel):
                entry.load_leased()

    def unload_many(
        self, names: Iterable[str] = (), *, all_models: bool = False, cancel: CancelToken | None = None
    ) -> tuple[list[str], list[str]]:
        """Bulk unload. Returns (unloaded ids, each once, in selection order; unknown ids).

        Takes a snapshot of the selection, publishes an exclusive barrier on every selected model in one short
        step, then unloads models as their barriers are granted: idle ones first, busy ones once their earlier
        work drains. Waits without limit (bulk ignores admission timeouts). If `cancel` fires, barriers not yet
        granted are withdrawn and granted ones released; models already unloaded stay unloaded. Raises
        RequestCancelled then, and ShuttingDown when shutdown refused a barrier still queued.
        """
        selected, not_found = self._select(names, all_models)
        # As unload: loads in progress are stopped until each barrier is granted.
        resumes = {entry: entry.stop_loads(UNLOADED_WHILE_LOADING) for entry in selected}
        try:
            return self._unload_selected(selected, not_found, cancel, resumes)
        finally:
            for resume in resumes.values():
                resume()

    def _unload_selected(
        self,
        selected: list[ModelEntry],
        not_found: list[str],
        cancel: CancelToken | None,
        resumes: Mapping[ModelEntry, Callable[[], None]],
    ) -> tuple[list[str], list[str]]:
        """unload_many's work once the selection is made (its docstring says how)."""
        reports: queue.SimpleQueue[Barrier[ModelEntry] | None] = queue.SimpleQueue()
        pending: dict[Barrier[ModelEntry], None] = {}  # insertion-ordered
        with self._bulk_lock:
            for entry in selected:
                barrier = entry.post_barrier(on_change=reports.put)
                if barrier.decided:
                    # Decided on arrival (granted, or refused by a closed queue): no later change will report
                    # it, so report it now.
                    reports.put(barrier)
                pending[barrier] = None
        if cancel is not None:
            cancel.add_callback(lambda: reports.put(None))
        unloaded: set[str] = set()
        try:
            while pending:
                reported = reports.get()
                if reported is None:
                    raise RequestCancelled("the bulk unload was cancelled")
                pending.pop(reported, None)
                if reported.refused:
                    # The queue closed under the barrier (shutdown): this bulk did not complete.
                    raise reported.refusal()
                if reported.granted:
                    resumes[reported.entry]()
                    with reported:
                        reported.entry.unload_leased()
                    unloaded.add(reported.entry.name)
        finally:
            for barrier in pending:
                barrier.withdraw()
        return list(dict.fromkeys(entry.name for entry in selected if entry.name in unloaded)), not_found

    def _select(self, names: Iterable[str], all_models: bool) -> tuple[list[ModelEntry], list[str]]:
        with self._lock:
            if all_models:
                return [e for name in sorted(self._entries) for e in self._entries[name].entries()], []
            selected, not_found, seen = [], [], set()
            for name in names:
                if name in seen:
                    continue
                seen.add(name)
                group = self._entries.get(name)
                if group is None:
                    not_found.append(name)
                else:
                    selected.extend(group.entries())
            return selected, not_found

    def stop_loads(self, reason: str) -> None:
        """At shutdown: stop every load in progress (a python model's hung initialize is killed) and make every
        later one fail at once, models registered from now on included. Never blocks."""
        with self._lock:
            self._stopped_for_good = reason
        for entry in self.entries():
            entry.stop_loads_for_good(reason)

    def close_idle_models(self) -> tuple[list[str], list[str]]:
        """At shutdown: unload every loaded model nobody holds (try-acquire; never waits). Returns (closed,
        still held). A model held by a hung call is left as it is."""
        closed, held = [], []
        for entry in self.entries():
            if entry.status().loaded:
                if entry.retire_if_idle("closed_at_shutdown"):
                    closed.append(entry.name)
                else:
                    held.append(entry.name)
        return closed, held

    # ---- repository -----------------------------------------------------------------------------------------

    def register_repository(self, *, load: bool) -> None:
        """Register every model directory of the repository (and load each when `load`). A model that fails
        is logged and stays registered unloaded; one whose configuration cannot be read or is refused is
        remembered as failed with its reason (`get` raises ModelConfigFailed)."""
        for name in self.repository.load_order(self.repository.names()):  # an ensemble after its steps
            try:
                self.register(Registration(name=name), load=load)
            except Exception as error:  # one broken model must not stop the others
                self.runtime.events.emit(_LOG, "not_loaded_at_startup", name, error=str(error))
                self._note_failure(name, error)


# What a load stopped by an unload is told (its model's last error; the requests waiting for it get it too).
UNLOADED_WHILE_LOADING = "the model was unloaded while it loaded"


def _step_models(config: Any) -> set[str]:
    """The models an ensemble's steps name (`config` is its ModelConfig message: the core imports no protobuf)."""
    return {step.model_name for step in config.ensemble_scheduling.step}


def _with_options(spec: ModelSpec, options: Mapping[str, str]) -> ModelSpec:
    """`spec` with backend options laid over its config parameters (the ModelConfig message too)."""
    parameters = dict(spec.parameters)
    parameters.update(options)
    config: Any = spec.config  # the ModelConfig message; engine.interface types it object (no protobuf in the core)
    if config is not None:
        config = type(config)()
        config.CopyFrom(spec.config)
        for key, value in options.items():
            config.parameters[key].string_value = value
    return dataclasses.replace(spec, parameters=parameters, config=config)


__all__ = ["ModelRegistry", "ModelVersions", "Registration", "RegistryPolicy", "MAX_SLOTS", "ModelConfigError"]


def version_load_failed(name: str, version: str, error: Exception) -> Exception:
    """A version's failed load (its engine's error) in Triton's words, which its clients and QA tests read: "load
    failed for model 'x': version N is at UNAVAILABLE state: <why>", as a copy of `error` (its class, so its
    reason and status code, are kept). A refusal of the server's own (busy, cancelled, residency, memory) is
    returned as it is."""
    if not isinstance(error, EngineError) or isinstance(error, ExecutionCancelled):
        return error
    failed = own_copy(error)
    failed.args = (f"{VERSION_LOAD_FAILED.format(name=name, version=version)}{error}",)
    return failed  # type: ignore[return-value]  # own_copy keeps the class


VERSION_LOAD_FAILED = "load failed for model '{name}': version {version} is at UNAVAILABLE state: "
