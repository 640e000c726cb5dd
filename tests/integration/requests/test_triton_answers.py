"""Answers slotserve gives as Triton 2.51 gives them (tests/differential compares them with a real Triton; these
run without one): ModelConfig's defaults, the refusal of typed contents beside raw_input_contents, and the
unload of a model the repository does not have."""

from __future__ import annotations

import numpy as np
import pytest

from generated import grpc_service_pb2 as pb
from generated import model_config_pb2
from service.testing import serve

from .._support import CALL_TIMEOUT, check_simple_response, demo_subset, rpc_error, simple_request, stub

MIXED = "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'"


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    repository = demo_subset(tmp_path_factory.mktemp("repository"), "simple")
    # The same model with an unnamed instance group and a version policy of its own.
    (repository / "grouped").mkdir()
    (repository / "grouped" / "1").mkdir()
    (repository / "grouped" / "1" / "model.onnx").write_bytes((repository / "simple" / "1" / "model.onnx").read_bytes())
    config = (repository / "simple" / "config.pbtxt").read_text().replace('name: "simple"', 'name: "grouped"')
    config += "instance_group [ { count: 1 kind: KIND_CPU } ]\nversion_policy: { all { } }\n"
    (repository / "grouped" / "config.pbtxt").write_text(config)
    with serve(repository, allow_management=True) as server:
        yield server


def _config(running, name: str) -> model_config_pb2.ModelConfig:
    return stub(running).ModelConfig(pb.ModelConfigRequest(name=name), timeout=CALL_TIMEOUT).config


def test_model_config_fills_tritons_defaults(running):
    config = _config(running, "simple")
    assert config.version_policy == model_config_pb2.ModelVersionPolicy(
        latest=model_config_pb2.ModelVersionPolicy.Latest(num_versions=1)
    )
    assert [(g.name, g.kind, g.count) for g in config.instance_group] == [
        ("simple", model_config_pb2.ModelInstanceGroup.KIND_CPU, 1)
    ]
    assert config.default_model_filename == "model.onnx"
    assert not config.HasField("optimization")  # Triton's pinned-memory defaults are not applied, so not claimed


def test_model_config_keeps_what_the_configuration_states(running):
    config = _config(running, "grouped")
    assert config.version_policy.WhichOneof("policy_choice") == "all"
    assert [g.name for g in config.instance_group] == ["grouped_0"]  # Triton's name for an unnamed group


def _valid_request_still_answers(running) -> None:
    request, first, second = simple_request(batch=2)
    check_simple_response(stub(running).ModelInfer(request, timeout=CALL_TIMEOUT), first, second)


def _typed(request: pb.ModelInferRequest, index: int) -> None:
    request.inputs[index].contents.int_contents.extend(range(16))


@pytest.mark.parametrize("raw_entries", [1, 2], ids=["fewer-raw-entries", "one-raw-entry-each"])
def test_typed_contents_beside_raw_contents_refused_in_tritons_words(running, raw_entries):
    """grpc_explicit_int_content_client's last request (both inputs typed, one raw entry), and the same with a raw
    entry per input: the typed contents are the problem, said as Triton says it."""
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
    _typed(request, 0)
    request.raw_input_contents.extend([np.zeros(16, "<i4").tobytes()] * raw_entries)
    error = rpc_error(stub(running).ModelInfer, request)
    assert (error.code, error.reason, error.message) == ("INVALID_ARGUMENT", "invalid_request_error", MIXED)
    _valid_request_still_answers(running)


def test_raw_entry_count_still_named_without_typed_contents(running):
    request, _, _ = simple_request()
    del request.raw_input_contents[1:]
    error = rpc_error(stub(running).ModelInfer, request)
    assert error.code == "INVALID_ARGUMENT"
    assert "raw_input_contents has 1 entries for 2 inputs" in error.message


def test_unload_of_a_model_the_repository_does_not_have_answers_ok(running):
    answer = stub(running).RepositoryModelUnload(
        pb.RepositoryModelUnloadRequest(model_name="nowhere"), timeout=CALL_TIMEOUT
    )
    assert answer == pb.RepositoryModelUnloadResponse()
    index = stub(running).RepositoryIndex(pb.RepositoryIndexRequest(), timeout=CALL_TIMEOUT)
    assert "nowhere" not in {model.name for model in index.models}
    _valid_request_still_answers(running)


def test_unload_of_an_unknown_model_in_explicit_mode_answers_ok(tmp_path):
    repository = demo_subset(tmp_path, "simple")
    with serve(repository, model_control_mode="explicit", load_models=("simple",), allow_management=True) as server:
        request = pb.RepositoryModelUnloadRequest(model_name="nowhere")
        assert stub(server).RepositoryModelUnload(request, timeout=CALL_TIMEOUT) == pb.RepositoryModelUnloadResponse()
        _valid_request_still_answers(server)


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_unload_of_an_unknown_model_still_refused_where_control_is_off(tmp_path, mode):
    repository = demo_subset(tmp_path, "simple")
    with serve(repository, model_control_mode=mode, allow_management=True) as server:
        error = rpc_error(stub(server).RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name="nowhere"))
        assert (error.code, error.reason) == ("UNAVAILABLE", "model_control_disabled")


def test_statistics_of_an_unknown_model_or_version_is_not_found(running):
    """slotserve's code for an unknown model on every call (Triton says INVALID_ARGUMENT here only: docs/errors.md)."""
    for name, version in (("nowhere", ""), ("simple", "2")):
        error = rpc_error(stub(running).ModelStatistics, pb.ModelStatisticsRequest(name=name, version=version))
        assert (error.code, error.reason) == ("NOT_FOUND", "model_not_found"), (name, version)
        assert error.message.startswith("Request for unknown model: "), error.message
