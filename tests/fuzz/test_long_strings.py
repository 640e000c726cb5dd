"""Long request strings echoed in error messages keep the call's status (a fuzzer finding, kept as a test)."""

from __future__ import annotations

import grpc
import pytest

from generated import grpc_service_pb2 as pb

from .lab import CALL_TIMEOUT


def _long(field: str, text: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16]).contents.int_contents.extend(range(16))
    if field == "model_name":
        request.model_name = text
    elif field == "input_name":
        request.inputs[1].name = text
    elif field == "datatype":
        request.inputs[1].datatype = text
    else:
        request.outputs.add(name=text)
    return request


@pytest.mark.parametrize(
    "field, text, code",
    [
        ("model_name", "x" * 10_000, "NOT_FOUND"),
        ("model_name", "\u00e9" * 3_000, "NOT_FOUND"),
        ("input_name", "I" * 10_000, "INVALID_ARGUMENT"),
        ("datatype", "D" * 10_000, "INVALID_ARGUMENT"),
        ("output_name", "O" * 10_000, "INVALID_ARGUMENT"),
    ],
)
def test_a_long_string_in_a_request_keeps_its_status(stub, field, text, code):
    """Found by the fuzzer (a 10,000-character model name came back RESOURCE_EXHAUSTED, not NOT_FOUND)."""
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(_long(field, text), timeout=CALL_TIMEOUT)
    assert info.value.code().name == code, info.value.details()[:300]
    assert f"({len(text)} characters)" in info.value.details()  # the string is shortened, its length named
