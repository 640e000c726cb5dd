"""config.pbtxt's `sequence_batching`, read into a SequenceSpec (docs/sequences.md).

A sequence model keeps every request of one sequence (one `sequence_id`) on one slot, in order. What the server
adds to each request of a sequence is declared here: control inputs (START, END, READY, CORRID) and implicit
state (a model output fed back as an input on the sequence's next request, kept on the server). Neither is
declared among the config's `input`s: the server fills them, the client never sends them.

An iterative sequence (`iterative_sequence: true`, Triton's request rescheduling) lets the model hand a request
back unfinished: its engine raises RequestRescheduled, and the sequence runs the same request again
(service/core/sequences.py).

`read_sequence_spec` checks the block and raises ModelConfigError naming the field; nothing here runs a model.
"""

from __future__ import annotations

import math
from pathlib import Path

from generated import model_config_pb2

from .. import datatypes
from ..errors import ModelConfigError
from .files import ModelRoots
from .specs import (
    CORRID,
    DEFAULT_IDLE_US,
    DIRECT,
    END,
    OLDEST,
    READY,
    START,
    BatchingSpec,
    SequenceControl,
    SequenceSpec,
    SequenceState,
)

# The folder of a model's initial state files, as in Triton.
INITIAL_STATE_FOLDER = "initial_state"

_KINDS = {
    "CONTROL_SEQUENCE_START": START,
    "CONTROL_SEQUENCE_END": END,
    "CONTROL_SEQUENCE_READY": READY,
    "CONTROL_SEQUENCE_CORRID": CORRID,
}
_CORRID_TYPES = ("UINT64", "INT64", "UINT32", "INT32", "BYTES")


def read_sequence_spec(
    config: model_config_pb2.ModelConfig, directory: Path | None, roots: ModelRoots, origin: str
) -> SequenceSpec | None:
    """The model's SequenceSpec, or None without a `sequence_batching` block. Raises ModelConfigError naming the
    field for a block that cannot work (a control without its values, a state without names, a name used
    twice, an initial state file of the wrong size)."""
    if not config.HasField("sequence_batching"):
        return None
    block = config.sequence_batching
    where = f"{origin}: sequence_batching"
    controls = tuple(_control(entry, f"{where}.control_input[{i}]") for i, entry in enumerate(block.control_input))
    states = tuple(
        _state(entry, directory, roots, f"{where}.state[{i}]", config.max_batch_size)
        for i, entry in enumerate(block.state)
    )
    _check_unique(controls, states, {t.name for t in config.input}, {t.name for t in config.output}, where)
    idle = int(block.max_sequence_idle_microseconds) or DEFAULT_IDLE_US
    iterative = bool(block.iterative_sequence)
    if block.WhichOneof("strategy_choice") != "oldest":
        return SequenceSpec(DIRECT, idle, controls, states, iterative=iterative)
    oldest = block.oldest
    if oldest.max_candidate_sequences < 0:
        raise ModelConfigError(
            f"{where}.oldest.max_candidate_sequences must not be negative, got {oldest.max_candidate_sequences}"
        )
    # 0 (unset): Triton's default, max(1, max_batch_size). With max_batch_size 0 (Triton accepts it) each request
    # runs alone.
    candidates = int(oldest.max_candidate_sequences) or max(1, int(config.max_batch_size))
    return SequenceSpec(OLDEST, idle, controls, states, candidates, iterative)


def oldest_batching(config: model_config_pb2.ModelConfig, origin: str) -> BatchingSpec | None:
    """The dynamic batching an `oldest` sequence model's requests get (its delay and preferred sizes), or None
    (not `oldest`, or max_batch_size 0: nothing to batch along, as Triton's batcher of batch size 0 runs each
    request alone). Raises ModelConfigError for a preferred size outside 1..max_batch_size."""
    if not config.HasField("sequence_batching") or config.sequence_batching.WhichOneof("strategy_choice") != "oldest":
        return None
    if config.max_batch_size < 1:
        return None
    oldest = config.sequence_batching.oldest
    preferred = sorted(set(int(size) for size in oldest.preferred_batch_size))
    for size in preferred:
        if not 1 <= size <= config.max_batch_size:
            raise ModelConfigError(
                f"{origin}: sequence_batching.oldest.preferred_batch_size {size} is outside 1..{config.max_batch_size}"
            )
    return BatchingSpec(
        max_queue_delay_us=int(oldest.max_queue_delay_microseconds),
        preferred_batch_sizes=tuple(preferred),
        allow_timeout_override=True,
    )


def _control(entry: model_config_pb2.ModelSequenceBatching.ControlInput, where: str) -> SequenceControl:
    if not entry.name:
        raise ModelConfigError(f"{where} has no name")
    where = f"{where} '{entry.name}'"
    if len(entry.control) != 1:
        raise ModelConfigError(f"{where} must have exactly one control, has {len(entry.control)}")
    control = entry.control[0]
    kind_name = model_config_pb2.ModelSequenceBatching.Control.Kind.Name(control.kind)
    kind = _KINDS[kind_name]
    if kind == CORRID:
        corrid = datatypes.BY_CONFIG_NAME.get(model_config_pb2.DataType.Name(control.data_type))
        if corrid is None or corrid.name not in _CORRID_TYPES:
            raise ModelConfigError(
                f"{where}: {kind_name} needs data_type TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or "
                f"TYPE_STRING, got {model_config_pb2.DataType.Name(control.data_type)}"
            )
        return SequenceControl(kind, entry.name, corrid.name)
    given = [
        (name, values)
        for name, values in (
            ("INT32", list(control.int32_false_true)),
            ("FP32", list(control.fp32_false_true)),
            ("BOOL", list(control.bool_false_true)),
        )
        if values
    ]
    if len(given) != 1:
        raise ModelConfigError(
            f"{where}: {kind_name} needs exactly one of int32_false_true, fp32_false_true, bool_false_true"
        )
    flag_type, values = given[0]
    if len(values) != 2:
        raise ModelConfigError(f"{where}: {kind_name}'s false_true must hold two values (false, true), has {values}")
    return SequenceControl(kind, entry.name, flag_type, values[0], values[1])


def _state(
    entry: model_config_pb2.ModelSequenceBatching.State,
    directory: Path | None,
    roots: ModelRoots,
    where: str,
    max_batch_size: int,
) -> SequenceState:
    if not entry.input_name or not entry.output_name:
        raise ModelConfigError(f"{where} needs both input_name and output_name")
    where = f"{where} '{entry.input_name}'"
    datatype = datatypes.BY_CONFIG_NAME.get(model_config_pb2.DataType.Name(entry.data_type))
    if datatype is None or datatype.name == "BYTES":
        raise ModelConfigError(
            f"{where} has data_type {model_config_pb2.DataType.Name(entry.data_type)}; a state needs a "
            "fixed-size type (not TYPE_STRING, not TYPE_INVALID)"
        )
    dims = tuple(int(d) for d in entry.dims)
    if not dims or any(d < -1 or d == 0 for d in dims):
        raise ModelConfigError(f"{where} has invalid dims {list(dims)} (positive, or -1 for a variable dimension)")
    if len(entry.initial_state) > 1:
        raise ModelConfigError(f"{where} has {len(entry.initial_state)} initial_state entries; at most one")
    if not entry.initial_state:
        if -1 in dims:
            raise ModelConfigError(f"{where} has variable dims {list(dims)}: it needs an initial_state with fixed dims")
        return SequenceState(entry.input_name, entry.output_name, datatype.name, dims, dims)
    initial = entry.initial_state[0]
    initial_dims = tuple(int(d) for d in initial.dims) or dims
    if initial.data_type not in (0, entry.data_type):
        raise ModelConfigError(f"{where}: initial_state's data_type differs from the state's")
    if len(initial_dims) != len(dims) or any(
        d < 0 or w not in (-1, d) for d, w in zip(initial_dims, dims, strict=True)
    ):
        raise ModelConfigError(f"{where}: initial_state dims {list(initial_dims)} do not fit the state's {list(dims)}")
    choice = initial.WhichOneof("state_data")
    if choice == "data_file":
        data = _initial_file(initial.data_file, directory, roots, where)
        expected = math.prod(initial_dims) * datatype.itemsize
        if len(data) != expected:
            raise ModelConfigError(
                f"{where}: initial_state data_file '{initial.data_file}' has {len(data)} bytes; "
                f"{list(initial_dims)} {datatype.name} takes {expected}"
            )
        return SequenceState(entry.input_name, entry.output_name, datatype.name, dims, initial_dims, data)
    if choice != "zero_data":
        raise ModelConfigError(f"{where}: initial_state needs zero_data or data_file")
    return SequenceState(entry.input_name, entry.output_name, datatype.name, dims, initial_dims)


def _initial_file(name: str, directory: Path | None, roots: ModelRoots, where: str) -> bytes:
    if directory is None:
        raise ModelConfigError(f"{where}: initial_state data_file needs a model directory")
    folder = (directory / INITIAL_STATE_FOLDER).resolve()
    path = roots.resolve(name, "initial_state data_file", origin=where, base=folder)
    if folder not in path.parents:
        raise ModelConfigError(f"{where}: initial_state data_file '{name}' must be inside {INITIAL_STATE_FOLDER}/")
    if not path.is_file():
        raise ModelConfigError(f"{where}: initial_state data_file {roots.shown(path)} not found")
    return path.read_bytes()


def _check_unique(
    controls: tuple[SequenceControl, ...],
    states: tuple[SequenceState, ...],
    inputs: set[str],
    outputs: set[str],
    where: str,
) -> None:
    """Each filled input is filled once and is not also a declared input; each kind of control is given once;
    a state output is not also a declared output (the client never sees it)."""
    seen: set[str] = set()
    for name in [c.input_name for c in controls] + [s.input_name for s in states]:
        if name in seen:
            raise ModelConfigError(f"{where}: input '{name}' is filled twice (control or state inputs)")
        if name in inputs:
            raise ModelConfigError(f"{where}: input '{name}' is filled by the server and may not be a declared input")
        seen.add(name)
    kinds = [c.kind for c in controls]
    for kind in set(kinds):
        if kinds.count(kind) > 1:
            raise ModelConfigError(f"{where}: control {kind.upper()} is given {kinds.count(kind)} times")
    for state in states:
        if state.output_name in outputs:
            raise ModelConfigError(
                f"{where}: state output '{state.output_name}' is kept by the server and may not be a declared output"
            )
