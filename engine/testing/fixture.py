"""The fixture backend: a controllable engine that makes lifecycle timing deterministic in tests.

It computes something real but trivial (output i = input i, cast to the output's datatype), and at every
boundary the contract names it passes a **gate** that a test can hold, fail or release:

    load        the primary load (also what a capacity probe does)
    clone       creating one slot's context (the k-th clone can be failed)
    prepare     a request is about to run on a context
    execute     the run itself (between prepare and the result)
    stream      before each partial response of a streaming model
    teardown    closing the engine (slow or hanging teardown)
    measure     reading what a pool holds (`memory_bytes`: the memory budget's load check and its watch)

A gate never sleeps: a held gate blocks arrivals on a condition until the test releases it, and the test
waits for arrivals with `wait_arrivals` (bounded by a timeout so a broken test fails instead of hanging).

Config parameters (config.pbtxt `parameters` or management options):
    capacity          advertised max_parallel_slots (default 16)
    stream_responses  N > 0 makes the model streaming: each request yields N partial responses
    memory_bytes      what a pool reports (weights), plus `slot_memory_bytes` per slot; a test changes what a
                      model reports from then on with `FixtureControls.set_memory` (a model that grows with use)
    gate_dir          a folder for tests that run the server in another process: at point P, if the file
                      `<model>.<P>.hold` exists there, the fixture writes `<model>.<P>.arrived` and waits until
                      `<model>.<P>.release` exists (a cancelled request stops waiting at prepare/execute/stream)
    hang              a point name: the fixture blocks there forever, ignoring cancellation (a hung backend)

Without declared inputs/outputs the model takes INPUT0 (FP32, [-1]) and returns OUTPUT0. A batching model
(max_batch_size > 0) receives a batch as one stacked array per input; `FixtureControls.batches` lists the rows
of each run, and the gates above are passed once per run, so a test holds a whole batch at `execute`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine import datatypes
from engine.config.specs import ModelSpec, TensorSpec
from engine.errors import ExecutionCancelled, ExecutionError, ModelConfigError, ModelLoadError
from engine.interface import Backend, CancelToken, Context, LoadedModel, ModelMetadata, Outputs

POINTS = ("load", "clone", "prepare", "execute", "stream", "teardown", "measure")


class Defect(Exception):
    """The default error a failing gate raises."""


class GateTimeout(AssertionError):
    """A test waited longer than its bound for callers to reach a gate."""


class Gate:
    """One boundary of one model. Thread-safe; every method returns promptly except the waits."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cond = threading.Condition()  # guards every field below
        self._held = False
        self._arrivals = 0  # callers that reached the gate, in total
        self._blocked = 0  # callers blocked at it now
        self._failures: list[BaseException | type[BaseException]] = []
        self._fail_at: dict[int, BaseException | type[BaseException]] = {}
        self._hold_from = 0  # > 0: arrivals with this number or later are held

    # ---- test side ------------------------------------------------------------------------------------------

    def hold(self) -> Gate:
        """Block every caller that arrives from now on, until `release`."""
        with self._cond:
            self._held = True
        return self

    def hold_from(self, arrival: int) -> Gate:
        """Let the first `arrival - 1` callers (counting earlier ones) through and hold every later one, until
        `release`. Callers already blocked below `arrival` go on."""
        with self._cond:
            self._hold_from = arrival
            self._cond.notify_all()
        return self

    def release(self) -> None:
        """Let blocked callers through and stop holding."""
        with self._cond:
            self._held = False
            self._hold_from = 0
            self._cond.notify_all()

    def fail_next(self, error: BaseException | type[BaseException] = Defect, times: int = 1) -> Gate:
        """The next `times` arrivals raise `error` (after waiting if held)."""
        with self._cond:
            self._failures.extend([error] * times)
        return self

    def fail_arrival(self, number: int, error: BaseException | type[BaseException] = Defect) -> Gate:
        """The `number`-th arrival in total (1-based, counting earlier ones) raises `error`."""
        with self._cond:
            self._fail_at[number] = error
        return self

    def wait_arrivals(self, count: int, timeout: float = 10.0) -> None:
        """Block until `count` callers in total have reached the gate. Raises GateTimeout after `timeout`."""
        self._wait(lambda: self._arrivals >= count, timeout, f"{count} arrival(s)")

    def wait_blocked(self, count: int, timeout: float = 10.0) -> None:
        """Block until `count` callers are blocked at the gate now."""
        self._wait(lambda: self._blocked >= count, timeout, f"{count} blocked caller(s)")

    def _wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise GateTimeout(
                    f"gate '{self.name}': waited {timeout} s for {what}; "
                    f"arrivals={self._arrivals} blocked={self._blocked}"
                )

    @property
    def arrivals(self) -> int:
        with self._cond:
            return self._arrivals

    @property
    def blocked(self) -> int:
        with self._cond:
            return self._blocked

    def _holds(self, number: int) -> bool:
        return self._held or (self._hold_from > 0 and number >= self._hold_from)

    # ---- engine side ----------------------------------------------------------------------------------------

    def passing(self, cancel: CancelToken | None = None) -> None:
        """Called by the fixture engine at its boundary: count, block while held, maybe fail.

        A held gate also lets a cancelled caller go (raising ExecutionCancelled), as a real interruptible
        backend would.
        """
        woken = None
        if cancel is not None:

            def woken() -> None:
                with self._cond:
                    self._cond.notify_all()

            cancel.add_callback(woken)
        try:
            with self._cond:
                self._arrivals += 1
                number = self._arrivals
                self._cond.notify_all()
                self._blocked += 1
                try:
                    self._cond.wait_for(lambda: not self._holds(number) or (cancel is not None and cancel.cancelled))
                finally:
                    self._blocked -= 1
                    self._cond.notify_all()
                error = self._fail_at.pop(number, None)
                if error is None and self._failures:
                    error = self._failures.pop(0)
            if cancel is not None and cancel.cancelled and self.name.endswith(("execute", "prepare", "stream")):
                raise ExecutionCancelled(f"cancelled at gate {self.name}")
            if error is not None:
                raise error
        finally:
            if woken is not None and cancel is not None:
                cancel.remove_callback(woken)


_CANCELLABLE = ("prepare", "execute", "stream")


def _file_gate(spec_parameters: Mapping[str, str], model: str, point: str, cancel: CancelToken | None) -> None:
    """The cross-process gate (see `gate_dir` in the module docstring). Polls the folder every few
    milliseconds: this is test machinery inside the server, never on a request path of a real backend."""
    if spec_parameters.get("hang") == point:
        threading.Event().wait()  # a hung backend call: never returns
    directory = spec_parameters.get("gate_dir")
    if not directory:
        return
    # Path.with_suffix would replace ".<point>" itself (m.execute -> m.hold): build each name in full.
    base = f"{model}.{point}"
    folder = Path(directory)
    if not (folder / f"{base}.hold").exists():
        return
    (folder / f"{base}.arrived").touch()
    release = folder / f"{base}.release"
    pause = threading.Event()
    while not release.exists():
        if cancel is not None and cancel.cancelled and point in _CANCELLABLE:
            raise ExecutionCancelled(f"cancelled at file gate {base}")
        pause.wait(0.005)


class FixtureControls:
    """Gates per (model, point), plus counters of what the fixture built and freed."""

    def __init__(self, *, keep_events: bool = True) -> None:
        """`keep_events=False` keeps only the counters: a long-running server (the soak) would otherwise grow
        `events` by one entry per request and load without bound."""
        self._lock = threading.Lock()  # guards: _gates, counters, events
        self._gates: dict[tuple[str, str], Gate] = {}
        self._keep_events = keep_events
        self.counters: Counter[str] = Counter()
        self.events: list[tuple[str, str]] = []  # (model, event) in order: "load", "clone", "close_context", ...
        self._batches: dict[str, list[int]] = {}  # model -> rows of each run of a batching model, in order
        self._memory: dict[str, int] = {}  # model -> bytes its pools report now, set by the test (set_memory)

    def gate(self, model: str, point: str) -> Gate:
        if point not in POINTS:
            raise ValueError(f"unknown gate point {point!r}; use one of {POINTS}")
        with self._lock:
            gate = self._gates.get((model, point))
            if gate is None:
                gate = self._gates[(model, point)] = Gate(f"{model}.{point}")
            return gate

    def record(self, model: str, event: str) -> None:
        with self._lock:
            self.counters[f"{model}.{event}"] += 1
            if self._keep_events:
                self.events.append((model, event))

    def record_batch(self, model: str, rows: int) -> None:
        with self._lock:
            if self._keep_events:
                self._batches.setdefault(model, []).append(rows)

    def batches(self, model: str) -> list[int]:
        """The rows (batch dimension) of each run of a batching model, in order."""
        with self._lock:
            return list(self._batches.get(model, ()))

    def set_memory(self, model: str, nbytes: int | None) -> None:
        """From now on every pool of `model` reports `nbytes` (what it holds now, whatever its slot count), as a
        model whose memory grows or shrinks with use; None: back to its configured memory_bytes."""
        with self._lock:
            if nbytes is None:
                self._memory.pop(model, None)
            else:
                self._memory[model] = nbytes

    def memory(self, model: str) -> int | None:
        """The bytes `set_memory` gave `model`, None when not set."""
        with self._lock:
            return self._memory.get(model)

    def count(self, model: str, event: str) -> int:
        with self._lock:
            return self.counters[f"{model}.{event}"]

    def live_contexts(self, model: str) -> int:
        return self.count(model, "clone") - self.count(model, "close_context")

    def live_engines(self, model: str) -> int:
        return self.count(model, "load") - self.count(model, "close_engine")

    def release_all(self) -> None:
        with self._lock:
            gates = list(self._gates.values())
        for gate in gates:
            gate.release()


@dataclass
class _Settings:
    capacity: int
    stream_responses: int
    memory_bytes: int
    slot_memory_bytes: int


def _int_option(spec: ModelSpec, key: str, default: int) -> int:
    raw = spec.parameter(key)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise ModelConfigError(f"model '{spec.name}': parameter {key} must be an integer, got {raw!r}") from None


class FixtureContext(Context):
    def __init__(self, model: FixtureModel) -> None:
        self._model = model
        self._busy = threading.Lock()  # proves the one-thread-per-context rule holds

    def _compute(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> Outputs:
        metadata = self._model.metadata
        names = list(outputs) or [t.name for t in metadata.outputs]
        values = list(inputs.values())
        result = {}
        for index, spec in enumerate(metadata.outputs):
            if spec.name in names:
                source = values[min(index, len(values) - 1)] if values else np.zeros(0, np.float32)
                result[spec.name] = np.asarray(source).astype(datatypes.numpy_dtype(spec.datatype), copy=False)
        return result

    def _pass(self, point: str, cancel: CancelToken) -> None:
        self._model.controls.gate(self._model.name, point).passing(cancel)
        _file_gate(self._model.parameters, self._model.name, point, cancel)

    def _enter(self) -> None:
        if not self._busy.acquire(blocking=False):
            raise ExecutionError("fixture context used by two threads at once")

    def execute(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], cancel: CancelToken) -> Outputs:
        controls, name = self._model.controls, self._model.name
        self._enter()
        try:
            self._pass("prepare", cancel)
            if cancel.cancelled:
                raise ExecutionCancelled("skipped: the caller gave up before the run")
            controls.record(name, "execute")
            if self._model.metadata.max_batch_size > 0 and inputs:
                controls.record_batch(name, len(next(iter(inputs.values()))))
            self._pass("execute", cancel)
            return self._compute(inputs, outputs)
        finally:
            self._busy.release()

    def execute_stream(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], cancel: CancelToken
    ) -> Iterator[Outputs]:
        controls, name = self._model.controls, self._model.name
        self._enter()
        try:
            self._pass("prepare", cancel)
            controls.record(name, "execute")
            for _ in range(max(1, self._model.settings.stream_responses)):
                self._pass("stream", cancel)
                yield self._compute(inputs, outputs)
        finally:
            self._busy.release()

    def close(self) -> None:
        self._model.controls.record(self._model.name, "close_context")


class FixtureModel(LoadedModel):
    def __init__(
        self, spec: ModelSpec, controls: FixtureControls, settings: _Settings, metadata: ModelMetadata
    ) -> None:
        self.name = spec.name
        self.parameters = spec.parameters
        self.controls = controls
        self.settings = settings
        self.metadata = metadata
        self.max_parallel_slots = settings.capacity
        self.streaming = settings.stream_responses > 0
        self.interruptible = True
        self._clones = 0
        self._lock = threading.Lock()  # guards: _clones

    def create_context(self) -> Context:
        with self._lock:
            self._clones += 1
        self.controls.gate(self.name, "clone").passing()
        _file_gate(self.parameters, self.name, "clone", None)
        self.controls.record(self.name, "clone")
        return FixtureContext(self)

    def memory_bytes(self, slots: int) -> int:
        self.controls.gate(self.name, "measure").passing()
        measured = self.controls.memory(self.name)
        if measured is not None:
            return measured
        return self.settings.memory_bytes + slots * self.settings.slot_memory_bytes

    def close(self) -> None:
        self.controls.gate(self.name, "teardown").passing()
        _file_gate(self.parameters, self.name, "teardown", None)
        self.controls.record(self.name, "close_engine")


def _default_metadata(spec: ModelSpec) -> ModelMetadata:
    inputs = spec.inputs or (TensorSpec("INPUT0", "FP32", (-1,)),)
    outputs = spec.outputs or (TensorSpec("OUTPUT0", inputs[0].datatype, inputs[0].shape),)
    return ModelMetadata(inputs, outputs, spec.max_batch_size, spec.platform or "fixture")


class FixtureBackend(Backend):
    """Backend "fixture". Tests pass their FixtureControls; the server's default instance has its own, which
    keeps counters but no event list (nothing in a served process reads it)."""

    name = "fixture"

    def __init__(self, controls: FixtureControls | None = None) -> None:
        self.controls = controls or FixtureControls(keep_events=False)

    def load(self, spec: ModelSpec) -> LoadedModel:
        settings = _Settings(
            capacity=max(1, _int_option(spec, "capacity", 16)),
            stream_responses=_int_option(spec, "stream_responses", 0),
            memory_bytes=_int_option(spec, "memory_bytes", 0),
            slot_memory_bytes=_int_option(spec, "slot_memory_bytes", 0),
        )
        self.controls.gate(spec.name, "load").passing()
        _file_gate(spec.parameters, spec.name, "load", None)
        self.controls.record(spec.name, "load")
        if spec.parameter("fail_load"):
            self.controls.record(spec.name, "close_engine")
            raise ModelLoadError(f"model '{spec.name}': fixture load failure ({spec.parameter('fail_load')})")
        return FixtureModel(spec, self.controls, settings, _default_metadata(spec))
