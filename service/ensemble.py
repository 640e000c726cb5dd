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
makes the request fail with UNAVAILABLE (model_not_loaded) naming the step; one unloaded or failed fails (or
loads) in its own call, its error named for the step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence

import numpy as np

from engine.ensemble_graph import Step, StepModel, check_against_models, read_steps
from engine.errors import ExecutionError, ModelConfigError, ModelError
from engine.interface import Backend, CancelToken, Context, LoadedModel, ModelMetadata, ModelSpec, Outputs

from .core.errors import ModelNotFound, ModelNotLoadedYet, own_copy
from .core.registry import ENSEMBLE_SLOTS
from .dataplane import Dataplane
from .internal_calls import call_model

_LOG = logging.getLogger(__name__)


class EnsembleBackend(Backend):
    """Loads ensembles. Needs the server's dataplane (`bind`), which is built after the backends."""

    name = "ensemble"

    def __init__(self) -> None:
        self._dataplane: Dataplane | None = None

    def bind(self, dataplane: Dataplane) -> None:
        self._dataplane = dataplane

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
    loaded. Raises ModelConfigError when it is not registered or failed."""
    try:
        entry = dataplane.registry.get(step.model)
    except ModelNotFound:
        raise ModelConfigError(f"{origin}: {step.label} names a model that is not registered") from None
    view = entry.view()
    spec = view.spec
    inputs, outputs, batch = spec.inputs, spec.outputs, spec.max_batch_size
    if not inputs and not outputs and view.metadata is not None:
        inputs, outputs, batch = view.metadata.inputs, view.metadata.outputs, view.metadata.max_batch_size
    policy = getattr(spec.config, "model_transaction_policy", None)  # spec.config: the parsed ModelConfig, or None
    decoupled = bool(policy is not None and policy.decoupled)
    return StepModel(batch, tuple(inputs), tuple(outputs), decoupled, spec.version)


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


def _named(ensemble: str, step: Step, error: BaseException) -> BaseException:
    """`error` with the ensemble and the step in front of its message, its class kept (so its status code). An
    error whose message clients never see (an internal one: no reason of its own) is logged here and becomes a
    ModelError (INTERNAL) that names the step and its model, and no more."""
    prefix = f"ensemble '{ensemble}': {step.label}"
    if getattr(error, "error_reason", None) is None:
        _LOG.error("%s failed: %s", prefix, error, exc_info=error)
        return ModelError(f"{prefix} failed to execute this request; see the server log")
    renamed = own_copy(error)
    renamed.args = (f"{prefix}: {error}",)
    return renamed


__all__ = ["ENSEMBLE_SLOTS", "EnsembleBackend"]
