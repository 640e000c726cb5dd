"""service/frontends/infer.py: ModelInfer decoded in the front end, run from its record, encoded back."""

from __future__ import annotations

import pickle

import numpy as np

from client._tensors import build_request
from engine.config.specs import TensorSpec
from engine.interface import ModelMetadata
from generated import grpc_service_pb2 as pb
from service.frontends.infer import ForwardedTensors, answer_bytes, infer_answer, infer_call
from service.frontends.messages import CallStart
from service.request_path.dataplane import InferenceResponse
from service.transport.tensors import decode_request

START = CallStart(3, "/inference.GRPCInferenceService/ModelInfer", (), None, "peer", None)


def _crossed(record):
    """As the link carries it."""
    return pickle.loads(pickle.dumps(record, protocol=5))


def _request(**inputs) -> bytes:
    return build_request(
        "m", inputs, ["OUT"], version="2", request_id="r-1", parameters={"timeout": 5000}
    ).SerializeToString()


def test_a_raw_request_crosses_decoded_and_is_rebuilt_as_read_only_views_equal_to_a_local_decode():
    data = _request(A=np.arange(6, dtype=np.float32).reshape(2, 3), B=np.array([[1, 2]], dtype=np.int64))
    record = _crossed(infer_call(START, data))
    assert record is not None
    assert (record.model, record.version, record.id, record.outputs, record.timeout_us) == (
        "m",
        "2",
        "r-1",
        ("OUT",),
        5000,
    )
    tensors = ForwardedTensors(record)
    decoded = tensors.decode()
    local = decode_request(pb.ModelInferRequest.FromString(data))
    assert decoded.signature == local.signature
    for name, array in local.inputs.items():
        assert decoded.inputs[name].dtype == array.dtype and np.array_equal(decoded.inputs[name], array)
        assert not decoded.inputs[name].flags.writeable
    assert tensors.decoded_bytes() == 6 * 4 + 2 * 8
    assert record.parameters == {"timeout": 5000}


def _message(data: bytes) -> pb.ModelInferRequest:
    return pb.ModelInferRequest.FromString(data)


def test_what_the_fast_path_does_not_cover_takes_the_generic_path():
    base = _message(_request(A=np.ones(2, np.float32)))
    in_memory = pb.ModelInferRequest()
    in_memory.CopyFrom(base)
    in_memory.inputs[0].parameters["shared_memory_region"].string_param = "region"
    output_in_memory = pb.ModelInferRequest()
    output_in_memory.CopyFrom(base)
    output_in_memory.outputs[0].parameters["shared_memory_region"].string_param = "region"
    typed = pb.ModelInferRequest()
    typed.CopyFrom(base)
    typed.ClearField("raw_input_contents")
    typed.inputs[0].contents.fp32_contents.extend([1.0, 1.0])
    words = _message(_request(S=np.array([b"a", b"bc"], dtype=object)))
    malformed = pb.ModelInferRequest()
    malformed.CopyFrom(base)
    malformed.inputs[0].shape[:] = [3]  # 3 floats declared, 8 bytes sent: refused where it always was
    for message in (in_memory, output_in_memory, typed, words, malformed):
        assert infer_call(START, message.SerializeToString()) is None
    assert infer_call(START, b"\xff\xff not a message") is None


def test_the_answer_is_cast_to_the_declared_datatypes_and_encodes_as_the_servicer_would():
    metadata = ModelMetadata(
        inputs=(),
        outputs=(
            TensorSpec("OUT", "FP32", (-1,)),
            TensorSpec("WORDS", "BYTES", (-1,)),
            TensorSpec("MISSING", "INT8", (1,)),
        ),
    )
    response = InferenceResponse(
        "m",
        "2",
        "r-1",
        {"OUT": np.array([1, 2], np.float64), "WORDS": np.array([b"x", b"yz"], dtype=object)},
        metadata,
        {},
    )
    answer = _crossed(infer_answer(response))
    decoded = pb.ModelInferResponse.FromString(answer_bytes(answer))
    assert (decoded.model_name, decoded.model_version, decoded.id) == ("m", "2", "r-1")
    assert [(t.name, t.datatype, list(t.shape)) for t in decoded.outputs] == [
        ("OUT", "FP32", [2]),
        ("WORDS", "BYTES", [2]),
    ]
    assert np.frombuffer(decoded.raw_output_contents[0], np.float32).tolist() == [1.0, 2.0]
    assert decoded.raw_output_contents[1] == b"\x01\x00\x00\x00x\x02\x00\x00\x00yz"


def test_a_bf16_input_crosses_though_numpy_cannot_export_its_buffer():
    from engine.datatypes import bfloat16

    values = np.array([[1.5, -2.0, 0.25]], dtype=bfloat16())
    record = _crossed(infer_call(START, _request(X=values)))
    assert record is not None
    decoded = ForwardedTensors(record).decode()
    assert decoded.signature["X"] == ("BF16", (1, 3))
    assert decoded.inputs["X"].dtype == values.dtype and np.array_equal(decoded.inputs["X"], values)


def test_a_large_request_crosses_in_shared_memory_whose_file_is_gone_once_the_admission_process_took_it():
    import os

    big = np.arange(40_000, dtype=np.float32).reshape(200, 200)  # 160 kB: past SEGMENT_BYTES
    record = _crossed(infer_call(START, _request(A=big, B=np.ones(3, np.int8))))
    assert record is not None and record.segment is not None
    assert os.path.exists(record.segment.path)  # named until taken
    tensors = ForwardedTensors.attach(record)
    assert not os.path.exists(record.segment.path)
    decoded = tensors.decode()
    assert np.array_equal(decoded.inputs["A"], big) and not decoded.inputs["A"].flags.writeable
    assert decoded.inputs["B"].tolist() == [1, 1, 1]
    assert tensors.decoded_bytes() == big.nbytes + 3


def test_without_room_in_shared_memory_a_large_request_crosses_in_the_frame(monkeypatch):
    from engine.errors import OutOfSharedMemoryError
    from engine.python import transport

    def no_room(size):
        raise OutOfSharedMemoryError("/dev/shm has no room")

    monkeypatch.setattr(transport.Segment, "create", classmethod(lambda cls, size: no_room(size)))
    big = np.ones(40_000, dtype=np.float32)
    record = _crossed(infer_call(START, _request(A=big)))
    assert record is not None and record.segment is None
    assert np.array_equal(ForwardedTensors.attach(record).decode().inputs["A"], big)


def test_a_large_answer_crosses_in_shared_memory_and_encodes_the_same():
    import os

    metadata = ModelMetadata(inputs=(), outputs=(TensorSpec("OUT", "FP32", (-1,)),))
    values = np.arange(50_000, dtype=np.float32)
    answer = _crossed(infer_answer(InferenceResponse("m", "1", "", {"OUT": values}, metadata, {})))
    assert answer.segment is not None and os.path.exists(answer.segment.path)
    decoded = pb.ModelInferResponse.FromString(answer_bytes(answer))
    assert not os.path.exists(answer.segment.path)
    assert np.array_equal(np.frombuffer(decoded.raw_output_contents[0], np.float32), values)
