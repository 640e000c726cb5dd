"""Shapes with a zero dimension whose other dimensions multiply past what numpy can address (a fuzzer finding,
kept as a test): the tensor holds no element, so the element-count bound let it through, and numpy's reshape
raised ValueError ("array is too big"), which reached the client as INTERNAL. It is INVALID_ARGUMENT, however
the input travels.

Ranks past numpy's 64 dimensions (below) are INVALID_ARGUMENT too, naming the limit, with nothing logged as a
traceback."""

from __future__ import annotations

import logging
import struct

import grpc
import pytest

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from tests.integration._shm import in_region
from tests.integration._support import write_fixture_model

from .lab import CALL_TIMEOUT
from .outcomes import small_request_succeeds

SHAPE = [0, 2**31, 2**34]  # no element; 2**65 without the zero


def request(how: str) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="gated")
    tensor = message.inputs.add(name="INPUT0", datatype="FP32", shape=SHAPE)
    if how == "raw":
        message.raw_input_contents.append(b"")
    elif how == "typed":
        tensor.contents.fp32_contents.extend([])
        tensor.contents.SetInParent()
    else:
        in_region(tensor, "fuzz_in", 0)
    return message


@pytest.mark.parametrize("how", ["raw", "typed", "shared_memory"])
def test_a_zero_element_shape_too_large_for_numpy_is_invalid_argument(stub, how):
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request(how), timeout=CALL_TIMEOUT)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert "input 'INPUT0'" in info.value.details() and str(SHAPE) in info.value.details()
    small_request_succeeds(stub)


# ---- ranks beyond numpy's ---------------------------------------------------------------------------------------
# numpy makes arrays of at most 64 dimensions; a 65-dimension input made reshape raise ValueError, which reached the
# client as INTERNAL with a traceback logged for every such request (a log flood for anyone who sends them).

MAX_RANK = 64  # numpy's limit, written out here independently of the server's constant


def ranked_request(how: str, rank: int, datatype: str = "FP32") -> pb.ModelInferRequest:
    """A one-element input of `rank` dimensions (all 1) for `gated` (FP32) or simple_identity (BYTES)."""
    message = pb.ModelInferRequest(model_name="gated" if datatype == "FP32" else "simple_identity")
    tensor = message.inputs.add(name="INPUT0", datatype=datatype, shape=[1] * rank)
    element = b"\x00\x00\x80\x3f" if datatype == "FP32" else struct.pack("<I", 2) + b"ab"
    if how == "raw":
        message.raw_input_contents.append(element)
    elif how == "typed":
        if datatype == "FP32":
            tensor.contents.fp32_contents.append(1.0)
        else:
            tensor.contents.bytes_contents.append(b"ab")
    else:
        in_region(tensor, "fuzz_in", len(element))
    return message


@pytest.mark.parametrize("datatype", ["FP32", "BYTES"])
@pytest.mark.parametrize("how", ["raw", "typed", "shared_memory"])
@pytest.mark.parametrize("rank", [MAX_RANK + 1, 100, 1000])
def test_a_rank_beyond_numpys_is_invalid_argument_naming_the_limit_and_logs_no_traceback(
    stub, caplog, how, datatype, rank
):
    caplog.set_level(logging.WARNING)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(ranked_request(how, rank, datatype), timeout=CALL_TIMEOUT)
    details = info.value.details()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "input 'INPUT0'" in details and f"{rank} dimensions" in details and str(MAX_RANK) in details, details
    assert not [record for record in caplog.records if record.exc_info], "a traceback was logged"
    small_request_succeeds(stub)


def test_a_rank_of_exactly_the_limit_is_served(slotserve, tmp_path):
    """The bound is numpy's and no lower: a model of 64 variable dimensions gets a 64-dimension input and
    answers it."""
    write_fixture_model(
        tmp_path, "rank64", inputs=[("INPUT0", "FP32", [-1] * MAX_RANK)], outputs=[("OUTPUT0", "FP32", [-1] * MAX_RANK)]
    )
    running = slotserve(tmp_path)
    request = ranked_request("raw", MAX_RANK)
    request.model_name = "rank64"
    response = pb_grpc.GRPCInferenceServiceStub(running.client.channel).ModelInfer(request, timeout=CALL_TIMEOUT)
    assert list(response.outputs[0].shape) == [1] * MAX_RANK
    assert response.raw_output_contents[0] == b"\x00\x00\x80\x3f"
