"""What slotserve already does, asked of both servers on the same add/sub repository (ONNX for slotserve, python
for Triton): metadata, config, readiness, the index, inference and its errors. Each test sends one question to
both and compares the answers; a documented slotserve choice is asserted as documented instead."""

from __future__ import annotations

import pytest

from generated import grpc_service_pb2 as pb

from .calls import add_sub_request, outcome, outputs_by_name

MODELS = ("simple", "simple_int8")


def ask(both, method: str, request):
    """The outcome of the same call on (triton, slotserve)."""
    return tuple(outcome(getattr(endpoint.stub, method), request) for endpoint in both)


def test_server_metadata_extensions_slotserve_names_mean_tritons(both):
    (triton_code, triton), (code, ours) = ask(both, "ServerMetadata", pb.ServerMetadataRequest())
    assert (triton_code, code) == ("OK", "OK")
    assert triton.name == "triton" and ours.name == "slotserve"
    # slotserve_management is slotserve's own service (docs/model-repository.md); every other name is Triton's.
    assert set(ours.extensions) - {"slotserve_management"} <= set(triton.extensions), (
        sorted(ours.extensions),
        sorted(triton.extensions),
    )
    for extension in ("model_repository", "model_configuration", "statistics"):
        assert extension in triton.extensions and extension in ours.extensions, extension


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("version", ["", "1"])
def test_model_metadata_names_versions_datatypes_shapes(both, model, version):
    (triton_code, triton), (code, ours) = ask(
        both, "ModelMetadata", pb.ModelMetadataRequest(name=model, version=version)
    )
    assert (triton_code, code) == ("OK", "OK"), (triton, ours)
    assert (ours.name, list(ours.versions)) == (triton.name, list(triton.versions)) == (model, ["1"])

    def tensors(reply):
        return [(t.name, t.datatype, list(t.shape)) for t in reply.inputs], [
            (t.name, t.datatype, list(t.shape)) for t in reply.outputs
        ]

    assert tensors(ours) == tensors(triton)


@pytest.mark.parametrize("model", MODELS)
def test_model_config_fields_both_fill(both, model):
    (triton_code, triton), (code, ours) = ask(both, "ModelConfig", pb.ModelConfigRequest(name=model))
    assert (triton_code, code) == ("OK", "OK"), (triton, ours)
    reference, config = triton.config, ours.config
    assert (config.name, config.max_batch_size) == (reference.name, reference.max_batch_size) == (model, 8)
    for ours_tensors, triton_tensors in ((config.input, reference.input), (config.output, reference.output)):
        assert [(t.name, t.data_type, list(t.dims)) for t in ours_tensors] == [
            (t.name, t.data_type, list(t.dims)) for t in triton_tensors
        ]
    assert [(g.kind, g.count) for g in config.instance_group] == [(g.kind, g.count) for g in reference.instance_group]


def test_model_config_default_version_policy(both):
    (_, triton), (_, ours) = ask(both, "ModelConfig", pb.ModelConfigRequest(name="simple"))
    assert str(triton.config.version_policy).split() == ["latest", "{", "num_versions:", "1", "}"]
    assert ours.config.version_policy == triton.config.version_policy


# ModelConfig fields that differ because the backends differ (ONNX for slotserve, python for Triton), or because
# slotserve does not apply them (docs/model-repository.md, "Where slotserve differs from Triton").
BACKEND_FIELDS = ("backend", "platform", "default_model_filename", "optimization")


@pytest.mark.parametrize("model", MODELS)
def test_model_config_answer_field_by_field(both, model):
    """Triton fills its defaults into the answer (version policy, the instance group's name, kind and count, the
    model file's name); slotserve fills the same, so the answers are equal but for the backend's own fields."""
    (triton_code, triton), (code, ours) = ask(both, "ModelConfig", pb.ModelConfigRequest(name=model))
    assert (triton_code, code) == ("OK", "OK"), (triton, ours)
    reference, config = type(triton.config)(), type(ours.config)()
    reference.CopyFrom(triton.config)
    config.CopyFrom(ours.config)
    assert [(g.name, g.kind, g.count) for g in config.instance_group] == [(model, 2, 1)]  # KIND_CPU
    assert (reference.backend, reference.platform, reference.default_model_filename) == ("python", "", "model.py")
    assert (config.backend, config.platform, config.default_model_filename) == (
        "onnxruntime",
        "onnxruntime_onnx",
        "model.onnx",
    )
    assert reference.optimization.input_pinned_memory.enable and reference.optimization.output_pinned_memory.enable
    assert not config.HasField("optimization")
    for message in (reference, config):
        for field in BACKEND_FIELDS:
            message.ClearField(field)
    assert config == reference, f"triton {reference}\nslotserve {config}"


@pytest.mark.parametrize(
    "model, version",
    [("simple", ""), ("simple", "1"), ("simple", "2"), ("simple_int8", "1"), ("nowhere", ""), ("nowhere", "1")],
)
def test_model_ready_with_and_without_version(both, model, version):
    (triton_code, triton), (code, ours) = ask(both, "ModelReady", pb.ModelReadyRequest(name=model, version=version))
    assert code == triton_code, (triton, ours)
    if code == "OK":
        assert ours.ready == triton.ready, (model, version, triton.ready)
    # The question's answer, so that a change on either side shows: ready exactly for the served version.
    assert (code, code == "OK" and ours.ready) == ("OK", model != "nowhere" and version in ("", "1"))


def test_repository_index_entries_and_states(both):
    (triton_code, triton), (code, ours) = ask(both, "RepositoryIndex", pb.RepositoryIndexRequest())
    assert (triton_code, code) == ("OK", "OK")

    def entries(reply):
        return sorted((m.name, m.version, m.state, m.reason) for m in reply.models)

    assert entries(ours) == entries(triton) == [("simple", "1", "READY", ""), ("simple_int8", "1", "READY", "")]


def test_repository_index_ready_only(both):
    (_, triton), (_, ours) = ask(both, "RepositoryIndex", pb.RepositoryIndexRequest(ready=True))
    assert sorted(m.name for m in ours.models) == sorted(m.name for m in triton.models) == list(MODELS)


@pytest.mark.parametrize(
    "request_",
    [
        add_sub_request("simple"),
        add_sub_request("simple", version="1"),
        add_sub_request("simple", shape=(3, 16)),
        add_sub_request("simple_int8", dtype="int8", datatype="INT8", shape=(2, 16)),
    ],
    ids=["simple", "simple-v1", "simple-batch3", "int8-wraps"],
)
def test_model_infer_outputs_equal(both, request_):
    (triton_code, triton), (code, ours) = ask(both, "ModelInfer", request_)
    assert (triton_code, code) == ("OK", "OK"), (triton, ours)
    assert outputs_by_name(ours) == outputs_by_name(triton)
    assert (ours.model_name, ours.model_version) == (triton.model_name, triton.model_version)


def test_model_infer_named_output_only(both):
    request = add_sub_request("simple")
    request.outputs.add(name="OUTPUT1")
    (_, triton), (_, ours) = ask(both, "ModelInfer", request)
    assert list(outputs_by_name(ours)) == list(outputs_by_name(triton)) == ["OUTPUT1"]
    assert outputs_by_name(ours) == outputs_by_name(triton)


ERRORS = {
    "unknown-model": add_sub_request("nowhere"),
    "unknown-version": add_sub_request("simple", version="2"),
    "version-not-a-number": add_sub_request("simple", version="one"),
    "wrong-datatype": add_sub_request("simple", dtype="float32", datatype="FP32"),
    "wrong-shape": add_sub_request("simple", shape=(1, 15)),
    "batch-above-max": add_sub_request("simple", shape=(9, 16)),
    "missing-input": add_sub_request("simple", names=("INPUT0",)),
    "unknown-input": add_sub_request("simple", names=("INPUT0", "INPUT1")),
}
ERRORS["unknown-input"].inputs[1].name = "INPUT9"
ERRORS["unknown-output"] = add_sub_request("simple")
ERRORS["unknown-output"].outputs.add(name="OUTPUT9")


@pytest.mark.parametrize("case", list(ERRORS))
def test_error_codes(both, case):
    (triton_code, triton), (code, ours) = ask(both, "ModelInfer", ERRORS[case])
    assert triton_code != "OK", triton
    assert code == triton_code, f"triton {triton_code}: {triton}\nslotserve {code}: {ours}"


def test_unknown_model_message_has_tritons_wording(both):
    (_, triton), (_, ours) = ask(both, "ModelInfer", ERRORS["unknown-model"])
    assert "Request for unknown model: 'nowhere' is not found" in triton
    assert "Request for unknown model: 'nowhere' is not found" in ours


@pytest.mark.parametrize("method", ["ModelMetadata", "ModelConfig"])
@pytest.mark.parametrize("model, version", [("nowhere", ""), ("nowhere", "1"), ("simple", "2"), ("simple", "one")])
def test_metadata_and_config_of_unknown_model_or_version(both, method, model, version):
    request = getattr(pb, f"{method}Request")(name=model, version=version)
    (triton_code, triton), (code, ours) = ask(both, method, request)
    assert triton_code != "OK", triton
    assert code == triton_code, f"triton {triton_code}: {triton}\nslotserve {code}: {ours}"


def _mixed_raw_and_contents() -> pb.ModelInferRequest:
    """grpc_explicit_int_content_client.py's last request: INPUT0 and INPUT1 in `contents`, then one
    raw_input_contents entry added as well."""
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16]).contents.int_contents.extend(range(16))
    request.raw_input_contents.append(bytes(32))
    return request


def test_mixed_raw_and_typed_contents_refused_alike(both):
    (triton_code, triton), (code, ours) = ask(both, "ModelInfer", _mixed_raw_and_contents())
    assert (triton_code, code) == ("INVALID_ARGUMENT", "INVALID_ARGUMENT"), (triton, ours)


def test_mixed_raw_and_typed_contents_message_has_tritons_wording(both):
    (_, triton), (_, ours) = ask(both, "ModelInfer", _mixed_raw_and_contents())
    wording = "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'"
    assert wording in triton
    assert wording in ours
