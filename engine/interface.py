"""The engine interface: what the server needs from a backend. Nothing here knows about gRPC. What a backend loads
is a ModelSpec (engine/config/specs.py, read by the config reader); what it reports back is ModelMetadata (here).

    Backend.load(spec) -> LoadedModel          the primary: weights or engine loaded once, I/O validated
    LoadedModel.metadata                        inputs/outputs (name, datatype, shape with -1 = variable)
    LoadedModel.max_parallel_slots              advertised capacity; 1 = no parallel factory
    LoadedModel.create_context() -> Context     one per slot: ONNX Runtime run state, TensorRT context+stream+buffers
    Context.execute(inputs, outputs, cancel)    -> {name: ndarray}
    Context.execute_stream(...)                 -> iterator of partial outputs (streaming models only)
    Context.close(); LoadedModel.close()        contexts are always closed before their LoadedModel

Threading: the server guarantees that one Context is used by one thread at a time (by at most
`LoadedModel.requests_per_context` threads at once where a backend says it takes more), and that `close` is never
called while that context executes. Different contexts of one LoadedModel run concurrently. `load`,
`create_context` and the `close` methods block for as long as the backend needs; the server never holds a lock
across them.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .config.specs import ModelSpec, TensorSpec
from .errors import InvalidInputError

# Largest dimension and element count a request may ask for; anything above is refused as absurd before any
# memory is allocated for it.
MAX_DIMENSION = 1 << 40
MAX_ELEMENTS = 1 << 34


@dataclass(frozen=True)
class ModelMetadata:
    """What a loaded model takes and returns. `max_batch_size` follows the protocol: 0 means the model has no
    batch dimension; N > 0 means every tensor has a leading batch dimension of at most N."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int = 0
    platform: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_inputs_by_name", {t.name: t for t in self.inputs})
        object.__setattr__(self, "_outputs_by_name", {t.name: t for t in self.outputs})
        # Signatures that passed check_request. Steady traffic repeats a few of them, so a hit skips the checks;
        # the cache is bounded (cleared when full) so varying shapes cannot grow it.
        object.__setattr__(self, "_accepted", set())

    def input(self, name: str) -> TensorSpec | None:
        by_name: dict[str, TensorSpec] = self._inputs_by_name  # type: ignore[attr-defined]
        return by_name.get(name)

    def output(self, name: str) -> TensorSpec | None:
        by_name: dict[str, TensorSpec] = self._outputs_by_name  # type: ignore[attr-defined]
        return by_name.get(name)

    def wire_shape(self, tensor: TensorSpec) -> tuple[int, ...]:
        """Shape as the protocol reports it: a leading -1 for the batch dimension of a batching model."""
        return ((-1,) + tensor.shape) if self.max_batch_size > 0 else tensor.shape

    def check_request(self, inputs: Mapping[str, tuple[str, tuple[int, ...]]], outputs: Sequence[str]) -> None:
        """Check a request's inputs ({name: (datatype, shape)}) and requested output names against the model.

        Raises InvalidInputError naming the first problem: unknown input, missing input, wrong datatype, wrong
        rank or dimension, batch beyond max_batch_size, batch sizes that differ, unknown output.
        """
        key = (tuple(inputs.items()), tuple(outputs))
        accepted = self._accepted  # type: ignore[attr-defined]
        if key in accepted:
            return
        self._check_request(inputs, outputs)
        if len(accepted) >= 256:
            accepted.clear()
        accepted.add(key)

    def name_model(self, model: str) -> ModelMetadata:
        """Tell this metadata which model it describes (the pool does, when it publishes it): the refusals of
        `check_request` then name the model, as Triton's do. Returns self."""
        object.__setattr__(self, "_model", model)
        return self

    def _check_request(self, inputs: Mapping[str, tuple[str, tuple[int, ...]]], outputs: Sequence[str]) -> None:
        known = self._inputs_by_name  # type: ignore[attr-defined]
        required = [spec.name for spec in self.inputs if not spec.optional]
        if not required_count_fits(len(inputs), len(required), len(self.inputs)):
            model = getattr(self, "_model", "")
            raise InvalidInputError(missing_inputs_message(model, inputs, required, len(self.inputs)))
        for name, (datatype, shape) in inputs.items():
            spec = known.get(name)
            if spec is None:
                raise InvalidInputError(f"unknown input '{name}'; the model takes {sorted(known)}")
            if datatype != spec.datatype:
                raise InvalidInputError(f"input '{name}' has datatype {datatype}, the model expects {spec.datatype}")
            self._check_shape(spec, shape)
        if any(name not in inputs for name in required):  # as many inputs as needed, but not the required ones
            model = getattr(self, "_model", "")
            raise InvalidInputError(missing_inputs_message(model, inputs, required, len(self.inputs)))
        if self.max_batch_size > 0:
            batches = {shape[0] for (_, shape) in inputs.values() if shape}
            if len(batches) > 1:
                raise InvalidInputError(f"inputs have different batch sizes {sorted(batches)}")
        produced = self._outputs_by_name  # type: ignore[attr-defined]
        for name in outputs:
            if name not in produced:
                raise InvalidInputError(f"unknown requested output '{name}'; the model produces {sorted(produced)}")

    def _check_shape(self, spec: TensorSpec, shape: tuple[int, ...]) -> None:
        expected = spec.shape
        sent, wanted = list(shape), list(self.wire_shape(spec))  # as the client sees them: batch dimension included
        if self.max_batch_size > 0:
            if len(shape) != len(expected) + 1:
                raise InvalidInputError(
                    f"input '{spec.name}' has shape {list(shape)}; the model expects "
                    f"{list(self.wire_shape(spec))} (a batch dimension, then {list(expected)})"
                )
            if shape[0] < 1 or shape[0] > self.max_batch_size:
                raise InvalidInputError(
                    f"input '{spec.name}' has batch size {shape[0]}; the model accepts 1..{self.max_batch_size}"
                )
            shape = shape[1:]
        elif len(shape) != len(expected):
            raise InvalidInputError(f"input '{spec.name}' has shape {list(shape)}; the model expects {list(expected)}")
        for got, want in zip(shape, expected, strict=True):
            if want != -1 and got != want:
                raise InvalidInputError(f"input '{spec.name}' has shape {sent}; the model expects {wanted}")


def required_count_fits(given: int, required: int, total: int) -> bool:
    """Whether `given` inputs are as many as a model with `required` required inputs of `total` takes."""
    return required <= given <= total


def missing_inputs_message(model: str, given: Iterable[str], required: Sequence[str], total: int) -> str:
    """Triton's words for a request that does not give a model its required inputs (clients and Triton's own tests
    read them): "expected 3 inputs but got 1 inputs for model 'm'. Got input(s) ['INPUT0'], but missing required
    input(s) ['INPUT1','INPUT2']. Please provide all required input(s)." With optional inputs the count reads
    "expected number of inputs between 3 and 4"."""
    sent = sorted(given)
    missing = sorted(name for name in required if name not in sent)
    if len(required) == total:
        expected = f"{len(required)} inputs"
    else:
        expected = f"number of inputs between {len(required)} and {total}"
    where = f" for model '{model}'" if model else ""
    return (
        f"expected {expected} but got {len(sent)} inputs{where}. Got input(s) {_listed(sent)}, but missing required "
        f"input(s) {_listed(missing)}. Please provide all required input(s)."
    )


def _listed(names: Iterable[str]) -> str:
    """Names as Triton lists them: ['INPUT0','INPUT1']."""
    return "[" + ",".join(f"'{name}'" for name in names) + "]"


class TraceHook(Protocol):
    """What a backend may tell a traced request's trace (service/core/tracing.py RequestTrace implements it)."""

    def model_ran(self, nanoseconds: int) -> None:
        """The model's own code ran `nanoseconds` for this request's run (inside the engine call's round trip).
        Called on the thread that reads the run's answer, before the engine call returns; never blocks."""
        ...


class CancelToken:
    """Set when the caller of a request gave up (client cancel, deadline, disconnect, shutdown).

    Backends poll `cancelled` before starting work and may register a callback to interrupt a run (ONNX
    Runtime sets `RunOptions.terminate`). Callbacks run on the thread that cancels (or on the thread that adds
    one to a token already cancelled) and must not block. A callback added while the token is being cancelled
    may run twice, so callbacks must be idempotent; in exchange adding and removing one takes no lock (list
    appends and removals are atomic), which matters on the request path. For the same reason `remove_callback`
    is no fence: a callback the token has already taken up to run can still run after it was removed. A
    callback must therefore act only on what belongs to the request it was added for (ONNX Runtime's checks
    the run's number; see OnnxRuntimeContext), never on state a later request may own by then.
    """

    __slots__ = ("_lock", "_cancelled", "_callbacks", "reason", "request", "trace")

    def __init__(self) -> None:
        self._lock = threading.Lock()  # serializes cancel(): the first cancel decides `reason`
        self._cancelled = False
        self._callbacks: list[Callable[[], None]] = []
        self.reason = ""  # why it was cancelled, e.g. "shutdown"
        # What the request being run says about itself (set by the dataplane as it admits the request; each
        # request of a stream has a token of its own). Backends that show it to a model read it here.
        self.request: RequestInfo | None = None
        # The request's trace when it is traced (service/core/tracing.py RequestTrace): a backend copies it onto the
        # token of a call it makes for the request (a BLS call), whose trace becomes its child, and tells it how
        # long the model's own code ran where only the backend knows (a python model's worker).
        self.trace: TraceHook | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self, reason: str = "") -> None:
        with self._lock:
            if self._cancelled:
                return
            self.reason = reason
            self._cancelled = True  # set before the swap: an add that misses the swap sees it and runs itself
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Run `callback` when the token is cancelled (at once if it already is)."""
        self._callbacks.append(callback)
        if self._cancelled:
            callback()

    def remove_callback(self, callback: Callable[[], None]) -> None:
        try:
            self._callbacks.remove(callback)
        except ValueError:
            pass


Outputs = dict[str, np.ndarray]


class FinalOutputs(dict[str, np.ndarray]):
    """A streaming context's answer that the model sent together with its final flag (Triton's
    TRITONSERVER_RESPONSE_COMPLETE_FINAL on a response): the stream ends with it. A context yields it so that the
    front end can mark that response final (`triton_final_response`) instead of sending an empty one after it."""


@dataclass(frozen=True)
class RequestInfo:
    """What a request says about itself, beyond its tensors: its id, the client's request parameters (bool, int,
    float or str values; the protocol's own keys such as `timeout` are left out) and the client's deadline (on
    the monotonic clock; None: none). `correlation_id` and `flags` are Triton's view of the sequence parameters
    (`sequence_id`; `sequence_start` 1 | `sequence_end` 2). `priority` is the request's `priority` parameter (0: the
    model's default level), which an ensemble passes on to its steps."""

    id: str = ""
    parameters: Mapping[str, object] = field(default_factory=dict)
    deadline: float | None = None
    correlation_id: int | str = 0
    flags: int = 0
    priority: int = 0


class ModelCalls(ABC):
    """Calls from a backend to another model of the same server, through that model's own admission (FIFO,
    slots, batching): python models' BLS calls. The server hands one to every backend at start
    (`Backend.bind_model_calls`); the engine never imports the service that implements it."""

    @abstractmethod
    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str,
        outputs: Sequence[str],
        cancel: CancelToken,
        request: RequestInfo,
    ) -> Outputs:
        """Run `model` once. Blocks while queued (until `request.deadline` or the model's admission timeout) and
        for the run. Raises the server's errors (each with its status), cancellation once `cancel` fires."""

    @abstractmethod
    def infer_stream(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str,
        outputs: Sequence[str],
        cancel: CancelToken,
        request: RequestInfo,
    ) -> Iterator[Outputs]:
        """Run `model` once and yield each of its responses (a decoupled model's several, another model's one).
        Blocks as `infer`; closing the iterator early releases the callee's slot."""

    @staticmethod
    @abstractmethod
    def describe(error: BaseException) -> tuple[str, str]:
        """(status code name, message) a client would get for `error`, e.g. ("NOT_FOUND", "...")."""


class Context(ABC):
    """One slot's execution state over a LoadedModel. Used by one thread at a time."""

    @abstractmethod
    def execute(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], cancel: CancelToken) -> Outputs:
        """Run one request. `outputs` names the outputs to return (all of them when empty).

        Blocks for the run. Raises ExecutionCancelled if `cancel` fired before or during the run (a backend
        that cannot interrupt finishes the run first), ExecutionError on a backend failure.
        """

    def execute_stream(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], cancel: CancelToken
    ) -> Iterator[Outputs]:
        """Run one request of a streaming model, yielding partial outputs (the last one as FinalOutputs when the
        model marked it final as it sent it). The default yields `execute`'s."""
        yield self.execute(inputs, outputs, cancel)

    def execute_streams(self, members: Sequence[object]) -> list[Iterator[Outputs]]:
        """A streaming model's batch, on a backend whose LoadedModel has `batches_as_requests`: one engine call of
        `members` (each with .inputs, .outputs, .cancel), each member's answers as an iterator of its own, read on
        that member's own thread (close one to drop the rest of its answers). The context stays in use until every
        iterator has ended. Raises as `execute_stream`; by default the backend does not stream batches."""
        raise NotImplementedError("this backend does not stream a batch's answers")

    def close(self) -> None:  # noqa: B027 (optional hook: a context with nothing to free keeps this one)
        """Free the slot's resources. Never called while `execute` runs."""


class LoadedModel(ABC):
    """A model's shared engine (weights once), from which per-slot contexts are made."""

    metadata: ModelMetadata
    max_parallel_slots: int = 1
    # Requests one context runs at once (the pool lends it that many times; admission counts each): 1 for every
    # engine but python's async decoupled models, whose worker overlaps its calls as Triton's stub does.
    requests_per_context: int = 1
    streaming: bool = False
    interruptible: bool = False  # True when a running execute stops promptly on cancel

    @abstractmethod
    def create_context(self) -> Context:
        """Make one slot's context. Blocks; raises ModelLoadError (OutOfDeviceMemoryError when memory ran out)."""

    def create_context_cancellable(self, cancel: CancelToken) -> Context:
        """`create_context`, given up when `cancel` fires (see Backend.load_cancellable)."""
        return self.create_context()

    def memory_bytes(self, slots: int) -> int:
        """What a pool of this engine with `slots` contexts costs: weights once plus per-slot memory.
        0 when the backend cannot tell."""
        return 0

    def close(self) -> None:  # noqa: B027 (optional hook: an engine with nothing to free keeps this one)
        """Free the engine. Called after every context of it is closed."""


class Backend(ABC):
    """Loads models of one kind."""

    name: str

    @abstractmethod
    def load(self, spec: ModelSpec) -> LoadedModel:
        """Load the primary (weights/engine) for `spec` and check its I/O against the spec.

        Blocks for the load. Raises ModelConfigError (the spec does not fit the model files), ModelLoadError,
        or BackendUnavailableError (the backend cannot run here).
        """

    def load_cancellable(self, spec: ModelSpec, cancel: CancelToken) -> LoadedModel:
        """`load`, given up when `cancel` fires (an unload or the shutdown no longer wants it). A backend whose load
        can block in a model's own code (a python model's `initialize`) overrides it: it ends that work when
        `cancel` fires and raises ModelLoadError. By default a load is not interrupted (`cancel` is not read)."""
        return self.load(spec)

    def bind_model_calls(self, calls: ModelCalls) -> None:  # noqa: B027 (optional hook)
        """Take the server's calls to other models (python models' BLS); called once, before any load."""
