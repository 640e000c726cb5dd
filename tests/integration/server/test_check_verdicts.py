"""`python -m service check` says of each model what a real server does with it (issue 25).

Each test builds a repository of small ONNX models (written here with onnx's helper), good ones beside broken
ones, runs the check as a process (`--format json`) and a real server on the same folder (service.testing.serve:
gRPC on a free port), and compares, model by model, served or not and the reason: the check's `reason` must be the
server's (RepositoryIndex's reason without its "failed to load: " / "model 'x': " opening). Exit status 0, 1 and 2
are each seen.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from service.testing import serve
from tests.check_repositories import write_broken_ensembles, write_triton_examples

from .._support import ROOT

CHECK_TIMEOUT = 180.0  # seconds: a loaded machine imports onnx, grpc and numpy slowly

GOOD_CONFIG = """platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
LIST_SYNTAX = (
    GOOD_CONFIG
    + """instance_group [ { count: 1 kind: KIND_GPU } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
model_warmup [ { name: "zeros" batch_size: 1
  inputs [ { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } ] } ]
"""
)
REFUSED = (
    GOOD_CONFIG
    + """instance_group [ { count: 1 passive: true } ]
batch_output [ { target_name: "Y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "X" } ]
"""
)
WRONG_INPUTS = GOOD_CONFIG.replace("dims: [ 4 ] } ]\noutput", "dims: [ 5 ] } ]\noutput")
PYTHON_CONFIG = 'backend: "python"\nmax_batch_size: 0\n'
PYTHON_MODEL = 'raise RuntimeError("this model must never be imported by a check without --load")\n'


def write_onnx(path: Path, width: int = 4) -> None:
    """An Identity model X -> Y, FP32 [batch, width]."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", width])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", width])
    graph = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "identity", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def model(root: Path, name: str, config: str, *, version: bool = True, file: bool = True) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "config.pbtxt").write_text(config)
    if version:
        (directory / "1").mkdir()
        if file:
            write_onnx(directory / "1" / "model.onnx")
    return directory


@pytest.fixture
def mixed(tmp_path) -> Path:
    """Every kind of model the issue names: each good or broken in its own way."""
    root = tmp_path / "mixed"
    model(root, "good", GOOD_CONFIG)
    model(root, "listed", LIST_SYNTAX)
    model(root, "bad_pbtxt", 'platform: "onnxruntime_onnx"\ninput [ { name: "X" ')
    model(root, "no_version", GOOD_CONFIG, version=False)
    model(root, "no_file", GOOD_CONFIG, file=False)
    model(root, "wrong_inputs", WRONG_INPUTS)
    model(root, "refused", REFUSED)
    python = model(root, "python", PYTHON_CONFIG, file=False)
    (python / "1" / "model.py").write_text(PYTHON_MODEL)
    model(root, "ensemble", 'platform: "ensemble"\nmax_batch_size: 0\n', file=False)
    return root


def run_check(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "service", "check", *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT,
    )


def check_json(repository: Path, *flags: str) -> tuple[int, dict]:
    done = run_check(str(repository), "--format", "json", *flags)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def server_verdicts(repository: Path, **options) -> dict[str, tuple[bool, str]]:
    """name -> (serves, reason) as a real server started on `repository` lists them."""
    options.setdefault("enable_test_backends", False)  # as `python -m service` starts by default
    with serve(repository, **options) as running:
        listed = running.client.repository_index()
        verdicts = {}
        for entry in listed:
            reason = entry.reason.removeprefix("failed to load: ").removeprefix(f"model '{entry.name}': ")
            verdicts[entry.name] = (entry.state == "READY" and running.client.model_ready(entry.name), reason)
        return verdicts


def without_python(verdicts: dict[str, tuple[bool, str]]) -> dict[str, tuple[bool, str]]:
    """The verdicts a check without --load can know: the python model's code (which raises at import) runs only
    with --load."""
    return {name: verdict for name, verdict in verdicts.items() if name != "python"}


def check_verdicts(report: dict) -> dict[str, tuple[bool, str]]:
    return {m["name"]: (m["serves"], m["reason"] or "") for m in report["models"]}


def test_the_check_says_of_each_model_what_a_real_server_does(mixed):
    status, report = check_json(mixed)
    expected = server_verdicts(mixed)
    verdicts = check_verdicts(report)
    # A python model's code runs only with --load (test_load_... below): without it the check reads its
    # configuration and file, which are fine, while the server imports the model.py, which raises.
    assert verdicts.pop("python") == (True, "")
    python = next(m for m in report["models"] if m["name"] == "python")
    assert python["not_run"].startswith("model.py is imported (its code runs) only with --load")
    assert expected["python"][0] is False and "must never be imported" in expected["python"][1]
    assert verdicts == {name: verdict for name, verdict in expected.items() if name != "python"}
    assert status == 1 and report["serves"] is False
    # The repository really has both kinds, and each broken model for its own reason.
    assert {name for name, (serves, _) in expected.items() if serves} == {"good", "listed"}
    reasons = {name: reason for name, (_, reason) in expected.items()}
    assert reasons["bad_pbtxt"].startswith("config.pbtxt: 2:")
    assert "no numeric version directory" in reasons["no_version"]
    assert "model file no_file/1/model.onnx not found" in reasons["no_file"]
    assert "input 'X' has dims [4] in the model" in reasons["wrong_inputs"]
    assert "instance_group[0].passive: not supported" in reasons["refused"]
    assert "batch_output: not supported" in reasons["refused"]
    assert "an ensemble needs ensemble_scheduling with at least one step" in reasons["ensemble"]


def test_the_same_verdict_under_the_parallel_runtime(mixed):
    # A slot count out of range is refused by the registry under --parallel-jobs, and only there.
    model(mixed, "too_many_slots", GOOD_CONFIG + "instance_group [ { count: 17 } ]\n")
    status, report = check_json(mixed, "--parallel-jobs", "3")
    assert without_python(check_verdicts(report)) == without_python(server_verdicts(mixed, parallel_jobs=3))
    by_name = {m["name"]: m for m in report["models"]}
    assert by_name["too_many_slots"]["serves"] is False and "1..16" in by_name["too_many_slots"]["reason"]
    assert by_name["good"]["slots"] == 3  # --parallel-jobs is the default count
    assert by_name["listed"]["slots"] == 1  # instance_group's count
    _, legacy = check_json(mixed)
    assert {m["name"]: m for m in legacy["models"]}["too_many_slots"]["serves"] is True  # one slot without it


def test_each_model_block_names_its_refused_and_ignored_fields_and_the_file(mixed):
    _, report = check_json(mixed)
    by_name = {m["name"]: m for m in report["models"]}
    refused = {f["field"] for f in by_name["refused"]["refused"]}
    assert refused == {"instance_group[0].passive", "batch_output"}
    listed = by_name["listed"]
    assert {f["field"] for f in listed["ignored"]} == {"instance_group[0].kind"}  # model_warmup is applied: it runs
    assert listed["warmup"] == [{"name": "zeros", "batch_size": 1, "count": 1, "inputs": ["X FP32 [4] zero"]}]
    assert listed["batching"]["max_queue_delay_us"] == 100 and listed["versions"] == [1]
    wrong = by_name["wrong_inputs"]["files"]
    assert wrong == [
        {
            "file": "wrong_inputs/1/model.onnx",
            "inputs": ["X FP32 [-1, 4]"],
            "outputs": ["Y FP32 [-1, 4]"],
            "problem": by_name["wrong_inputs"]["reason"],
        }
    ]


def test_text_output_has_one_block_per_model(mixed):
    done = run_check(str(mixed))
    assert done.returncode == 1, done.stderr
    blocks = done.stdout.strip().split("\n\n")
    assert blocks[-1] == "3 of 9 models would serve"  # good, listed and python (whose code runs only with --load)
    heads = [block.splitlines()[0] for block in blocks[:-1]]
    assert "model 'good' version 1: serves" in heads
    assert "model 'refused' version 1: does not serve" in heads
    refused = next(block for block in blocks if block.startswith("model 'refused'"))
    assert "  refused: batch_output: not supported: ragged batching" in refused


def test_exit_status_0_when_every_model_serves(tmp_path):
    model(tmp_path / "repo", "good", GOOD_CONFIG)
    model(tmp_path / "repo", "listed", LIST_SYNTAX)
    status, report = check_json(tmp_path / "repo")
    assert status == 0 and report["serves"] is True
    assert check_verdicts(report) == server_verdicts(tmp_path / "repo")


@pytest.mark.parametrize("kind", ["missing", "file", "empty"])
def test_exit_status_2_when_the_path_is_not_a_repository(tmp_path, kind):
    path = tmp_path / "models"
    if kind == "file":
        path.write_text("not a folder")
    elif kind == "empty":
        (path / "notes").mkdir(parents=True)  # a folder without config.pbtxt or a version folder
    done = run_check(str(path))
    expected = {"missing": "no such folder", "file": "not a folder", "empty": "it holds no model folder"}[kind]
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"slotserve check: {path} is not a model repository: {expected}"), done.stderr


def test_load_loads_each_model_and_sends_one_request(mixed):
    status, report = check_json(mixed, "--load")
    assert status == 1
    assert check_verdicts(report) == server_verdicts(mixed)  # the python model's import fails in both
    by_name = {m["name"]: m for m in report["models"]}
    for name in ("good", "listed"):
        load = by_name[name]["load"]
        assert load["request"] == "ok" and load["seconds"] > 0 and load["memory_bytes"] > 0, load
    assert by_name["wrong_inputs"]["load"] is None  # its load failed: nothing to measure
    assert by_name["python"]["load"] is None  # its model.py raised at import: nothing to measure


def test_the_servers_flags_are_checked_as_the_server_checks_them(tmp_path):
    model(tmp_path / "repo", "good", GOOD_CONFIG)
    model(tmp_path / "repo", "other", GOOD_CONFIG)
    done = run_check(str(tmp_path / "repo"), "--load-model", "good")  # lazy mode, as the server's default
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "slotserve check: --load-model needs --model-control-mode explicit (the mode is lazy)\n"
    status, report = check_json(tmp_path / "repo", "--model-control-mode", "explicit", "--load-model", "good")
    startup = {m["name"]: m["startup"] for m in report["models"]}
    assert status == 0
    assert startup["good"] == "loaded at startup (--model-control-mode explicit, --load-model)"
    assert startup["other"].startswith("registered, not loaded at startup")
    with serve(tmp_path / "repo", model_control_mode="explicit", load_models=("good",)) as running:
        assert running.client.model_ready("good") and not running.client.model_ready("other")


def test_the_slotserve_command_has_the_check_too(tmp_path, capsys):
    """`slotserve check PATH` (the console script, service.process.cli.main) is `python -m service check PATH`."""
    from service.process.cli import main

    model(tmp_path / "repo", "good", GOOD_CONFIG)
    assert main(["check", str(tmp_path / "repo"), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(m["name"], m["serves"]) for m in report["models"]] == [("good", True)]


MODEL_KEYS = {  # the JSON shape docs/migrating-from-triton.md documents (format 1)
    "name", "serves", "reason", "backend", "model_file", "version_folders", "versions", "slots", "max_batch_size",
    "batching", "sequence", "rate_limiter", "warmup", "warmup_runs", "startup", "not_run", "refused", "ignored",
    "files", "load",
}  # fmt: skip


def test_the_json_has_the_documented_shape(mixed):
    _, report = check_json(mixed)
    assert set(report) == {"format", "repository", "serves", "models"} and report["format"] == 1
    assert report["repository"] == str(mixed)
    assert all(set(m) == MODEL_KEYS for m in report["models"]), [sorted(m) for m in report["models"]]
    page = (ROOT / "docs" / "migrating-from-triton.md").read_text()
    assert all(f"`{key}`" in page for key in MODEL_KEYS)


def test_a_file_onnx_cannot_read_does_not_serve_and_load_gives_the_servers_words(tmp_path):
    root = tmp_path / "repo"
    model(root, "good", GOOD_CONFIG)
    corrupt = model(root, "corrupt", GOOD_CONFIG, file=False)
    (corrupt / "1" / "model.onnx").write_bytes(b"\x08\x07 this is not a protobuf message" * 8)
    expected = server_verdicts(root)
    assert expected["corrupt"][0] is False and expected["good"][0] is True
    assert expected["corrupt"][1].startswith("onnxruntime could not load corrupt/1/model.onnx: ")
    status, report = check_json(root)
    verdicts = check_verdicts(report)
    assert status == 1 and {name: serves for name, (serves, _) in verdicts.items()} == {"good": True, "corrupt": False}
    # Without a session the words are onnx's, naming the file; --load asks ONNX Runtime, as the server does.
    assert verdicts["corrupt"][1].startswith("model file corrupt/1/model.onnx is not an ONNX model onnx can read: ")
    status, loaded = check_json(root, "--load")
    assert status == 1 and check_verdicts(loaded) == expected


# ---- issue 35: the check and the server share one loading decision -----------------------------------------------


def test_tritons_example_repository_gets_the_servers_verdicts(tmp_path):
    """Triton's eight examples (tests/check_repositories.py): the sequence models serve, their control inputs being
    the sequence batcher's; densenet's reshaped tensors and the TensorFlow model do not, for the server's reasons."""
    root = write_triton_examples(tmp_path / "examples")
    status, report = check_json(root)
    expected = server_verdicts(root)
    assert check_verdicts(report) == expected
    assert expected["simple_sequence"] == (True, "") and expected["simple_dyna_sequence"] == (True, "")
    assert {name for name, (serves, _) in expected.items() if not serves} == {"densenet_onnx", "inception_graphdef"}
    assert status == 1
    by_name = {m["name"]: m for m in report["models"]}
    assert by_name["simple_sequence"]["sequence"]["filled_inputs"] == ["READY", "START"]
    assert by_name["simple_dyna_sequence"]["sequence"]["filled_inputs"] == ["CORRID", "END", "READY", "START"]


def test_an_ensemble_the_server_refuses_does_not_serve(tmp_path):
    """A step naming no model, and max_batch_size 16 over steps allowing 8: refused when the ensemble loads, so the
    check says so (and exits 1) with the server's reasons; the good ensemble beside them serves."""
    root = write_broken_ensembles(tmp_path / "ensembles")
    status, report = check_json(root)
    expected = server_verdicts(root)
    assert check_verdicts(report) == expected
    assert status == 1 and report["serves"] is False
    reasons = {name: reason for name, (serves, reason) in expected.items() if not serves}
    assert reasons == {
        "missing_step": "ensemble 'missing_step': step 1 (model 'no_such_model') names a model that is not registered",
        "too_wide": "ensemble 'too_wide': the ensemble allows maximum batch size 16, but step 0 (model 'prep') only "
        "allows maximum batch size 8",
    }


def test_load_loads_an_ensembles_steps_in_its_throwaway_server(tmp_path):
    """`--load` on an ensemble loads its steps first, so its request of zeros runs through them; each model still
    gets the server's verdict."""
    root = write_broken_ensembles(tmp_path / "ensembles")
    status, report = check_json(root, "--load")
    assert status == 1 and check_verdicts(report) == server_verdicts(root)
    by_name = {m["name"]: m for m in report["models"]}
    for name in ("pipeline", "outer"):  # outer's step is the ensemble pipeline: its steps load first
        assert by_name[name]["serves"] is True and by_name[name]["load"]["request"] == "ok", by_name[name]["load"]
