"""Ensembles (config.pbtxt `platform: "ensemble"`): a model whose engine runs other models as a data flow.

The ensemble is an ordinary registered model (its entry, state, statistics, admission) whose backend is
`EnsembleBackend`. Its graph is read and checked when its configuration is read (engine/ensemble_graph.py
`read_steps`) and checked again against its step models when it loads (`check_against_models`: every step model
registered and not failed, not decoupled, the maps' tensors known to the models, datatypes and shapes agreeing,
Triton's max_batch_size rules). A step runs as an internal call (service/internal_calls.py): through its own
model's admission (FIFO, slots, batching, residency, statistics), with the ensemble request's CancelToken (a child
of it: a failed step cancels the others). A step starts as soon as every tensor it reads exists; steps that are
ready together run at the same time, each on a thread of its own, except that a step ready alone while nothing
else runs runs on the calling thread (a linear chain starts no thread). Tensors pass between steps as the same
numpy arrays (no copy).

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
from collections.abc import Mapping, Sequence

import numpy as np

from engine.ensemble_graph import Step, StepModel, check_against_models, read_steps
from engine.errors import DeviceFailedError, ExecutionError, ModelConfigError, ModelError, ModelLoadError
from engine.interface import Backend, CancelToken, Context, LoadedModel, ModelMetadata, ModelSpec, Outputs
from engine.repository import hide_paths

from .core.errors import ModelConfigFailed, ModelNotFound, ModelNotLoadedYet, own_copy
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
        """Check the ensemble's graph against its step models as registered now. Raises ModelConfigError naming
        the step and the problem. Does not load the step models (each loads on its first call, as usual)."""
        if self._dataplane is None:
            raise ModelConfigError(f"model '{spec.name}': ensembles need a server (EnsembleBackend.bind)")
        origin = f"ensemble '{spec.name}'"
        steps = read_steps(spec.config, origin)
        dataplane = self._dataplane
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
    max_parallel_slots = ENSEMBLE_SLOTS

    def __init__(self, name: str, metadata: ModelMetadata, steps: Sequence[Step], dataplane: Dataplane) -> None:
        self.name = name
        self.metadata = metadata
        self.steps = tuple(steps)
        self.dataplane = dataplane

    def create_context(self) -> Context:
        return EnsembleContext(self)


class EnsembleContext(Context):
    def __init__(self, model: EnsembleModel) -> None:
        self.model = model

    def execute(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], cancel: CancelToken) -> Outputs:
        """Run every step as its inputs appear; return the ensemble's outputs (`outputs`, or all). Blocks until
        every started step has ended. Raises the first failing step's error, renamed for the step; the other
        running steps are cancelled first."""
        model = self.model
        self._check_steps_available()
        run = _Run(model, dict(inputs), cancel)
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


class _Run:
    """One ensemble request's data flow. The coordinator (the calling thread) starts ready steps and waits for
    them; each step's thread stores its outputs and wakes the coordinator."""

    def __init__(self, model: EnsembleModel, tensors: dict[str, np.ndarray], cancel: CancelToken) -> None:
        self.model = model
        self.tensors = tensors  # ensemble tensor -> array; written only under _done
        self.pending = list(model.steps)
        self.cancel = CancelToken()  # the steps' token: fired by the request's, or by a failed step
        self._parent = cancel
        self._done = threading.Condition()  # guards: tensors, _running, _failure
        self._running = 0
        self._failure: tuple[Step, BaseException] | None = None

    def go(self) -> None:
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
            with self._done:
                while self._failure is None and self._running and not self._ready():
                    self._done.wait()
                if self._failure is not None:
                    while self._running:  # the others were cancelled: let them end before answering
                        self._done.wait()
                    step, error = self._failure
                    raise _named(self.model.name, step, error)
                ready = self._ready()
                if not ready and not self._running:
                    if self.pending:  # cannot happen with a checked graph; never hang on it
                        raise ExecutionError(f"ensemble '{self.model.name}': steps never became ready")
                    return
                for step in ready:
                    self.pending.remove(step)
                self._running += len(ready)
                inline = ready[0] if len(ready) == 1 and self._running == 1 else None
            if inline is not None:
                self._run_step(inline)
                continue
            for step in ready:
                # daemon: a step hung in its backend must not keep the process from exiting (shutdown abandons it)
                threading.Thread(
                    target=self._run_step, args=(step,), name=f"ensemble-{step.model}", daemon=True
                ).start()

    def _ready(self) -> list[Step]:
        return [step for step in self.pending if all(t in self.tensors for t in step.inputs.values())]

    def _run_step(self, step: Step) -> None:
        """Run one step and store its outputs (or its failure, cancelling the other steps). Never raises."""
        failure: BaseException | None = None
        produced: dict[str, np.ndarray] = {}
        try:
            inputs = {model_input: self.tensors[tensor] for model_input, tensor in step.inputs.items()}
            results = call_model(
                self.model.dataplane,
                step.model,
                inputs,
                version=step.version_string,
                outputs=list(step.outputs),
                cancel=self.cancel,
            )
            for model_output, tensor in step.outputs.items():
                if model_output not in results:
                    raise ExecutionError(f"the model returned no output '{model_output}'")
                produced[tensor] = results[model_output]
        except BaseException as error:  # noqa: BLE001 (handed to the coordinator, which raises it)
            failure = error
        with self._done:
            self._running -= 1
            if failure is not None:
                if self._failure is None:
                    self._failure = (step, failure)
            else:
                self.tensors.update(produced)
            self._done.notify_all()
        if failure is not None:
            self.cancel.cancel(f"{step.label} failed")


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
