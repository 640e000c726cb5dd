"""BF16 outputs of 64 KiB and more, through a real server, unary and on streams; and a response that cannot be
serialized is counted as a failure, not as a success.

Large outputs (service/wire.LARGE_MESSAGE_BYTES, 64 KiB, and more) are kept out of the protobuf message and appended
to it from the array's buffer. `memoryview()` of an ml_dtypes bfloat16 array raises ("cannot include dtype 'E' in a
buffer"): ModelInfer failed with gRPC's INTERNAL "Failed to serialize response!" and was still counted as a success
(the serializer ran after the request was counted); ModelStreamInfer answered an error message.

The models are fixture models (output = input cast to the output's datatype): ONNX Runtime's Python binding neither
takes nor returns bfloat16 arrays, so no ONNX model can produce a BF16 output here. Expected bytes are computed with
ml_dtypes and numpy in the test, never with the server's codec.
"""

from __future__ import annotations

import grpc
import ml_dtypes
import numpy as np
import pytest

from engine.testing.fixture import FixtureBackend, FixtureControls
from generated import grpc_service_pb2 as pb
from service import wire
from service.testing import serve

from .._support import CALL_TIMEOUT, stub, write_fixture_model

BF16 = np.dtype(ml_dtypes.bfloat16)
# Element counts: 64 KiB of BF16 exactly (the first size kept out of the message), and well past it.
LARGE = (32 * 1024, 200_000)


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    repository = tmp_path_factory.mktemp("bf16")
    write_fixture_model(
        repository, "identity_bf16", inputs=[("INPUT0", "BF16", [-1])], outputs=[("OUTPUT0", "BF16", [-1])]
    )
    write_fixture_model(
        repository, "cast_fp32_to_bf16", inputs=[("INPUT0", "FP32", [-1])], outputs=[("OUTPUT0", "BF16", [-1])]
    )
    write_fixture_model(
        repository,
        "stream_bf16",
        inputs=[("INPUT0", "BF16", [-1])],
        outputs=[("OUTPUT0", "BF16", [-1])],
        extra='parameters { key: "stream_responses" value { string_value: "2" } }\n',
    )
    with serve(repository, backends={"fixture": FixtureBackend(FixtureControls())}) as server:
        yield server


def bf16_values(count: int) -> np.ndarray:
    values = np.random.default_rng(count).standard_normal(count).astype(np.float32).astype(BF16)
    values[:4] = np.array([np.inf, -np.inf, -0.0, 1.5], dtype=np.float32).astype(BF16)
    return values


def request_for(model: str, values: np.ndarray, datatype: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=f"{model}-{values.size}")
    request.inputs.add(name="INPUT0", datatype=datatype, shape=[values.size])
    request.raw_input_contents.append(values.tobytes())
    return request


def counts(running, model: str) -> tuple[int, int]:
    """(success, fail) from ModelStatistics."""
    response = stub(running).ModelStatistics(pb.ModelStatisticsRequest(name=model), timeout=CALL_TIMEOUT)
    stats = response.model_stats[0].inference_stats
    return stats.success.count, stats.fail.count


def check_output(response: pb.ModelInferResponse, expected: np.ndarray) -> None:
    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("OUTPUT0", "BF16", [expected.size])
    assert response.raw_output_contents[0] == expected.tobytes()  # bit for bit: -0.0 and inf included


@pytest.mark.parametrize("count", LARGE)
@pytest.mark.parametrize("model", ["identity_bf16", "cast_fp32_to_bf16"])
def test_a_large_bf16_output_is_served_by_model_infer_and_counted_once(running, model, count):
    expected = bf16_values(count)
    sent = expected if model == "identity_bf16" else expected.astype(np.float32)
    before = counts(running, model)
    response = stub(running).ModelInfer(
        request_for(model, sent, "BF16" if model == "identity_bf16" else "FP32"), timeout=CALL_TIMEOUT
    )
    check_output(response, expected)
    assert counts(running, model) == (before[0] + 1, before[1])


@pytest.mark.parametrize("count", LARGE)
@pytest.mark.parametrize("model,answers", [("identity_bf16", 1), ("stream_bf16", 2)])
def test_a_large_bf16_output_is_served_on_a_stream(running, model, answers, count):
    """An ordinary model answers once, a streaming one (the fixture's stream_responses) twice: every answer carries
    the whole output, and the request is counted once as a success."""
    expected = bf16_values(count)
    before = counts(running, model)
    replies = list(stub(running).ModelStreamInfer(iter([request_for(model, expected, "BF16")]), timeout=CALL_TIMEOUT))
    assert [reply.error_message for reply in replies] == [""] * answers
    for reply in replies:
        check_output(reply.infer_response, expected)
    assert counts(running, model) == (before[0] + 1, before[1])


def test_a_response_that_cannot_be_serialized_is_a_counted_failure(running, monkeypatch):
    """Whatever makes serialization fail (here a failing serializer stands in for the BF16 defect above) reaches
    the client as INTERNAL, is counted as failed and not as a success, and the server goes on serving."""

    def failing(response):
        raise RuntimeError("serializer broke")

    monkeypatch.setattr(wire, "serialize_infer_response", failing)
    expected = bf16_values(LARGE[0])
    before = counts(running, "identity_bf16")
    with pytest.raises(grpc.RpcError) as info:
        stub(running).ModelInfer(request_for("identity_bf16", expected, "BF16"), timeout=CALL_TIMEOUT)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "serializer broke" not in info.value.details()  # internals stay in the log
    assert counts(running, "identity_bf16") == (before[0], before[1] + 1)
    monkeypatch.undo()
    check_output(
        stub(running).ModelInfer(request_for("identity_bf16", expected, "BF16"), timeout=CALL_TIMEOUT), expected
    )
