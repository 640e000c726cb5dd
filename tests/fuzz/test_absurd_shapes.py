"""Shapes with a zero dimension whose other dimensions multiply past what numpy can address (a fuzzer finding,
kept as a test): the tensor holds no element, so the element-count bound let it through, and numpy's reshape
raised ValueError ("array is too big"), which reached the client as INTERNAL. It is INVALID_ARGUMENT, however
the input travels."""

from __future__ import annotations

import grpc
import pytest

from generated import grpc_service_pb2 as pb
from tests.integration._shm import in_region

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
