"""The specs: what a model is, as the config reader hands it to the server and the backends. Frozen dataclasses,
no reading and no I/O (engine/config/repository.py and its neighbours make them from a model's folder).

    ModelSpec           everything needed to load one version of one model
    TensorSpec          one declared input or output
    BatchingSpec        dynamic batching (config.pbtxt `dynamic_batching`, or an `oldest` sequence model's)
    PrioritySpec        its priority levels and queue policies (QueuePolicySpec), when it sets levels or DELAY
    VersionPolicy       which version folders are served (`version_policy`)
    WarmupSample/Input  the warmup requests (`model_warmup`)
    SequenceSpec        sequence batching (`sequence_batching`): its controls (SequenceControl) and implicit state
                        (SequenceState); the kinds and strategies are the constants below
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np

from .. import datatypes
from .files import ModelRoots
from .rate_limiter import RateLimiterSpec

# Triton's default for max_sequence_idle_microseconds (1 s).
DEFAULT_IDLE_US = 1_000_000

# The kinds of a sequence's control inputs, and the two strategies of sequence batching.
START, END, READY, CORRID = "start", "end", "ready", "corrid"
DIRECT, OLDEST = "direct", "oldest"


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model. `shape` excludes the batch dimension of a batching model."""

    name: str
    datatype: str  # KServe name, e.g. "FP32"
    shape: tuple[int, ...]  # -1 marks a variable dimension
    optional: bool = False


@dataclass(frozen=True)
class QueuePolicySpec:
    """One priority level's queue policy (config.pbtxt `ModelQueuePolicy`). Times in microseconds; 0: none."""

    max_queue_size: int = 0  # queued requests of this level (delayed ones included); 0: no limit of the level's
    default_timeout_us: int = 0  # how long a request of this level may wait in the queue
    allow_timeout_override: bool = False  # whether a request's `timeout` parameter may shorten it
    delay: bool = False  # timeout_action DELAY: past its timeout a request moves behind its level's others (REJECT:
    # it is refused)


@dataclass(frozen=True)
class PrioritySpec:
    """A batching model's priority levels (Triton's: level 1 is served first) and queue policies.

    `levels` 0 means one level (only `default_policy` matters, with DELAY); a request's `priority` 0, or above
    `levels`, takes `default_level`."""

    levels: int = 0
    default_level: int = 0
    default_policy: QueuePolicySpec = QueuePolicySpec()
    policies: tuple[tuple[int, QueuePolicySpec], ...] = ()  # (level, its own policy), by level

    def level_of(self, priority: int) -> int:
        """The level a request's `priority` parameter puts it on (Triton's rule)."""
        if priority == 0 or priority > self.levels:
            return self.default_level
        return priority

    def policy_of(self, level: int) -> QueuePolicySpec:
        """The queue policy of `level`: its own, else the default one."""
        return next((policy for key, policy in self.policies if key == level), self.default_policy)


@dataclass(frozen=True)
class BatchingSpec:
    """A model's dynamic batching settings (config.pbtxt `dynamic_batching`), as slotserve applies them.

    Present only on a model with `max_batch_size > 0` and the block; None on every other model. Queued requests
    whose tensors stack are handed to one slot as one engine call (service/core/admission.py says the rule).
    Changing only these settings keeps the engine loaded (they are not part of `ModelSpec.session_key`).
    """

    max_queue_delay_us: int = 0  # 0: opportunistic, batches form only from requests that had to queue
    preferred_batch_sizes: tuple[int, ...] = ()  # a delayed batch is dispatched once it reaches one of these
    preserve_ordering: bool = False  # accepted; each request gets its own response whatever the batch order
    max_queue_size: int = 0  # queued requests of this model; 0: the server's --max-queue
    default_timeout_us: int = 0  # admission timeout of this model's requests; 0: the model's admission timeout
    allow_timeout_override: bool = False  # whether a request's `timeout` parameter may shorten it
    # Priority levels and per-level queue policies (service/core/admission.py applies them per request). When set,
    # the three fields above are 0/False: they are what applies to a request before its level is known, and every
    # limit then depends on the level.
    priorities: PrioritySpec | None = None

    @property
    def largest_preferred(self) -> int:
        """The largest preferred batch size, or 0 when none is set."""
        return max(self.preferred_batch_sizes, default=0)


@dataclass(frozen=True)
class WarmupInput:
    """One input of a warmup sample (config.pbtxt `model_warmup[].inputs`), checked when the model is read.

    `data` says what the tensor holds: "zero" (every element zero, empty strings for BYTES), "random" (random
    values), or "file" (`file`: the raw row-major bytes, BYTES elements each a 4-byte little-endian length and its
    bytes, read from the model's `warmup/` folder; its size was checked against `shape`)."""

    name: str
    datatype: str  # KServe name, e.g. "FP32"
    shape: tuple[int, ...]  # without the batch dimension of a batching model; every dimension fixed (>= 0)
    data: str  # "zero", "random" or "file"
    file: Path | None = None  # the resolved path when data == "file"


@dataclass(frozen=True)
class WarmupSample:
    """One warmup request (config.pbtxt `model_warmup`), run `count` times (at least once).

    `batch_size` is the leading dimension added to every input's shape on a batching model (1..max_batch_size);
    on a model with max_batch_size 0 it is 1 and no dimension is added. Every required declared input of the
    model has an entry; each entry names a declared input with its datatype and a shape its dims accept."""

    name: str
    batch_size: int
    count: int
    inputs: tuple[WarmupInput, ...]


@dataclass(frozen=True)
class VersionPolicy:
    """Which numbered version folders a model serves (config.pbtxt `version_policy`; default: the latest one).

    kind "latest": the `num_versions` highest; "all": every one; "specific": those in `versions` that exist."""

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def select(self, available: Iterable[int]) -> tuple[int, ...]:
        """The versions this policy serves out of `available`, highest first (possibly none)."""
        present = sorted(set(available), reverse=True)
        if self.kind == "all":
            return tuple(present)
        if self.kind == "specific":
            return tuple(v for v in present if v in self.versions)
        return tuple(present[: self.num_versions])


def _frozen_mapping(value: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to load one model, as read from its repository directory (or a management request).

    `instance_count` is the slot count the configuration asks for (None: not set). `config` is the parsed
    inference.ModelConfig message, kept for the ModelConfig RPC; it does not take part in equality. `roots`
    (engine.config.files.ModelRoots) says where the model's files may be: a backend resolves a file parameter
    through it and shows paths relative to the repository in messages; None for a spec read from no repository.
    """

    name: str
    backend: str  # "onnxruntime", "tensorrt", "python" or "fixture"
    version: str = "1"
    directory: Path | None = None
    model_file: Path | None = None
    # What the engine reads, as it was when the spec was read (engine.config.files.files_stamp: every file of the
    # version folder by size, times, inode and, for small files, content); "" for a spec read from no repository.
    files: str = ""
    platform: str = ""
    max_batch_size: int = 0
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    instance_count: int | None = None
    parameters: Mapping[str, str] = field(default_factory=dict)
    batching: BatchingSpec | None = None  # dynamic batching; None: one request per engine call
    version_policy: VersionPolicy = VersionPolicy()  # every version it selects is served (its own spec)
    warmup: tuple[WarmupSample, ...] = ()  # run on every slot before the pool is published
    response_cache: bool = False  # `response_cache { enable: true }` (service/request_path/response_cache.py)
    sequence: SequenceSpec | None = None  # sequence_batching (engine/config/sequence_batching.py); None: no sequences
    rate_limiter: RateLimiterSpec | None = None  # instance_group[0].rate_limiter (engine/config/rate_limiter.py)
    config: object = field(default=None, compare=False, repr=False)
    roots: ModelRoots | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parameters", _frozen_mapping(self.parameters))

    def session_key(self) -> tuple[object, ...]:
        """What determines the engine built from this spec (everything except slot count and admission
        settings). Two specs with the same key can reuse each other's advertised capacity, and a reconfiguration
        keeps the engine only between them: `files` makes any change to the files the engine reads (model.py or a
        neighbour, the ONNX file or its external data, the plan) a new engine, as Triton reloads changed files."""
        params = tuple(sorted((k, v) for k, v in self.parameters.items() if not k.startswith("slotserve.")))
        # The inputs a sequence model's server fills are checked against the engine at load, so they are part of it.
        filled = tuple(sorted(self.sequence.provided_inputs().items())) if self.sequence is not None else ()
        # An ensemble's engine is its steps: a reload that changes them builds (and checks) a new one.
        scheduling = getattr(self.config, "ensemble_scheduling", None)
        steps = scheduling.SerializeToString(deterministic=True) if scheduling is not None else b""
        return (
            self.backend,
            self.model_file,
            self.files,
            self.max_batch_size,
            self.inputs,
            self.outputs,
            params,
            filled,
            steps,
        )

    def parameter(self, key: str, default: str | None = None) -> str | None:
        return self.parameters.get(key, default)


@dataclass(frozen=True)
class SequenceControl:
    """One control input: `input_name` gets `true_value` or `false_value` (a flag), or the sequence id (CORRID)."""

    kind: str  # START, END, READY or CORRID
    input_name: str
    datatype: str  # KServe name: INT32, FP32 or BOOL for a flag; CORRID's data_type
    false_value: float = 0
    true_value: float = 1


@dataclass(frozen=True)
class SequenceState:
    """One implicit state: the model's output `output_name` comes back as its input `input_name` on the
    sequence's next request. The first request of a sequence gets `initial` (raw little-endian bytes of
    `initial_dims`), or zeros of `dims` when no initial state is given."""

    input_name: str
    output_name: str
    datatype: str
    dims: tuple[int, ...]  # without the batch dimension; -1: variable
    initial_dims: tuple[int, ...]
    initial: bytes | None = None  # None: zeros

    def initial_array(self) -> np.ndarray:
        """The state a sequence starts with (a fresh array each time: it becomes the sequence's own)."""
        dtype = datatypes.numpy_dtype(self.datatype)
        if self.initial is None:
            return np.zeros(self.initial_dims, dtype)
        return np.frombuffer(self.initial, dtype).reshape(self.initial_dims).copy()


@dataclass(frozen=True)
class SequenceSpec:
    """A model's sequence batching. `direct`: max(1, max_batch_size) sequences per slot (Triton's sequence slots),
    each pinned to one slot (instance), each request run alone on it. `oldest`: up to `max_candidates` sequences
    per slot open at once; the next requests of different sequences that wait together run as one batch (dynamic
    batching's rule: ModelSpec.batching carries the delay and preferred sizes; with max_batch_size 0 each runs
    alone, on any slot), each sequence still one request at a time, in order, its rows at their own place in the
    batch."""

    strategy: str = DIRECT
    max_idle_us: int = DEFAULT_IDLE_US
    controls: tuple[SequenceControl, ...] = ()
    states: tuple[SequenceState, ...] = ()
    max_candidates: int = 0  # oldest: sequences open at once per slot (0: direct, max(1, max_batch_size) per slot)
    # iterative_sequence: a request without an id gets one (and START); the model may reschedule a request
    # (RequestRescheduled); the request that started a sequence ends it when it finishes.
    iterative: bool = False

    def provided_inputs(self) -> dict[str, str]:
        """The model inputs the server fills (control inputs and state inputs), name -> datatype."""
        provided = {control.input_name: control.datatype for control in self.controls}
        provided.update({state.input_name: state.datatype for state in self.states})
        return provided

    def state_outputs(self) -> tuple[str, ...]:
        return tuple(state.output_name for state in self.states)

    def control(self, kind: str) -> SequenceControl | None:
        return next((control for control in self.controls if control.kind == kind), None)
