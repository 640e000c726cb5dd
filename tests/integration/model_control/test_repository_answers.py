"""What the repository answers, without the reference server (tests/differential/test_repository_answers.py asks
Triton the same questions): the ModelConfig answer loads back as RepositoryModelLoad's `config` (issue 34, item 7), a
folder with only `1/model.py` is a python model completed by its auto_complete_config (34.11b), and a load of a
model the repository does not have gets Triton's code and words (34.8)."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import json_format

from generated import grpc_service_pb2 as pb
from service.testing import serve

from .._support import CALL_TIMEOUT, demo_subset, rpc_error, stub

PYTHON_CONFIG = """name: "py"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

IDENTITY = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        values = [pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy() for request in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)]) for value in values]
"""

AUTO_COMPLETE = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        config.set_max_batch_size(4)
        return config

    def execute(self, requests):
        values = [pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy() for request in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value * 2)]) for value in values]
"""


@pytest.fixture
def repository(tmp_path):
    root = demo_subset(tmp_path / "repository", "identity_fp32")
    (root / "py" / "1").mkdir(parents=True)
    (root / "py" / "config.pbtxt").write_text(PYTHON_CONFIG)
    (root / "py" / "1" / "model.py").write_text(IDENTITY)
    (root / "auto" / "1").mkdir(parents=True)
    (root / "auto" / "1" / "model.py").write_text(AUTO_COMPLETE)
    return root


def load(running, name: str, config: str | None = None) -> None:
    request = pb.RepositoryModelLoadRequest(model_name=name)
    if config is not None:
        request.parameters["config"].string_param = config
    stub(running).RepositoryModelLoad(request, timeout=CALL_TIMEOUT)


@pytest.mark.parametrize("parallel_jobs", [None, 2])
def test_the_model_config_answer_loads_back(repository, parallel_jobs):
    options = {"parallel_jobs": parallel_jobs} if parallel_jobs else {}
    with serve(
        repository, model_control_mode="explicit", load_models=("*",), allow_management=True, **options
    ) as running:
        values = np.arange(1, 5, dtype=np.float32).reshape(1, 4)
        for name in ("py", "identity_fp32"):
            answer = running.client.model_config(name)
            assert answer.default_model_filename == ("model.py" if name == "py" else "model.onnx")
            load(running, name, json_format.MessageToJson(answer))  # the python model looked for model.plan
            assert running.client.model_config(name) == answer
            assert running.client.infer(name, {"INPUT0": values})["OUTPUT0"].tolist() == values.tolist()


def test_a_folder_with_only_model_py_serves_as_its_auto_complete_config_says(repository):
    with serve(repository) as running:
        values = np.arange(8, dtype=np.float32).reshape(2, 4)
        assert running.client.infer("auto", {"INPUT0": values})["OUTPUT0"].tolist() == (values * 2).tolist()
        config = running.client.model_config("auto")
        assert (config.backend, config.max_batch_size, config.default_model_filename) == ("python", 4, "model.py")
        assert [list(tensor.shape) for tensor in running.client.model_metadata("auto").inputs] == [[-1, 4]]


def test_loading_a_model_the_repository_does_not_have_gets_tritons_answer(repository):
    with serve(repository, model_control_mode="explicit", allow_management=True) as running:
        error = rpc_error(stub(running).RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="nowhere"))
        assert (error.code, error.reason) == ("INTERNAL", "repository_poll_failed"), error
        assert error.message == (
            "failed to load 'nowhere', failed to poll from model repository: no model folder 'nowhere' in the "
            "repository"
        )
        assert running.client.live()
