"""EXECUTION_ENV_PATH on real Triton 2.51 and on slotserve, the same repository (issue 34 item 10): a model written
for numpy 1 (`np.NINF`) in an environment given as a folder (bench/.venv-pytriton, absolute) and as a packed
archive under `$$TRITON_MODEL_DIRECTORY` (a `--copies` venv whose site-packages reach numpy 1 through a .pth file,
packed at the archive's top as conda-pack does), and a model whose archive is not there. Both servers load the
first two and answer the same, on numpy 1; both refuse the third at load (INVALID_ARGUMENT).

What is not asked of Triton here, and why:
* another Python minor version: Triton's stub would need a libpython of that version to link, which this machine
  lacks (Triton sources the environment's bin/activate and runs its own stub; slotserve runs the environment's
  bin/python3 and refuses another minor version by name: tests/integration/python_models/test_environments.py);
* an archive that writes outside its folder: Triton 2.51 extracts it (its libarchive call sets no
  ARCHIVE_EXTRACT_SECURE_* flag; NVIDIA's zip-slip regression test came with a later release, which refuses with
  "Path contains '..'" and "Path is absolute", the words slotserve's refusals carry), so the test would write
  outside its folder;
* a folder without bin/activate: Triton needs that script, slotserve needs bin/python3 (a conda environment made
  with `conda create -p` has no activate script; Triton's README says to copy conda-pack's in).
"""

from __future__ import annotations

import numpy as np
import pytest

from generated import grpc_service_pb2 as pb
from tests.python_environments import (
    ABOUT_IO,
    LEGACY,
    MISSING_ENVIRONMENT,
    SITE_PACKAGES,
    copies_venv,
    model_environment,
    pack,
    write_model,
)

from .calls import outcome, outputs_by_name

pytestmark = pytest.mark.interop

X = np.array([1.5, -2.0, 0.0, -0.5], np.float32)
MODELS = ("legacy_folder", "legacy_packed", "missing")


def _repository(root, environment):
    repository = root / "models"
    write_model(repository, "legacy_folder", LEGACY, ABOUT_IO, environment=environment)
    packed = write_model(
        repository, "legacy_packed", LEGACY, ABOUT_IO, environment="$$TRITON_MODEL_DIRECTORY/env.tar.gz"
    )
    pack(copies_venv(root / "packed", site_packages=environment / SITE_PACKAGES), packed / "env.tar.gz")
    write_model(repository, "missing", LEGACY, ABOUT_IO, environment="$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    return repository


def _request(model: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="X", datatype="FP32", shape=list(X.shape))
    request.raw_input_contents.append(X.tobytes())
    for name in ("Y", "NUMPY"):
        request.outputs.add(name=name)
    return request


def _answers(endpoint) -> dict[str, tuple]:
    """model -> (load's code, (Y's bytes, NUMPY's bytes) or the inference's code)."""
    answers: dict[str, tuple] = {}
    for model in MODELS:
        loaded, _ = outcome(endpoint.stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name=model))
        code, reply = outcome(endpoint.stub.ModelInfer, _request(model))
        if code == "OK":
            outputs = outputs_by_name(reply)
            answers[model] = (loaded, (outputs["Y"], outputs["NUMPY"][2]))
        else:
            answers[model] = (loaded, code)
    return answers


def test_a_numpy_1_model_in_its_environment_answers_the_same_on_both(triton, slotserve_endpoint, tmp_path):
    environment = model_environment()
    if environment is None:
        pytest.skip(MISSING_ENVIRONMENT)
    repository = _repository(tmp_path, environment)
    reference = _answers(triton(repository, "--model-control-mode=explicit"))
    ours = _answers(
        slotserve_endpoint(repository, model_control_mode="explicit", python_environments_dir=tmp_path / "environments")
    )

    expected_y = ("FP32", [4], np.array([1.5, -np.inf, 0.0, -np.inf], np.float32).tobytes())
    version = _version(environment).encode()  # the environment's numpy answers, on both
    for model in ("legacy_folder", "legacy_packed"):
        loaded, (y, numpy_bytes) = reference[model]
        assert loaded == "OK" and y == expected_y and numpy_bytes.endswith(version), reference
    assert reference["missing"] == ("INVALID_ARGUMENT", "NOT_FOUND"), reference  # "Failed to get the canonical path"
    assert ours["legacy_folder"] == reference["legacy_folder"]
    assert ours["legacy_packed"] == reference["legacy_packed"]
    # The load is refused with Triton's code; a request for the model then gets UNAVAILABLE naming the reason, as for
    # any model whose load failed (docs/model-repository.md: "never NOT_FOUND"), where Triton answers NOT_FOUND.
    assert ours["missing"] == ("INVALID_ARGUMENT", "UNAVAILABLE"), ours


def _version(environment) -> str:
    found = sorted((environment / SITE_PACKAGES).glob("numpy-1.*.dist-info"))
    return found[0].name.removeprefix("numpy-").removesuffix(".dist-info")
