"""Malformed ModelInfer requests, one test per case, through a real server on a real channel.

Each case asserts the status code, the ErrorInfo reason and a message that names the problem, then that the next
valid request on the same server succeeds with correct outputs. Requests are built with the raw generated stubs,
since the client library refuses to build most of them.
"""

from __future__ import annotations

import numpy as np
import pytest

from generated import grpc_service_pb2 as pb
from service.testing import serve

from .._support import CALL_TIMEOUT, check_simple_response, demo_subset, rpc_error, simple_request, stub

INVALID = "INVALID_ARGUMENT"


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    repository = demo_subset(tmp_path_factory.mktemp("repository"), "simple", "simple_identity")
    with serve(repository) as server:
        yield server


@pytest.fixture
def infer(running):
    return stub(running).ModelInfer


def refused(infer, request, *, code=INVALID, reason="invalid_request_error", says=()):
    """Send `request`, expect `code`/`reason` and every phrase of `says` in the message; then a valid request on
    the same server must succeed."""
    error = rpc_error(infer, request)
    assert error.code == code, error
    assert error.reason == reason, error
    assert error.domain == "slotserve"
    for phrase in says:
        assert phrase in error.message, f"{phrase!r} not in {error.message!r}"
    valid, first, second = simple_request(batch=2)
    check_simple_response(infer(valid, timeout=CALL_TIMEOUT), first, second)
    return error


def simple(*tensors, raw=None, model="simple", version=""):
    """A ModelInferRequest with (name, datatype, shape) inputs and the given raw contents (None: no raw)."""
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    for name, datatype, shape in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
    if raw is not None:
        request.raw_input_contents.extend(raw)
    return request


ROW = np.arange(16, dtype="<i4").reshape(1, 16).tobytes()
GOOD = (("INPUT0", "INT32", [1, 16]), ("INPUT1", "INT32", [1, 16]))


def test_unknown_input_name(infer):
    request = simple(("INPUT0", "INT32", [1, 16]), ("INPUT9", "INT32", [1, 16]), raw=[ROW, ROW])
    refused(infer, request, says=("unknown input", "'INPUT9'"))


def test_missing_input(infer):
    refused(infer, simple(("INPUT0", "INT32", [1, 16]), raw=[ROW]), says=("missing required input(s)", "'INPUT1'"))


def test_duplicate_input(infer):
    request = simple(("INPUT0", "INT32", [1, 16]), ("INPUT0", "INT32", [1, 16]), raw=[ROW, ROW])
    refused(infer, request, says=("input 'INPUT0' already exists in request",))  # Triton's words


def test_wrong_datatype(infer):
    request = simple(("INPUT0", "FP32", [1, 16]), ("INPUT1", "INT32", [1, 16]), raw=[ROW, ROW])
    refused(infer, request, says=("'INPUT0'", "FP32", "INT32"))


def test_shape_does_not_match_byte_length(infer):
    request = simple(*GOOD, raw=[ROW, ROW[:-4]])
    refused(
        infer, request, says=("input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 60",)
    )


def test_negative_dimension(infer):
    request = simple(("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [1, 16]), raw=[ROW, ROW])
    refused(infer, request, says=("'INPUT0'", "negative dimension"))


def test_absurd_dimension(infer):
    request = simple(("INPUT0", "INT32", [2**50, 16]), ("INPUT1", "INT32", [1, 16]), raw=[ROW, ROW])
    refused(infer, request, says=("'INPUT0'", "absurd dimension", str(2**50)))


def test_absurd_element_count_from_ordinary_dimensions(infer):
    # Each dimension is plausible; their product (2**60 elements) is not. Nothing may be allocated for it.
    request = simple(("INPUT0", "INT32", [2**30, 2**30]), ("INPUT1", "INT32", [1, 16]), raw=[ROW, ROW])
    refused(infer, request, says=("'INPUT0'", "more elements than any request may hold"))


def test_batch_beyond_max_batch_size(infer):
    rows = np.zeros((9, 16), dtype="<i4").tobytes()
    request = simple(("INPUT0", "INT32", [9, 16]), ("INPUT1", "INT32", [9, 16]), raw=[rows, rows])
    refused(infer, request, says=("batch size 9", "1..8"))


def test_raw_and_typed_contents_both_set(infer):
    request = simple(*GOOD, raw=[ROW, ROW])
    request.inputs[0].contents.int_contents.extend(range(16))
    refused(infer, request, says=("contents field must not be specified when using raw_input_contents for 'INPUT0'",))


def test_typed_contents_of_the_wrong_kind(infer):
    request = simple(*GOOD)
    request.inputs[0].contents.fp32_contents.extend([float(v) for v in range(16)])
    request.inputs[1].contents.int_contents.extend(range(16))
    refused(infer, request, says=("'INPUT0'", "int_contents", "fp32_contents"))


def test_bytes_with_truncated_length_prefix(infer):
    # Element 0 is complete ("abc"); element 1 has only two of its four length bytes.
    request = simple(("INPUT0", "BYTES", [1, 2]), raw=[b"\x03\x00\x00\x00abc\x05\x00"], model="simple_identity")
    refused(infer, request, says=("incomplete string length indicator for inference input 'INPUT0'", "only 2 bytes"))


def test_unknown_requested_output(infer):
    request = simple(*GOOD, raw=[ROW, ROW])
    request.outputs.add(name="OUTPUT7")
    refused(infer, request, says=("unknown requested output", "'OUTPUT7'"))


def test_unknown_model(infer):
    request = simple(*GOOD, raw=[ROW, ROW], model="no_such_model")
    refused(
        infer,
        request,
        code="NOT_FOUND",
        reason="model_not_found",
        says=("Request for unknown model", "'no_such_model'"),
    )


def test_non_numeric_version(infer):
    request = simple(*GOOD, raw=[ROW, ROW], version="abc")
    refused(infer, request, says=("version", "'abc'"))


def test_unknown_numeric_version(infer):
    request = simple(*GOOD, raw=[ROW, ROW], version="7")
    refused(
        infer,
        request,
        code="NOT_FOUND",
        reason="model_not_found",
        says=("Request for unknown model", "'simple'", "version 7"),
    )


def test_unknown_datatype_string(infer):
    request = simple(("INPUT0", "INT33", [1, 16]), ("INPUT1", "INT32", [1, 16]), raw=[ROW, ROW])
    refused(infer, request, says=("'INPUT0'", "unknown datatype 'INT33'"))


def test_raw_contents_count_differs_from_inputs(infer):
    refused(
        infer,
        simple(*GOOD, raw=[ROW]),
        says=(
            "unable to find data for input tensor 'INPUT1' for model 'simple' in request.",  # Triton's words first
            "raw_input_contents has 1 entries for 2 inputs",
        ),
    )


# ---- Triton's words (issue 34 item 8; tests/differential/qa/test_triton_words.py asks Triton) -----------------


def test_each_malformed_input_is_named_in_tritons_words(infer):
    """Triton names one of several malformed inputs (the second of two); slotserve names each, in order."""
    error = refused(infer, simple(*GOOD, raw=[ROW[:-4], ROW + ROW[:4]]))
    assert error.message == (
        "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60 (shape [1, 16] of "
        "INT32); input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 68 (shape [1, 16] "
        "of INT32)"
    )


def test_typed_contents_of_the_wrong_count_are_a_byte_size_mismatch(infer):
    request = simple(*GOOD)
    request.inputs[0].contents.int_contents.extend(range(16))
    request.inputs[1].contents.int_contents.extend(range(15))
    refused(
        infer,
        request,
        says=("input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 60", "holds 15"),
    )


def test_typed_contents_in_two_fields(infer):
    request = simple(*GOOD)
    request.inputs[0].contents.int_contents.extend(range(16))
    request.inputs[0].contents.int64_contents.extend(range(16))
    request.inputs[1].contents.int_contents.extend(range(16))
    refused(
        infer,
        request,
        says=(
            "unexpected explicit tensor data for input tensor 'INPUT0' for model 'simple', binary data was already "
            "supplied.",
            "int_contents and int64_contents",
        ),
    )


@pytest.mark.parametrize(
    "count, words", [(1, "expected 2 string elements"), (3, "unexpected number of string elements 3")]
)
def test_bytes_contents_of_the_wrong_count(infer, count, words):
    raw = simple(("INPUT0", "BYTES", [1, 2]), raw=[b"\x01\x00\x00\x00a" * count], model="simple_identity")
    typed = simple(("INPUT0", "BYTES", [1, 2]), model="simple_identity")
    typed.inputs[0].contents.bytes_contents.extend([b"a"] * count)
    for request in (raw, typed):
        refused(infer, request, says=(f"{words} for inference input 'INPUT0' for model 'simple_identity'",))


def test_timeout_parameter_of_the_wrong_type(infer):
    request = simple(*GOOD, raw=[ROW, ROW])
    request.parameters["timeout"].string_param = "5"
    refused(infer, request, says=("'timeout'", "integer"))


# ---- further malformed requests -------------------------------------------------------------------------------


def test_output_requested_twice(infer):
    request = simple(*GOOD, raw=[ROW, ROW])
    request.outputs.add(name="OUTPUT1")
    request.outputs.add(name="OUTPUT1")
    refused(infer, request, says=("'OUTPUT1'", "requested twice"))


def test_negative_timeout_parameter(infer):
    request = simple(*GOOD, raw=[ROW, ROW])
    request.parameters["timeout"].int64_param = -5
    refused(infer, request, says=("'timeout'", ">= 0", "-5"))


def test_shared_memory_input(infer):
    request = simple(*GOOD, raw=[ROW, ROW])
    request.inputs[0].parameters["shared_memory_region"].string_param = "region0"
    refused(infer, request, says=("'INPUT0'", "shared memory"))


def test_classification_output(infer):
    request = simple(*GOOD, raw=[ROW, ROW])
    request.outputs.add(name="OUTPUT0").parameters["classification"].int64_param = 2
    refused(infer, request, says=("'OUTPUT0'", "classification"))


def test_input_without_contents(infer):
    refused(infer, simple(*GOOD), says=("unable to find data for input tensor 'INPUT0'", "neither raw_input_contents"))


def test_bytes_with_more_elements_than_the_shape(infer):
    two = b"\x01\x00\x00\x00a\x01\x00\x00\x00b"
    request = simple(("INPUT0", "BYTES", [1, 1]), raw=[two], model="simple_identity")
    refused(infer, request, says=("unexpected number of string elements 2 for inference input 'INPUT0'", "expecting 1"))


def test_batch_of_zero(infer):
    request = simple(("INPUT0", "INT32", [0, 16]), ("INPUT1", "INT32", [0, 16]), raw=[b"", b""])
    refused(infer, request, says=("batch size 0", "1..8"))


def test_missing_batch_dimension(infer):
    request = simple(("INPUT0", "INT32", [16]), ("INPUT1", "INT32", [16]), raw=[ROW, ROW])
    refused(infer, request, says=("'INPUT0'", "[16]", "a batch dimension"))
