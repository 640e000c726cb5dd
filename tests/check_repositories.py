"""Repositories for the tests of `python -m service check` that hold its verdicts against a live server's.

* ``write_triton_examples``: Triton's example repository (the eight models of the server repository's
  docs/examples/model_repository), as a user moving to slotserve has it after converting what converts: the
  TensorFlow models that have an ONNX twin here are ONNX files under their own names and Triton's configurations
  (platform changed to onnxruntime_onnx), densenet_onnx is ONNX already (with the real model's tensors, which its
  `reshape` hides from Triton), and inception_graphdef stays TensorFlow. `simple_sequence` and
  `simple_dyna_sequence` take their control inputs (START, READY; START, END, READY, CORRID) as graph inputs the
  configuration does not list: the sequence batcher fills them.
* ``write_broken_ensembles``: two good ensembles (one the other's step) beside two the server refuses at load (a
  step naming no model; a max_batch_size of 16 over a step that allows 8).
* ``write_ensemble_cycle``: two ensembles that are each other's step.
* ``write_backend_refusals``: ONNX and python models the backends refuse at load for their parameters.

The configurations are written here, shaped like Triton's; nothing is copied from Triton's repository.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from demo import build_repository as demo

_OPSET = helper.make_opsetid("", demo.OPSET)


def _save(root: Path, name: str, nodes, inputs, outputs, initializers=()) -> None:
    graph = helper.make_graph(nodes, name, inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[_OPSET], ir_version=demo.IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(root / name / "1" / "model.onnx"))


def _config(root: Path, name: str, text: str) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(text)


def _tensor(kind: str, name: str, data_type: str, dims: str) -> str:
    return f'{kind} [ {{ name: "{name}" data_type: {data_type} dims: [ {dims} ] }} ]\n'


def _pair(kind: str, data_type: str) -> str:
    return (
        f'{kind} [ {{ name: "{kind.upper()}0" data_type: {data_type} dims: [ 16 ] }},\n'
        f'  {{ name: "{kind.upper()}1" data_type: {data_type} dims: [ 16 ] }} ]\n'
    )


def _flag(name: str, kind: str) -> str:
    return f'{{ name: "{name}" control [ {{ kind: {kind} int32_false_true: [ 0, 1 ] }} ] }}'


# The four TensorFlow examples that have an ONNX twin in the demo (the same tensors and arithmetic).
_ADD_SUB = {
    "simple": (demo.build_simple, "TYPE_INT32"),
    "simple_int8": (demo.build_simple_int8, "TYPE_INT8"),
    "simple_string": (demo.build_simple_string, "TYPE_STRING"),
}


def write_triton_examples(root: Path) -> Path:
    """Triton's example repository (see the module docstring) in `root`; returns `root`."""
    for name, (build, data_type) in _ADD_SUB.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(build().onnx_bytes)
        _config(
            root,
            name,
            f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            + _pair("input", data_type)
            + _pair("output", data_type),
        )
    (root / "simple_identity" / "1").mkdir(parents=True)
    (root / "simple_identity" / "1" / "model.onnx").write_bytes(demo.build_simple_identity().onnx_bytes)
    _config(
        root,
        "simple_identity",
        'name: "simple_identity"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        + _tensor("input", "INPUT0", "TYPE_STRING", "-1")
        + _tensor("output", "OUTPUT0", "TYPE_STRING", "-1"),
    )
    _write_simple_sequence(root)
    _write_simple_dyna_sequence(root)
    _write_densenet(root)
    _config(
        root,
        "inception_graphdef",
        'name: "inception_graphdef"\nplatform: "tensorflow_graphdef"\nmax_batch_size: 128\n'
        'input [ { name: "input" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [ 299, 299, 3 ] } ]\n'
        'output [ { name: "InceptionV3/Predictions/Softmax" data_type: TYPE_FP32 dims: [ 1001 ]\n'
        '  label_filename: "inception_labels.txt" } ]\n'
        "instance_group [ { kind: KIND_GPU } ]\n",
    )
    (root / "inception_graphdef" / "1").mkdir()
    (root / "inception_graphdef" / "1" / "model.graphdef").write_bytes(b"not converted")
    return root


def _batched(name: str, element: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, element, ["batch", 1])


def _write_simple_sequence(root: Path) -> None:
    """OUTPUT = (INPUT + START) * READY, INT32 [batch, 1]: START and READY are the controls the server fills."""
    inputs = [_batched(n, TensorProto.INT32) for n in ("INPUT", "START", "READY")]
    nodes = [
        helper.make_node("Add", ["INPUT", "START"], ["started"]),
        helper.make_node("Mul", ["started", "READY"], ["OUTPUT"]),
    ]
    _save(root, "simple_sequence", nodes, inputs, [_batched("OUTPUT", TensorProto.INT32)])
    _config(
        root,
        "simple_sequence",
        'name: "simple_sequence"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        "sequence_batching {\n  control_input [\n"
        f"    {_flag('START', 'CONTROL_SEQUENCE_START')},\n"
        f"    {_flag('READY', 'CONTROL_SEQUENCE_READY')}\n  ]\n}}\n"
        + _tensor("input", "INPUT", "TYPE_INT32", "1")
        + _tensor("output", "OUTPUT", "TYPE_INT32", "1")
        + "instance_group [ { kind: KIND_CPU } ]\n",
    )


def _write_simple_dyna_sequence(root: Path) -> None:
    """OUTPUT = INPUT + START + END + READY + CORRID (as INT32), INT32 [batch, 1]; the oldest strategy."""
    inputs = [_batched(n, TensorProto.INT32) for n in ("INPUT", "START", "END", "READY")]
    inputs.append(_batched("CORRID", TensorProto.UINT64))
    nodes = [
        helper.make_node("Cast", ["CORRID"], ["corrid"], to=TensorProto.INT32),
        helper.make_node("Add", ["INPUT", "START"], ["a"]),
        helper.make_node("Add", ["a", "END"], ["b"]),
        helper.make_node("Add", ["b", "READY"], ["c"]),
        helper.make_node("Add", ["c", "corrid"], ["OUTPUT"]),
    ]
    _save(root, "simple_dyna_sequence", nodes, inputs, [_batched("OUTPUT", TensorProto.INT32)])
    _config(
        root,
        "simple_dyna_sequence",
        'name: "simple_dyna_sequence"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        "sequence_batching {\n  max_sequence_idle_microseconds: 10000000\n"
        "  oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }\n"
        "  control_input [\n"
        f"    {_flag('START', 'CONTROL_SEQUENCE_START')},\n"
        f"    {_flag('END', 'CONTROL_SEQUENCE_END')},\n"
        f"    {_flag('READY', 'CONTROL_SEQUENCE_READY')},\n"
        '    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }\n'
        "  ]\n}\n"
        + _tensor("input", "INPUT", "TYPE_INT32", "1")
        + _tensor("output", "OUTPUT", "TYPE_INT32", "1")
        + 'parameters [ { key: "execute_delay_ms" value: { string_value: "3" } } ]\n'
        + "instance_group [ { count: 2 kind: KIND_CPU } ]\n",
    )


def _write_densenet(root: Path) -> None:
    """The real densenet's tensors (data_0 [1, 3, 224, 224] -> fc6_1 [1, 1000, 1, 1]) through a 1x1 convolution and
    a pooling; the configuration states them as Triton's does, through `reshape` (which slotserve ignores)."""
    data = helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [1, 3, 224, 224])
    scores = helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, [1, 1000, 1, 1])
    weights = helper.make_tensor("w", TensorProto.FLOAT, [1000, 3, 1, 1], [0.001] * 3000)
    nodes = [
        helper.make_node("Conv", ["data_0", "w"], ["map"]),
        helper.make_node("GlobalAveragePool", ["map"], ["fc6_1"]),
    ]
    _save(root, "densenet_onnx", nodes, [data], [scores], [weights])
    _config(
        root,
        "densenet_onnx",
        'name: "densenet_onnx"\nplatform: "onnxruntime_onnx"\nmax_batch_size : 0\n'
        'input [ { name: "data_0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 224, 224 ]\n'
        "  reshape { shape: [ 1, 3, 224, 224 ] } } ]\n"
        'output [ { name: "fc6_1" data_type: TYPE_FP32 dims: [ 1000 ] reshape { shape: [ 1, 1000, 1, 1 ] }\n'
        '  label_filename: "densenet_labels.txt" } ]\n',
    )
    (root / "densenet_onnx" / "densenet_labels.txt").write_text("".join(f"class{i}\n" for i in range(1000)))


# ---- ensembles ---------------------------------------------------------------------------------------------------

STEP_CONFIG = (
    'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    + _tensor("input", "X", "TYPE_FP32", "4")
    + _tensor("output", "Y", "TYPE_FP32", "4")
)


def ensemble_config(name: str, max_batch_size: int, steps: list[str]) -> str:
    """An ensemble X -> steps[0] -> steps[1] -> ... -> Y, each step an X -> Y model, FP32 [4]."""
    blocks = []
    for index, step in enumerate(steps):
        source = "X" if index == 0 else f"t{index}"
        target = "Y" if index == len(steps) - 1 else f"t{index + 1}"
        blocks.append(
            f'{{ model_name: "{step}" model_version: -1\n'
            f'      input_map {{ key: "X" value: "{source}" }} output_map {{ key: "Y" value: "{target}" }} }}'
        )
    return (
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
        + _tensor("input", "X", "TYPE_FP32", "4")
        + _tensor("output", "Y", "TYPE_FP32", "4")
        + "ensemble_scheduling { step [\n    "
        + ",\n    ".join(blocks)
        + "\n] }\n"
    )


def write_step(root: Path, name: str, config: str = STEP_CONFIG) -> None:
    """An Identity model X -> Y, FP32 [batch, 4], with `config` (default: max_batch_size 8)."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 4])
    _save(root, name, [helper.make_node("Identity", ["X"], ["Y"])], [x], [y])
    _config(root, name, config)


ZEROS_WARMUP = """model_warmup [ { name: "zeros" batch_size: 1
  inputs [ { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } ] } ]
"""


def write_broken_ensembles(root: Path) -> Path:
    """`prep` and `scale` (max_batch_size 8); `pipeline` (8, over both, with a warmup sample) serves, and so does
    `outer`, whose one step is `pipeline`; `missing_step` names a model the repository does not have; `too_wide`
    allows 16 over steps that allow 8."""
    write_step(root, "prep")
    write_step(root, "scale")
    _config(root, "pipeline", ensemble_config("pipeline", 8, ["prep", "scale"]) + ZEROS_WARMUP)
    _config(root, "outer", ensemble_config("outer", 8, ["pipeline"]))
    _config(root, "missing_step", ensemble_config("missing_step", 8, ["prep", "no_such_model"]))
    _config(root, "too_wide", ensemble_config("too_wide", 16, ["prep", "scale"]))
    return root


def write_ensemble_cycle(root: Path) -> Path:
    """`first` runs `second`, which runs `first`; `step` is an ordinary model beside them."""
    write_step(root, "step")
    _config(root, "first", ensemble_config("first", 8, ["step", "second"]))
    _config(root, "second", ensemble_config("second", 8, ["first"]))
    return root


def write_backend_refusals(root: Path) -> Path:
    """Models the backends refuse at load for their parameters, beside ones they serve: ONNX `one_slot` (at most 1
    slot, 2 asked for by instance_group: refused under --parallel-jobs), `threads` (intra_op_num_threads not a
    number); python `environment` (EXECUTION_ENV_PATH names an archive that is not there), `not_an_environment`
    (EXECUTION_ENV_PATH names a folder without bin/python3), `no_slots` (max_parallel_slots 0) and `plain` (serves)."""

    def parameters(**values: str) -> str:
        return "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in values.items())

    write_step(root, "onnx_good")
    write_step(root, "one_slot", STEP_CONFIG + parameters(max_parallel_slots="1") + "instance_group [ { count: 2 } ]\n")
    write_step(root, "threads", STEP_CONFIG + parameters(intra_op_num_threads="many"))
    python = 'backend: "python"\nmax_batch_size: 0\n' + _tensor("input", "X", "TYPE_FP32", "4")
    python += _tensor("output", "Y", "TYPE_FP32", "4")
    for name, extra in (
        ("plain", ""),
        ("environment", parameters(EXECUTION_ENV_PATH="$$TRITON_MODEL_DIRECTORY/env.tar.gz")),
        ("not_an_environment", parameters(EXECUTION_ENV_PATH="$$TRITON_MODEL_DIRECTORY/1")),
        ("no_slots", parameters(max_parallel_slots="0")),
    ):
        _config(root, name, python + extra)
        (root / name / "1").mkdir()
        (root / name / "1" / "model.py").write_text(_IDENTITY_PY)
    return root


_IDENTITY_PY = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
            for r in requests
        ]
"""


def write_hostile_files(root: Path) -> Path:
    """Special files where a model's files belong, beside a model that serves: `folder_config` has a folder named
    config.pbtxt, `fifo_config` a FIFO there, `fifo_model` a FIFO as its 1/model.onnx; `good` serves."""
    write_step(root, "good")
    (root / "folder_config" / "config.pbtxt").mkdir(parents=True)
    (root / "folder_config" / "1").mkdir()
    (root / "fifo_config" / "1").mkdir(parents=True)
    os.mkfifo(root / "fifo_config" / "config.pbtxt")
    _config(root, "fifo_model", STEP_CONFIG)
    (root / "fifo_model" / "1").mkdir()
    os.mkfifo(root / "fifo_model" / "1" / "model.onnx")
    return root
