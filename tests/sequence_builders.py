"""Small sequence models for the sequence tests of slotserve (tests/unit, tests/contract, tests/integration):

* ``write_accumulate`` (ONNX, implicit state): OUTPUT = STATE_IN * (1 - START) + INPUT, STATE_OUT the same; the
  server keeps STATE_OUT per sequence and feeds it back as STATE_IN (zeros at START). INT32 [1] values; the
  client sees OUTPUT only.
* ``write_controls`` (ONNX, control inputs only): answers the control tensors the server filled (START as INT32,
  END as FP32, READY as BOOL, CORRID as UINT64) and OUTPUT = INPUT, so a test sees what the server put in.
* ``write_fixture_sequence`` (the fixture backend, gates for ordering; control inputs only).

`expected_sums` says what an accumulating sequence must answer for its values.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

OPSET = 17
IR_VERSION = helper.find_min_ir_version_for([helper.make_opsetid("", OPSET)])

CONTROLS = """  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
"""


def _save(graph, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _shape(batched: bool) -> list:
    return ["B", 1] if batched else [1]


def write_accumulate(
    root: Path,
    name: str = "accumulate",
    *,
    slots: int = 1,
    idle_us: int = 5_000_000,
    batched: bool = False,
    extra="",
    strategy: str = "direct { }",
    max_batch_size: int = 1,
) -> Path:
    """The accumulator with implicit state (see the module docstring); `batched`: `max_batch_size` (1)."""
    shape = _shape(batched)
    inputs = [
        helper.make_tensor_value_info("INPUT", TensorProto.INT32, shape),
        helper.make_tensor_value_info("START", TensorProto.INT32, shape),
        helper.make_tensor_value_info("STATE_IN", TensorProto.INT32, shape),
    ]
    outputs = [
        helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, shape),
        helper.make_tensor_value_info("STATE_OUT", TensorProto.INT32, shape),
    ]
    one = helper.make_tensor("one", TensorProto.INT32, [1], [1])
    nodes = [
        helper.make_node("Sub", ["one", "START"], ["keep"]),
        helper.make_node("Mul", ["STATE_IN", "keep"], ["kept"]),
        helper.make_node("Add", ["kept", "INPUT"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
    ]
    _save(helper.make_graph(nodes, name, inputs, outputs, [one]), root / name / "1" / "model.onnx")
    config = (
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: {max_batch_size if batched else 0}\n'
        'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        f"instance_group [ {{ count: {slots} }} ]\n"
        "sequence_batching {\n"
        f"  max_sequence_idle_microseconds: {idle_us}\n"
        f"  {strategy}\n"
        '  control_input [ { name: "START"\n'
        "    control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]\n"
        '  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]\n'
        "            initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } ]\n"
        f"{extra}}}\n"
    )
    (root / name / "config.pbtxt").write_text(config)
    return root / name


def write_controls(root: Path, name: str = "controls", *, slots: int = 1, idle_us: int = 5_000_000) -> Path:
    """The control-only model (see the module docstring), max_batch_size 0."""
    inputs = [
        helper.make_tensor_value_info("INPUT", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("START", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("END", TensorProto.FLOAT, [1]),
        helper.make_tensor_value_info("READY", TensorProto.BOOL, [1]),
        helper.make_tensor_value_info("CORRID", TensorProto.UINT64, [1]),
    ]
    outputs = [
        helper.make_tensor_value_info(f"{n}_OUT", t, [1])
        for n, t in (
            ("INPUT", TensorProto.INT32),
            ("START", TensorProto.INT32),
            ("END", TensorProto.FLOAT),
            ("READY", TensorProto.BOOL),
            ("CORRID", TensorProto.UINT64),
        )
    ]
    nodes = [helper.make_node("Identity", [n], [f"{n}_OUT"]) for n in ("INPUT", "START", "END", "READY", "CORRID")]
    _save(helper.make_graph(nodes, name, inputs, outputs), root / name / "1" / "model.onnx")
    config = (
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        f"instance_group [ {{ count: {slots} }} ]\n"
        f"sequence_batching {{\n  max_sequence_idle_microseconds: {idle_us}\n{CONTROLS}}}\n"
    )
    (root / name / "config.pbtxt").write_text(config)
    return root / name


def write_fixture_sequence(
    root: Path,
    name: str = "seq",
    *,
    slots: int = 1,
    idle_us: int = 5_000_000,
    parameters: dict | None = None,
    strategy: str = "direct { }",
    max_batch_size: int = 0,
) -> Path:
    """A fixture model (OUTPUT0 = INPUT0) with sequence batching (`strategy`) and a START control, `slots`
    slots."""
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    lines = [
        f'name: "{name}"',
        'backend: "fixture"',
        f"max_batch_size: {max_batch_size}",
        'input { name: "INPUT0" data_type: TYPE_FP32 dims: -1 }',
        'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: -1 }',
        f"instance_group [ {{ count: {slots} }} ]",
        f"sequence_batching {{ max_sequence_idle_microseconds: {idle_us} {strategy}",
        '  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]',
        "}",
    ]
    for key, value in (parameters or {}).items():
        lines.append(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}')
    (directory / "config.pbtxt").write_text("\n".join(lines) + "\n")
    return directory


def expected_sums(values: list[int]) -> list[int]:
    """What an accumulating sequence answers: the running sum of its values."""
    total, sums = 0, []
    for value in values:
        total += value
        sums.append(total)
    return sums
