"""System shared memory under generated input (the server of conftest.py runs with `--shared-memory system`).

* Valid requests with any of their inputs moved into a region (at any offset, aligned or not) and any of their
  outputs asked for in another (exactly as large as needed, or larger), mixed with raw or typed contents for the
  rest: every one succeeds, outputs in regions come back as empty raw entries and the region holds them, checked
  against the request's own values with numpy.
* Generated SystemSharedMemoryRegister calls (names, keys that are paths, outside the prefix, missing or real;
  offsets and sizes at the edges up to 2**64-1): only OK, INVALID_ARGUMENT or RESOURCE_EXHAUSTED, an OK only for a
  registration that fits a real object, and afterwards nothing of theirs stays registered or mapped.

Bad shared-memory parameters on inference requests are one of the mutations every fuzz test applies
(mutations.mutate_shared_memory).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import grpc
from hypothesis import given, note, settings
from hypothesis import strategies as st

from client import ClientError
from generated import grpc_service_pb2 as pb
from tests.integration._shm import ShmObject, in_region, mappings

from .lab import CALL_TIMEOUT, FUZZ, MODELS, REGION_OBJECTS, REGIONS, SHM_PREFIX, examples
from .outcomes import Ledger, assert_server_clean, check_response, request_input, statistics, summary
from .valid_requests import Case, valid_requests


@dataclass
class ShmCase:
    """A valid request with tensors moved into the seq_in / seq_out regions, and the bytes seq_in must hold."""

    case: Case
    writes: list[tuple[int, bytes]] = field(default_factory=list)  # (offset in seq_in, bytes)

    def __repr__(self) -> str:
        return f"ShmCase(writes={[(offset, len(data)) for offset, data in self.writes]}, {self.case!r})"


def input_bytes(request: pb.ModelInferRequest, name: str) -> bytes:
    """An input's bytes in the protocol's raw form (BYTES serialized), from its raw or typed contents."""
    datatype, _, values = request_input(request, name)
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + bytes(v) for v in values)
    return values.astype({"INT32": "<i4", "FP32": "<f4"}[datatype]).tobytes()


@st.composite
def requests_in_regions(draw) -> ShmCase:
    case = draw(valid_requests())
    request = case.request
    shm_case = ShmCase(case)
    sizes = {tensor.name: len(input_bytes(request, tensor.name)) for tensor in request.inputs}
    cursor = draw(st.integers(0, 64))
    moved = [draw(st.integers(0, 3)) > 0 for _ in request.inputs]  # mostly moved: a region is the point
    for index in reversed(range(len(request.inputs))):  # from the end: raw entries are removed by position
        if not moved[index]:
            continue
        tensor = request.inputs[index]
        data = input_bytes(request, tensor.name)
        shm_case.writes.append((cursor, data))
        if request.raw_input_contents:
            del request.raw_input_contents[index]
        tensor.ClearField("contents")
        in_region(tensor, "seq_in", len(data), cursor)
        cursor += len(data) + draw(st.integers(0, 7))
    needed = sizes[request.inputs[0].name]  # every model here returns outputs the size of its first input
    if not request.outputs and draw(st.integers(0, 3)) > 0:
        for name, _ in MODELS[request.model_name].outputs:
            request.outputs.add(name=name)
    cursor = draw(st.integers(0, 64))
    for output in request.outputs:
        if draw(st.integers(0, 3)) > 0:
            in_region(output, "seq_out", needed + draw(st.sampled_from((0, 0, 1, 13))), cursor)
            cursor += needed + draw(st.integers(0, 7))
    assert cursor < REGIONS["seq_out"]
    return shm_case


def test_valid_requests_with_tensors_in_regions_succeed(running, stub):
    ledger = Ledger()
    before = statistics(running)
    taken = running.server.shared_memory.statistics().taken

    @settings(FUZZ, max_examples=examples(300))
    @given(shm_case=requests_in_regions())
    def one(shm_case: ShmCase) -> None:
        note(repr(shm_case))
        for offset, data in shm_case.writes:
            REGION_OBJECTS["seq_in"].write(offset, data)
        request = shm_case.case.request
        try:
            response = stub.ModelInfer(request, timeout=CALL_TIMEOUT)
        except grpc.RpcError as rpc_error:
            ledger.record(request, rpc_error.code().name)
            raise AssertionError(f"a valid request failed: {ClientError.from_rpc_error(rpc_error)}") from None
        ledger.record(request, "OK")
        check_response(request, response, read_regions=True)

    one()
    print(f"\nshared-memory fuzz: {sum(ledger.statuses.values())} requests, "
          f"{running.server.shared_memory.statistics().taken - taken} region references: {summary(ledger)}")
    assert_server_clean(running, stub, ledger, before)


NAMES = st.one_of(st.sampled_from(("", "fuzz_in", "new", "new ", "\u00e9", "x" * 300)), st.text(max_size=12))
SIZES = st.one_of(st.sampled_from((0, 1, 4095, 4096, 4097, 8192, 2**31, 2**63 - 1, 2**63, 2**64 - 1)),
                  st.integers(0, 2**64 - 1))


@st.composite
def registrations(draw, real_key: str) -> pb.SystemSharedMemoryRegisterRequest:
    key = draw(st.one_of(
        st.just(real_key), st.just(real_key), st.sampled_from(
            ("", "/", "/.", "/..", "relative", f"/dev/shm{real_key}", real_key + "/", real_key[1:], real_key + " ",
             SHM_PREFIX + "missing", "/elsewhere", "//" + real_key[1:], "/" + "x" * 300, real_key + "\x00")),
        st.text(max_size=20)))
    return pb.SystemSharedMemoryRegisterRequest(name=draw(NAMES), key=key, offset=draw(SIZES),
                                                byte_size=draw(SIZES))


def test_generated_registrations(running, stub):
    real = ShmObject(8192, f"{SHM_PREFIX}register_fuzz")
    codes: dict[str, int] = {}
    try:
        @settings(FUZZ, max_examples=examples(400))
        @given(request=registrations(real.key))
        def one(request: pb.SystemSharedMemoryRegisterRequest) -> None:
            note(str(request)[:500])
            try:
                stub.SystemSharedMemoryRegister(request, timeout=CALL_TIMEOUT)
                code = "OK"
            except grpc.RpcError as rpc_error:
                error = ClientError.from_rpc_error(rpc_error)
                code = error.code
                assert code in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"), error
                assert error.domain == "slotserve", error
            codes[code] = codes.get(code, 0) + 1
            fits = (request.key == real.key and request.name and request.name not in REGIONS
                    and 0 < request.byte_size and request.offset + request.byte_size <= real.size)
            assert (code == "OK") == bool(fits), f"{code} for {request}"
            if code == "OK":
                assert mappings(real.key) == 1
                stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name=request.name),
                                                  timeout=CALL_TIMEOUT)
            assert mappings(real.key) == 0

        one()
    finally:
        real.close()
    print(f"\nregister fuzz: {codes}")
    shared = running.server.shared_memory.statistics()
    assert shared.regions == shared.mapped_regions == len(REGIONS) and shared.holds == 0, shared
