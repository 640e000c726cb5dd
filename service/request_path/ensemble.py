"""Ensembles (config.pbtxt `platform: "ensemble"`): a model whose engine runs other models as a data flow.

The ensemble is an ordinary registered model (its entry, state, statistics, admission) whose backend is
`EnsembleBackend`. Its graph is read and checked when its configuration is read (engine/config/ensemble_graph.py
`read_steps`) and checked again when it loads, by every path (startup, RepositoryModelLoad, RegisterModel, poll
mode, a load with files): first the ensembles' call graph (`call_graph_refusal`: no cycle through ensembles, no
chain of ensembles deeper than MAX_NESTING), then against its step models (`check_against_models`: every step
model registered and not failed, not decoupled, the maps' tensors known to the models, datatypes and shapes
agreeing, Triton's max_batch_size rules).

A step runs as an internal call (service/request_path/internal_calls.py): through its own model's admission (FIFO,
slots, batching, residency, statistics), with a child of the ensemble request's CancelToken (a failed step cancels the
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
import enum
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from engine.config.ensemble_graph import (
    CYCLE_REFUSAL,
    MAX_NESTING,
    Step,
    StepModel,
    call_graph_refusal,
    check_against_models,
    read_steps,
    step_models,
)
from engine.config.files import hide_paths
from engine.config.specs import ModelSpec
from engine.errors import (
    DeviceFailedError,
    ExecutionError,
    ModelConfigError,
    ModelError,
    ModelErrorUnsupported,
    ModelLoadError,
)
from engine.interface import Backend, CancelToken, Context, FinalOutputs, LoadedModel, ModelMetadata, Outputs

from ..core.errors import ModelConfigFailed, ModelNotFound, ModelNotLoadedYet, RequestCancelled, own_copy
from ..core.lifecycle import ModelEntry, ModelState
from ..core.registry import ENSEMBLE_SLOTS, ModelRegistry
from .dataplane import Dataplane
from .internal_calls import call_model, call_model_stream
from .response_cache import model_enables_cache

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
        MAX_NESTING: engine/config/ensemble_graph.py call_graph_refusal), then its graph against its step models as
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
        models: dict[int, StepModel] = {}

        def model_of(step: Step) -> StepModel:
            models[step.index] = _step_model(dataplane, step, origin)
            return models[step.index]

        decoupled = check_against_models(origin, spec.max_batch_size, spec.inputs, spec.outputs, steps, model_of)
        if decoupled and model_enables_cache(spec.config):
            raise ModelConfigError(  # Triton 2.51 refuses it too: its ensemble is decoupled by then
                f"{origin}: the response cache does not support a model with the 'decoupled' transaction policy "
                f"(an ensemble with a decoupled step: {_decoupled_steps(steps, models)})"
            )
        _say_decoupled(spec.config, decoupled)
        metadata = ModelMetadata(spec.inputs, spec.outputs, spec.max_batch_size, platform="ensemble")
        streaming_steps = frozenset(index for index, model in models.items() if model.decoupled)
        return EnsembleModel(spec.name, metadata, steps, dataplane, streaming_steps)


def _decoupled_steps(steps: Sequence[Step], models: Mapping[int, StepModel]) -> str:
    return ", ".join(step.label for step in steps if models[step.index].decoupled)


def _say_decoupled(config: object, decoupled: bool) -> None:
    """Triton's rule: an ensemble is decoupled exactly when one of its steps is (whatever its config.pbtxt says), and
    its configuration says so from its load: ModelConfig answers `model_transaction_policy { decoupled: true }`, and
    a stream writes its answers as they come (Dataplane.stream_placement reads the flag). A config that says
    nothing about it keeps saying nothing when the ensemble is not decoupled."""
    policy = getattr(config, "model_transaction_policy", None)  # the parsed ModelConfig, or None
    if policy is None:
        return
    if decoupled or config.HasField("model_transaction_policy"):  # type: ignore[attr-defined]
        policy.decoupled = decoupled


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
    decoupled = _answers_many(dataplane.registry, spec, 0)
    return StepModel(batch, tuple(inputs), tuple(outputs), decoupled, spec.version)


def _answers_many(registry: ModelRegistry, spec: ModelSpec, depth: int) -> bool:
    """Whether a model answers a request with any number of responses, so that an ensemble step calls it on a
    stream: a decoupled model (`model_transaction_policy { decoupled: true }`), or an ensemble one of whose steps'
    models (as registered: the served version) does, however deep (Triton's rule; its own config.pbtxt is not
    read for it). A chain of ensembles deeper than MAX_NESTING is refused by the call-graph check before this."""
    config = spec.config  # the parsed ModelConfig, or None
    if spec.backend != "ensemble" or config is None:
        policy = getattr(config, "model_transaction_policy", None)
        return bool(policy is not None and policy.decoupled)
    if depth >= MAX_NESTING:
        return False
    for model in step_models(config):
        try:
            step_spec = registry.get(model).spec
        except (ModelNotFound, ModelConfigFailed):  # its own load names it
            continue
        if _answers_many(registry, step_spec, depth + 1):
            return True
    return False


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
    """A loaded ensemble: its checked steps, which of them answer on a stream (decoupled steps: the ensemble is
    then streaming itself), and the helper threads its requests share (StepHelpers, closed with the model)."""

    max_parallel_slots = ENSEMBLE_SLOTS

    def __init__(
        self,
        name: str,
        metadata: ModelMetadata,
        steps: Sequence[Step],
        dataplane: Dataplane,
        streaming_steps: frozenset[int] = frozenset(),
    ) -> None:
        self.name = name
        self.metadata = metadata
        self.steps = tuple(steps)
        self.dataplane = dataplane
        self.streaming_steps = streaming_steps  # indexes of the steps called on a stream (decoupled models)
        self.streaming = bool(streaming_steps)  # Triton's rule: decoupled when a step is (ModelStreamInfer only)
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
        load check refuses any other) or nested too deep; a decoupled ensemble is refused (ModelErrorUnsupported,
        Triton's words: it answers on a stream only)."""
        if self.model.streaming:
            raise ModelErrorUnsupported("ModelInfer RPC doesn't support models with decoupled transaction policy")
        answers = list(self._run(inputs, outputs, cancel).answers())
        if len(answers) != 1:  # cannot happen with a checked graph; never answer half of one
            raise ExecutionError(f"ensemble '{self.model.name}' answered {len(answers)} times, not once")
        return dict(answers[0])

    def execute_stream(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], cancel: CancelToken
    ) -> Iterator[Outputs]:
        """Run the steps and yield the ensemble's outputs as they are made: each response of a decoupled step runs
        the steps after it as a request of its own, and each set of the ensemble's outputs that belong together (the
        ones asked for) is an answer, the last one as FinalOutputs when nothing else can follow it. Steps run as in
        `execute`; the request ends at the first failing step (its error raised after the answers made before it)
        or when it is cancelled; closing this iterator early ends it the same way (its running steps cancelled,
        waited for; the streams of its decoupled steps closed, their slots freed). An ensemble that is not
        decoupled yields its one answer."""
        yield from self._run(inputs, outputs, cancel).answers()

    def _run(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], cancel: CancelToken) -> _Run:
        model = self.model
        callers = cancel.ensembles if isinstance(cancel, StepToken) else ()
        _check_callers(model.name, callers)
        self._check_steps_available()
        wanted = tuple(outputs) or tuple(spec.name for spec in model.metadata.outputs)
        return _Run(model, inputs, wanted, cancel, (*callers, model.name))

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
# Answers and ordinary calls made from a decoupled step's responses that may wait for the request's own thread
# before a helper reads that step's stream on (_Run._wait_for_room): bounds what a slow client makes the server hold.
BACKLOG = 16
RECHECK_SECONDS = 2.0  # the longest a helper held back goes without looking at its request again


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

    def want(self, run: _Run) -> bool:
        """Ask for a helper to take `run`'s ready steps: wakes an idle one, else starts one under the limit, else
        the run waits its turn in the queue (its own thread goes on meanwhile). Never blocks; a run already asking
        is not queued twice. True when a helper is on its way to this run now (an idle one woken or one started:
        a helper idles only once no run is asking, so every run ahead of this one has its own on the way too)."""
        with self._changed:
            if self._closed or self.limit == 0 or run in self._queued:
                return False
            self._queued.add(run)
            self._asking.append(run)
            start = False
            if self._idle > 0:
                self._idle -= 1  # that helper is busy from now: the next `want` must not count it
                self._changed.notify()
            elif self._threads < self.limit:
                self._threads += 1
                start = True
            else:
                return False
        if start:
            # daemon: a step hung in its backend must not keep the process from exiting (shutdown abandons it)
            threading.Thread(target=self._serve, name=f"ensemble-{self.name}-helper", daemon=True).start()
        return True

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


Key = tuple[int, ...]  # which response of which decoupled step a value descends from, outermost first: () the request


@dataclass(eq=False)
class _Call:
    """One step's call for one key, made once every input of the step exists for that key: its inputs (an input
    whose producer's response left it out is left out), and for a streaming step its responses (opened by its first
    turn) and how many it gave so far."""

    step: Step
    key: Key
    inputs: dict[str, np.ndarray]
    streaming: bool
    answers: Iterator[Outputs] | None = None
    count: int = 0


@dataclass
class _Turn:
    """What one turn of a call gave: the ensemble tensors produced (None for a tensor the response left out) under
    `key`, or nothing (`produced` None); whether the call is over (an ordinary call after its one turn, a streaming
    one after its last response); or the error it failed with."""

    produced: dict[str, np.ndarray | None] | None = None
    key: Key = ()
    over: bool = True
    failure: BaseException | None = None


class _Run:
    """One ensemble request's data flow (Triton's: each response of a decoupled step runs the steps after it as a
    request of its own). Every value is kept under its tensor and its key; a step's call for a key is made once every
    tensor it reads exists for that key (Triton's load check gives them all one origin, so keys of one length), and
    the ensemble's answer for a key once every output asked for exists. A value is dropped once every step reading
    it, and the answer, took it.

    Longer than the house's ~300 lines for a reason: the coordinator, the helpers and the relay of decoupled answers
    all move one data flow under one lock (values, calls ready and running, the backlog bound); each method is one
    move of it.

    Threads. The request's own (the coordinator, in `answers`) yields the answers as they are made and runs ordinary
    calls. A streaming call holds its callee's slot until its last response is read, so it is read without pause by
    one owner until it ends: a helper (`help`: streams first, then ordinary calls), or the coordinator when no
    helper is free (at most one at a time, read between its other work; an answer a helper makes meanwhile waits
    for that stream's next response). A stream no owner is free for waits, unopened, until one is. So every open
    stream drains, and a call waiting for its callee's slot never waits for a stream nobody reads. Whoever ends a turn
    stores what it produced, which may make calls and answers ready, and asks for a helper when more calls are ready
    than it takes. Once the request is cancelled, its iterator closed or a step failed, no call is taken; running
    ones get the cancellation, and open streams are closed."""

    def __init__(
        self,
        model: EnsembleModel,
        inputs: Mapping[str, np.ndarray],
        wanted: Sequence[str],
        cancel: CancelToken,
        ensembles: tuple[str, ...],
    ) -> None:
        self.model = model
        self.cancel = StepToken(ensembles)  # the steps' token: fired by the request's, or by a failed step
        self._parent = cancel
        # The ensemble request's trace (service/core/tracing.py), set on its token by the dataplane; None: not traced.
        self._trace = cancel.trace
        # Its steps' request parameters: its `priority` (set on its token by the dataplane, RequestInfo), which each
        # step's request carries into its model's queue, as Triton 2.51's ensemble passes it on; none at level 0.
        priority = cancel.request.priority if cancel.request is not None else 0
        self._step_parameters: dict[str, object] = {"priority": priority} if priority else {}
        self._wanted = tuple(dict.fromkeys(wanted))  # the ensemble outputs each answer carries
        self._changed = threading.Condition()  # guards every field below
        self._values: dict[tuple[str, Key], np.ndarray | None] = {}  # None: left out by its producer's response
        self._uses: dict[tuple[str, Key], int] = {}  # readers (and the answer) yet to take each value
        self._calls: collections.deque[_Call] = collections.deque()  # ordinary calls ready
        self._streams: collections.deque[_Call] = collections.deque()  # streaming calls ready, not opened
        self._own: _Call | None = None  # the coordinator's open stream
        self._awaiting_helper = False  # a helper was woken for this run's streams and has not come yet
        self._held_back = 0  # helpers waiting for room before reading their stream on (_wait_for_room)
        self._coordinator_busy = False  # the request's thread is in a turn of its own (takes no answers meanwhile)
        self._coordinator_blocked = False  # it waits for a step's turn to end before taking that step's next call
        self._stepping: set[int] = set()  # steps with an ordinary call's turn running (one at a time per step)
        self._answers: collections.deque[Outputs] = collections.deque()  # made, not yielded yet
        self._running = 0  # turns being taken, and streams a helper owns
        self._started: set[int] = set()  # steps with a call taken
        self._failure: tuple[Step, BaseException] | None = None
        # An optional input the client left out is a value left out: a step reading it runs without it (Triton's).
        self._store_locked({spec.name: inputs.get(spec.name) for spec in model.metadata.inputs}, ())

    # ---- the request's thread --------------------------------------------------------------------------------

    def answers(self) -> Iterator[Outputs]:
        """The ensemble's answers as they are made (the last as FinalOutputs when nothing can follow it), then
        returns once every call ended; raises as EnsembleContext.execute says, after the answers made before the
        failure. Closed early, it ends the request (`_end`)."""
        relay = self._relay
        self._parent.add_callback(relay)
        try:
            while True:
                with self._changed:
                    kind, answer, call, more = self._coordinator_next_locked()
                if kind is _Next.ANSWER:
                    yield answer  # type: ignore[misc]  # an ANSWER carries one
                elif kind is _Next.DONE:
                    return
                elif kind is _Next.ASK:
                    self._ask_for_a_helper()
                else:
                    if more:
                        self.model.helpers.want(self)  # outside this run's lock: it may start a thread
                    self._set_coordinator_busy(True)
                    try:
                        self._take_turn(call, own=kind is _Next.PUMP)  # type: ignore[arg-type]  # CALL and PUMP carry one
                    finally:
                        self._set_coordinator_busy(False)
        finally:
            self._parent.remove_callback(relay)
            self._end()

    def _set_coordinator_busy(self, busy: bool) -> None:
        """The request's thread starts (or ended) a turn of its own. While it is in one it takes no answers, and the
        turn may wait for a slot a helper's stream holds (a step after a decoupled one on a model with one slot):
        helpers held back for room must read on then, or neither would ever move (_wait_for_room)."""
        with self._changed:
            self._coordinator_busy = busy
            if busy and self._held_back:
                self._changed.notify_all()

    def _relay(self) -> None:
        self.cancel.cancel(self._parent.reason or "cancelled")
        self._wake_held_back()

    def _wake_held_back(self) -> None:
        """The run ended early: helpers waiting for room stop waiting (and close their streams)."""
        with self._changed:
            if self._held_back:
                self._changed.notify_all()

    def _coordinator_next_locked(self) -> tuple[_Next, Outputs | None, _Call | None, bool]:
        """What the coordinator does next: yield an answer; take a turn of an ordinary call (and whether more are
        ready) or of its own stream; ask for a helper for a stream; or nothing more (DONE). Waits while only other
        threads' turns, or a helper on its way, can make progress (each turn's end, and a helper's arrival,
        notifies). Raises the run's end (_finish_locked)."""
        while True:
            ended = self._failure is not None or self._ended_locked()
            if self._answers and not self._parent.cancelled:  # (those made before a failure go out first)
                answer = self._answers.popleft()
                if self._held_back:
                    self._changed.notify_all()  # room for a helper reading a stream
                return _Next.ANSWER, (FinalOutputs(answer) if self._over_locked() else answer), None, False
            if not ended:
                call = self._free_call_locked()
                if call is not None:
                    if self._held_back:
                        self._changed.notify_all()
                    return _Next.CALL, None, self._taken_locked(self._calls, call), bool(self._calls or self._streams)
                if self._own is not None:
                    self._running += 1
                    return _Next.PUMP, None, self._own, False
                if self._streams and not self._awaiting_helper:
                    self._awaiting_helper = True
                    return _Next.ASK, None, None, False
            if not self._running and (ended or not (self._calls or self._streams or self._own)):
                self._finish_locked()
                return _Next.DONE, None, None, False
            # Calls ready but each behind its step's running turn: a helper held back for room must read on, as
            # when the coordinator is in a turn itself (that turn may wait for the slot the helper's stream holds).
            self._coordinator_blocked = bool(self._calls) and not ended
            if self._coordinator_blocked and self._held_back:
                self._changed.notify_all()
            self._changed.wait()
            self._coordinator_blocked = False

    def _ask_for_a_helper(self) -> None:
        """Streams are ready: a helper on its way takes them (`help` says it has come); none free, the coordinator
        opens one itself (it owns none now: it was asked only then)."""
        if self.model.helpers.want(self):
            return
        with self._changed:
            self._awaiting_helper = False
            if self._streams and self._own is None and self._failure is None and not self._ended_locked():
                self._own = self._taken_locked(self._streams)
                self._running -= 1  # owned between turns, counted while a turn runs (_coordinator_next_locked)

    def _over_locked(self) -> bool:
        """Nothing can follow: no answer, call, stream or turn left, and the run did not fail or end early."""
        busy = self._answers or self._calls or self._streams or self._own is not None or self._running
        return not busy and self._failure is None and not self._ended_locked()

    def _ended_locked(self) -> bool:
        """The request ended early (its token fired, or a step failed and cancelled the others)."""
        return self.cancel.cancelled or self._parent.cancelled

    def _finish_locked(self) -> None:
        """Every turn has ended and nothing is ready (or may be taken): raise the first failure, or the request's
        end, or return."""
        if self._failure is not None:
            step, error = self._failure
            raise _named(self.model.name, step, error)
        if self._ended_locked():
            reason = self._parent.reason or self.cancel.reason or "cancelled"
            not_started = len(self.model.steps) - len(self._started)
            raise RequestCancelled(
                f"ensemble '{self.model.name}': the request ended ({reason}) with {not_started} step(s) not started"
            )

    def _end(self) -> None:
        """However the request's iterator ends: a run not over is cancelled (its iterator was closed early); its
        running turns are waited for (the cancellation ends them: bounded by those steps), and the coordinator's
        open stream is closed (its callee's slot freed)."""
        with self._changed:
            over = not (self._calls or self._streams or self._own is not None or self._running)
        if not over:
            self.cancel.cancel("the request ended")
            self._wake_held_back()
        with self._changed:
            while self._running:
                self._changed.wait()  # every turn's end notifies
            own, self._own = self._own, None
            self._calls.clear()
            self._streams.clear()
            self._answers.clear()
        if own is not None:
            _close(own)

    # ---- helpers -----------------------------------------------------------------------------------------------

    def help(self) -> None:
        """A helper's turn (StepHelpers): take this request's calls, streams first (each read to its end here),
        until none is left for it. Never raises."""
        while True:
            with self._changed:
                if self._awaiting_helper:  # this helper has come: the coordinator stops waiting for one
                    self._awaiting_helper = False
                    self._changed.notify_all()
                taking = self._failure is None and not self._ended_locked()
                call = None
                if taking and self._streams:
                    call = self._taken_locked(self._streams)
                elif taking:
                    free = self._free_call_locked()
                    call = None if free is None else self._taken_locked(self._calls, free)
                if call is not None and self._held_back:
                    self._changed.notify_all()  # room for a helper reading a stream
                more = bool(self._calls or self._streams)
            if call is None:
                return
            if more:
                self.model.helpers.want(self)
            if call.streaming:
                while self._take_turn(call, own=True, keep=True):
                    self._wait_for_room()
            else:
                self._take_turn(call, own=False)

    def _wait_for_room(self) -> None:
        """Before a helper reads its stream's next response: wait while BACKLOG answers and calls made from earlier
        ones wait for the coordinator (its client reads slowly, or the next step is slow), so that the stream is
        read no faster than its results are taken, as a decoupled model's own stream is (the model's send waits for
        the server's read). Ends when there is room, a step failed, the request ended, or the request's thread is
        in a turn of its own (each notifies): that turn may wait for the very slot this helper's stream holds, so the
        backlog may pass BACKLOG by what the streams read meanwhile. Rechecks every RECHECK_SECONDS."""
        with self._changed:
            self._held_back += 1
            try:
                while (
                    len(self._answers) + len(self._calls) >= BACKLOG
                    and not self._coordinator_busy
                    and not self._coordinator_blocked
                ):
                    if self._failure is not None or self._ended_locked():
                        return
                    self._changed.wait(RECHECK_SECONDS)
            finally:
                self._held_back -= 1

    # ---- turns -------------------------------------------------------------------------------------------------

    def _free_call_locked(self) -> _Call | None:
        """The first ordinary call ready whose step has no turn running, or None. One turn per step at a time keeps
        a step's calls entering its model's queue in the order they were made (Triton's: the order of the
        responses they come from). Two threads racing into the queue let a later call take a one-slot step first:
        a call that waits (for its request's cancellation, say) then held back the earlier one, and the answer the
        client was waiting for before it cancels never came (the 1-in-8 hang of a cancelled decoupled ensemble).
        Nor does the coordinator then sit in a turn while another thread's turn of that step makes an answer."""
        for call in self._calls:
            if call.step.index not in self._stepping:
                return call
        return None

    def _taken_locked(self, ready: collections.deque[_Call], call: _Call | None = None) -> _Call:
        """Take `call` (the first one when None) out of `ready` and count its turn running."""
        if call is None:
            call = ready.popleft()
        else:
            ready.remove(call)
        if not call.streaming:
            self._stepping.add(call.step.index)
        self._running += 1
        self._started.add(call.step.index)
        return call

    def _take_turn(self, call: _Call, *, own: bool, keep: bool = False) -> bool:
        """Take one turn of `call` (outside the lock) and store what it gave; `own`: a stream its taker owns (the
        coordinator's, or a helper's with `keep`: counted running until it ends). Returns whether that stream has
        more to read now. Never raises: a failure is kept for the coordinator to raise, and cancels the other
        steps."""
        turn = self._turn(call)
        close = False
        with self._changed:
            if not call.streaming:
                self._stepping.discard(call.step.index)
            if turn.failure is not None:
                if self._failure is None:
                    self._failure = (call.step, turn.failure)
            elif turn.produced is not None and self._failure is None and not self._ended_locked():
                self._store_locked(turn.produced, turn.key)  # (nothing is made after the request's end)
            more = own and not turn.over and turn.failure is None
            if more and (self._failure is not None or self._ended_locked()):
                more, close = False, keep  # a helper closes its stream; _end closes the coordinator's
            if not (more and keep):
                self._running -= 1
            if own and not keep and (turn.over or turn.failure is not None):
                self._own = None  # the coordinator's stream has ended
            self._changed.notify_all()
        if turn.failure is not None:
            self.cancel.cancel(f"{call.step.label} failed")
        if close:
            _close(call)
        return more

    def _turn(self, call: _Call) -> _Turn:
        """One turn of a call through its model's admission: an ordinary step's call (its one answer), or the next
        response of a streaming step's (opened on its first turn). Never raises."""
        step = call.step
        try:
            if not call.streaming:
                results = call_model(
                    self.model.dataplane,
                    step.model,
                    call.inputs,
                    version=step.version_string,
                    outputs=list(step.outputs),
                    cancel=self._call_token(),
                    parameters=self._step_parameters,
                )
                produced: dict[str, np.ndarray | None] = {}
                for model_output, tensor in step.outputs.items():
                    if model_output not in results:
                        raise ExecutionError(f"the model returned no output '{model_output}'")
                    produced[tensor] = results[model_output]
                return _Turn(produced, call.key)
            if call.answers is None:
                call.answers = call_model_stream(
                    self.model.dataplane,
                    step.model,
                    call.inputs,
                    version=step.version_string,
                    outputs=list(step.outputs),
                    cancel=self._call_token(),
                    parameters=self._step_parameters,
                )
            outputs = next(call.answers, None)
            if outputs is None:
                return _Turn()
            # Sent with the final flag: read the stream to its end now (it ends there: the callee is counted and its
            # slot freed), so that an answer this response makes can be the ensemble's final one.
            over = isinstance(outputs, FinalOutputs) and next(call.answers, None) is None
            key = (*call.key, call.count)
            call.count += 1
            # A response may leave outputs out (Triton's placeholder): the steps reading them run without them.
            return _Turn({tensor: outputs.get(name) for name, tensor in step.outputs.items()}, key, over)
        except BaseException as error:  # noqa: BLE001 (handed to the coordinator, which raises it)
            return _Turn(failure=error)

    def _call_token(self) -> CancelToken:
        """The token of one step's call: the steps' shared one, or, for a traced request, one of the call's own
        carrying the request's trace (the dataplane makes the call's trace its child and sets it on the token, where
        a shared token would hand one step's trace to its siblings), cancelled with the shared one."""
        if self._trace is None:
            return self.cancel
        token = StepToken(self.cancel.ensembles)
        token.trace = self._trace
        shared = self.cancel
        shared.add_callback(lambda: token.cancel(shared.reason or "cancelled"))
        return token

    # ---- values ------------------------------------------------------------------------------------------------

    def _store_locked(self, produced: Mapping[str, np.ndarray | None], key: Key) -> None:
        """Keep the values a turn produced under `key`; make ready (in step order) the calls whose inputs now all
        exist for it, and the answer when every output asked for does."""
        readers: dict[int, Step] = {}
        answer_due = False
        for tensor, value in produced.items():
            wanted = tensor in self._wanted
            uses = len(self.model.readers.get(tensor, ())) + wanted
            if not uses:
                continue
            self._values[(tensor, key)] = value
            self._uses[(tensor, key)] = uses
            for reader in self.model.readers.get(tensor, ()):
                readers[reader.index] = reader
            answer_due = answer_due or wanted
        for index in sorted(readers):
            step = readers[index]
            if all((tensor, key) in self._values for tensor in step.inputs.values()):
                self._make_call_locked(step, key)
        if answer_due and all((name, key) in self._values for name in self._wanted):
            answer = {}
            for name in self._wanted:
                value = self._values[(name, key)]
                if value is not None:
                    answer[name] = value
                self._release_locked(name, key)
            self._answers.append(answer)

    def _make_call_locked(self, step: Step, key: Key) -> None:
        inputs = {}
        for model_input, tensor in step.inputs.items():
            value = self._values[(tensor, key)]
            if value is not None:
                inputs[model_input] = value
        for tensor in dict.fromkeys(step.inputs.values()):
            self._release_locked(tensor, key)
        call = _Call(step, key, inputs, step.index in self.model.streaming_steps)
        (self._streams if call.streaming else self._calls).append(call)

    def _release_locked(self, tensor: str, key: Key) -> None:
        """One reader (or the answer) took the value: dropped when the last one has."""
        slot = (tensor, key)
        self._uses[slot] -= 1
        if not self._uses[slot]:
            del self._uses[slot], self._values[slot]


class _Next(enum.Enum):
    """What the coordinator does next (_Run._coordinator_next_locked)."""

    ANSWER = "yield an answer"
    CALL = "take a turn of an ordinary call"
    PUMP = "read the next response of its own stream"
    ASK = "ask for a helper for the streams ready"
    DONE = "nothing more"


def _close(call: _Call) -> None:
    """Close a streaming call's responses that the run no longer reads: the callee's request ends (its slot is
    freed, its statistics count it). Never raises (logged)."""
    close = getattr(call.answers, "close", None)
    if close is None:
        return
    try:
        close()
    except Exception:  # noqa: BLE001 (ending a stream must not fail the request that no longer wants it)
        _LOG.exception("%s: closing its responses failed", call.step.label)


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
