"""How an answer is checked (allowed status, a well-formed and correct response recomputed with numpy) and how
the server is checked after a run (no slot leased, nothing queued, statistics matching what the test saw)."""

from __future__ import annotations

import math
import struct
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from client import ClientError
from generated import grpc_service_pb2 as pb

from .lab import ALLOWED, CALL_TIMEOUT, MODELS, REGION_OBJECTS, REGIONS
from .valid_requests import TYPED_FIELD, Case


def parse_bytes(buffer: bytes) -> list[bytes]:
    elements, offset = [], 0
    while offset < len(buffer):
        assert offset + 4 <= len(buffer), "BYTES output with a truncated length prefix"
        (length,) = struct.unpack_from("<I", buffer, offset)
        offset += 4
        assert offset + length <= len(buffer), "BYTES output element longer than the contents"
        elements.append(bytes(buffer[offset : offset + length]))
        offset += length
    return elements


def placement(tensor) -> tuple[str, int, int] | None:
    """(region, offset, byte size) of a tensor that names a shared-memory region, else None."""
    parameters = tensor.parameters
    if "shared_memory_region" not in parameters:
        return None
    offset = parameters["shared_memory_offset"] if "shared_memory_offset" in parameters else None
    return (
        parameters["shared_memory_region"].string_param,
        getattr(offset, offset.WhichOneof("parameter_choice")) if offset is not None else 0,
        getattr(
            parameters["shared_memory_byte_size"], parameters["shared_memory_byte_size"].WhichOneof("parameter_choice")
        ),
    )


def region_bytes(region: str, offset: int, size: int) -> bytes:
    """What the test-side object behind a registered region holds (every lab region is registered at offset 0)."""
    return REGION_OBJECTS[region].read(offset, size)


def request_input(request: pb.ModelInferRequest, name: str) -> tuple[str, list[int], Any]:
    """(datatype, shape, flat values) of an input of an accepted request, decoded here with numpy/struct: from its
    raw entry (one per input not in shared memory, in order), its typed contents, or its region."""
    raw_index = 0
    for tensor in request.inputs:
        place = placement(tensor)
        if tensor.name == name:
            if place is not None or request.raw_input_contents:
                raw = region_bytes(*place) if place is not None else request.raw_input_contents[raw_index]
                if tensor.datatype == "BYTES":
                    return tensor.datatype, list(tensor.shape), parse_bytes(raw)
                return tensor.datatype, list(tensor.shape), np.frombuffer(raw, dtype=_dtype(tensor.datatype))
            values = getattr(tensor.contents, TYPED_FIELD[tensor.datatype])
            if tensor.datatype == "BYTES":
                return tensor.datatype, list(tensor.shape), list(values)
            return tensor.datatype, list(tensor.shape), np.array(values, dtype=_dtype(tensor.datatype))
        if place is None:
            raw_index += 1
    raise AssertionError(f"accepted request has no input {name!r}")


def _dtype(datatype: str) -> np.dtype:
    return np.dtype({"INT32": "<i4", "FP32": "<f4"}[datatype])


def expected_outputs(request: pb.ModelInferRequest) -> dict[str, tuple[str, list[int], Any]]:
    """What the model must return for an accepted request, computed from the request's own contents."""
    if request.model_name == "simple":
        datatype, shape, first = request_input(request, "INPUT0")
        _, _, second = request_input(request, "INPUT1")
        with np.errstate(over="ignore"):
            return {"OUTPUT0": (datatype, shape, first + second), "OUTPUT1": (datatype, shape, first - second)}
    return {"OUTPUT0": request_input(request, "INPUT0")}


def check_response(
    request: pb.ModelInferRequest, response: pb.ModelInferResponse, *, read_regions: bool = False
) -> None:
    """An OK response is well-formed and correct for the request that produced it. An output asked for in a
    shared-memory region has an empty raw entry; `read_regions` (only where no other request can have written the
    region since) also checks what the region holds."""
    assert request.model_name in MODELS, f"OK for unknown model {request.model_name!r}"
    model = MODELS[request.model_name]
    produced = dict(model.outputs)
    names = [tensor.name for tensor in response.outputs]
    assert len(response.raw_output_contents) == len(response.outputs), (
        f"{len(response.raw_output_contents)} raw_output_contents for {len(response.outputs)} outputs"
    )
    assert len(set(names)) == len(names), f"duplicate outputs {names}"
    wanted = {output.name for output in request.outputs} or set(produced)
    assert set(names) == wanted, f"outputs {names}, asked for {sorted(wanted)}"
    assert response.model_name == request.model_name
    assert response.model_version == "1"
    assert response.id == request.id
    expected = expected_outputs(request)
    places = {output.name: placement(output) for output in request.outputs}
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        datatype, shape, values = expected[tensor.name]
        assert tensor.datatype == produced[tensor.name] == datatype
        assert list(tensor.shape) == shape, f"{tensor.name} shape {list(tensor.shape)}, input shape {shape}"
        place = places.get(tensor.name)
        if place is not None:
            assert raw == b"", f"{tensor.name} was asked for in region {place[0]!r} and came back in the message"
            if not read_regions:
                continue
            region, offset, _ = place
            size = (
                len(b"".join(struct.pack("<I", len(e)) + e for e in values))
                if datatype == "BYTES"
                else math.prod(shape) * 4
            )
            raw = region_bytes(region, offset, size)
        if datatype == "BYTES":
            assert parse_bytes(raw) == list(values), f"{tensor.name} differs from the input"
        else:
            assert len(raw) == math.prod(shape) * 4, f"{tensor.name}: {len(raw)} bytes for shape {shape}"
            got = np.frombuffer(raw, dtype=_dtype(datatype))
            assert got.tobytes() == np.asarray(values, dtype=_dtype(datatype)).tobytes(), f"{tensor.name} values differ"


def known_version(request: pb.ModelInferRequest) -> bool:
    return request.model_version in ("", "1")


@dataclass
class Ledger:
    """What the test saw, per model, to compare with the server's statistics afterwards."""

    ok: Counter = field(default_factory=Counter)  # OK responses
    reached: Counter = field(default_factory=Counter)  # non-OK answers to a known model and version
    known_model: Counter = field(default_factory=Counter)  # non-OK answers to a known model, any version
    statuses: Counter = field(default_factory=Counter)

    def record(self, request: pb.ModelInferRequest, code: str) -> None:
        self.statuses[code] += 1
        name = request.model_name
        if name not in MODELS:
            return
        if code == "OK":
            self.ok[name] += 1
        else:
            self.known_model[name] += 1
            if known_version(request):
                self.reached[name] += 1


def check_status(case: Case, code: str, error: ClientError | None, *, alone: bool) -> None:
    """The status rules of every answer. `alone`: nothing else competed for the model's slots."""
    assert code in ALLOWED, f"status {code} ({error}) for {case!r}"
    if case.request.model_name not in MODELS:
        assert code == "NOT_FOUND", f"unknown model answered {code} ({error})"
    if not case.mutations:
        allowed = {"OK"} if alone else {"OK", "UNAVAILABLE"}
        assert code in allowed, f"valid request answered {code} ({error})"
    if code == "UNAVAILABLE":
        assert error is not None and error.reason == "server_busy", f"UNAVAILABLE for {error}"
    if error is not None:
        assert error.domain == "slotserve", f"{code} without slotserve's ErrorInfo: {error!r}"


def statistics(running) -> dict[str, tuple[int, int]]:
    """(success count, fail count) per model from ModelStatistics."""
    return {
        s.name: (s.inference_stats.success.count, s.inference_stats.fail.count)
        for s in running.client.statistics(timeout=10)
    }


def wait_idle(running, timeout: float = 10.0) -> list:
    """ListModels until no model has a leased slot or a queued request (bounded); the last statuses."""
    deadline = time.monotonic() + timeout
    while True:
        models = running.management.list(timeout=10)
        busy = [m for m in models if m.active_slots or m.queued_requests]
        if not busy or time.monotonic() > deadline:
            return models
        time.sleep(0.01)  # ordering-free: re-checks a state predicate


def assert_server_clean(running, stub, ledger: Ledger, before: dict[str, tuple[int, int]]) -> None:
    """After a fuzz run: no leased slot or queued request, statistics that match what the test saw, and a valid
    request answered correctly."""
    models = wait_idle(running)
    for status in models:
        assert status.state == "READY" and status.loaded, status
        assert status.active_slots == 0, f"{status.model_id}: {status.active_slots} slot(s) still leased"
        assert status.queued_requests == 0, f"{status.model_id}: {status.queued_requests} request(s) still queued"
    shared = running.server.shared_memory.statistics()
    assert shared.holds == 0, f"{shared.holds} region reference(s) still held"
    assert shared.regions == shared.open_regions == len(REGIONS), shared
    after = statistics(running)
    for name in MODELS:
        success = after[name][0] - before[name][0]
        fail = after[name][1] - before[name][1]
        assert success == ledger.ok[name], f"{name}: {success} successes counted, {ledger.ok[name]} OK seen"
        assert ledger.reached[name] <= fail <= ledger.known_model[name], (
            f"{name}: {fail} failures counted, {ledger.reached[name]}..{ledger.known_model[name]} expected"
        )
    first = np.arange(32, dtype=np.int32).reshape(2, 16)
    second = np.full((2, 16), 7, dtype=np.int32)
    outputs = running.client.infer("simple", {"INPUT0": first, "INPUT1": second}, timeout=CALL_TIMEOUT)
    np.testing.assert_array_equal(outputs["OUTPUT0"], first + second)
    np.testing.assert_array_equal(outputs["OUTPUT1"], first - second)
    request = pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 3]).contents.fp32_contents.extend([1.5, -2, 0])
    response = stub.ModelInfer(request, timeout=CALL_TIMEOUT)
    assert np.frombuffer(response.raw_output_contents[0], "<f4").tolist() == [1.5, -2.0, 0.0]


def summary(ledger: Ledger) -> str:
    return ", ".join(f"{code} {count}" for code, count in sorted(ledger.statuses.items()))


def fp32_request(elements: int, *, typed: bool = False) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="identity_fp32")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, elements])
    values = np.linspace(-1, 1, elements, dtype=np.float32)
    if typed:
        tensor.contents.fp32_contents.extend(values.tolist())
    else:
        request.raw_input_contents.append(values.tobytes())
    return request


def small_request_succeeds(stub) -> None:
    response = stub.ModelInfer(fp32_request(4), timeout=CALL_TIMEOUT)
    assert (
        np.frombuffer(response.raw_output_contents[0], "<f4").tolist()
        == np.linspace(-1, 1, 4, dtype=np.float32).tolist()
    )
