"""triton_python_backend_utils as slotserve writes it (engine/python/triton_python_backend_utils.py), and the
shared-memory tensor transport its workers use (engine/python/transport.py)."""

from __future__ import annotations

import asyncio
import functools
import json

import numpy as np
import pytest

from engine import datatypes
from engine.python import transport
from engine.python import triton_python_backend_utils as pb_utils


def test_tensor_and_response_accessors():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor("OUT", array)
    assert tensor.name() == "OUT" and tensor.as_numpy() is array and tensor.is_cpu()
    assert tensor.shape() == [2, 3] and tensor.triton_dtype() == 11
    response = pb_utils.InferenceResponse(output_tensors=[tensor])
    assert not response.has_error() and response.error() is None
    assert pb_utils.get_output_tensor_by_name(response, "OUT") is tensor
    assert pb_utils.get_output_tensor_by_name(response, "NOPE") is None
    failed = pb_utils.InferenceResponse(error=pb_utils.TritonError("no", pb_utils.TritonError.NOT_FOUND))
    assert failed.has_error() and failed.error().code() == 2 and failed.error().message() == "no"


def test_tensor_refuses_what_is_not_a_numpy_array_by_name():
    with pytest.raises(TypeError, match="numpy array, got list"):  # Triton's binding: a TypeError
        pb_utils.Tensor("X", [1, 2])
    with pytest.raises(pb_utils.TritonModelException, match="InferenceResponse output_tensors"):
        pb_utils.InferenceResponse(output_tensors=[np.zeros(1)])


def test_arguments_are_checked_as_tritons_binding_checks_them():
    """What NVIDIA's argument_validation model checks (L0_backend_python/argument_validation)."""
    inputs = [pb_utils.Tensor("INPUT0", np.asarray([1, 2], dtype=np.int32))]
    request = functools.partial(pb_utils.InferenceRequest, model_name="m", inputs=inputs, requested_output_names=["o"])
    with pytest.raises(pb_utils.TritonModelException):
        request(inputs=[None])
    for keyword in ("inputs", "model_name", "requested_output_names", "correlation_id", "request_id", "model_version",
                    "flags"):  # fmt: skip
        with pytest.raises(TypeError):
            request(**{keyword: None})
    with pytest.raises(TypeError):
        request(requested_output_names=[None])
    assert request(correlation_id=5).correlation_id() == 5
    assert request(correlation_id="test_str_id-5").correlation_id() == "test_str_id-5"
    assert request().correlation_id() == 0
    pb_utils.InferenceRequest(requested_output_names=[], inputs=[], model_name="m")
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(output_tensors=[None])
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=None)
    for name, array in ((None, np.zeros(1)), ("OUTPUT0", None), ("", None)):
        with pytest.raises(TypeError):
            pb_utils.Tensor(name, array)
    for name in ("OUTPUT0", ""):
        with pytest.raises(pb_utils.TritonModelException):
            pb_utils.Tensor.from_dlpack(name, None)


def test_a_bytes_model_name_is_its_text_as_tritons_binding_takes_it():
    """The bls example passes `model_name=tensor.as_numpy()[0]`, a bytes."""
    call = pb_utils.InferenceRequest(model_name=b"add_sub", inputs=[], requested_output_names=[b"OUTPUT0"])
    assert call.model_name() == "add_sub" and call.requested_output_names() == ["OUTPUT0"]


def test_logger_takes_its_levels_and_text_only():
    logger = pb_utils.Logger
    for level in (None, 1):
        with pytest.raises(TypeError):
            logger.log("Invalid Level", level)
    for method in (logger.log_info, logger.log_warn, logger.log_error, logger.log_verbose):
        with pytest.raises(TypeError):
            method(None)
    logger.log("Level unspecified")
    logger.log("Level given", logger.INFO)
    logger.log("Level given", logger.LogLevel.WARNING)


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.uint64, np.bool_, np.float16, "bf16"])
def test_dlpack_round_trips_every_datatype_bf16_included(dtype):
    bf16 = datatypes.bfloat16()
    values = np.array([[1.5, -2.0], [0.25, 3.0]]) if dtype != np.bool_ else np.array([[True, False], [False, True]])
    array = values.astype(bf16 if dtype == "bf16" else dtype)
    array.setflags(write=False)  # an input tensor's array is read-only: exported as a copy
    tensor = pb_utils.Tensor("INPUT0", array)
    copy = pb_utils.Tensor.from_dlpack("OUTPUT0", tensor.to_dlpack())
    assert copy.name() == "OUTPUT0" and copy.as_numpy().dtype == array.dtype
    assert np.array_equal(copy.as_numpy().astype(np.float64), array.astype(np.float64))


def test_dlpack_takes_objects_with_dlpack_and_refuses_what_triton_refuses():
    value = np.arange(6, dtype=np.int32)
    assert np.array_equal(pb_utils.Tensor.from_dlpack("A", value).as_numpy(), value)  # no copy: a view of it
    tensor = pb_utils.Tensor("B", value)
    assert np.array_equal(np.from_dlpack(tensor), value) and tensor.__dlpack_device__() == (1, 0)
    with pytest.raises(pb_utils.TritonModelException, match="not contiguous"):
        pb_utils.Tensor.from_dlpack("C", value.reshape(2, 3).T)
    capsule = tensor.to_dlpack()
    pb_utils.Tensor.from_dlpack("D", capsule)
    with pytest.raises(pb_utils.TritonModelException, match="not an unused DLPack tensor"):
        pb_utils.Tensor.from_dlpack("E", capsule)  # a capsule is read once
    assert pb_utils.Tensor.from_dlpack("F", pb_utils.Tensor("G", np.ones([0], np.float32)).to_dlpack()).shape() == [0]


def test_triton_error_codes_are_tritons():
    codes = [
        pb_utils.TritonError.UNKNOWN,
        pb_utils.TritonError.INTERNAL,
        pb_utils.TritonError.NOT_FOUND,
        pb_utils.TritonError.INVALID_ARG,
        pb_utils.TritonError.UNAVAILABLE,
        pb_utils.TritonError.UNSUPPORTED,
        pb_utils.TritonError.ALREADY_EXISTS,
        pb_utils.TritonError.CANCELLED,
    ]
    assert codes == list(range(8))
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL
    with pytest.raises(pb_utils.TritonModelException, match="0..7, got 9"):
        pb_utils.TritonError("x", 9)


def test_request_accessors_and_input_lookup():
    flags = []
    request = pb_utils.InferenceRequest(
        model_name="m",
        inputs=[pb_utils.Tensor("A", np.zeros(2))],
        requested_output_names=["B"],
        request_id="r1",
        correlation_id=5,
        parameters={"k": 1},
        _cancelled=lambda: bool(flags),
    )
    assert pb_utils.get_input_tensor_by_name(request, "A").name() == "A"
    assert pb_utils.get_input_tensor_by_name(request, "Z") is None
    assert request.requested_output_names() == ["B"] and request.request_id() == "r1"
    assert request.correlation_id() == 5 and json.loads(request.parameters()) == {"k": 1}
    assert not request.is_cancelled()
    flags.append(1)
    assert request.is_cancelled()


def test_bls_outside_a_worker_and_custom_metrics_are_refused_by_name():
    request = pb_utils.InferenceRequest(model_name="other", inputs=[], requested_output_names=[])
    with pytest.raises(pb_utils.TritonModelException, match=r"BLS outside a worker \(InferenceRequest.exec\)"):
        request.exec()
    with pytest.raises(pb_utils.TritonModelException, match="BLS outside a worker"):
        asyncio.run(request.async_exec())
    with pytest.raises(pb_utils.TritonModelException, match="custom metrics need a server"):
        pb_utils.MetricFamily(name="m", description="d", kind=pb_utils.MetricFamily.COUNTER)


def test_response_sender_takes_one_response_for_a_model_that_is_not_decoupled():
    """Triton's checks and words (python_backend's response_sender.cc), in its order."""
    sender = pb_utils.InferenceRequest().get_response_sender()
    with pytest.raises(pb_utils.TritonModelException, match="cannot send complete final before sending a response"):
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(pb_utils.TritonModelException, match="^Inference Response object must be provided when"):
        sender.send()
    with pytest.raises(pb_utils.TritonModelException, match=r"^Unable to send response\. Unsupported flag provided\.$"):
        sender.send(pb_utils.InferenceResponse(), flags=4)
    response = pb_utils.InferenceResponse()
    sender.send(response)
    with pytest.raises(
        pb_utils.TritonModelException,
        match=r"^Unable to send response\. Non-decoupled model cannot send more than one response\.$",
    ):
        sender.send(pb_utils.InferenceResponse())
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert sender.response is response and sender.closed
    with pytest.raises(
        pb_utils.TritonModelException, match=r"^Unable to send response\. Response sender has been closed\.$"
    ):
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def test_type_conversions():
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.numpy_to_triton_type(np.int64) == 9
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.triton_to_numpy_type(8) is np.int32
    assert pb_utils.triton_to_numpy_type(99) is None


def test_config_lookup_and_decoupled_policy():
    config = {"input": [{"name": "A", "data_type": "TYPE_FP32"}], "output": [{"name": "B", "data_type": "TYPE_INT8"}]}
    assert pb_utils.get_input_config_by_name(config, "A")["data_type"] == "TYPE_FP32"
    assert pb_utils.get_output_config_by_name(json.dumps(config), "B")["data_type"] == "TYPE_INT8"
    assert pb_utils.get_input_config_by_name(config, "B") is None
    assert not pb_utils.using_decoupled_model_transaction_policy(config)
    assert pb_utils.using_decoupled_model_transaction_policy({"model_transaction_policy": {"decoupled": True}})


def test_auto_complete_config_adds_and_refuses_contradictions():
    config = pb_utils.ModelConfig({"max_batch_size": 0, "input": [{"name": "A", "data_type": "TYPE_FP32"}]})
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_output({"name": "B", "data_type": "TYPE_INT32", "dims": [-1]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": False})
    assert config.as_dict() == {
        "max_batch_size": 8,
        "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "B", "data_type": "TYPE_INT32", "dims": [-1]}],
        "dynamic_batching": {},
        "model_transaction_policy": {"decoupled": False},
    }
    with pytest.raises(pb_utils.TritonModelException, match="data_type TYPE_FP32 in the configuration"):
        config.add_input({"name": "A", "data_type": "TYPE_INT8"})
    with pytest.raises(pb_utils.TritonModelException, match="max_batch_size 8"):
        config.set_max_batch_size(4)
    with pytest.raises(pb_utils.TritonModelException, match="unknown fields"):
        config.add_output({"name": "C", "format": "x"})


def test_logger_writes_to_the_log(caplog):
    with caplog.at_level("INFO", logger="slotserve.python_model"):
        pb_utils.Logger.log_info("hello from model.py")
        pb_utils.Logger.log_error("bad thing")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "hello from model.py"),
        ("ERROR", "bad thing"),
    ]


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.int32).reshape(3, 4),
        np.linspace(-1, 1, 7, dtype=np.float16),
        np.array([True, False, True]),
        np.zeros((0, 3), dtype=np.float64),
        np.arange(10, dtype=np.uint64)[::2],  # not contiguous
    ],
)
def test_transport_round_trips_numeric_tensors(array):
    segment = transport.Segment.create(0)
    try:
        layout = transport.Layout()
        first = layout.plan("A", array, transport.datatype_of(array))
        second = layout.plan("B", array[::-1].copy(), transport.datatype_of(array))
        layout.write(segment)
        assert first.offset % transport.ALIGNMENT == 0 and second.offset % transport.ALIGNMENT == 0
        view = transport.read(segment, first, copy=False)
        np.testing.assert_array_equal(view, array)
        assert not view.flags.writeable  # the model gets a read-only view of the segment
        owned = transport.read(segment, second, copy=True)
        np.testing.assert_array_equal(owned, array[::-1])
        assert owned.flags.owndata
        del view
    finally:
        segment.unlink()
        segment.close()


def test_transport_round_trips_bytes_tensors_as_object_arrays_of_bytes():
    array = np.array([[b"", b"\x00\xff"], ["grüße", b"x" * 1000]], dtype=np.object_)
    segment = transport.Segment.create(0)
    try:
        layout = transport.Layout()
        descriptor = layout.plan("S", array, "BYTES")
        layout.write(segment)
        back = transport.read(segment, descriptor, copy=False)
        assert back.dtype == object and back.shape == (2, 2)
        assert back.tolist() == [[b"", b"\x00\xff"], ["grüße".encode(), b"x" * 1000]]
    finally:
        segment.unlink()
        segment.close()


def test_segment_sizes_round_up_and_attach_sees_the_same_memory():
    segment = transport.Segment.create(70_000)
    try:
        assert segment.size == 1 << 17
        other = transport.Segment.attach(segment.path, segment.size)
        segment.view[:4] = b"abcd"
        assert bytes(other.view[:4]) == b"abcd"
        other.close()
    finally:
        segment.unlink()
        segment.close()
