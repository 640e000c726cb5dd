"""tritonclient's model control (load_model with config and files, explicit mode's unload) against slotserve,
from a separate process (clients/tritonclient_model_control.py)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from google.protobuf import json_format, text_format

from generated import model_config_pb2

pytestmark = pytest.mark.interop

SCRIPT = "tritonclient_model_control.py"
MODEL = "identity_fp32"
VALUES = np.arange(6, dtype=np.float32).reshape(1, 6).tolist()


@pytest.fixture
def arguments(demo_repository, tmp_path):
    """(config JSON file naming the model `fresh`, the identity ONNX file)."""
    config = text_format.Parse((demo_repository / MODEL / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    config.name = "fresh"
    config_path = tmp_path / "fresh.json"
    config_path.write_text(json_format.MessageToJson(config))
    return str(config_path), str(demo_repository / MODEL / "1" / "model.onnx")


def test_load_model_with_config_and_files(slotserve, run_client, demo_repository, arguments, tmp_path):
    repository = tmp_path / "repository"
    shutil.copytree(demo_repository / MODEL, repository / MODEL)
    files_dir = tmp_path / "files"
    files_dir.mkdir()
    server = slotserve(repository, allow_management=True, model_control_mode="explicit", model_files_dir=files_dir)

    seen = run_client(SCRIPT, server.address, "files", *arguments)

    assert seen["ready_after_load"] is True
    assert seen["infer_after_load"] == VALUES and seen["infer_after_reload"] == VALUES
    assert seen["no_config"]["status"] == "StatusCode.INVALID_ARGUMENT", seen["no_config"]
    assert "'config' parameter" in seen["no_config"]["message"]
    # a `file:` path the server refuses gets Triton's answer: INTERNAL "failed to poll from model repository"
    assert seen["bad_name"]["status"] == "StatusCode.INTERNAL", seen["bad_name"]
    assert (
        "failed to poll from model repository" in seen["bad_name"]["message"] and "'..'" in seen["bad_name"]["message"]
    )
    assert seen["ready_after_unload"] is False
    assert seen["infer_after_unload"]["status"] == "StatusCode.UNAVAILABLE", seen["infer_after_unload"]
    assert not list(files_dir.glob("*/fresh-*")), "the files of the unloaded model are still there"


def test_explicit_mode_unload_sticks_for_tritonclient(slotserve, run_client, demo_repository, arguments, tmp_path):
    repository = tmp_path / "repository"
    shutil.copytree(demo_repository / MODEL, repository / MODEL)
    server = slotserve(repository, allow_management=True, model_control_mode="explicit", load_models=("*",))

    seen = run_client(SCRIPT, server.address, "explicit", *arguments)

    assert seen["ready_at_start"] is True and seen["ready_after_unload"] is False
    for key in ("infer_after_unload", "still_after_unload"):
        assert seen[key]["status"] == "StatusCode.UNAVAILABLE", seen[key]
        assert "--model-control-mode explicit" in seen[key]["message"], seen[key]
    assert seen["ready_after_load"] is True and seen["infer_after_load"] == VALUES
