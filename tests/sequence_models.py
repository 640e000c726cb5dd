"""Sequence models for the tests of issue 23 (sequence batching), servable by slotserve and, for the python ones,
by real Triton 2.51 (whose wheel in bench/.venv-pytriton ships only the python backend).

Python models (a model.py and its config.pbtxt; tests/differential/test_sequences.py runs them on both servers):

* ``echo``: answers, for each request, the control tensors the server filled (START, END, READY, CORRID) and its
  INPUT unchanged, plus BATCH: how many requests the execute call held. A test sees what the server put in.
* ``accumulate``: keeps a running sum per correlation id inside the worker (START resets it, END forgets it) and
  answers it as OUTPUT. It needs every request of a sequence in order on the same instance, which is what
  sequence batching promises.
* ``stateful``: the accumulator written with implicit state (as ``onnx_accumulate`` below). Triton 2.51's python
  backend loads it but does not carry the state (see STATEFUL_MODEL_PY), so it is no differential case.

ONNX models (slotserve only; the reference has no onnxruntime backend):

* ``onnx_echo``: control inputs only. A sequence model without state cannot accumulate, so it does what is
  honest statelessly: it answers its control tensors (as INT32 / FP32 / BOOL / UINT64, the kinds configured)
  and INPUT, the same outputs as the python ``echo``.
* ``onnx_accumulate``: implicit state (``state { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" }``):
  OUTPUT_STATE = INPUT_STATE * (1 - START) + INPUT, OUTPUT = OUTPUT_STATE. The server keeps OUTPUT_STATE per
  sequence and feeds it back as the next request's INPUT_STATE (zeros at START: ``initial_state`` zero_data).

Every builder takes the sequence options (strategy, idle timeout, CORRID type, batch size) so that one test can
write the variant it needs; `expected_sums` computes what ``accumulate`` / ``onnx_accumulate`` must answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from demo import build_repository as builders

DIRECT = "direct"
OLDEST = "oldest"
CORRID_TYPES = {"TYPE_UINT64": np.uint64, "TYPE_INT64": np.int64, "TYPE_UINT32": np.uint32, "TYPE_STRING": object}


@dataclass(frozen=True)
class SequenceOptions:
    """The `sequence_batching` block of a config: which strategy, how long an idle sequence is kept, what type
    CORRID has, how many requests one execution may hold (max_batch_size; 0 = no batch dimension)."""

    strategy: str = DIRECT
    max_sequence_idle_microseconds: int = 5_000_000
    corrid_type: str = "TYPE_UINT64"
    max_batch_size: int = 4
    instances: int = 1
    max_candidate_sequences: int = 4  # oldest only
    max_queue_delay_microseconds: int = 0  # oldest only
    preferred_batch_size: tuple[int, ...] = ()  # oldest only

    def block(self) -> str:
        """The config.pbtxt text of the sequence_batching block (controls START, END, READY, CORRID with one kind
        of each false/true spelling, so one model exercises all three)."""
        if self.strategy == DIRECT:
            strategy = "  direct { }\n"
        else:
            preferred = "".join(f" preferred_batch_size: {size}" for size in self.preferred_batch_size)
            strategy = (
                f"  oldest {{ max_candidate_sequences: {self.max_candidate_sequences}{preferred}"
                f" max_queue_delay_microseconds: {self.max_queue_delay_microseconds} }}\n"
            )
        return (
            "sequence_batching {\n"
            f"  max_sequence_idle_microseconds: {self.max_sequence_idle_microseconds}\n"
            "  control_input [\n"
            '    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },\n'
            '    { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },\n'
            '    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },\n'
            f'    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {self.corrid_type} }} ] }}\n'
            "  ]\n" + strategy + "}\n"
        )

    def instance_group(self) -> str:
        return f"instance_group [ {{ count: {self.instances} kind: KIND_CPU }} ]\n"


def _tensors(kind: str, entries: Iterable[tuple[str, str]]) -> str:
    rows = ",\n".join(f'  {{ name: "{name}" data_type: {datatype} dims: [ 1 ] }}' for name, datatype in entries)
    return f"{kind} [\n{rows}\n]\n"


# ------------------------------------------------------------------------------------------------ python models

ECHO_OUTPUTS = ("OUT_START", "OUT_END", "OUT_READY", "OUT_CORRID", "OUT_INPUT", "BATCH")

ECHO_MODEL_PY = '''\
"""Echo what the sequence batcher filled: the control tensors and INPUT of each request, and BATCH, the number
of requests this execute call held (tests/sequence_models.py)."""

import numpy as np
import triton_python_backend_utils as pb_utils

CONTROLS = ("START", "END", "READY", "CORRID", "INPUT")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for name in CONTROLS:
                value = pb_utils.get_input_tensor_by_name(request, name).as_numpy()
                outputs.append(pb_utils.Tensor("OUT_" + name, value))
            batch = np.full(outputs[-1].as_numpy().shape, len(requests), dtype=np.int32)
            outputs.append(pb_utils.Tensor("BATCH", batch))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''

ACCUMULATE_MODEL_PY = '''\
"""A running sum per sequence, kept in this worker: START resets it, END forgets it (tests/sequence_models.py).
A request of a sequence this worker has not seen start is answered with an error naming it: sequence batching
must send every request of a sequence to the instance that saw its START, in order."""

import numpy as np
import triton_python_backend_utils as pb_utils


def _key(corrid):
    value = corrid.reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else int(value)


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}  # correlation id -> running sum (an int64 array shaped as INPUT)

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().astype(np.int64)
        start = bool(pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0])
        end = bool(pb_utils.get_input_tensor_by_name(request, "END").as_numpy().reshape(-1)[0])
        key = _key(pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy())
        if start:
            self.sums[key] = value
        elif key in self.sums:
            self.sums[key] = self.sums[key] + value
        else:
            error = pb_utils.TritonError(f"accumulate: sequence {key!r} was not started on this instance")
            return pb_utils.InferenceResponse(output_tensors=[], error=error)
        total = self.sums.pop(key) if end else self.sums[key]
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", total.astype(np.int32))])
'''

# Implicit state read and written by a python model. Triton 2.51's python backend loads it and feeds INPUT_STATE,
# but never carries the returned OUTPUT_STATE over (INPUT_STATE is the initial zeros on every request), so it
# answers 1, 2, 3 where the state would give 1, 3, 6: not a differential case; slotserve may do better.
STATEFUL_MODEL_PY = '''\
"""OUTPUT_STATE = INPUT_STATE * (1 - START) + INPUT; OUTPUT = OUTPUT_STATE (implicit state).

Written by tests/sequence_models.py."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "INPUT_STATE").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy().astype(np.int32)
            total = (state * (1 - start) + value).astype(np.int32)
            outputs = [pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("OUTPUT_STATE", total)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''


def state_block() -> str:
    """The implicit state of the stateful models: INPUT_STATE / OUTPUT_STATE, INT32 [1] (the batch dimension
    excluded, as for a tensor), zeros at START."""
    return (
        "  state [ {\n"
        '    input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ]\n'
        '    initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zeros" }\n'
        "  } ]\n"
    )


def echo_config(name: str, options: SequenceOptions, backend: str = "python") -> str:
    """config.pbtxt of an echo model (python or onnxruntime): INPUT INT32 [1]; the echoes of the controls."""
    outputs = [
        ("OUT_START", "TYPE_INT32"),
        ("OUT_END", "TYPE_FP32"),
        ("OUT_READY", "TYPE_BOOL"),
        ("OUT_CORRID", options.corrid_type),
        ("OUT_INPUT", "TYPE_INT32"),
        ("BATCH", "TYPE_INT32"),
    ]
    return (
        f'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: {options.max_batch_size}\n'
        + _tensors("input", [("INPUT", "TYPE_INT32")])
        + _tensors("output", outputs)
        + options.block()
        + options.instance_group()
    )


def accumulate_config(name: str, options: SequenceOptions, backend: str = "python", state: bool = False) -> str:
    """config.pbtxt of an accumulator: INPUT INT32 [1] -> OUTPUT INT32 [1]; with `state`, the implicit state."""
    block = options.block()
    if state:
        block = block[: block.rindex("}")] + state_block() + "}\n"
    return (
        f'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: {options.max_batch_size}\n'
        + _tensors("input", [("INPUT", "TYPE_INT32")])
        + _tensors("output", [("OUTPUT", "TYPE_INT32")])
        + block
        + options.instance_group()
    )


def write_python_echo(root: Path, name: str = "echo", options: SequenceOptions = SequenceOptions()) -> Path:
    """Write the python echo model into root/<name>/ and return that directory."""
    return builders.write_python_model(root, name, echo_config(name, options), ECHO_MODEL_PY)


def accumulate_source(execute_seconds: float = 0.0) -> str:
    """ACCUMULATE_MODEL_PY, with a fixed cost per execute call when `execute_seconds` > 0: a sleep (it releases
    the GIL, as a call into a native model would) paid once per call however many requests it holds, so that
    batching the requests of several sequences into one call shows (bench/sections/sequences.py)."""
    if execute_seconds <= 0:
        return ACCUMULATE_MODEL_PY
    source = ACCUMULATE_MODEL_PY.replace("import numpy as np\n", "import time\n\nimport numpy as np\n", 1)
    call = "    def execute(self, requests):\n"
    assert call in source
    cost = f"        time.sleep({execute_seconds!r})  # the fixed cost of one call\n"  # ordering-free: a bench cost
    return source.replace(call, call + cost, 1)


def write_python_accumulate(
    root: Path, name: str = "accumulate", options: SequenceOptions = SequenceOptions(), execute_seconds: float = 0.0
) -> Path:
    """Write the python accumulator (state inside the worker; `execute_seconds`: see accumulate_source) into
    root/<name>/ and return that directory."""
    source = accumulate_source(execute_seconds)
    return builders.write_python_model(root, name, accumulate_config(name, options), source)


def write_python_stateful(root: Path, name: str = "stateful", options: SequenceOptions = SequenceOptions()) -> Path:
    """Write the python accumulator that uses implicit state into root/<name>/ and return that directory."""
    config = accumulate_config(name, options, state=True)
    return builders.write_python_model(root, name, config, STATEFUL_MODEL_PY)


def expected_sums(values: Iterable[int]) -> list[int]:
    """What an accumulator answers for the requests of one sequence: the running sums (int32 wrap-around)."""
    return [int(total) for total in np.cumsum(np.asarray(list(values), dtype=np.int64)).astype(np.int32)]


# -------------------------------------------------------------------------------------------------- ONNX models

_ONNX_TYPES = {
    "TYPE_INT32": TensorProto.INT32,
    "TYPE_INT64": TensorProto.INT64,
    "TYPE_UINT32": TensorProto.UINT32,
    "TYPE_UINT64": TensorProto.UINT64,
    "TYPE_FP32": TensorProto.FLOAT,
    "TYPE_BOOL": TensorProto.BOOL,
    "TYPE_STRING": TensorProto.STRING,
}


def _control_tensors(options: SequenceOptions) -> list[tuple[str, str]]:
    """The control inputs as the model sees them (name, config type), in the kinds options.block() configures."""
    return [("START", "TYPE_INT32"), ("END", "TYPE_FP32"), ("READY", "TYPE_BOOL"), ("CORRID", options.corrid_type)]


def _value_info(name: str, config_type: str, max_batch_size: int) -> onnx.ValueInfoProto:
    dims: list[int | str] = (["batch"] if max_batch_size > 0 else []) + [1]
    return helper.make_tensor_value_info(name, _ONNX_TYPES[config_type], dims)


def _onnx_bytes(name: str, nodes, inputs, outputs, max_batch_size: int) -> bytes:
    graph = helper.make_graph(
        nodes,
        name,
        [_value_info(tensor, kind, max_batch_size) for tensor, kind in inputs],
        [_value_info(tensor, kind, max_batch_size) for tensor, kind in outputs],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", builders.OPSET)],
        ir_version=builders.IR_VERSION,
        producer_name="slotserve-tests",
    )
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString(deterministic=True)


def _write_onnx(root: Path, name: str, onnx_bytes: bytes, config: str) -> Path:
    directory = root / name
    (directory / "1").mkdir(parents=True, exist_ok=True)
    (directory / "1" / "model.onnx").write_bytes(onnx_bytes)
    (directory / "config.pbtxt").write_text(config)
    return directory


def onnx_echo_bytes(options: SequenceOptions = SequenceOptions()) -> bytes:
    """The graph of onnx_echo: OUT_<control> = <control>, OUT_INPUT = INPUT, BATCH = the rows of this execution
    (INPUT's leading dimension, 1 without a batch dimension) broadcast to INPUT's shape."""
    controls = _control_tensors(options)
    nodes = [helper.make_node("Identity", [tensor], [f"OUT_{tensor}"]) for tensor, _ in [*controls, ("INPUT", "")]]
    nodes.append(helper.make_node("Shape", ["INPUT"], ["input_shape"]))
    if options.max_batch_size > 0:
        nodes.append(helper.make_node("Shape", ["INPUT"], ["rows"], end=1))
    else:
        nodes.append(
            helper.make_node("Constant", [], ["rows"], value=helper.make_tensor("one", TensorProto.INT64, [1], [1]))
        )
    nodes += [
        helper.make_node("Cast", ["rows"], ["rows_int32"], to=TensorProto.INT32),
        helper.make_node("Expand", ["rows_int32", "input_shape"], ["BATCH"]),
    ]
    outputs = [(f"OUT_{tensor}", kind) for tensor, kind in controls] + [("OUT_INPUT", "TYPE_INT32")]
    outputs.append(("BATCH", "TYPE_INT32"))
    inputs = [("INPUT", "TYPE_INT32"), *controls]
    return _onnx_bytes("onnx_echo", nodes, inputs, outputs, options.max_batch_size)


def onnx_accumulate_bytes(options: SequenceOptions = SequenceOptions()) -> bytes:
    """The graph of onnx_accumulate: OUTPUT_STATE = INPUT_STATE * (1 - START) + INPUT; OUTPUT = OUTPUT_STATE. END,
    READY and CORRID are inputs it does not use (the server fills them as configured all the same)."""
    nodes = [
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", TensorProto.INT32, [1], [1])),
        helper.make_node("Sub", ["one", "START"], ["keep"]),
        helper.make_node("Mul", ["INPUT_STATE", "keep"], ["kept"]),
        helper.make_node("Add", ["kept", "INPUT"], ["OUTPUT_STATE"]),
        helper.make_node("Identity", ["OUTPUT_STATE"], ["OUTPUT"]),
    ]
    inputs = [("INPUT", "TYPE_INT32"), ("INPUT_STATE", "TYPE_INT32"), *_control_tensors(options)]
    outputs = [("OUTPUT", "TYPE_INT32"), ("OUTPUT_STATE", "TYPE_INT32")]
    return _onnx_bytes("onnx_accumulate", nodes, inputs, outputs, options.max_batch_size)


def write_onnx_echo(root: Path, name: str = "onnx_echo", options: SequenceOptions = SequenceOptions()) -> Path:
    """Write onnx_echo (control inputs only) into root/<name>/ and return that directory."""
    return _write_onnx(root, name, onnx_echo_bytes(options), echo_config(name, options, backend="onnxruntime"))


def write_onnx_accumulate(
    root: Path, name: str = "onnx_accumulate", options: SequenceOptions = SequenceOptions()
) -> Path:
    """Write onnx_accumulate (implicit state) into root/<name>/ and return that directory."""
    config = accumulate_config(name, options, backend="onnxruntime", state=True)
    return _write_onnx(root, name, onnx_accumulate_bytes(options), config)


# ------------------------------------------------------------------------------------------ iterative sequences
# `sequence_batching { iterative_sequence: true }`: a model may hand a request back unfinished
# (`request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`); the server runs it again later. Each
# model below answers LOG, what it saw on the execution that answered (or on each, streaming):

LOG_FIELDS = ("execution", "flags", "correlation_id", "requests", "calls", "START", "END", "CORRID")
# execution: how many times this request was executed (1 = its first); flags: request.flags() (START 1 | END 2);
# correlation_id: request.correlation_id() (-7 for a string); requests: len(requests) of that execute call; calls:
# execute calls of the worker so far; START, END, CORRID: the control inputs the server filled (-1 without them).

_LOG_HELPERS = """\
import numpy as np
import triton_python_backend_utils as pb_utils

RESCHEDULE = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE


def _key(request):
    return (str(request.correlation_id()), request.request_id())


def _log(request, execution, requests, calls):
    corrid = request.correlation_id()
    log = [execution, request.flags(), -7 if isinstance(corrid, str) else int(corrid), len(requests), calls]
    for name in ("START", "END", "CORRID"):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        log.append(-1 if tensor is None else int(tensor.as_numpy().reshape(-1)[0]))
    return pb_utils.Tensor("LOG", np.array(log, dtype=np.int64).reshape(SHAPE))
"""

# Executes each request IN times: reschedules it (returning None for it, as Triton requires) until then.
COUNTDOWN_MODEL_PY = (
    '"""Answers a request on its IN-th execution, rescheduling it before (tests/sequence_models.py)."""\n\n'
    + _LOG_HELPERS
    + """

class TritonPythonModel:
    def initialize(self, args):
        self.executions = {}  # (correlation id, request id) -> executions so far
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        responses = []
        for request in requests:
            wanted = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
            key = _key(request)
            execution = self.executions.get(key, 0) + 1
            if execution < wanted:
                self.executions[key] = execution
                request.set_release_flags(RESCHEDULE)
                responses.append(None)
                continue
            self.executions.pop(key, None)
            responses.append(pb_utils.InferenceResponse([_log(request, execution, requests, self.calls)]))
        return responses
"""
)

# COUNTDOWN_MODEL_PY returning None, not a list, from a call whose every request it rescheduled.
COUNTDOWN_RETURNING_NONE_MODEL_PY = COUNTDOWN_MODEL_PY.replace(
    "        return responses\n", "        return None if all(r is None for r in responses) else responses\n"
)

# Decoupled: one response per execution, IN responses in all; every execution but the last reschedules the
# request before execute returns; the last response carries the final flag.
COUNTDOWN_STREAM_MODEL_PY = (
    '"""Sends one response per execution of a request, IN in all, rescheduling it until the last (final) one\n'
    '(tests/sequence_models.py)."""\n\n'
    + _LOG_HELPERS
    + """

class TritonPythonModel:
    def initialize(self, args):
        self.executions = {}
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        for request in requests:
            wanted = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
            key = _key(request)
            execution = self.executions.get(key, 0) + 1
            response = pb_utils.InferenceResponse([_log(request, execution, requests, self.calls)])
            sender = request.get_response_sender()
            if execution < wanted:
                self.executions[key] = execution
                request.set_release_flags(RESCHEDULE)
                sender.send(response)
            else:
                self.executions.pop(key, None)
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
)

# Reschedules every request and returns a response for it all the same: Triton's "wrong return type".
RESCHEDULE_AND_ANSWER_MODEL_PY = (
    '"""Reschedules each request but returns a response for it (tests/sequence_models.py)."""\n\n'
    + _LOG_HELPERS
    + """

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            request.set_release_flags(RESCHEDULE)
            responses.append(pb_utils.InferenceResponse([_log(request, 1, requests, 1)]))
        return responses
"""
)

ITERATIVE_CONTROLS = (
    "  control_input [\n"
    '    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },\n'
    '    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },\n'
    '    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }\n'
    "  ]\n"
)


@dataclass(frozen=True)
class IterativeOptions:
    """The config of a LOG model: its sequence_batching block (None: none), batch size, transaction policy."""

    sequence: str | None = "  iterative_sequence: true\n" + ITERATIVE_CONTROLS
    max_batch_size: int = 0
    decoupled: bool = False
    instances: int = 1


def log_config(name: str, options: IterativeOptions) -> str:
    """config.pbtxt of a LOG model: IN INT32 [1] (how many executions) -> LOG INT64 [8] (LOG_FIELDS)."""
    text = f'name: "{name}"\nbackend: "python"\nmax_batch_size: {options.max_batch_size}\n'
    text += _tensors("input", [("IN", "TYPE_INT32")])
    text += f'output [\n  {{ name: "LOG" data_type: TYPE_INT64 dims: [ {len(LOG_FIELDS)} ] }}\n]\n'
    if options.sequence is not None:
        text += "sequence_batching {\n" + options.sequence + "}\n"
    if options.decoupled:
        text += "model_transaction_policy { decoupled: true }\n"
    return text + f"instance_group [ {{ count: {options.instances} kind: KIND_CPU }} ]\n"


def write_python_log_model(root: Path, name: str, source: str, options: IterativeOptions = IterativeOptions()) -> Path:
    """Write one of the LOG models above (COUNTDOWN_MODEL_PY, COUNTDOWN_STREAM_MODEL_PY,
    RESCHEDULE_AND_ANSWER_MODEL_PY) into root/<name>/ and return that directory."""
    shape = "(1, -1)" if options.max_batch_size > 0 else "(-1,)"
    return builders.write_python_model(root, name, log_config(name, options), source.replace("SHAPE", shape))
