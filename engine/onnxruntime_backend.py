"""ONNX Runtime on CPU: one shared InferenceSession per model, one run state per slot.

The session (weights, graph) is loaded once. `InferenceSession.run` is thread-safe and releases the GIL, so
several slots run concurrently on one session; each slot owns its RunOptions, which is how a running request is
terminated when its caller gives up (`RunOptions.terminate`).

Parameters read from config.pbtxt (all optional):
    intra_op_num_threads   threads one run may use (default 1: slots, not intra-op threads, use the cores)
    inter_op_num_threads   default 1
    graph_optimization_level   disable | basic | extended | all (default all)
    max_parallel_slots     cap on the advertised capacity (default 16)

BYTES tensors are ONNX string tensors, which hold text: elements must be UTF-8 and come back UTF-8 encoded.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Mapping, Sequence

import numpy as np

from . import datatypes
from .errors import ExecutionCancelled, ExecutionError, InvalidInputError, ModelConfigError
from .interface import Backend, CancelToken, Context, LoadedModel, ModelMetadata, ModelSpec, Outputs, TensorSpec
from .repository import hide_paths, shown_path

_LOG = logging.getLogger(__name__)

MAX_SLOTS = 16
_OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")


def _ort():
    import onnxruntime

    return onnxruntime


# The most threads a session's pools may have: more is a typo, and ONNX Runtime does not refuse it (beyond an
# int32 it raised a TypeError; 200 000 hung the load while it created threads, and 1024 spinning threads took
# over 20 s to load on two cores).
MAX_THREADS = 256


def session_options(spec: ModelSpec):
    """The SessionOptions slotserve uses for `spec` (public so tests can build an identical session)."""
    ort = _ort()
    options = ort.SessionOptions()
    options.intra_op_num_threads = _int_parameter(spec, "intra_op_num_threads", 1, minimum=0, maximum=MAX_THREADS)
    options.inter_op_num_threads = _int_parameter(spec, "inter_op_num_threads", 1, minimum=0, maximum=MAX_THREADS)
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    level = spec.parameter("graph_optimization_level", "all")
    if level not in _OPTIMIZATION_LEVELS:
        raise ModelConfigError(
            f"model '{spec.name}': graph_optimization_level must be one of {', '.join(_OPTIMIZATION_LEVELS)}"
        )
    options.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    options.log_severity_level = 3
    return options


def _resident_bytes() -> int:
    """Resident memory of this process (Linux /proc), 0 where it cannot be read."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _int_parameter(spec: ModelSpec, key: str, default: int, minimum: int, maximum: int | None = None) -> int:
    raw = spec.parameter(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ModelConfigError(f"model '{spec.name}': parameter {key} must be an integer, got {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"{minimum}..{maximum}"
        raise ModelConfigError(f"model '{spec.name}': parameter {key} must be {bounds}, got {value}")
    return value


def _model_tensor(node, origin: str) -> TensorSpec:
    datatype = datatypes.ORT_TYPE_STRING.get(node.type)
    if datatype is None:
        raise ModelConfigError(f"{origin}: tensor '{node.name}' has unsupported type {node.type}")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (node.shape or ()))
    return TensorSpec(node.name, datatype, shape)


def _reconcile(
    declared: tuple[TensorSpec, ...], actual: list[TensorSpec], max_batch_size: int, kind: str, origin: str
) -> tuple[TensorSpec, ...]:
    """The model's tensors as served: the declared ones checked against the model, or the model's own
    (auto-completed) when the configuration declares none."""
    by_name = {t.name: t for t in actual}
    batch = max_batch_size > 0

    def served_shape(tensor: TensorSpec) -> tuple[int, ...]:
        if not batch:
            return tensor.shape
        if not tensor.shape:
            raise ModelConfigError(
                f"{origin}: {kind} '{tensor.name}' has no batch dimension but max_batch_size is {max_batch_size}"
            )
        return tensor.shape[1:]

    if not declared:
        return tuple(TensorSpec(t.name, t.datatype, served_shape(t)) for t in actual)
    for spec in declared:
        model = by_name.get(spec.name)
        if model is None:
            raise ModelConfigError(f"{origin}: {kind} '{spec.name}' is not in the model; it has {sorted(by_name)}")
        if model.datatype != spec.datatype:
            raise ModelConfigError(
                f"{origin}: {kind} '{spec.name}' is {model.datatype} in the model, {spec.datatype} in the config"
            )
        model_dims = served_shape(model)
        if len(model_dims) != len(spec.shape) or any(
            m != -1 and d != -1 and m != d for m, d in zip(model_dims, spec.shape, strict=True)
        ):
            raise ModelConfigError(
                f"{origin}: {kind} '{spec.name}' has dims {list(model_dims)} in the model "
                f"({'after the batch dimension' if batch else 'no batching'}), {list(spec.shape)} in the config"
            )
    if kind == "input":
        missing = sorted(set(by_name) - {s.name for s in declared})
        if missing:
            raise ModelConfigError(f"{origin}: the model's inputs {missing} are not in the config")
    return declared


def _without_sequence_tensors(
    spec: ModelSpec, inputs: list[TensorSpec], outputs: list[TensorSpec], origin: str
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The model's inputs and outputs less a sequence model's control and state tensors (engine/sequence_config.py),
    each checked to be in the model with its datatype. Raises ModelConfigError naming the tensor."""
    assert spec.sequence is not None
    filled = spec.sequence.provided_inputs()
    by_name = {t.name: t for t in inputs}
    for name, datatype in filled.items():
        found = by_name.get(name)
        if found is None:
            raise ModelConfigError(f"{origin}: sequence_batching fills input '{name}', which is not in the model")
        if found.datatype != datatype:
            raise ModelConfigError(
                f"{origin}: sequence_batching input '{name}' is {found.datatype} in the model, {datatype} in the config"
            )
    kept = set(spec.sequence.state_outputs())
    missing = sorted(kept - {t.name for t in outputs})
    if missing:
        raise ModelConfigError(f"{origin}: sequence_batching state outputs {missing} are not in the model")
    return [t for t in inputs if t.name not in filled], [t for t in outputs if t.name not in kept]


def served_metadata(spec: ModelSpec, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> ModelMetadata:
    """What a model whose graph has `inputs` and `outputs` serves under `spec`: a sequence model's control and state
    tensors set aside (the server fills and keeps them), then the declared tensors checked against the graph's (or
    the graph's own when none are declared). Pure: the load calls it with the session's tensors, `python -m service
    check` with the file's. Raises ModelConfigError naming the tensor."""
    origin = f"model '{spec.name}'"
    if spec.sequence is not None:  # the inputs and outputs the server fills and keeps are not the client's
        inputs, outputs = _without_sequence_tensors(spec, inputs, outputs, origin)
    return ModelMetadata(
        inputs=_reconcile(spec.inputs, inputs, spec.max_batch_size, "input", origin),
        outputs=_reconcile(spec.outputs, outputs, spec.max_batch_size, "output", origin),
        max_batch_size=spec.max_batch_size,
        platform=spec.platform or "onnxruntime_onnx",
    )


def parallel_slots(spec: ModelSpec) -> int:
    """The most slots a model's session serves (its max_parallel_slots parameter, at most MAX_SLOTS). Raises
    ModelConfigError for a parameter that is not an integer >= 1."""
    return min(MAX_SLOTS, _int_parameter(spec, "max_parallel_slots", MAX_SLOTS, minimum=1))


def _to_ort_input(name: str, array: np.ndarray) -> np.ndarray:
    if array.dtype != object:
        return array
    try:
        return np.array([element.decode("utf-8") for element in array.reshape(-1)], dtype=object).reshape(array.shape)
    except UnicodeDecodeError:
        raise InvalidInputError(
            f"input '{name}': ONNX string tensors hold text and an element is not valid UTF-8"
        ) from None


def _from_ort_output(array: np.ndarray) -> np.ndarray:
    if array.dtype != object:
        return array
    flat = [e.encode("utf-8") if isinstance(e, str) else bytes(e) for e in array.reshape(-1)]
    result = np.empty(len(flat), dtype=object)
    result[:] = flat
    return result.reshape(array.shape)


class OnnxRuntimeContext(Context):
    """One slot: its own RunOptions over the shared session.

    A cancelled caller's run is stopped with `RunOptions.terminate`, set by a callback on its CancelToken. A
    token runs its callbacks after it lets go of its own lock, so removing the callback when the run ends does
    not stop one already on its way: it can arrive while the slot runs the *next* lease's request. Each run
    therefore has a number, and a callback terminates only the run it was registered for (checked under
    `_lock`, which the next run takes to begin).
    """

    def __init__(self, model: OnnxRuntimeModel) -> None:
        self._model = model
        self._run_options = _ort().RunOptions()
        self._run_options.log_severity_level = 3
        self._lock = threading.Lock()  # guards: _run, _terminated, _run_options.terminate
        self._run = 0  # the number of the current (or last) run on this slot
        self._terminated = False

    def _terminate(self, run: int) -> None:
        with self._lock:
            if run != self._run:
                return  # a late callback of an earlier lease: this run's caller did not give up
            self._terminated = True
            self._run_options.terminate = True

    def _begin_run(self) -> int:
        with self._lock:
            self._run += 1
            if self._terminated:  # the previous run on this slot was terminated: clear the flag first
                self._terminated = False
                self._run_options.terminate = False
            return self._run

    def execute(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], cancel: CancelToken) -> Outputs:
        model = self._model
        names = list(outputs) if outputs else model.output_names
        feed = (
            inputs if not model.string_inputs else {name: _to_ort_input(name, array) for name, array in inputs.items()}
        )
        if cancel.cancelled:
            raise ExecutionCancelled("the caller gave up before the run started")
        terminate = functools.partial(self._terminate, self._begin_run())
        cancel.add_callback(terminate)
        try:
            results = model.run(names, feed, self._run_options)
        except Exception as error:  # onnxruntime raises its own exception types, all Exception subclasses
            if cancel.cancelled:
                raise ExecutionCancelled("the run was terminated because the caller gave up") from None
            _LOG.error("model '%s': onnxruntime run failed: %s", model.name, error)
            raise ExecutionError(f"model '{model.name}' failed to execute") from error
        finally:
            cancel.remove_callback(terminate)
        if model.string_outputs:
            return {name: _from_ort_output(array) for name, array in zip(names, results, strict=True)}
        return dict(zip(names, results, strict=True))


class OnnxRuntimeModel(LoadedModel):
    """The shared session of one model."""

    interruptible = True

    def __init__(self, spec: ModelSpec, session, metadata: ModelMetadata, weights_bytes: int) -> None:
        self.name = spec.name
        self.session = session
        # The binding's run, without the Python wrapper's re-validation (inputs were checked against the model's
        # metadata already); falls back to the public method where the binding is not exposed.
        binding = getattr(session, "_sess", None)
        self.run = binding.run if binding is not None and hasattr(binding, "run") else session.run
        self.metadata = metadata
        self.output_names = [t.name for t in metadata.outputs]
        self.string_inputs = any(t.datatype == "BYTES" for t in metadata.inputs)
        self.string_outputs = any(t.datatype == "BYTES" for t in metadata.outputs)
        self.max_parallel_slots = parallel_slots(spec)
        self._weights_bytes = weights_bytes

    def create_context(self) -> Context:
        return OnnxRuntimeContext(self)

    def memory_bytes(self, slots: int) -> int:
        # Slots share the session's weights and arena; a slot itself is a RunOptions object.
        return self._weights_bytes

    def close(self) -> None:
        self.session = None
        self.run = None


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def load(self, spec: ModelSpec) -> LoadedModel:
        ort = _ort()
        origin = f"model '{spec.name}'"
        if spec.model_file is None or not spec.model_file.exists():
            raise ModelConfigError(f"{origin}: model file not found")
        options = session_options(spec)
        resident_before = _resident_bytes()
        try:
            session = ort.InferenceSession(str(spec.model_file), options, providers=["CPUExecutionProvider"])
        except Exception as error:
            _LOG.error("%s: onnxruntime could not load %s: %s", origin, spec.model_file, error)
            # ONNX Runtime's text quotes absolute paths (the file, its external data): the client gets them
            # relative to the repository.
            raise ModelConfigError(
                f"{origin}: onnxruntime could not load {shown_path(spec.model_file, spec.roots)}: "
                f"{hide_paths(str(error).splitlines()[0], spec.roots)[:300]}"
            ) from None
        inputs = [_model_tensor(node, origin) for node in session.get_inputs()]
        outputs = [_model_tensor(node, origin) for node in session.get_outputs()]
        metadata = served_metadata(spec, inputs, outputs)
        # What the session added to the process (weights, graph, arena), measured as it was built; the file size
        # when concurrent activity makes the measurement useless.
        grown = _resident_bytes() - resident_before
        weights = grown if grown > 0 else os.path.getsize(spec.model_file)
        return OnnxRuntimeModel(spec, session, metadata, weights)
