"""The repository reader and RepositoryModelLoad asked of real Triton 2.51 and of slotserve (issues 33 and 34): the
same python models on both (slotserve runs Triton's python backend API too), the same calls.

* Version folders: `01` and `007` are not versions (Triton ignores leading zeros, with a warning), `0` is one. Folders
  Triton mishandles are sent to slotserve only: `1a`, `-1`, `+3` (Triton reads a number off the front, then never
  finishes loading that version: the load waits until the client's deadline, the model stays LOADING) and
  `99999999999999999999999` (Triton aborts, the whole server: std::out_of_range). slotserve ignores all of them:
  a folder name is a version only if it is ASCII digits without leading zeros, within int64.
* RepositoryModelLoad of an unknown model: INTERNAL "failed to load 'x', failed to poll from model repository" on
  both; slotserve adds its reason after Triton's words. A name that is no name (`a/b`, `..`, 300 characters): Triton
  answers INTERNAL with the same words; slotserve INVALID_ARGUMENT on purpose (issue 33: the caller's mistake),
  with Triton's words first.
* The ModelConfig answer, sent back as RepositoryModelLoad's `config`, loads the same model on both (slotserve's
  answer for a python model named model.plan, and without --parallel-jobs its count of 1 was refused).
* A changed model.py is reloaded with every instance new (34.7): the worker's pid changes on both. A load with
  nothing changed re-creates the instance on Triton; slotserve keeps it on purpose (its engine is unchanged).
* A folder with only `1/model.py` (no config.pbtxt) is a python model whose auto_complete_config gives its inputs,
  outputs and max_batch_size (34.11b), as Triton serves it by default (--strict-model-config=false); a model.py with
  no version folder is no model on either.

Skips, naming the reason, where the reference is not set up (bench/setup.sh).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf import json_format

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from service.testing import serve

from .calls import outcome
from .conftest import INSTALLATION, MISSING_REASON, Endpoint
from .reference import run_triton

pytestmark = pytest.mark.interop

POLL_FAILED = "failed to poll from model repository"

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }} ]
{extra}"""

# OUTPUT0 = INPUT0 * FACTOR; PID: the process that runs this instance (a python model instance is a process on both
# servers: Triton's stub, slotserve's worker).
MODEL = """import os

import numpy as np
import triton_python_backend_utils as pb_utils

FACTOR = {factor}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            pid = np.full((value.shape[0], 1), os.getpid(), dtype=np.int64)
            outputs = [pb_utils.Tensor("OUTPUT0", value * FACTOR), pb_utils.Tensor("PID", pid)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

# Triton's examples/auto_complete batch model, reduced: no config.pbtxt, everything from auto_complete_config.
AUTO_COMPLETE = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.set_max_batch_size(4)
        return auto_complete_model_config

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value * 2)]))
        return responses
"""

# model -> its version folders; each holds model.py, the model has a config.pbtxt.
FOLDERS = {"v01": ("01",), "v007": ("007",), "v0": ("0",), "vmix": ("1", "01", "007")}
# Version folders Triton mishandles (above): written into slotserve's repository only.
SLOTSERVE_ONLY_FOLDERS = {"v1a": ("1a",), "vneg": ("-1",), "vplus": ("+3",), "vhuge": ("99999999999999999999999",)}


def write_model(root: Path, name: str, folders=("1",), extra: str = "", factor: int = 1) -> None:
    for folder in folders:
        (root / name / folder).mkdir(parents=True, exist_ok=True)
        (root / name / folder / "model.py").write_text(MODEL.format(factor=factor))
    (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))


def write_repository(root: Path, *, slotserve: bool) -> Path:
    for name, folders in {**FOLDERS, **(SLOTSERVE_ONLY_FOLDERS if slotserve else {})}.items():
        write_model(root, name, folders, "version_policy { all { } }\n" if name == "vmix" else "")
    write_model(root, "ident")
    write_model(root, "reloaded")
    (root / "auto" / "1").mkdir(parents=True)
    (root / "auto" / "1" / "model.py").write_text(AUTO_COMPLETE)
    (root / "noversion").mkdir()
    (root / "noversion" / "model.py").write_text(AUTO_COMPLETE)
    return root


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Iterator[tuple[Endpoint, Endpoint, Path, Path]]:
    """(triton, slotserve, triton's repository, slotserve's), both in explicit mode with nothing loaded at start;
    slotserve with --parallel-jobs 2 (the reload test asks for two instances)."""
    if INSTALLATION is None:
        pytest.skip(MISSING_REASON)
    root = tmp_path_factory.mktemp("repository-answers")
    triton_repository = write_repository(root / "triton", slotserve=False)
    ours_repository = write_repository(root / "slotserve", slotserve=True)
    with ExitStack() as stack:
        running = stack.enter_context(
            run_triton(INSTALLATION, triton_repository, root, "--model-control-mode=explicit")
        )
        triton = Endpoint("triton", running.address, running.stub, running.metrics_url)
        server = stack.enter_context(
            serve(ours_repository, model_control_mode="explicit", allow_management=True, parallel_jobs=2)
        )
        channel = stack.enter_context(grpc.insecure_channel(server.address))
        ours = Endpoint("slotserve", server.address, pb_grpc.GRPCInferenceServiceStub(channel), "")
        yield triton, ours, triton_repository, ours_repository


def load(endpoint: Endpoint, name: str, config: str | None = None) -> tuple[str, object]:
    request = pb.RepositoryModelLoadRequest(model_name=name)
    if config is not None:
        request.parameters["config"].string_param = config
    return outcome(endpoint.stub.RepositoryModelLoad, request)


def versions(endpoint: Endpoint, name: str) -> list[str]:
    code, reply = outcome(endpoint.stub.RepositoryIndex, pb.RepositoryIndexRequest(ready=True))
    assert code == "OK", reply
    return sorted(model.version for model in reply.models if model.name == name)


def infer(endpoint: Endpoint, name: str, rows: int = 1, width: int = 3) -> tuple[np.ndarray, np.ndarray | None]:
    """(OUTPUT0, PID or None) for INPUT0 = 1..rows*width as FP32 [rows, width]."""
    values = np.arange(1, rows * width + 1, dtype=np.float32).reshape(rows, width)
    request = pb.ModelInferRequest(model_name=name)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=list(values.shape))
    request.raw_input_contents.append(values.tobytes())
    code, reply = outcome(endpoint.stub.ModelInfer, request)
    assert code == "OK", (endpoint.name, reply)
    found = {output.name: raw for output, raw in zip(reply.outputs, reply.raw_output_contents, strict=True)}
    pid = np.frombuffer(found["PID"], dtype=np.int64) if "PID" in found else None
    return np.frombuffer(found["OUTPUT0"], dtype=np.float32).reshape(rows, width) / values, pid


# ---- version folders ------------------------------------------------------------------------------------------------


def test_version_folders_with_leading_zeros_are_not_versions(pair):
    triton, ours, _, _ = pair
    for name in FOLDERS:
        answers = [load(endpoint, name) for endpoint in (triton, ours)]
        assert answers[0][0] == answers[1][0], (name, answers)
        assert [versions(endpoint, name) for endpoint in (triton, ours)] == [versions(triton, name)] * 2, name
    assert load(triton, "v01") == (
        "INVALID_ARGUMENT",
        "load failed for model 'v01': at least one version must be available under the version policy of model 'v01'\n",
    )
    assert versions(triton, "v0") == ["0"] and versions(triton, "vmix") == ["1"]


def test_version_folders_triton_mishandles_are_not_versions_on_slotserve(pair):
    _, ours, _, _ = pair
    for name in SLOTSERVE_ONLY_FOLDERS:
        code, message = load(ours, name)
        assert code == "INVALID_ARGUMENT" and "no numeric version directory" in str(message), (name, message)
        assert versions(ours, name) == []
    code, _ = outcome(ours.stub.ServerLive, pb.ServerLiveRequest())
    assert code == "OK"


# ---- messages ---------------------------------------------------------------------------------------------------


def test_loading_an_unknown_model_answers_with_tritons_code_and_words(pair):
    triton, ours, _, _ = pair
    reference, answer = load(triton, "nonexistent"), load(ours, "nonexistent")
    assert reference == ("INTERNAL", f"failed to load 'nonexistent', {POLL_FAILED}")
    assert answer[0] == reference[0] and str(answer[1]).startswith(reference[1]), answer


@pytest.mark.parametrize("name", ["a/b", "../../escaped", "/abs", "m" * 300, ""])
def test_a_bad_model_name_is_invalid_argument_with_tritons_words_first(pair, name):
    triton, ours, _, _ = pair
    reference, answer = load(triton, name), load(ours, name)
    assert reference == ("INTERNAL", f"failed to load '{name}', {POLL_FAILED}")
    assert answer[0] == "INVALID_ARGUMENT", answer  # issue 33: the caller's mistake
    if len(name) <= 120:  # a longer quoted name is shortened in every message (docs/errors.md)
        assert str(answer[1]).startswith(reference[1]), answer
        assert f"', {POLL_FAILED}: invalid model name " in str(answer[1]), answer


def test_a_file_component_over_name_max_gets_tritons_code_and_words(pair):
    """Sent to slotserve only: Triton answers INTERNAL "failed to poll from model repository", or aborts (both were
    seen from one run to the next)."""
    _, ours, _, _ = pair
    request = pb.RepositoryModelLoadRequest(model_name="fresh")
    request.parameters["config"].string_param = json.dumps({"backend": "python"})
    request.parameters["file:1/model.py"].bytes_param = AUTO_COMPLETE.encode()
    request.parameters["file:1/" + "m" * 256].bytes_param = b"x"
    code, message = outcome(ours.stub.RepositoryModelLoad, request)
    assert code == "INTERNAL" and message.startswith(f"failed to load 'fresh', {POLL_FAILED}: "), message
    assert "NAME_MAX" in message


# ---- the ModelConfig answer sent back --------------------------------------------------------------------------------


def test_the_model_config_answer_loads_back(pair):
    triton, ours, _, _ = pair
    for endpoint in (triton, ours):
        assert load(endpoint, "ident") == ("OK", pb.RepositoryModelLoadResponse())
        code, reply = outcome(endpoint.stub.ModelConfig, pb.ModelConfigRequest(name="ident"))
        assert code == "OK", reply
        answer = json_format.MessageToJson(reply.config)
        assert load(endpoint, "ident", answer)[0] == "OK", (endpoint.name, load(endpoint, "ident", answer))
        code, again = outcome(endpoint.stub.ModelConfig, pb.ModelConfigRequest(name="ident"))
        assert again.config == reply.config, endpoint.name
        assert infer(endpoint, "ident")[0].tolist() == [[1.0, 1.0, 1.0]]
    # Triton's own answer loads on slotserve too (its `optimization` is ignored with a warning).
    _, reference = outcome(triton.stub.ModelConfig, pb.ModelConfigRequest(name="ident"))
    assert load(ours, "ident", json_format.MessageToJson(reference.config))[0] == "OK"
    assert infer(ours, "ident")[0].tolist() == [[1.0, 1.0, 1.0]]


# ---- a changed model.py: every instance new -------------------------------------------------------------------


def test_a_changed_model_py_is_reloaded_with_every_instance_new(pair):
    triton, ours, triton_repository, ours_repository = pair
    seen = {}
    for endpoint, repository in ((triton, triton_repository), (ours, ours_repository)):
        assert load(endpoint, "reloaded")[0] == "OK"
        # Several requests, one after another: slotserve hands its free slots out in turn, so they meet every
        # instance (slotserve runs two here, Triton one); the set of worker pids is the set of instances.
        first = [infer(endpoint, "reloaded") for _ in range(4)]
        assert all(answer.tolist() == [[1.0, 1.0, 1.0]] for answer, _ in first)
        first_pids = {int(pid[0]) for _, pid in first}
        assert load(endpoint, "reloaded")[0] == "OK"  # nothing changed: the instances stay
        unchanged_pids = {int(infer(endpoint, "reloaded")[1][0]) for _ in range(4)}
        # model.py answers 1000 now, and two instances are asked for.
        write_model(repository, "reloaded", factor=1000, extra="instance_group [ { count: 2 } ]\n")
        assert load(endpoint, "reloaded")[0] == "OK"
        answers = [infer(endpoint, "reloaded") for _ in range(4)]
        pids = {int(pid[0]) for _, pid in answers}
        seen[endpoint.name] = (
            unchanged_pids <= first_pids,
            all(answer.tolist() == [[1000.0] * 3] for answer, _ in answers),
            not pids & (first_pids | unchanged_pids),
        )
    # Both: the new model.py answers, from instances that are all new. Where they differ on purpose: Triton 2.51
    # re-created the instance on a load with nothing changed; slotserve keeps an engine whose files and settings
    # did not change (docs/lifecycle.md, "A reconfiguration").
    assert seen["triton"] == (False, True, True), seen
    assert seen["slotserve"] == (True, True, True), seen


# ---- a folder with only 1/model.py -----------------------------------------------------------------------------


def test_a_folder_with_only_model_py_is_a_python_model_completed_by_the_model(pair):
    triton, ours, _, _ = pair
    configs, metadata = [], []
    for endpoint in (triton, ours):
        assert load(endpoint, "auto") == ("OK", pb.RepositoryModelLoadResponse()), endpoint.name
        code, reply = outcome(endpoint.stub.ModelConfig, pb.ModelConfigRequest(name="auto"))
        assert code == "OK", reply
        configs.append(reply.config)
        code, reply = outcome(endpoint.stub.ModelMetadata, pb.ModelMetadataRequest(name="auto"))
        assert code == "OK", reply
        metadata.append(reply)
        answer, _ = infer(endpoint, "auto", rows=2, width=4)
        assert answer.tolist() == [[2.0] * 4] * 2, endpoint.name
    for field in ("name", "backend", "max_batch_size", "input", "output", "default_model_filename"):
        assert getattr(configs[1], field) == getattr(configs[0], field), (field, configs)
    assert configs[0].max_batch_size == 4 and configs[0].backend == "python"
    assert [list(t.shape) for t in metadata[1].inputs] == [list(t.shape) for t in metadata[0].inputs] == [[-1, 4]]


def test_model_py_without_a_version_folder_is_no_model_on_either(pair):
    triton, ours, _, _ = pair
    reference, answer = load(triton, "noversion"), load(ours, "noversion")
    assert reference == ("INTERNAL", f"failed to load 'noversion', {POLL_FAILED}")
    assert answer[0] == reference[0] and str(answer[1]).startswith(reference[1]), answer
