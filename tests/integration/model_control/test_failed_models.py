"""A repository with broken models beside good ones, on a real server: a model whose config.pbtxt cannot be read or
is refused stays in RepositoryIndex with its reason, ModelReady says not ready, inference gets UNAVAILABLE "model 'x'
failed to load: <reason>" (never NOT_FOUND "unknown model"), the good models serve, and fixing the files then
RepositoryModelLoad brings the model back. Configs in Triton's list syntax parse."""

from __future__ import annotations

import numpy as np
import pytest

from generated import grpc_service_pb2 as pb
from service.testing import serve

from .._support import CALL_TIMEOUT, client_error, rpc_error, stub, write_fixture_model

TENSORS = {"inputs": [("X", "FP32", [4])], "outputs": [("Y", "FP32", [4])]}
LIST_SYNTAX_GOOD = """
instance_group [ { count: 1 kind: KIND_CPU } ]
model_warmup [ { name: "zeros" batch_size: 1
  inputs [ { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } ] } ]
response_cache { enable: true }
"""
REFUSED = """
instance_group [ { count: 1 passive: true } ]
batch_output [ { target_name: "Y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "X" } ]
"""


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "repository"
    write_fixture_model(root, "good", **TENSORS)
    write_fixture_model(root, "listed", **TENSORS, extra=LIST_SYNTAX_GOOD)
    write_fixture_model(root, "refused", **TENSORS, max_batch_size=4, extra=REFUSED)
    broken = write_fixture_model(root, "broken", **TENSORS)
    (broken / "config.pbtxt").write_text('name: "broken"\nbackend: "fixture"\ninput [ { name: "X" ')
    versioned = write_fixture_model(root, "versioned", **TENSORS, extra="version_policy { specific { versions: 7 } }")
    (versioned / "1").mkdir()
    (versioned / "2").mkdir()
    return root


def index(running) -> dict[str, tuple[str, str]]:
    return {m.name: (m.state, m.reason) for m in running.client.repository_index()}


def infer_error(running, model: str):
    request = pb.ModelInferRequest(model_name=model)
    return rpc_error(stub(running).ModelInfer, request)


def serves(running, model: str) -> bool:
    x = np.arange(4, dtype=np.float32)
    return bool(np.array_equal(running.client.infer(model, {"X": x})["Y"], x))


EXPECTED_REASONS = {
    "broken": "config.pbtxt: 3:",  # protobuf's line and column
    "refused": "instance_group[0].passive: not supported",
    "versioned": "version_policy: selects none of the version folders [1, 2]",
}


def test_broken_models_stay_listed_with_their_reason_and_answer_unavailable(repository):
    with serve(repository, allow_management=True) as running:
        listed = index(running)
        for name, words in EXPECTED_REASONS.items():
            state, reason = listed[name]
            assert state == "UNAVAILABLE" and reason.startswith("failed to load: ") and words in reason, listed[name]
            assert running.client.model_ready(name) is False
            error = infer_error(running, name)
            assert (error.code, error.reason) == ("UNAVAILABLE", "model_not_loaded"), error
            assert error.message.startswith(f"model '{name}' failed to load: ") and words in error.message, error
            assert "unknown model" not in error.message
        assert "batch_output: not supported" in listed["refused"][1]  # every refused field, not the first
        for name in ("good", "listed"):
            assert listed[name][0] == "READY" and running.client.model_ready(name)
            assert serves(running, name)
        unknown = infer_error(running, "nowhere")
        assert (unknown.code, unknown.reason) == ("NOT_FOUND", "model_not_found")


def test_a_stream_request_for_a_broken_model_gets_the_reason_and_the_stream_goes_on(repository):
    x = np.arange(4, dtype=np.float32)
    good = pb.ModelInferRequest(model_name="good", id="after")
    good.inputs.add(name="X", datatype="FP32", shape=[4])
    good.raw_input_contents.append(x.tobytes())
    with serve(repository) as running:
        requests = iter([pb.ModelInferRequest(model_name="refused", id="first"), good])
        call = stub(running).ModelStreamInfer(requests, timeout=CALL_TIMEOUT)
        responses = list(call)
    assert [r.infer_response.id for r in responses] == ["first", "after"]
    assert responses[0].error_message.startswith("model 'refused' failed to load: ")
    assert "passive" in responses[0].error_message
    assert responses[1].error_message == ""
    assert np.frombuffer(responses[1].infer_response.raw_output_contents[0], dtype="<f4").tolist() == x.tolist()


def test_the_failure_is_visible_to_metadata_and_config_as_unavailable(repository):
    with serve(repository) as running:
        for call in (running.client.model_metadata, running.client.model_config):
            error = client_error(call, "refused")
            assert (error.code, error.reason) == ("UNAVAILABLE", "model_not_loaded"), error
            assert "model 'refused' failed to load: " in error.message


def test_fixing_the_config_and_loading_brings_the_model_back(repository):
    with serve(repository, allow_management=True) as running:
        still = client_error(running.client.load, "refused")
        assert still.code == "INVALID_ARGUMENT" and "passive" in still.message
        (repository / "refused" / "config.pbtxt").write_text(
            'name: "refused"\nbackend: "fixture"\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] '
            'allow_ragged_batch: true } ]\noutput [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        )
        again = client_error(running.client.load, "refused")
        assert "allow_ragged_batch" in again.message
        state, reason = index(running)["refused"]
        assert state == "UNAVAILABLE" and "input[0].allow_ragged_batch: not supported" in reason, reason
        assert "passive" not in reason  # the reason is the latest one
        write_fixture_model(repository, "refused", **TENSORS)
        running.client.load("refused")
        assert index(running)["refused"][0] == "READY"
        assert running.client.model_ready("refused") and serves(running, "refused")
        assert serves(running, "good")
