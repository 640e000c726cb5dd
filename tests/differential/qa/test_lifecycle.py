"""L0_lifecycle, the cases whose models can be python, rewritten: a model without a version folder, version folders
that are not plain numbers (ignored), explicit loads that fail and their words, a load whose configuration is
given by the request, a load with files but no configuration, new versions loaded while unchanged ones stay, and
the poll mode adding and removing models. The QA's many-backend, GPU, multi-repository and shutdown-timing cases
are left out (only the python backend here; tests/differential/test_model_control.py has the repository ones)."""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from generated import grpc_service_pb2 as pb

from .harness import Model, python_model, wait_for
from .models import IDENTITY, identity_config

# Identity that counts its loads per version in loads/<version> beside the repository.
COUNTED = """
    import fcntl
    import os

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            folder = os.path.join(os.path.dirname(os.path.dirname(args["model_repository"])), "loads")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, args["model_version"]), "a") as handle:
                fcntl.lockf(handle, fcntl.LOCK_EX)
                handle.write("x")

        def execute(self, requests):
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests
            ]
"""

BROKEN = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("this version is broken")
"""

EXPLICIT = {"triton_args": ("--model-control-mode=explicit",), "model_control_mode": "explicit"}


def _versioned(versions, source: str = IDENTITY, extra: str = "") -> Model:
    model = python_model(identity_config(extra=extra), source)
    text = model.files["1/model.py"]
    return Model(model.config, {f"{version}/model.py": text for version in versions})


def _works(server, model: str, version: str = "") -> bool:
    value = np.arange(4, dtype=np.float32)[None]
    answer = server.infer(model, {"INPUT0": value}, version=version)
    return answer.ok and np.array_equal(answer["OUTPUT0"], value)


def test_parse_error_model_no_version(launch):
    """A model folder with no version folder: that model is not ready (the server neither), the others serve."""
    models = {"good": _versioned(["1"]), "noversion": Model(python_model(identity_config(), IDENTITY).config)}
    # Triton's default strict readiness, said on both sides (slotserve's default is false: docs/command-line.md)
    server = launch(models, ("--exit-on-error=false", "--strict-readiness=true"), strict_readiness=True)
    assert server.call("ServerLive", pb.ServerLiveRequest())[2].live
    assert not server.call("ServerReady", pb.ServerReadyRequest())[2].ready
    assert not server.ready("noversion")
    assert server.ready("good") and _works(server, "good")
    assert not _works(server, "noversion")


def test_parse_ignore_zero_prefixed_version(launch):
    """Version folders "1" and "003": only 1 is a version."""
    server = launch({"model": _versioned(["1", "003"])})
    assert server.ready("model", "1") and not server.ready("model", "3")
    assert _works(server, "model")


def test_parse_ignore_non_integral_version(launch):
    """Version folders "1" and "abc": only 1 is a version."""
    server = launch({"model": _versioned(["1", "abc"])})
    assert server.ready("model", "1")
    assert _works(server, "model")


def test_model_control_fail(launch):
    """A model whose configuration cannot be read: each load fails, in Triton's words."""
    broken = python_model(identity_config(), BROKEN)
    server = launch({"broken": broken}, **EXPLICIT)
    for _ in range(2):
        code, message = server.load("broken")
        assert code != "OK" and "load failed for model 'broken'" in message, (code, message)
        assert not server.ready("broken", "1")


def test_config_override(launch):
    """A load whose request gives the configuration: the file's (serving version 3, which fails) is not used;
    version 2 only."""
    model = _versioned(["1", "2", "3"])
    files = {**model.files, "1/model.py": BROKEN, "3/model.py": BROKEN}
    server = launch({"model": Model(model.config, files)}, **EXPLICIT)
    code, message = server.load("model")
    assert code != "OK" and "load failed for model 'model'" in message, (code, message)
    given = {
        "backend": "python",
        "max_batch_size": 64,
        "version_policy": {"specific": {"versions": [2]}},
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
    assert server.load("model", config=json.dumps(given)) == ("OK", "")
    assert [server.ready("model", version) for version in ("1", "2", "3")] == [False, True, False]
    assert _works(server, "model", "2")


def test_file_override(launch):
    """Files without a configuration are refused in Triton's words; with one, they load as the model's files."""
    model = _versioned(["3"])
    server = launch(
        {"model": model},
        ("--model-control-mode=explicit", "--load-model=model"),
        **{"model_control_mode": "explicit", "load_models": ("model",)},
    )
    source = model.files["3/model.py"].encode()
    code, message = server.load("model", files={"file:1/model.py": source})
    assert code != "OK" and "failed to load 'model', failed to poll from model repository" in message, message
    assert server.ready("model", "3") and _works(server, "model", "3")
    given = json.dumps(
        {
            "backend": "python",
            "max_batch_size": 64,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        }
    )
    assert server.load("override_model", config=given, files={"file:1/model.py": source}) == ("OK", "")
    assert server.ready("override_model", "1") and _works(server, "override_model", "1")


def _loads(server) -> dict[str, int]:
    folder = Path(server.repository).parent / "loads"
    return {path.name: len(path.read_text()) for path in folder.iterdir()} if folder.exists() else {}


def test_load_new_model_version(launch):
    """Versions 1, 2 served; 2's model.py touched, 3 and 4 added: a load brings 3 and 4 and reloads 2 only."""
    policy = "version_policy: { specific: { versions: [1, 2] } }"
    model = _versioned(["1", "2", "3"], COUNTED, policy)
    server = launch(
        {"identity_fp32": model},
        ("--model-control-mode=explicit", "--load-model=*"),
        model_control_mode="explicit",
        load_models=("*",),
    )
    folder = Path(server.repository) / "identity_fp32"
    assert [server.ready("identity_fp32", v) for v in "1234"] == [True, True, False, False]
    assert _loads(server) == {"1": 1, "2": 1}
    (folder / "2" / "model.py").touch()
    shutil.copytree(folder / "3", folder / "4")
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace("versions: [1, 2]", "versions: [1, 2, 3, 4]"))
    assert server.load("identity_fp32") == ("OK", "")
    assert [server.ready("identity_fp32", v) for v in "1234"] == [True, True, True, True]
    assert _loads(server) == {"1": 1, "2": 2, "3": 1, "4": 1}
    config.write_text(config.read_text().replace("versions: [1, 2, 3, 4]", "versions: [4]"))
    assert server.load("identity_fp32") == ("OK", "")
    assert [server.ready("identity_fp32", v) for v in "1234"] == [False, False, False, True]
    assert _loads(server) == {"1": 1, "2": 2, "3": 1, "4": 1}


def test_dynamic_model_load_unload(launch):
    """Poll mode: a model folder added is loaded, removed is unloaded."""
    server = launch(
        {"first": _versioned(["1"])},
        ("--model-control-mode=poll", "--repository-poll-secs=1"),
        model_control_mode="poll",
        repository_poll_seconds=1,
    )
    assert server.ready("first") and not server.ready("second")
    second = Path(server.repository) / "second"
    staging = Path(server.repository).parent / "second"
    staging.mkdir()
    (staging / "config.pbtxt").write_text(_versioned(["1"]).config or "")
    (staging / "1").mkdir()
    (staging / "1" / "model.py").write_text(_versioned(["1"]).files["1/model.py"])
    staging.rename(second)  # whole at once: a poll never sees half a model
    wait_for(lambda: server.ready("second"), "the added model is loaded", seconds=60)
    assert _works(server, "second")
    shutil.rmtree(second)
    wait_for(lambda: not server.ready("second"), "the removed model is unloaded", seconds=60)
    assert server.ready("first")
