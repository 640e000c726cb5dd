"""The generated parts of docs/migrating-from-triton.md.

The features of config.pbtxt: each Triton feature with what slotserve does, in the words of
engine/config/fields.py's FIELDS table (so the page says what the server does, and `make docs` updates it when a
rule changes).

The walkthrough: a Triton-style repository (an ONNX model with settings slotserve
refuses or ignores, a python model, an ensemble, a sequence model), the edits `python -m service check` leads to,
and the check's real output at each stage. `make docs` writes the page's generated parts from here (tests/docs
fails when they are stale), so every output the page shows is what the check prints today.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = "models"  # the folder the page's commands name, relative to where they run
SET_ASIDE = "triton-only"  # where the walkthrough moves the models slotserve does not serve yet

CLASSIFIER_BEFORE = """name: "classifier"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "pixels" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "scores" data_type: TYPE_FP16 dims: [ 4 ] } ]
instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] } ]
dynamic_batching {
  max_queue_delay_microseconds: 500
  priority_levels: 2
  default_priority_level: 1
}
optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" } ] } }
model_repository_agents { agents [ { name: "checksum" } ] }
"""
# First edit: the repository agent removed (slotserve runs none). The priority levels stay: they are served.
AGENT_LINE = 'model_repository_agents { agents [ { name: "checksum" } ] }\n'
CLASSIFIER_EDITED = CLASSIFIER_BEFORE.replace(AGENT_LINE, "")
# Second edit: the output's datatype as the model file has it.
CLASSIFIER_AFTER = CLASSIFIER_EDITED.replace("TYPE_FP16", "TYPE_FP32")

PREPROCESS = """name: "preprocess"
backend: "python"
max_batch_size: 8
input [ { name: "image" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "pixels" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
PREPROCESS_CODE = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        ...
"""
PIPELINE = """name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [ { name: "image" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "scores" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    { model_name: "preprocess" model_version: -1
      input_map { key: "image" value: "image" } output_map { key: "pixels" value: "pixels" } },
    { model_name: "classifier" model_version: -1
      input_map { key: "pixels" value: "pixels" } output_map { key: "scores" value: "scores" } }
  ]
}
"""
TRACKER = """name: "tracker"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "pixels" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "scores" data_type: TYPE_FP32 dims: [ 4 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] } ]
}
"""

CONFIGS_BEFORE = {
    "classifier": CLASSIFIER_BEFORE,
    "preprocess": PREPROCESS,
    "pipeline": PIPELINE,
    "tracker": TRACKER,
}
ONNX_MODELS = ("classifier", "tracker")
NOT_YET = ("tracker",)  # set aside by the first edit
AFTER_FLAGS = ("--parallel-jobs", "2")  # the flag that makes instance_group's count the slot count


def write_onnx(path: Path) -> None:
    """An Identity model pixels -> scores, FP32 [batch, 4]: small, and enough for the check to read."""
    import onnx
    from onnx import TensorProto, helper

    pixels = helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 4])
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Identity", ["pixels"], ["scores"])], "classifier", [pixels], [scores])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def write_before(where: Path) -> Path:
    """The Triton-style repository, written into `where`/models; returns that folder."""
    root = where / REPOSITORY
    for name, config in CONFIGS_BEFORE.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
        if name in ONNX_MODELS:
            write_onnx(root / name / "1" / "model.onnx")
    (root / "preprocess" / "1" / "model.py").write_text(PREPROCESS_CODE)
    return root


def first_edit(where: Path) -> None:
    """The models slotserve does not serve yet go to a folder of their own; the repository agent goes."""
    (where / SET_ASIDE).mkdir()
    for name in NOT_YET:
        (where / REPOSITORY / name).rename(where / SET_ASIDE / name)
    (where / REPOSITORY / "classifier" / "config.pbtxt").write_text(CLASSIFIER_EDITED)


def second_edit(where: Path) -> None:
    (where / REPOSITORY / "classifier" / "config.pbtxt").write_text(CLASSIFIER_AFTER)


def run_check(where: Path, *flags: str) -> str:
    """`$ python -m service check models FLAGS`, its output and its exit status, as a console block's text."""
    done = subprocess.run(
        [sys.executable, "-m", "service", "check", REPOSITORY, *flags],
        cwd=where,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode not in (0, 1) or done.stderr:
        raise RuntimeError(f"the check failed on the walkthrough: {done.returncode}\n{done.stderr}")
    command = " ".join(("python -m service check", REPOSITORY, *flags))
    return f"$ {command}\n{done.stdout}$ echo $?\n{done.returncode}\n"


def outputs() -> dict[str, str]:
    """The check's output on the repository as written, after the first edit, and after the second."""
    with tempfile.TemporaryDirectory() as folder:
        where = Path(folder)
        write_before(where)
        found = {"before": run_check(where)}
        first_edit(where)
        found["edited"] = run_check(where)
        second_edit(where)
        found["after"] = run_check(where, *AFTER_FLAGS)
        return found


# Triton's configuration features, each judged by the FIELDS entry named beside it.
CONFIG_FEATURES = (
    ("Backends", "backend"),
    ("Platforms", "platform"),
    ("Ensembles", "ensemble_scheduling"),
    ("Sequence batching (stateful models)", "sequence_batching"),
    ("Version policies", "version_policy"),
    ("Instance groups: count", "instance_group.count"),
    ("Instance groups: kind, GPUs, host policy", "instance_group.kind"),
    ("Instance groups: rate limiter", "instance_group.rate_limiter"),
    ("Dynamic batching", "dynamic_batching"),
    ("Dynamic batching: priority levels", "dynamic_batching.priority_levels"),
    ("Dynamic batching: queue policy", "dynamic_batching.default_queue_policy"),
    ("Dynamic batching: timeout action DELAY", "dynamic_batching.default_queue_policy.timeout_action"),
    ("Ragged batching", "input.allow_ragged_batch"),
    ("Batch inputs and outputs", "batch_input"),
    ("Input and output reshape, formats", "input.reshape"),
    ("Classification labels", "output.label_filename"),
    ("Optimization (execution accelerators, CUDA graphs, priority)", "optimization"),
    ("Model warmup", "model_warmup"),
    ("Response cache", "response_cache"),
    ("Decoupled models", "model_transaction_policy.decoupled"),
    ("Custom operations", "model_operations"),
    ("Repository agents", "model_repository_agents"),
    ("Metric tags", "metric_tags"),
    ("Backend parameters", "parameters"),
)
TREATMENT_WORDS = {"applied": "supported", "refused": "refused", "ignored": "ignored"}


def config_features_table() -> str:
    from engine.config.fields import FIELDS

    rows = ["| Triton | field | slotserve | what happens |", "|---|---|---|---|"]
    for feature, path in CONFIG_FEATURES:
        rule = FIELDS[path]
        reason = rule.reason.replace("|", "\\|")
        rows.append(f"| {feature} | `{path}` | {TREATMENT_WORDS[rule.treatment.value]} | {reason} |")
    return "\n".join(rows) + "\n"


def fenced(text: str, language: str) -> str:
    return f"```{language}\n{text}```\n"


def parts() -> dict[str, str]:
    """The page's generated parts, by name."""
    found = outputs()
    files = "".join(
        f"`{REPOSITORY}/{name}/config.pbtxt`:\n\n" + fenced(config, "protobuf") + "\n"
        for name, config in CONFIGS_BEFORE.items()
    )
    moves = "".join(f"mv {REPOSITORY}/{name} {SET_ASIDE}/\n" for name in NOT_YET)
    return {
        "config-features": config_features_table(),
        "walkthrough-files": files.rstrip("\n") + "\n",
        "walkthrough-before": fenced(found["before"], "console"),
        "walkthrough-first-edit": fenced(f"mkdir {SET_ASIDE}\n{moves}", "bash")
        + "\nand in `classifier/config.pbtxt`, this line goes:\n\n"
        + fenced(AGENT_LINE, "protobuf"),
        "walkthrough-edited": fenced(found["edited"], "console"),
        "walkthrough-after": fenced(found["after"], "console"),
    }
