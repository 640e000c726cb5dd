"""Ensembles (config.pbtxt `platform: "ensemble"`): a model whose engine runs other models as a data flow.

The ensemble is an ordinary registered model (its entry, state, statistics, admission) whose backend is
`EnsembleBackend`. Its graph is read and checked when its configuration is read (engine/ensemble_graph.py
`read_steps`) and checked again when it loads, by every path (startup, RepositoryModelLoad, RegisterModel, poll
mode, a load with files): first the ensembles' call graph (`call_graph_refusal`: no cycle through ensembles, no
chain of ensembles deeper than MAX_NESTING), then against its step models (`check_against_models`: every step
model registered and not failed, not decoupled, the maps' tensors known to the models, datatypes and shapes
agreeing, Triton's max_batch_size rules).

A step runs as an internal call (service/internal_calls.py): through its own model's admission (FIFO, slots,
batching, residency, statistics), with a child of the ensemble request's CancelToken (a failed step cancels the
others; a StepToken, which also names the ensembles the call is inside). A step starts as soon as every tensor it
reads exists, on the request's own thread or, when several are ready at once, on one of the ensemble's helper
threads (StepHelpers: at most STEP_HELPERS per loaded ensemble, shared by its requests, started on demand and
stopped with the model), so an ensemble request takes at most its own thread plus the shared helpers, whatever
its width. A linear chain starts no thread. Once the request ends (its deadline, the client's cancel, a failed
step), no step that has not started starts; running ones get the cancellation. Tensors pass between steps as the
same numpy arrays (no copy).

Slots: Triton has no instances for an ensemble. Its slots here are contexts that hold nothing, ENSEMBLE_SLOTS of
them whatever --parallel-jobs or instance_group say, so the ensemble's own admission does not throttle below
that; its steps' admissions do the throttling.

Errors: a failing step's error keeps its class (so its status code) and its message is prefixed with the ensemble
and the step (`ensemble 'e': step 1 (model 'm'): ...`). A step model that is not registered when a request arrives
makes the request fail with UNAVAILABLE (model_not_loaded) naming the step; one unloaded fails (or loads) in its
own call, its error named for the step.

Step models' lives (StepWatcher): a step model that failed (its load, or its device) unloads the ensembles with
a step on it, listed with the reason naming the step, and a load of such an ensemble is refused while the step
stays failed; the step's next load loads them again. An evicted or idle-retired step model is not failed: the
ensemble stays loaded and the step's next call loads it.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from engine.ensemble_graph import (
    CYCLE_REFUSAL,
    MAX_NESTING,
    Step,
    StepModel,
    call_graph_refusal,
    check_against_models,
    read_steps,
    step_models,
)
from engine.errors import DeviceFailedError, ExecutionError, ModelConfigError, ModelError, ModelLoadError
from engine.interface import Backend, CancelToken, Context, LoadedModel, ModelMetadata, ModelSpec, Outputs
from engine.repository import hide_paths

from .core.errors import ModelConfigFailed, ModelNotFound, ModelNotLoadedYet, RequestCancelled, own_copy
from .core.lifecycle import ModelEntry, ModelState
from .core.registry import ENSEMBLE_SLOTS, ModelRegistry
from .dataplane import Dataplane
from .internal_calls import call_model

_LOG = logging.getLogger(__name__)


class EnsembleBackend(Backend):
    """Loads ensembles. Needs the server's dataplane (`bind`), which is built after the backends."""

    name = "ensemble"

    def __init__(self) -> None:
        self._dataplane: Dataplane | None = None

    def bind(self, dataplane: Dataplane) -> None:
        """Give the backend the server's dataplane, and keep the registered ensembles in step with the failures
        and loads of their step models from now on (StepWatcher)."""
        self._dataplane = dataplane
        registry = dataplane.registry
        registry.runtime.events.subscribe(StepWatcher(registry).note)

    def load(self, spec: ModelSpec) -> LoadedModel:
        """Check the ensembles' call graph from this one (no cycle through ensembles, no chain deeper than
        MAX_NESTING: engine/ensemble_graph.py call_graph_refusal), then its graph against its step models as
        registered now. Raises ModelConfigError naming the cycle, or the step and the problem (ModelLoadError for
        a step model that failed). Does not load the step models (each loads on its first call, as usual)."""
        if self._dataplane is None:
            raise ModelConfigError(f"model '{spec.name}': ensembles need a server (EnsembleBackend.bind)")
        origin = f"ensemble '{spec.name}'"
        steps = read_steps(spec.config, origin)
        dataplane = self._dataplane
        refusal = call_graph_refusal(spec.name, _called_models(dataplane.registry, spec.name, steps))
        if refusal is not None:
            raise ModelConfigError(refusal)
        check_against_models(
            origin,
            spec.max_batch_size,
            spec.inputs,
            spec.outputs,
            steps,
            lambda step: _step_model(dataplane, step, origin),
        )
        metadata = ModelMetadata(spec.inputs, spec.outputs, spec.max_batch_size, platform="ensemble")
        return EnsembleModel(spec.name, metadata, steps, dataplane)


def _called_models(registry: ModelRegistry, name: str, steps: Sequence[Step]) -> Callable[[str], tuple[str, ...]]:
    """The models an ensemble's steps name, as call_graph_refusal asks for them when ensemble `name` loads: `name`'s
    own from `steps` (the configuration being loaded, which may change them); a registered model's from its
    registered configuration (every version); a model not registered from its folder in the repository (startup
    registers one model after the other, so the ensemble a loading ensemble calls may not be registered yet: its
    cycle is still named, not "not registered"); nothing for a model that is not an ensemble, or whose
    configuration was refused (it loads nothing, so it calls nothing)."""
    own = tuple(step.model for step in steps)

    def called(model: str) -> tuple[str, ...]:
        if model == name:
            return own
        try:
            group = registry.versions(model)
        except ModelConfigFailed:
            return ()
        except ModelNotFound:
            return _repository_steps(registry, model)
        return tuple(
            dict.fromkeys(
                called_model
                for entry in group.entries()
                if entry.spec.backend == "ensemble" and entry.spec.config is not None
                for called_model in step_models(entry.spec.config)
            )
        )

    return called


def _repository_steps(registry: ModelRegistry, model: str) -> tuple[str, ...]:
    """The models named by the steps of repository model `model`, if it is an ensemble not registered yet."""
    try:
        if model not in registry.repository.names():
            return ()
        spec = registry.repository.read(model)
    except Exception:  # noqa: BLE001 (a configuration that cannot be read is refused when it registers)
        return ()
    return step_models(spec.config) if spec.backend == "ensemble" and spec.config is not None else ()


def _step_model(dataplane: Dataplane, step: Step, origin: str) -> StepModel:
    """A step's model as the load check sees it: its declared tensors, else those it published when it last
    loaded. Raises ModelConfigError when it is not registered, ModelLoadError when it failed (its last load
    failed, or its device did, and nothing loaded it since: unloaded with an error)."""
    try:
        entry = dataplane.registry.get(step.model)
    except ModelNotFound:
        raise ModelConfigError(f"{origin}: {step.label} names a model that is not registered") from None
    view = entry.view()
    if view.status.state is ModelState.UNLOADED and view.status.last_error:
        raise ModelLoadError(failed_step_reason(origin, step, view.status.last_error))  # not the config's fault
    spec = view.spec
    inputs, outputs, batch = spec.inputs, spec.outputs, spec.max_batch_size
    if not inputs and not outputs and view.metadata is not None:
        inputs, outputs, batch = view.metadata.inputs, view.metadata.outputs, view.metadata.max_batch_size
    policy = getattr(spec.config, "model_transaction_policy", None)  # spec.config: the parsed ModelConfig, or None
    decoupled = bool(policy is not None and policy.decoupled)
    return StepModel(batch, tuple(inputs), tuple(outputs), decoupled, spec.version)


def failed_step_reason(origin: str, step: Step, error: str) -> str:
    """What an ensemble whose step model failed is listed with, and what a load of it is refused with."""
    return f"{origin}: {step.label} failed: {error}"


# The events of a step model that change what its ensembles can do (service/core/events.py).
_FAILED = ("load_failed", "device_failed")
_LOADED = "loaded"


class StepWatcher:
    """Keeps the ensembles in step with their step models (subscribed to the lifecycle events by
    EnsembleBackend.bind):

    * a step model failed (its load failed, or its device under a request): every loaded ensemble with a step on
      it is unloaded, after its running requests, and listed UNAVAILABLE with the reason naming the step;
    * a step model loaded (by any path: a request, RepositoryModelLoad, a rebuild after a device failure): the
      ensembles unloaded with it, or whose own load failed, are loaded again.

    An eviction or an idle retirement of a step model changes nothing: its next call (an ensemble's step) loads
    it again, as any call would. The work runs on one thread, in the order the events came, started when an event
    arrives and ended when none is left (the emitting thread may hold the step's lease, or be an ensemble's own
    request, which an unload of that ensemble waits for). Each event's work is logged on failure, never raised."""

    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry
        self._lock = threading.Lock()  # guards: _events, _working
        self._events: collections.deque[tuple[str, str, str]] = collections.deque()
        self._working = False

    def note(self, event: str, model: str, fields: Mapping[str, object]) -> None:
        """Events.subscribe's listener: queue a step model's failure or load; never blocks."""
        if event not in _FAILED and event != _LOADED:
            return
        with self._lock:
            self._events.append((event, model, str(fields.get("error", ""))))
            if self._working:
                return
            self._working = True
        threading.Thread(target=self._work, name="ensemble-step-watcher", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._events:
                    self._working = False
                    return
                event, model, error = self._events.popleft()
            try:
                self._apply(event, model, error)
            except Exception:  # noqa: BLE001 (the watcher must outlive one event's failure)
                _LOG.exception("ensembles of model '%s' not updated after %s", model, event)

    def _apply(self, event: str, model: str, error: str) -> None:
        registry = self._registry
        if event == _LOADED:
            registry.reload_ensembles_of(model, None)
            return
        try:
            roots = registry.get(model).spec.roots
        except (ModelNotFound, ModelConfigFailed):
            roots = None
        hidden = hide_paths(error, roots) or event

        def reason(ensemble: ModelEntry) -> str:
            origin = f"ensemble '{ensemble.name}'"
            steps = [s for s in read_steps(ensemble.spec.config, origin) if s.model == model]
            return failed_step_reason(origin, steps[0], hidden)

        registry.unload_ensembles_of(model, None, reason)


class EnsembleModel(LoadedModel):
    """A loaded ensemble: its checked steps, and the helper threads its requests share (StepHelpers, closed with
    the model)."""

    max_parallel_slots = ENSEMBLE_SLOTS

    def __init__(self, name: str, metadata: ModelMetadata, steps: Sequence[Step], dataplane: Dataplane) -> None:
        self.name = name
        self.metadata = metadata
        self.steps = tuple(steps)
        self.dataplane = dataplane
        readers: dict[str, list[Step]] = {}
        for step in self.steps:
            for tensor in dict.fromkeys(step.inputs.values()):
                readers.setdefault(tensor, []).append(step)
        self.readers: Mapping[str, Sequence[Step]] = readers  # ensemble tensor -> the steps that read it
        self.helpers = StepHelpers(name, min(STEP_HELPERS, len(self.steps) - 1))

    def create_context(self) -> Context:
        return EnsembleContext(self)

    def close(self) -> None:
        """Stop the helper threads (an unloaded ensemble has no request left: each helper is idle, and ends)."""
        self.helpers.close()


class EnsembleContext(Context):
    def __init__(self, model: EnsembleModel) -> None:
        self.model = model

    def execute(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], cancel: CancelToken) -> Outputs:
        """Run every step as its inputs appear; return the ensemble's outputs (`outputs`, or all). Blocks until
        every step that started has ended; steps not started when the request ends (cancelled, its deadline passed,
        a step failed) never start. Raises the first failing step's error, renamed for the step (the other running
        steps are cancelled first), RequestCancelled when the request ended with no step failing, ModelConfigError
        when the request is inside a call of this same ensemble (a cycle made by reloads racing each other: the
        load check refuses any other) or nested too deep."""
        model = self.model
        callers = cancel.ensembles if isinstance(cancel, StepToken) else ()
        _check_callers(model.name, callers)
        self._check_steps_available()
        run = _Run(model, dict(inputs), cancel, (*callers, model.name))
        run.go()
        wanted = outputs or [spec.name for spec in model.metadata.outputs]
        return {name: run.tensors[name] for name in wanted}

    def _check_steps_available(self) -> None:
        """Refuse a request while a step model is not registered (UNAVAILABLE, naming the step). A step model that
        is registered but unloaded or failed is left to its own call: it loads there as any request would load it,
        or fails naming its reason (prefixed with the step)."""
        model = self.model
        for step in model.steps:
            try:
                model.dataplane.registry.get(step.model)
            except ModelNotFound:
                raise ModelNotLoadedYet(
                    f"ensemble '{model.name}' is unavailable: {step.label} is not registered"
                ) from None


def _check_callers(name: str, callers: Sequence[str]) -> None:
    """Refuse a run of ensemble `name` inside a call of itself, or nested deeper than MAX_NESTING (`callers`: the
    ensembles whose steps called it, outermost first). The load check refuses both; this stops a cycle that two
    reloads made at once (each checked against the other's old steps) before it recurses."""
    if name in callers:
        cycle = " -> ".join([*callers[callers.index(name) :], name])
        raise ModelConfigError(f"{CYCLE_REFUSAL}: ensemble '{name}' calls itself through {cycle}")
    if len(callers) >= MAX_NESTING:
        raise ModelConfigError(
            f"ensemble '{callers[0]}' nests more than {MAX_NESTING} ensembles deep; at most {MAX_NESTING} "
            "ensembles may call each other in a chain"
        )


class StepToken(CancelToken):
    """The token an ensemble request's steps carry: cancelled with the request (or by a failing step), and naming
    the ensembles the call is inside (outermost first), so that a step that is an ensemble knows its callers."""

    __slots__ = ("ensembles",)

    def __init__(self, ensembles: tuple[str, ...]) -> None:
        super().__init__()
        self.ensembles = ensembles


# Helper threads per loaded ensemble: an ensemble request runs its steps on its own thread and, when several are
# ready at once, on at most this many helpers, which the ensemble's requests share. Bounds the threads an ensemble
# can start whatever its width and however many requests it serves (docs/ensembles.md).
STEP_HELPERS = 8
HELPER_IDLE_SECONDS = 10.0  # a helper with nothing to do for this long ends (one starts again when needed)


class StepHelpers:
    """The helper threads of one loaded ensemble: at most `limit`, started when a request has more ready steps than
    it runs on its own thread, each ending after HELPER_IDLE_SECONDS without work, and all at `close` (when the
    ensemble unloads). A request asks with `want(run)`; a helper takes the request that asked first and runs its
    ready steps (_Run.help). No request ever waits for a helper: its own thread runs whatever ready step no helper
    took, so a busy or closed pool only makes steps run one after the other, never stops them; nor does an
    ensemble's step that is an ensemble itself wait for the outer one's helpers (it has its own)."""

    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = max(0, limit)
        self._changed = threading.Condition()  # guards: _asking, _queued, _threads, _idle, _closed
        self._asking: collections.deque[_Run] = collections.deque()
        self._queued: set[_Run] = set()  # the runs in _asking
        self._threads = 0  # helpers alive
        self._idle = 0  # helpers waiting for work that no `want` has woken yet
        self._closed = False

    def want(self, run: _Run) -> None:
        """Ask for a helper to take `run`'s ready steps: wakes an idle one, else starts one under the limit, else
        the run waits its turn in the queue (its own thread goes on meanwhile). Never blocks; a run already asking
        is not queued twice."""
        with self._changed:
            if self._closed or self.limit == 0 or run in self._queued:
                return
            self._queued.add(run)
            self._asking.append(run)
            start = False
            if self._idle > 0:
                self._idle -= 1  # that helper is busy from now: the next `want` must not count it
                self._changed.notify()
            elif self._threads < self.limit:
                self._threads += 1
                start = True
        if start:
            # daemon: a step hung in its backend must not keep the process from exiting (shutdown abandons it)
            threading.Thread(target=self._serve, name=f"ensemble-{self.name}-helper", daemon=True).start()

    def close(self) -> None:
        """No helper takes work from now on; the idle ones end at once, a busy one after its step. Never blocks."""
        with self._changed:
            self._closed = True
            self._asking.clear()
            self._queued.clear()
            self._idle = 0
            self._changed.notify_all()

    def _serve(self) -> None:
        while True:
            run = self._next()
            if run is None:
                return
            try:
                run.help()
            except Exception:  # noqa: BLE001 (help never raises; a helper must outlive a bug in one run)
                _LOG.exception("ensemble '%s': a helper thread failed", self.name)

    def _next(self) -> _Run | None:
        """The next run that asked, or None when this helper ends (closed, or idle for HELPER_IDLE_SECONDS)."""
        with self._changed:
            while not self._asking:
                if self._closed:
                    self._threads -= 1
                    return None
                self._idle += 1
                if not self._changed.wait(HELPER_IDLE_SECONDS):  # timed out: nobody counted this helper busy
                    self._idle -= 1
                    if not self._asking:
                        self._threads -= 1
                        return None
            run = self._asking.popleft()
            self._queued.discard(run)
            return run


class _Run:
    """One ensemble request's data flow. Its own thread (the coordinator, in `go`) takes ready steps and runs them,
    and waits for the steps helpers took when none is ready; a thread that ends a step stores its outputs, makes the
    steps reading them ready, and goes on with the next ready step itself. Steps are taken in the order they became
    ready (the config's order among those ready together). Once the request is cancelled or a step failed, no step
    is taken."""

    def __init__(
        self, model: EnsembleModel, tensors: dict[str, np.ndarray], cancel: CancelToken, ensembles: tuple[str, ...]
    ) -> None:
        self.model = model
        self.tensors = tensors  # ensemble tensor -> array; written only under _changed
        self.cancel = StepToken(ensembles)  # the steps' token: fired by the request's, or by a failed step
        self._parent = cancel
        self._changed = threading.Condition()  # guards: tensors, _missing, _ready, _untaken, _running, _failure
        self._missing = {
            step.index: sum(1 for t in dict.fromkeys(step.inputs.values()) if t not in tensors) for step in model.steps
        }
        self._ready = collections.deque(step for step in model.steps if not self._missing[step.index])
        self._untaken = len(model.steps)
        self._running = 0
        self._failure: tuple[Step, BaseException] | None = None

    def go(self) -> None:
        """Run the data flow on the calling thread (with help). Returns when every step ended; raises as
        EnsembleContext.execute says."""
        relay = self._relay
        self._parent.add_callback(relay)
        try:
            self._coordinate()
        finally:
            self._parent.remove_callback(relay)

    def _relay(self) -> None:
        self.cancel.cancel(self._parent.reason or "cancelled")

    def _coordinate(self) -> None:
        while True:
            with self._changed:
                taken = self._take_locked()
                while taken is None:
                    if not self._running:
                        self._finish_locked()
                        return
                    self._changed.wait()  # a running step ends (every end notifies): bounded by that step
                    taken = self._take_locked()
                more = bool(self._ready)
            self._work(*taken, more)

    def help(self) -> None:
        """A helper's turn (StepHelpers): run ready steps of this request until none is left for it. Never
        raises."""
        with self._changed:
            taken = self._take_locked()
            more = bool(self._ready)
        if taken is not None:
            self._work(*taken, more)

    def _take_locked(self) -> tuple[Step, dict[str, np.ndarray]] | None:
        """The next ready step and its inputs, counted running; None when none is ready, a step failed or the
        request was cancelled."""
        if self._failure is not None or self.cancel.cancelled or not self._ready:
            return None
        step = self._ready.popleft()
        self._untaken -= 1
        self._running += 1
        return step, {model_input: self.tensors[tensor] for model_input, tensor in step.inputs.items()}

    def _work(self, step: Step, inputs: dict[str, np.ndarray], more: bool) -> None:
        """Run `step`, then every ready step this thread can take next; ask for a helper whenever more steps are
        ready than the one this thread takes (`more`). Never raises."""
        taken: tuple[Step, dict[str, np.ndarray]] | None = (step, inputs)
        while taken is not None:
            if more:
                self.model.helpers.want(self)  # outside this run's lock: it may start a thread
            step, inputs = taken
            produced, failure = self._call(step, inputs)
            with self._changed:
                self._running -= 1
                if failure is not None:
                    if self._failure is None:
                        self._failure = (step, failure)
                else:
                    self._store_locked(produced)
                self._changed.notify_all()
                taken = self._take_locked()
                more = bool(self._ready)
            if failure is not None:
                self.cancel.cancel(f"{step.label} failed")

    def _call(self, step: Step, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], BaseException | None]:
        """One step through its model's admission: (the ensemble tensors it produced, None) or ({}, its error)."""
        try:
            results = call_model(
                self.model.dataplane,
                step.model,
                inputs,
                version=step.version_string,
                outputs=list(step.outputs),
                cancel=self.cancel,
            )
            produced = {}
            for model_output, tensor in step.outputs.items():
                if model_output not in results:
                    raise ExecutionError(f"the model returned no output '{model_output}'")
                produced[tensor] = results[model_output]
            return produced, None
        except BaseException as error:  # noqa: BLE001 (handed to the coordinator, which raises it)
            return {}, error

    def _store_locked(self, produced: Mapping[str, np.ndarray]) -> None:
        self.tensors.update(produced)
        for tensor in produced:
            for reader in self.model.readers.get(tensor, ()):
                self._missing[reader.index] -= 1
                if not self._missing[reader.index]:
                    self._ready.append(reader)

    def _finish_locked(self) -> None:
        """Every taken step has ended: raise the first failure, or the request's end, or return."""
        if self._failure is not None:
            step, error = self._failure
            raise _named(self.model.name, step, error)
        if self.cancel.cancelled:
            reason = self._parent.reason or self.cancel.reason or "cancelled"
            raise RequestCancelled(
                f"ensemble '{self.model.name}': the request ended ({reason}) with {self._untaken} step(s) not started"
            )
        if self._untaken:  # cannot happen with a checked graph; never hang on it
            raise ExecutionError(f"ensemble '{self.model.name}': steps never became ready")


class StepDeviceFailed(ExecutionError):
    """A step model's device failed under a step: UNAVAILABLE `device_failed` for the client, as the step's own
    error, but not a DeviceFailedError of the ensemble: the step model is taken out of service (and its ensembles
    unloaded with the reason, by StepWatcher), never the ensemble's own engine, which has no device."""

    error_reason: str | None = "device_failed"


def _named(ensemble: str, step: Step, error: BaseException) -> BaseException:
    """`error` with the ensemble and the step in front of its message, its class kept (so its status code). An
    error whose message clients never see (an internal one: no reason of its own) is logged here and becomes a
    ModelError (INTERNAL) that names the step and its model, and no more."""
    prefix = f"ensemble '{ensemble}': {step.label}"
    if isinstance(error, DeviceFailedError):
        return StepDeviceFailed(f"{prefix}: {error}")
    if getattr(error, "error_reason", None) is None:
        _LOG.error("%s failed: %s", prefix, error, exc_info=error)
        return ModelError(f"{prefix} failed to execute this request; see the server log")
    renamed = own_copy(error)
    renamed.args = (f"{prefix}: {error}",)
    return renamed


__all__ = ["ENSEMBLE_SLOTS", "EnsembleBackend"]
