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

Memory (what the pool reports, which --memory-budget counts): the C heap's growth while the session is built
(glibc's `mallinfo2`: bytes malloc handed out and not taken back, which the allocator's reuse of freed memory
does not hide, unlike the process's resident size: a reloaded model used to report 4 KiB), never less than the
model file's size. It is measured on the first load of a file in this process and remembered per file (path,
device, inode, size, modification time) and session options, so every later load of the same file reports the
same figure. What runs allocate later (ONNX Runtime's arena grows with the inputs) is not in it. Where mallinfo2
is missing (not glibc) the figure is the file's size.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import logging
import os
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from . import datatypes
from .config.files import hide_paths, shown_path
from .config.specs import ModelSpec, TensorSpec
from .errors import ExecutionCancelled, ExecutionError, InvalidInputError, ModelConfigError
from .interface import Backend, CancelToken, Context, LoadedModel, ModelMetadata, Outputs

_LOG = logging.getLogger(__name__)

MAX_SLOTS = 16
_OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")


def _ort() -> types.ModuleType:
    import onnxruntime

    module: types.ModuleType = onnxruntime  # the library has no type hints: it is a module, used as one
    return module


# The most threads a session's pools may have: more is a typo, and ONNX Runtime does not refuse it (beyond an
# int32 it raised a TypeError; 200 000 hung the load while it created threads, and 1024 spinning threads took
# over 20 s to load on two cores).
MAX_THREADS = 256


def session_options(spec: ModelSpec) -> Any:  # onnxruntime.SessionOptions (the library has no type hints)
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


_MALLINFO2_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")


class _MallInfo2(ctypes.Structure):
    """glibc's struct mallinfo2: ten size_t counters."""

    _fields_ = [(name, ctypes.c_size_t) for name in (*_MALLINFO2_FIELDS, "keepcost")]


@functools.cache
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    """glibc's mallinfo2 (2.33 and later), None elsewhere."""
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    function.argtypes = []
    return function


def _heap_bytes() -> int | None:
    """Bytes the C heap has handed out and not taken back (small blocks and mmapped ones), None where glibc's
    mallinfo2 is not available."""
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        return None
    info = mallinfo2()
    return int(info.uordblks + info.hblkhd)


class _SessionKey(NamedTuple):
    """Which file (as it is on disk now), and which session options, a session is built from."""

    path: str
    device: int
    inode: int
    size: int
    modified_ns: int
    options: tuple[str | None, ...]


class _SessionSizes:
    """What a session of each model file took when first built in this process (see the module docstring).
    Bounded: the oldest figures go first. Thread-safe; its lock is a leaf held for dictionary work only."""

    LIMIT = 512

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards: _sizes
        self._sizes: collections.OrderedDict[_SessionKey, int] = collections.OrderedDict()

    def get(self, key: _SessionKey) -> int | None:
        with self._lock:
            return self._sizes.get(key)

    def remember(self, key: _SessionKey, size: int) -> int:
        """Keep `size` for `key` unless a figure is already there (a load that ran at the same time); returns the
        figure kept."""
        with self._lock:
            kept = self._sizes.setdefault(key, size)
            self._sizes.move_to_end(key)
            while len(self._sizes) > self.LIMIT:
                self._sizes.popitem(last=False)
            return kept


_SESSION_SIZES = _SessionSizes()


def _session_key(spec: ModelSpec) -> _SessionKey | None:
    """Which file, and which session options, a session is built from; None when the file cannot be read."""
    assert spec.model_file is not None
    try:
        stat = os.stat(spec.model_file)
    except OSError:
        return None
    options = tuple(
        spec.parameter(name, "")
        for name in ("graph_optimization_level", "intra_op_num_threads", "inter_op_num_threads")
    )
    return _SessionKey(str(spec.model_file), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, options)


def session_memory_bytes(spec: ModelSpec) -> int | None:
    """The figure remembered for `spec`'s model file (what its pools report), None when no session of that file
    was built in this process."""
    key = _session_key(spec)
    return _SESSION_SIZES.get(key) if key is not None else None


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


def _model_tensor(node: Any, origin: str) -> TensorSpec:  # node: an onnxruntime NodeArg
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
    """The model's inputs and outputs less a sequence model's control and state tensors
    (engine/config/sequence_batching.py), each checked to be in the model with its datatype. Raises
    ModelConfigError naming the tensor."""
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


# BYTES inputs go to ONNX Runtime as numpy unicode arrays (4 bytes a character, the longest element's width) when
# that takes no more than this many bytes an element (beside their contents): a str object behind a pointer,
# the other way, takes about 72 bytes for a short one. 2 million 2-byte elements: 16 MiB instead of 144 MiB.
_OBJECT_ELEMENT_BYTES = 72


def _to_ort_input(name: str, array: np.ndarray) -> np.ndarray:
    """A BYTES input as ONNX Runtime takes a string tensor: a numpy unicode array when the elements are short
    enough for one (see _OBJECT_ELEMENT_BYTES), else an object array of str. Raises InvalidInputError naming the
    input when an element is not UTF-8 (ONNX strings hold text)."""
    if array.dtype.kind == "U" or (array.dtype != object and array.dtype.kind != "S"):
        return array
    try:
        compact = _unicode_array(array)
        return compact if compact is not None else _str_objects(array)
    except UnicodeDecodeError:
        raise InvalidInputError(
            f"input '{name}': ONNX string tensors hold text and an element is not valid UTF-8"
        ) from None


def _unicode_array(array: np.ndarray) -> np.ndarray | None:
    """`array`'s elements (bytes) decoded into a numpy unicode array, or None when that would take more memory
    than str objects (one long element among many short ones), or cannot hold them exactly (an element ending
    with NUL bytes, which numpy's fixed-width strings drop; an element that is not bytes)."""
    count = array.size
    if not count:
        return None
    if array.dtype.kind == "S":
        fixed = array.reshape(-1)
        width = array.dtype.itemsize
        lengths = np.strings.str_len(fixed)
    else:
        flat = array.reshape(-1)
        try:
            lengths = np.fromiter(map(len, flat), dtype=np.int64, count=count)
        except TypeError:
            return None
        width = max(1, int(lengths.max()))
        if count * width * 5 > count * _OBJECT_ELEMENT_BYTES + int(lengths.sum()):  # 'S' then 'U': 5 bytes a byte
            return None
        if not all(type(element) is bytes for element in flat):
            return None
        fixed = flat.astype(f"S{width}")
        if not np.array_equal(np.strings.str_len(fixed), lengths):
            return None  # an element ends with NUL: its fixed-width copy lost them
    if _holds_nul(fixed, lengths, width):
        return None  # ONNX Runtime reads a unicode array's elements as C strings: "he\0llo" would reach it as "he"
    del lengths
    if int(fixed.view(np.uint8).max(initial=0)) < 0x80:  # ASCII, the common case: numpy converts it in one pass
        text = fixed.astype(f"U{width}")
    else:
        text = np.strings.decode(fixed, "utf-8")
    return text.reshape(array.shape)


def _holds_nul(fixed: np.ndarray, lengths: np.ndarray, width: int) -> bool:
    """Whether an element of `fixed` (a flat 'S' array; `lengths` its elements' lengths) has a NUL byte inside it
    (the NULs past an element's length are the fixed width's padding)."""
    cells = fixed.view(np.uint8).reshape(-1, width)
    inside = np.arange(width) < lengths[:, None]
    return bool(np.any((cells == 0) & inside))


def _str_objects(array: np.ndarray) -> np.ndarray:
    """An object array of str, each element decoded straight into the result (no list of them first)."""
    result = np.empty(array.size, dtype=object)
    for index, element in enumerate(array.reshape(-1)):
        result[index] = element if isinstance(element, str) else bytes(element).decode("utf-8")
    return result.reshape(array.shape)


def _from_ort_output(array: np.ndarray) -> np.ndarray:
    """ONNX Runtime's string output (str objects) as BYTES (bytes objects), replaced in place one element at a
    time: each str is freed as its bytes takes its place, so the two arrays' objects are never all alive at once
    (a copy beside the original held 2 million short strings twice: about 250 MiB)."""
    if array.dtype != object:
        return array
    array = np.ascontiguousarray(array)  # ONNX Runtime's own output: already contiguous, not copied
    flat = array.reshape(-1)  # a view: assigning to it replaces the output's elements
    for index, element in enumerate(flat):
        if type(element) is not bytes:
            flat[index] = element.encode("utf-8") if isinstance(element, str) else bytes(element)
    return array


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
        del feed  # converted BYTES inputs (ONNX Runtime copied them in) go before the outputs are converted
        if model.string_outputs:
            return {name: _from_ort_output(array) for name, array in zip(names, results, strict=True)}
        return dict(zip(names, results, strict=True))


class OnnxRuntimeModel(LoadedModel):
    """The shared session of one model."""

    interruptible = True

    def __init__(self, spec: ModelSpec, session: Any, metadata: ModelMetadata, memory_bytes: int) -> None:
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
        self._memory_bytes = memory_bytes

    def create_context(self) -> Context:
        return OnnxRuntimeContext(self)

    def memory_bytes(self, slots: int) -> int:
        # Slots share the session's weights and arena; a slot itself is a RunOptions object.
        return self._memory_bytes

    def close(self) -> None:
        self.session = None
        self.run = None


def _memory_figure(spec: ModelSpec, grown: int) -> int:
    """What a pool of `spec` reports: the figure remembered for its file, else `grown` (the heap's growth while
    this session was built), at least the file's size, remembered from now on."""
    key = _session_key(spec)
    if key is None:  # the file went away after the session read it: this load's own figure
        return max(grown, 0)
    remembered = _SESSION_SIZES.get(key)
    if remembered is not None:
        return remembered
    return _SESSION_SIZES.remember(key, max(grown, key.size))


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def load(self, spec: ModelSpec) -> LoadedModel:
        ort = _ort()
        origin = f"model '{spec.name}'"
        if spec.model_file is None or not spec.model_file.exists():
            raise ModelConfigError(f"{origin}: model file not found")
        options = session_options(spec)
        heap_before = _heap_bytes()
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
        heap_after = _heap_bytes()
        grown = heap_after - heap_before if heap_after is not None and heap_before is not None else 0
        memory = _memory_figure(spec, grown)
        inputs = [_model_tensor(node, origin) for node in session.get_inputs()]
        outputs = [_model_tensor(node, origin) for node in session.get_outputs()]
        metadata = served_metadata(spec, inputs, outputs)
        return OnnxRuntimeModel(spec, session, metadata, memory)
