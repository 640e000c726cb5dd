"""Memory per request is bounded: a request whose decoded tensors would exceed --max-request-tensor-bytes, or take
the requests in flight past --max-inflight-tensor-bytes, is refused with RESOURCE_EXHAUSTED naming the limit,
before the memory is taken; every request gives its share back when it ends, however it ends.

BYTES elements of 2 bytes take 6 on the wire and about 56 decoded (a Python bytes object behind a pointer), which
is how one 11 MiB request used to raise the server's peak RSS by 740 MiB; an engine copies them while it runs,
so each is reserved four times (tests/integration/requests/test_bytes_memory_peak.py measures the peak against it). The
real server runs in this process, so the account (`Dataplane.tensor_memory.statistics()`) and tracemalloc can be
read directly.
"""

from __future__ import annotations

import struct
import time
import tracemalloc

import grpc
import pytest

from client import ClientError
from engine.testing.fixture import FixtureBackend, FixtureControls
from generated import grpc_service_pb2 as pb
from service import wire
from service.testing import serve

from .._support import CALL_TIMEOUT, demo_subset, rpc_error, stub, write_fixture_model

REQUEST_LIMIT = 8 << 20
IN_FLIGHT_LIMIT = 12 << 20
ELEMENT_COST = 56  # what the server counts per decoded BYTES element beyond its contents (written out here)
COPIES = 4  # a BYTES element is reserved for itself and three copies an engine makes of it
SETTLE = 30.0  # seconds: how long the account may take to come back to zero after a stream's last answer


@pytest.fixture(scope="module")
def controls():
    controls = FixtureControls()
    yield controls
    controls.release_all()


@pytest.fixture(scope="module")
def running(tmp_path_factory, controls):
    repository = demo_subset(tmp_path_factory.mktemp("tensor-memory") / "repository", "simple_identity")
    bytes_tensor = [("INPUT0", "BYTES", [-1])]
    output = [("OUTPUT0", "BYTES", [-1])]
    write_fixture_model(repository, "gated_bytes", inputs=bytes_tensor, outputs=output)
    write_fixture_model(
        repository,
        "stream_bytes",
        inputs=bytes_tensor,
        outputs=output,
        extra='parameters { key: "stream_responses" value { string_value: "2" } }\n',
    )
    write_fixture_model(
        repository,
        "batched_bytes",
        inputs=bytes_tensor,
        outputs=output,
        max_batch_size=4,
        extra="dynamic_batching { }\n",
    )
    with serve(
        repository,
        backends={"fixture": FixtureBackend(controls)},
        max_request_tensor_bytes=REQUEST_LIMIT,
        max_inflight_tensor_bytes=IN_FLIGHT_LIMIT,
    ) as server:
        yield server


BATCHING = ("simple_identity", "batched_bytes")  # their shapes take a batch dimension first


def bytes_request(model: str, elements: int, *, shape=None, contents: bytes | None = None) -> pb.ModelInferRequest:
    """`elements` BYTES elements of b"ab" (or the given raw contents) as INPUT0 of `model`."""
    request = pb.ModelInferRequest(model_name=model, id=f"{model}-{elements}")
    default_shape = [1, elements] if model in BATCHING else [elements]
    request.inputs.add(name="INPUT0", datatype="BYTES", shape=shape or default_shape)
    request.raw_input_contents.append(contents if contents is not None else (struct.pack("<I", 2) + b"ab") * elements)
    return request


def estimate(elements: int) -> int:
    return COPIES * (elements * ELEMENT_COST + 2 * elements)


def account(running):
    return running.server.dataplane.tensor_memory.statistics()


def settled(running) -> None:
    """Wait (bounded) until no request holds tensor memory: every reservation was given back."""
    deadline = time.monotonic() + SETTLE
    while (statistics := account(running)).in_flight_bytes or statistics.requests:
        assert time.monotonic() < deadline, f"tensor memory still held: {statistics}"
        time.sleep(0.005)  # ordering-free: re-checks an observable state; orders nothing


def small_request_succeeds(running) -> None:
    response = stub(running).ModelInfer(bytes_request("simple_identity", 3), timeout=CALL_TIMEOUT)
    assert response.raw_output_contents[0] == (struct.pack("<I", 2) + b"ab") * 3


# ---- the per-request limit --------------------------------------------------------------------------------------


def test_a_bytes_request_over_the_request_limit_is_refused_before_it_is_decoded(running):
    """1 M elements take 6 MiB on the wire and are reserved 232 MB: refused by name, with both numbers. Decoding
    them would allocate some 43 MiB of Python objects (tracemalloc counts what was asked of the allocator, an
    under-count of RSS); during the refused call, the whole process (client and server) allocates less than four
    times the wire size: the message on each side, nothing per element."""
    elements = 1_000_000
    request = bytes_request("simple_identity", elements)
    wire_size = request.ByteSize()
    refused_before = account(running).refused_request
    tracemalloc.start()
    try:
        error = rpc_error(stub(running).ModelInfer, request)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (error.code, error.reason) == ("RESOURCE_EXHAUSTED", "tensor_memory_limit"), error.message
    assert "--max-request-tensor-bytes" in error.message and str(REQUEST_LIMIT) in error.message, error.message
    assert str(estimate(elements)) in error.message, error.message
    assert peak < 4 * wire_size, f"{peak} bytes allocated while refusing a {wire_size}-byte request"
    assert account(running).refused_request == refused_before + 1
    settled(running)
    small_request_succeeds(running)


def test_a_request_just_under_the_limit_is_served(running):
    elements = REQUEST_LIMIT // (COPIES * (ELEMENT_COST + 2)) - 10
    response = stub(running).ModelInfer(bytes_request("simple_identity", elements), timeout=CALL_TIMEOUT)
    assert response.raw_output_contents[0] == (struct.pack("<I", 2) + b"ab") * elements
    settled(running)


def test_fixed_size_inputs_count_their_nbytes(running):
    """A fixed-size tensor counts its own size: 3 M FP32 values (12 MiB) are past the 8 MiB limit even though
    nothing is copied to decode them; the model is not even looked at (its input is BYTES)."""
    request = pb.ModelInferRequest(model_name="gated_bytes")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[3 << 20])
    request.raw_input_contents.append(bytes(12 << 20))
    error = rpc_error(stub(running).ModelInfer, request)
    assert (error.code, error.reason) == ("RESOURCE_EXHAUSTED", "tensor_memory_limit"), error.message
    assert str(12 << 20) in error.message
    settled(running)


def test_a_shape_claiming_more_elements_than_its_contents_hold_is_invalid_not_resource_exhausted(running):
    """The estimate counts only the elements the contents can hold (each takes at least its 4-byte length): a
    shape of a billion BYTES elements with 6 bytes of contents is malformed, and nothing of a billion is
    allocated to find out."""
    request = bytes_request("gated_bytes", 1, shape=[10**9])
    error = rpc_error(stub(running).ModelInfer, request)
    assert (error.code, error.reason) == ("INVALID_ARGUMENT", "invalid_request_error"), error.message
    assert "expected 1000000000 string elements for inference input 'INPUT0'" in error.message
    settled(running)


# ---- the in-flight limit ---------------------------------------------------------------------------------------


def test_requests_in_flight_together_are_bounded_and_the_memory_comes_back(running, controls):
    """A request held at the fixture's execute gate keeps its reservation (7 MB); a second one of the same size
    would take the requests in flight past 12 MiB and is refused at once, naming the in-flight limit and what is
    held; once the first is answered, the second goes through."""
    elements = 30_000
    gate = controls.gate("gated_bytes", "execute").hold()
    held = stub(running).ModelInfer.future(bytes_request("gated_bytes", elements), timeout=CALL_TIMEOUT)
    try:
        gate.wait_blocked(1)
        statistics = account(running)
        assert (statistics.in_flight_bytes, statistics.requests) == (estimate(elements), 1)
        error = rpc_error(stub(running).ModelInfer, bytes_request("simple_identity", elements))
        assert (error.code, error.reason) == ("RESOURCE_EXHAUSTED", "tensor_memory_limit"), error.message
        assert "--max-inflight-tensor-bytes" in error.message, error.message
        assert f"hold {estimate(elements)} of the {IN_FLIGHT_LIMIT}" in error.message, error.message
    finally:
        gate.release()
    assert len(held.result(timeout=CALL_TIMEOUT).raw_output_contents[0]) == 6 * elements
    settled(running)
    response = stub(running).ModelInfer(bytes_request("simple_identity", elements), timeout=CALL_TIMEOUT)
    assert len(response.raw_output_contents[0]) == 6 * elements
    settled(running)
    assert account(running).peak_bytes >= estimate(elements)


# ---- nothing leaks ---------------------------------------------------------------------------------------------


def _unary_cases(running):
    """(what, call) for requests that end every way a unary call can."""

    def ok():
        stub(running).ModelInfer(bytes_request("simple_identity", 1000), timeout=CALL_TIMEOUT)

    def batched():
        stub(running).ModelInfer(bytes_request("batched_bytes", 1000), timeout=CALL_TIMEOUT)

    def truncated():
        assert (
            rpc_error(stub(running).ModelInfer, bytes_request("simple_identity", 2, contents=b"\x02\x00")).code
            == "INVALID_ARGUMENT"
        )

    def wrong_input():
        request = bytes_request("simple_identity", 10)
        request.inputs[0].name = "NOPE"
        assert rpc_error(stub(running).ModelInfer, request).code == "INVALID_ARGUMENT"

    def over_limit():
        assert (
            rpc_error(stub(running).ModelInfer, bytes_request("simple_identity", 200_000)).code == "RESOURCE_EXHAUSTED"
        )

    return {"ok": ok, "batched": batched, "truncated": truncated, "wrong_input": wrong_input, "over_limit": over_limit}


@pytest.mark.parametrize("case", ["ok", "batched", "truncated", "wrong_input", "over_limit"])
def test_a_unary_request_gives_its_memory_back(running, case):
    _unary_cases(running)[case]()
    settled(running)


def test_a_cancelled_request_gives_its_memory_back(running, controls):
    gate = controls.gate("gated_bytes", "execute").hold()
    try:
        future = stub(running).ModelInfer.future(bytes_request("gated_bytes", 5000), timeout=CALL_TIMEOUT)
        gate.wait_blocked(1)
        assert account(running).requests == 1
        future.cancel()
    finally:
        gate.release()
    with pytest.raises(grpc.FutureCancelledError):
        future.result(timeout=CALL_TIMEOUT)
    settled(running)


def test_a_request_whose_response_fails_to_serialize_gives_its_memory_back(running, monkeypatch):
    def failing(response):
        raise RuntimeError("serializer broke")

    monkeypatch.setattr(wire, "serialize_infer_response", failing)
    assert rpc_error(stub(running).ModelInfer, bytes_request("simple_identity", 1000)).code == "INTERNAL"
    monkeypatch.undo()
    settled(running)


@pytest.mark.parametrize("model,answers", [("simple_identity", 1), ("stream_bytes", 2), ("batched_bytes", 1)])
def test_a_stream_gives_its_memory_back(running, model, answers):
    requests = [bytes_request(model, 1000), bytes_request(model, 2, contents=b"\x09"), bytes_request(model, 500)]
    replies = list(stub(running).ModelStreamInfer(iter(requests), timeout=CALL_TIMEOUT))
    errors = [reply.error_message for reply in replies]
    assert errors.count("") == 2 * answers and len(errors) == 2 * answers + 1, errors
    settled(running)


def test_a_stream_refused_by_the_limit_goes_on_and_gives_its_memory_back(running):
    requests = [bytes_request("simple_identity", 200_000), bytes_request("simple_identity", 10)]
    replies = list(stub(running).ModelStreamInfer(iter(requests), timeout=CALL_TIMEOUT))
    assert "--max-request-tensor-bytes" in replies[0].error_message
    assert replies[1].error_message == "" and len(replies[1].infer_response.raw_output_contents[0]) == 60
    settled(running)


def test_a_stream_cancelled_between_a_streaming_models_answers_gives_its_memory_back(running, controls):
    """The streaming model holds its slot (and the request its memory) between answers; the client cancels the
    call while the second answer is held at the fixture's stream gate."""
    gate = controls.gate("stream_bytes", "stream")
    gate.hold_from(gate.arrivals + 2)  # the module's earlier tests passed it too
    call = stub(running).ModelStreamInfer(iter([bytes_request("stream_bytes", 5000)]), timeout=CALL_TIMEOUT)
    try:
        first = next(call)
        assert first.error_message == ""
        gate.wait_blocked(1)
        assert account(running).requests == 1
        call.cancel()
    finally:
        gate.release()
    with pytest.raises(grpc.RpcError) as info:
        list(call)
    assert info.value.code() == grpc.StatusCode.CANCELLED
    settled(running)


def test_the_refusals_are_counted_under_their_own_outcome(running):
    before = running.server.registry.get("simple_identity").statistics.snapshot()
    with pytest.raises(ClientError) as info:
        running.client.infer("simple_identity", {"INPUT0": _strings(200_000)})
    assert info.value.reason == "tensor_memory_limit"
    after = running.server.registry.get("simple_identity").statistics.snapshot()
    assert after.fail.count == before.fail.count + 1 and after.success.count == before.success.count
    settled(running)


def _strings(count: int):
    import numpy as np

    array = np.empty((1, count), dtype=object)
    array[:] = b"ab"
    return array
