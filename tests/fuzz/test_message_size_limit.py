"""Oversize messages are refused by the configured --max-message-bytes with RESOURCE_EXHAUSTED, and the server
goes on."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from generated import grpc_service_pb2_grpc as pb_grpc
from service.testing import serve
from tests.integration._support import demo_subset

from .lab import CALL_TIMEOUT
from .outcomes import fp32_request, small_request_succeeds, wait_idle

LIMIT = 1 << 20  # --max-message-bytes for the size tests


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    repository = demo_subset(tmp_path_factory.mktemp("limited") / "repository", "identity_fp32", "simple")
    with serve(repository, max_message_bytes=LIMIT) as server:
        yield server


def _code(call: Callable[[], object]) -> tuple[str, str]:
    try:
        call()
    except grpc.RpcError as error:
        return error.code().name, error.details() or ""
    return "OK", ""


@pytest.mark.parametrize(
    "elements, typed",
    [(LIMIT // 4 + 1000, False), (4 * LIMIT, False), (LIMIT // 4 + 1000, True)],
    ids=["just_over_raw", "four_times_raw", "just_over_typed"],
)
def test_oversize_request_is_refused_by_the_configured_limit(limited, elements, typed):
    stub = pb_grpc.GRPCInferenceServiceStub(limited.client.channel)
    request = fp32_request(elements, typed=typed)
    assert request.ByteSize() > LIMIT
    code, details = _code(lambda: stub.ModelInfer(request, timeout=CALL_TIMEOUT))
    assert code == "RESOURCE_EXHAUSTED", (code, details)
    assert "larger than max" in details and str(LIMIT) in details, details
    small_request_succeeds(stub)  # the same channel, the next request


def test_request_at_the_limit_is_accepted(limited):
    stub = pb_grpc.GRPCInferenceServiceStub(limited.client.channel)
    elements = LIMIT // 4 - 100
    overhead = fp32_request(elements).ByteSize() - 4 * elements
    request = fp32_request((LIMIT - overhead) // 4 - 8)  # near the limit, with room for the response's extra bytes
    assert LIMIT - 64 < request.ByteSize() <= LIMIT
    response = stub.ModelInfer(request, timeout=CALL_TIMEOUT)
    assert len(response.raw_output_contents[0]) == 4 * request.inputs[0].shape[1]


def test_oversize_response_is_refused_and_the_server_goes_on(limited):
    """A request that fits whose response does not (the response carries a few more bytes: model name and
    version): gRPC refuses to send it with RESOURCE_EXHAUSTED; the slot is released and the next call works."""
    stub = pb_grpc.GRPCInferenceServiceStub(limited.client.channel)
    elements = LIMIT // 4 - 100
    overhead = fp32_request(elements).ByteSize() - 4 * elements
    request = fp32_request((LIMIT - overhead) // 4)
    assert LIMIT - 4 < request.ByteSize() <= LIMIT
    code, details = _code(lambda: stub.ModelInfer(request, timeout=CALL_TIMEOUT))
    assert code == "RESOURCE_EXHAUSTED", (code, details)
    small_request_succeeds(stub)
    status = wait_idle(limited)
    assert all(m.active_slots == 0 and m.queued_requests == 0 for m in status), status


def test_oversize_stream_message_ends_the_stream_with_resource_exhausted(limited):
    stub = pb_grpc.GRPCInferenceServiceStub(limited.client.channel)
    requests = [fp32_request(4), fp32_request(LIMIT // 4 + 1000)]
    answers = []

    def consume() -> None:
        for answer in stub.ModelStreamInfer(iter(requests), timeout=CALL_TIMEOUT):
            answers.append(answer)

    code, details = _code(consume)
    assert code == "RESOURCE_EXHAUSTED", (code, details)
    assert len(answers) <= 1 and all(not a.error_message for a in answers)
    small_request_succeeds(stub)
    status = wait_idle(limited)
    assert all(m.active_slots == 0 and m.queued_requests == 0 for m in status), status
