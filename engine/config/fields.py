"""Every field of config.pbtxt's ModelConfig and what slotserve does with it when it is set: applied, refused (the
model is not loaded; the refusal names the field) or ignored (the model loads; one warning names the field).

`FIELDS` is the table (docs/model-repository.md's table is generated from it); `classify_fields` and
`judge_config` judge one configuration by it. Pure: nothing here reads a file or raises.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from generated import model_config_pb2


class Treatment(StrEnum):
    """What slotserve does with a field of config.pbtxt that is set."""

    APPLIED = "applied"
    REFUSED = "refused"  # the model is not loaded: ModelConfigError names every refused field
    IGNORED = "ignored"  # the model loads; one warning names every ignored field


@dataclass(frozen=True)
class FieldRule:
    treatment: Treatment
    reason: str  # for the docs table and the refusal or warning: what happens, and why


def _applied(reason: str) -> FieldRule:
    return FieldRule(Treatment.APPLIED, reason)


def _refused(reason: str) -> FieldRule:
    return FieldRule(Treatment.REFUSED, reason)


def _ignored(reason: str) -> FieldRule:
    return FieldRule(Treatment.IGNORED, reason)


_RAGGED = "not supported: ragged batching is not implemented; requests batch only when their shapes stack"
_SHAPE_AS_IS = "tensors travel in the model's own shape and layout"
_ROUTING = "slots run where the backend runs them (TensorRT takes its device from the trt_device parameter)"

# Every field of ModelConfig, by path (repeated fields without an index, maps as a whole). A path with entries
# below it is a branch: its set subfields are judged one by one, and each must have an entry. A path without
# entries below it judges its whole subtree. docs/model-repository.md's table is generated from this one
# (`make docs`; tests/docs fails when they differ), and tests/unit checks that it covers the whole message.
FIELDS: dict[str, FieldRule] = {
    "name": _applied("must be the folder's name, or left out"),
    "platform": _applied("selects the backend: onnxruntime_onnx, tensorrt_plan or ensemble (docs/ensembles.md)"),
    "backend": _applied("onnxruntime, tensorrt, python (docs/python-models.md) or fixture (test backend)"),
    "runtime": _ignored("the backend chooses its own runtime library"),
    "version_policy": _applied(
        "latest (num_versions), all or specific: each selected version folder is served as its own pool; "
        "a policy that selects none of the folders is refused"
    ),
    "max_batch_size": _applied("0: no batch dimension; N > 0: a leading batch dimension of 1..N rows"),
    "input": _applied("declared inputs are checked against the model at load"),
    "input.name": _applied("the input's name"),
    "input.data_type": _applied("a TYPE_* other than TYPE_INVALID"),
    "input.dims": _applied("positive, or -1 for a variable dimension"),
    "input.optional": _applied("the request may leave the input out"),
    "input.allow_ragged_batch": _refused(_RAGGED),
    "input.format": _ignored(_SHAPE_AS_IS),
    "input.reshape": _ignored(_SHAPE_AS_IS),
    "input.is_shape_tensor": _ignored("shape tensors are passed as ordinary inputs"),
    "input.is_non_linear_format_io": _ignored(_SHAPE_AS_IS),
    "output": _applied("declared outputs are checked against the model at load"),
    "output.name": _applied("the output's name"),
    "output.data_type": _applied("a TYPE_* other than TYPE_INVALID"),
    "output.dims": _applied("positive, or -1 for a variable dimension"),
    "output.reshape": _ignored(_SHAPE_AS_IS),
    "output.label_filename": _ignored(
        "classification outputs are not produced (a request asking for `classification` is refused)"
    ),
    "output.is_shape_tensor": _ignored("shape tensors are returned as ordinary outputs"),
    "output.is_non_linear_format_io": _ignored(_SHAPE_AS_IS),
    "batch_input": _refused(_RAGGED),
    "batch_output": _refused(_RAGGED),
    "optimization": _ignored(
        "backend optimization settings (graph level, priority, CUDA graphs, execution accelerators, pinned "
        "memory, gather kernel, eager batching) are not applied; ONNX Runtime and TensorRT take theirs from "
        "`parameters`"
    ),
    "dynamic_batching": _applied(
        "queued requests that stack run as one engine call (ignored when max_batch_size is 0)"
    ),
    "dynamic_batching.preferred_batch_size": _applied("a delayed batch goes once it reaches one of these sizes"),
    "dynamic_batching.max_queue_delay_microseconds": _applied("how long a free slot waits for its batch to grow"),
    "dynamic_batching.preserve_ordering": _applied("every request gets its own response, in order"),
    "dynamic_batching.priority_levels": _applied(
        "a queue per level, level 1 served first, FIFO within a level (docs/lifecycle.md, Priorities)"
    ),
    "dynamic_batching.default_priority_level": _applied(
        "the level of a request whose `priority` is 0 or above priority_levels (1..priority_levels)"
    ),
    "dynamic_batching.priority_queue_policy": _applied(
        "a level's own queue policy (max_queue_size, timeout, override, timeout_action), keyed 1..priority_levels"
    ),
    "dynamic_batching.default_queue_policy": _applied("the queue policy of every level without one of its own"),
    "dynamic_batching.default_queue_policy.max_queue_size": _applied("a level's queue limit (delayed requests count)"),
    "dynamic_batching.default_queue_policy.default_timeout_microseconds": _applied("a level's queue timeout"),
    "dynamic_batching.default_queue_policy.allow_timeout_override": _applied(
        "whether a request's `timeout` may shorten it"
    ),
    "dynamic_batching.default_queue_policy.timeout_action": _applied(
        "REJECT: refused at its queue timeout; DELAY: moved behind its level's requests that have not timed out"
    ),
    "sequence_batching": _applied(
        "stateful sequences: every request of a sequence on one slot, in order (docs/sequences.md)"
    ),
    "sequence_batching.max_sequence_idle_microseconds": _applied(
        "an open sequence with no request for this long is ended and its slot freed (default 1 s)"
    ),
    "sequence_batching.control_input": _applied("inputs the server fills on each request of a sequence"),
    "sequence_batching.control_input.name": _applied("the model input the server fills"),
    "sequence_batching.control_input.control": _applied("exactly one control per input"),
    "sequence_batching.control_input.control.kind": _applied(
        "CONTROL_SEQUENCE_START, _END, _READY (flags) or _CORRID (the sequence id)"
    ),
    "sequence_batching.control_input.control.int32_false_true": _applied("a flag as INT32: the false and true values"),
    "sequence_batching.control_input.control.fp32_false_true": _applied("a flag as FP32: the false and true values"),
    "sequence_batching.control_input.control.bool_false_true": _applied("a flag as BOOL: the false and true values"),
    "sequence_batching.control_input.control.data_type": _applied(
        "CORRID's type: TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING"
    ),
    "sequence_batching.direct": _applied(
        "max(1, max_batch_size) sequences per slot, each pinned to its slot, each request run alone"
    ),
    "sequence_batching.direct.max_queue_delay_microseconds": _ignored(
        "a sequence's request runs alone on its slot: there is no batch to wait for"
    ),
    "sequence_batching.direct.minimum_slot_utilization": _ignored(
        "a sequence's request runs alone on its slot: there is no batch to fill"
    ),
    "sequence_batching.oldest": _applied(
        "up to max_candidate_sequences open sequences; their next requests that wait together run as one batch"
    ),
    "sequence_batching.oldest.max_candidate_sequences": _applied("how many sequences may be open at once"),
    "sequence_batching.oldest.preferred_batch_size": _applied("a delayed batch goes once it reaches one of these"),
    "sequence_batching.oldest.max_queue_delay_microseconds": _applied(
        "how long a free slot waits for more sequences' requests to join its batch"
    ),
    "sequence_batching.oldest.preserve_ordering": _applied("every request gets its own response, in order"),
    "sequence_batching.state": _applied(
        "implicit state: the output comes back as the input on the sequence's next request, kept on the server"
    ),
    "sequence_batching.state.input_name": _applied("the model input that gets the state"),
    "sequence_batching.state.output_name": _applied("the model output that becomes the next state"),
    "sequence_batching.state.data_type": _applied("a fixed-size TYPE_* (not TYPE_STRING)"),
    "sequence_batching.state.dims": _applied("the state's dims without the batch dimension; -1 needs an initial_state"),
    "sequence_batching.state.initial_state": _applied("the state a sequence starts with (default: zeros of dims)"),
    "sequence_batching.state.initial_state.data_type": _applied("the state's data_type"),
    "sequence_batching.state.initial_state.dims": _applied("fixed dims that fit the state's"),
    "sequence_batching.state.initial_state.zero_data": _applied("start from zeros"),
    "sequence_batching.state.initial_state.data_file": _applied(
        "start from this file's raw bytes, in the model's initial_state/ folder"
    ),
    "sequence_batching.state.initial_state.name": _ignored("the initial state is named by its state"),
    "sequence_batching.state.use_same_buffer_for_input_output": _ignored(
        "states are arrays kept per sequence on the server; there is no device buffer to share"
    ),
    "sequence_batching.state.use_growable_memory": _ignored(
        "states are arrays kept per sequence on the server, as large as the model returns them"
    ),
    "sequence_batching.iterative_sequence": _applied(
        "a request without a sequence id gets one; a python model may reschedule a request, which runs again"
    ),
    "ensemble_scheduling": _applied("the steps of an ensemble, run as a data flow (docs/ensembles.md)"),
    "ensemble_scheduling.step": _applied("one step: a model run through its own admission"),
    "ensemble_scheduling.step.model_name": _applied("the step's model, registered on this server"),
    "ensemble_scheduling.step.model_version": _applied("-1: the served version; a number must be that version"),
    "ensemble_scheduling.step.input_map": _applied("the step model's input -> the ensemble tensor feeding it"),
    "ensemble_scheduling.step.output_map": _applied("the step model's output -> the ensemble tensor it produces"),
    "ensemble_scheduling.step.model_namespace": _refused("not supported: model namespaces are not implemented"),
    "instance_group": _applied("the first group's count is the slot count"),
    "instance_group.count": _applied(
        "the model's slot count (1..16, with --parallel-jobs); a later group's count is ignored"
    ),
    "instance_group.name": _ignored("slots are named by their model"),
    "instance_group.kind": _ignored(_ROUTING),
    "instance_group.gpus": _ignored(_ROUTING),
    "instance_group.host_policy": _ignored(_ROUTING),
    "instance_group.profile": _ignored("TensorRT profiles come from the trt_* parameters"),
    "instance_group.rate_limiter": _applied(
        "the resources each slot needs to run and its priority among their waiters, with --rate-limit "
        "execution_count (docs/lifecycle.md); read and ignored with --rate-limit off; a later group's is ignored"
    ),
    "instance_group.secondary_devices": _refused("not supported: slots use no secondary devices"),
    "instance_group.passive": _refused("not supported: every slot takes requests"),
    "default_model_filename": _applied("the model file's name in the version folder"),
    "cc_model_filenames": _ignored("one model file serves every device"),
    "metric_tags": _ignored("metrics are labelled by model only"),
    "parameters": _applied("backend settings, `string_value` each"),
    "model_warmup": _applied(
        "every sample runs `count` times on every slot before the model is ready; a failure fails the load"
    ),
    "model_operations": _refused("not supported: custom operation libraries are not loaded"),
    "model_transaction_policy": _applied("decoupled: python models, and ensembles (set from their steps)"),
    "model_transaction_policy.decoupled": _applied(
        "python models: the model answers through response senders, over ModelStreamInfer "
        "(docs/python-models.md); an ensemble's is set when it loads, true exactly when a step is decoupled "
        "(docs/ensembles.md); refused for other backends"
    ),
    "model_repository_agents": _refused("not supported: repository agents are not run"),
    "response_cache": _applied(
        "with --response-cache-bytes > 0, ModelInfer answers are kept by request content and served again without a "
        "slot (docs/operations.md, Response cache); with no cache memory nothing is cached"
    ),
}


@dataclass(frozen=True)
class Classified:
    """The set fields of one configuration that were refused or ignored, each as (path, reason)."""

    refused: tuple[tuple[str, str], ...]
    ignored: tuple[tuple[str, str], ...]


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and bool(field.message_type.GetOptions().map_entry)


def _is_branch(path: str) -> bool:
    prefix = path + "."
    return any(key.startswith(prefix) for key in FIELDS)


def rule_for(path: str) -> FieldRule | None:
    """The rule of `path` (no indices): its own entry, or that of the nearest ancestor that is not a branch."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        key = ".".join(parts[:end])
        rule = FIELDS.get(key)
        if rule is not None:
            return rule if end == len(parts) or not _is_branch(key) else None
    return None


def classify_fields(config: model_config_pb2.ModelConfig) -> Classified:
    """Judge every set field of `config` by FIELDS: the refused and ignored ones with their paths
    (`instance_group[0].rate_limiter`). Pure; never raises."""
    refused: list[tuple[str, str]] = []
    ignored: list[tuple[str, str]] = []

    def visit(message: Message, path: str, shown: str) -> None:
        for field, value in message.ListFields():
            key = f"{path}.{field.name}" if path else field.name
            label = f"{shown}.{field.name}" if shown else field.name
            rule = rule_for(key)
            if rule is None:  # a field the table has no word for: never applied silently
                ignored.append((label, "slotserve does not know this field"))
                continue
            if key == "instance_group.count" and not label.startswith("instance_group[0]."):
                ignored.append((label, "only the first instance group sets the slot count"))
                continue
            if key == "instance_group.rate_limiter" and not label.startswith("instance_group[0]."):
                ignored.append((label, "only the first instance group's rate limiter applies to the slots"))
                continue
            if rule.treatment is Treatment.REFUSED:
                refused.append((label, rule.reason))
            elif rule.treatment is Treatment.IGNORED:
                ignored.append((label, rule.reason))
            elif _is_branch(key) and not _is_map(field):
                if field.is_repeated:
                    for index, item in enumerate(value):
                        visit(item, key, f"{label}[{index}]")
                else:
                    visit(value, key, label)

    visit(config, "", "")
    return Classified(tuple(refused), tuple(ignored))


def judge_config(config: model_config_pb2.ModelConfig, more_refused: Iterable[tuple[str, str]] = ()) -> Classified:
    """Every refused and ignored field of `config` (classify_fields), with the refusals found elsewhere
    (`more_refused`: a backend not run yet, a version policy) and dynamic_batching ignored without a batch
    dimension. Pure; never raises. The server (through `_judge_fields`) and `python -m service check` both use it."""
    judged = classify_fields(config)
    ignored = judged.ignored
    if config.HasField("dynamic_batching") and config.max_batch_size == 0:
        ignored = (*ignored, ("dynamic_batching", "max_batch_size is 0, so there is no batch dimension"))
    return Classified((*judged.refused, *more_refused), ignored)
