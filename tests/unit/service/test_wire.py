"""service.wire: ModelInfer messages parsed and serialized without copying tensor bytes."""

from __future__ import annotations

import numpy as np
import pytest

from generated import grpc_service_pb2 as pb
from service.wire import LARGE_MESSAGE_BYTES, InferResponse, WireError, parse_infer_request, serialize_infer_response


def _request(arrays: dict[str, np.ndarray], **fields) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", model_version="1", id="req-7", **fields)
    request.parameters["timeout"].int64_param = 1500
    for name, array in arrays.items():
        request.inputs.add(name=name, datatype="FP32", shape=array.shape)
        request.raw_input_contents.append(array.tobytes())
    request.outputs.add(name="OUT")
    return request


@pytest.mark.parametrize("elements", [4, LARGE_MESSAGE_BYTES // 4 + 10, 1 << 20])
def test_parse_gives_the_same_message_and_contents(elements):
    rng = np.random.default_rng(elements)
    arrays = {"A": rng.random(elements, dtype=np.float32), "B": rng.random(elements // 2 + 1, dtype=np.float32)}
    original = _request(arrays)
    data = original.SerializeToString()
    parsed = parse_infer_request(data)
    without_raw = pb.ModelInferRequest()
    without_raw.CopyFrom(original)
    del without_raw.raw_input_contents[:]
    message = pb.ModelInferRequest()
    message.CopyFrom(parsed.message)
    del message.raw_input_contents[:]
    assert message == without_raw
    assert [bytes(c) for c in parsed.raw_contents] == [a.tobytes() for a in arrays.values()]


def test_large_raw_contents_are_views_of_the_received_bytes():
    array = np.arange(LARGE_MESSAGE_BYTES, dtype=np.float32)
    data = _request({"A": array}).SerializeToString()
    parsed = parse_infer_request(data)
    view = parsed.raw_contents[0]
    assert isinstance(view, memoryview) and view.obj is data  # no copy was made
    assert np.array_equal(np.frombuffer(view, np.float32), array)
    assert len(parsed.message.raw_input_contents) == 0


@pytest.mark.parametrize("cut", [1, 7, 1000])
def test_truncated_large_message_is_refused(cut):
    data = _request({"A": np.zeros(LARGE_MESSAGE_BYTES, np.float32)}).SerializeToString()
    with pytest.raises(WireError):
        parse_infer_request(data[:-cut])


def test_serialized_response_with_raw_tail_parses_as_the_protocols_message():
    outputs = [np.arange(LARGE_MESSAGE_BYTES, dtype=np.float32), np.array([[1, 2], [3, 4]], np.int64)]
    message = pb.ModelInferResponse(model_name="m", model_version="1", id="x")
    for index, array in enumerate(outputs):
        message.outputs.add(name=f"O{index}", datatype="FP32", shape=array.shape)
    data = serialize_infer_response(InferResponse(message, outputs))
    parsed = pb.ModelInferResponse.FromString(data)
    assert [o.name for o in parsed.outputs] == ["O0", "O1"] and parsed.id == "x"
    assert list(parsed.raw_output_contents) == [a.tobytes() for a in outputs]
    assert InferResponse(message, outputs).to_message() == parsed


def test_plain_messages_serialize_as_protobuf_does():
    message = pb.ModelInferResponse(model_name="m", raw_output_contents=[b"abc"])
    assert serialize_infer_response(message) == message.SerializeToString()
