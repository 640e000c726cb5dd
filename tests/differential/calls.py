"""Requests both servers get, and the outcome of a call in a form that compares: ("OK", reply) or (status code
name, details)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import numpy as np

from generated import grpc_service_pb2 as pb

CALL_TIMEOUT = 60.0  # a loaded machine; these calls answer in milliseconds otherwise


def outcome(method: Callable, request) -> tuple[str, Any]:
    """("OK", reply) or (code name, details) for one unary call."""
    try:
        return "OK", method(request, timeout=CALL_TIMEOUT)
    except grpc.RpcError as error:
        return error.code().name, error.details()


def add_sub_request(
    model: str = "simple",
    *,
    version: str = "",
    dtype=np.int32,
    datatype: str = "INT32",
    shape: tuple[int, ...] = (1, 16),
    names: tuple[str, ...] = ("INPUT0", "INPUT1"),
) -> pb.ModelInferRequest:
    """An add/sub request with raw inputs 0..n-1 and 1..n (n the element count of `shape`)."""
    count = int(np.prod(shape))
    values = {"INPUT0": np.arange(count), "INPUT1": np.arange(1, count + 1)}
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    for name in names:
        request.inputs.add(name=name, datatype=datatype, shape=list(shape))
        request.raw_input_contents.append(values[name].astype(dtype).tobytes())
    return request


def outputs_by_name(reply: pb.ModelInferResponse) -> dict[str, tuple[str, list[int], bytes]]:
    """{name: (datatype, shape, raw bytes)} of a ModelInferResponse (raw outputs in order)."""
    assert len(reply.raw_output_contents) == len(reply.outputs), reply
    return {
        output.name: (output.datatype, list(output.shape), raw)
        for output, raw in zip(reply.outputs, reply.raw_output_contents, strict=True)
    }
