"""System shared memory under generated input (the server of conftest.py runs with `--shared-memory system`).

* Valid requests with any of their inputs moved into a region (at any offset, aligned or not) and any of their
  outputs asked for in another (exactly as large as needed, or larger), mixed with raw or typed contents for the
  rest: every one succeeds, outputs in regions come back as empty raw entries and the region holds them, checked
  against the request's own values with numpy.
* Generated SystemSharedMemoryRegister calls (names short and past 255 bytes, keys that are paths, outside the
  prefix, missing or real; offsets and sizes at the edges up to 2**64-1): only OK, INVALID_ARGUMENT or
  RESOURCE_EXHAUSTED, an OK only for a registration that fits a real object, and afterwards nothing of theirs
  stays registered or open.
* A region's object resized between register and use (emptied, cut below the region's offset, inside the region
  or the tensor, to exactly the tensor's end, grown), then a request with its input, its output or both in the
  region: OK with the right values exactly when the object still holds the tensor's bytes, else INVALID_ARGUMENT
  naming the region and the object's size now; an object is never grown by the server, and the server goes on.

Bad shared-memory parameters on inference requests are one of the mutations every fuzz test applies
(mutations.mutate_shared_memory).
"""

from __future__ import annotations

import itertools
import os
import struct
from dataclasses import dataclass, field

import grpc
import numpy as np
from hypothesis import given, note, settings
from hypothesis import strategies as st

from client import ClientError
from generated import grpc_service_pb2 as pb
from tests.integration._shm import ShmObject, descriptors, in_region

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
    print(
        f"\nshared-memory fuzz: {sum(ledger.statuses.values())} requests, "
        f"{running.server.shared_memory.statistics().taken - taken} region references: {summary(ledger)}"
    )
    assert_server_clean(running, stub, ledger, before)


NAMES = st.one_of(
    st.sampled_from(("", "fuzz_in", "new", "new ", "\u00e9", "x" * 255, "x" * 256, "\u00e9" * 128, "x" * 300)),
    st.text(max_size=12),
)
SIZES = st.one_of(
    st.sampled_from((0, 1, 4095, 4096, 4097, 8192, 2**31, 2**63 - 1, 2**63, 2**64 - 1)), st.integers(0, 2**64 - 1)
)


@st.composite
def registrations(draw, real_key: str) -> pb.SystemSharedMemoryRegisterRequest:
    key = draw(
        st.one_of(
            st.just(real_key),
            st.just(real_key),
            st.sampled_from(
                (
                    "",
                    "/",
                    "/.",
                    "/..",
                    "relative",
                    f"/dev/shm{real_key}",
                    real_key + "/",
                    real_key[1:],
                    real_key + " ",
                    SHM_PREFIX + "missing",
                    "/elsewhere",
                    "//" + real_key[1:],
                    "/" + "x" * 300,
                    real_key + "\x00",
                )
            ),
            st.text(max_size=20),
        )
    )
    return pb.SystemSharedMemoryRegisterRequest(name=draw(NAMES), key=key, offset=draw(SIZES), byte_size=draw(SIZES))


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
                # A well-formed request naming a region the lab registered already is Triton's
                # ALREADY_EXISTS (checked after the request's own fields); any other refusal is
                # INVALID_ARGUMENT or, past the server's limits, RESOURCE_EXHAUSTED.
                refusals: tuple[str, ...] = ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED")
                if request.name in REGIONS:
                    refusals += ("ALREADY_EXISTS",)
                assert code in refusals, error
                assert error.domain == "slotserve", error
            codes[code] = codes.get(code, 0) + 1
            fits = (
                request.key == real.key
                and request.name
                and len(request.name.encode()) <= 255
                and request.name not in REGIONS
                and 0 < request.byte_size
                and request.offset + request.byte_size <= real.size
            )
            assert (code == "OK") == bool(fits), f"{code} for {request}"
            if code == "OK":
                assert descriptors(real.key) == 1
                stub.SystemSharedMemoryUnregister(
                    pb.SystemSharedMemoryUnregisterRequest(name=request.name), timeout=CALL_TIMEOUT
                )
            assert descriptors(real.key) == 0

        one()
    finally:
        real.close()
    print(f"\nregister fuzz: {codes}")
    shared = running.server.shared_memory.statistics()
    assert shared.regions == shared.open_regions == len(REGIONS) and shared.holds == 0, shared


# ---- objects resized between register and use -------------------------------------------------------------------

_KEYS = itertools.count()


@dataclass(frozen=True)
class Resize:
    """A region of `region_size` bytes at `region_offset` of an object of `object_size` bytes; an FP32 tensor of
    `count` elements at `tensor_offset` in it; the object resized to `new_size` after register; the tensor used as
    the request's input, output or both."""

    object_size: int
    region_offset: int
    region_size: int
    tensor_offset: int
    count: int
    new_size: int
    where: str

    @property
    def start(self) -> int:
        return self.region_offset + self.tensor_offset

    @property
    def end(self) -> int:
        return self.start + 4 * self.count


@st.composite
def resizes(draw) -> Resize:
    region_offset = draw(st.one_of(st.sampled_from((0, 1, 4095, 4096, 4097)), st.integers(0, 3 * 4096)))
    region_size = draw(st.one_of(st.sampled_from((4, 4096)), st.integers(4, 3 * 4096)))
    object_size = region_offset + region_size + draw(st.sampled_from((0, 0, 1, 4096)))
    count = draw(st.integers(1, region_size // 4))
    tensor_offset = draw(st.integers(0, region_size - 4 * count))
    start = region_offset + tensor_offset
    end = start + 4 * count
    edges = {
        0,
        max(0, region_offset - 1),
        region_offset,
        start,
        start + 1,
        end - 1,
        end,
        end + 1,
        object_size - 1,
        object_size,
        object_size + 1,
        object_size + 4096,
        4 * object_size,
    }
    new_size = draw(st.one_of(st.sampled_from(sorted(edges)), st.integers(0, 2 * object_size)))
    return Resize(
        object_size,
        region_offset,
        region_size,
        tensor_offset,
        count,
        new_size,
        draw(st.sampled_from(("input", "output", "both"))),
    )


def test_a_region_resized_between_register_and_use(running, stub):
    ledger = Ledger()
    before = statistics(running)
    outcomes: dict[str, int] = {}

    @settings(FUZZ, max_examples=examples(200))
    @given(case=resizes(), seed=st.integers(0, 2**32 - 1))
    def one(case: Resize, seed: int) -> None:
        note(repr(case))
        values = np.random.default_rng(seed).standard_normal(case.count).astype("<f4")
        item = ShmObject(case.object_size, f"{SHM_PREFIX}resized_{os.getpid()}_{next(_KEYS)}")
        try:
            item.write(0, b"\xee" * case.object_size)
            item.write(case.start, values)
            stub.SystemSharedMemoryRegister(
                pb.SystemSharedMemoryRegisterRequest(
                    name="resized", key=item.key, offset=case.region_offset, byte_size=case.region_size
                ),
                timeout=CALL_TIMEOUT,
            )
            os.truncate(item.path, case.new_size)
            request = pb.ModelInferRequest(model_name="identity_fp32")
            tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, case.count])
            if case.where == "output":
                request.raw_input_contents.append(values.tobytes())
            else:
                in_region(tensor, "resized", 4 * case.count, case.tensor_offset)
            if case.where == "output":  # nothing of the values there beforehand: the output must write them
                item.write(case.start, b"\xee" * min(4 * case.count, max(0, case.new_size - case.start)))
            if case.where != "input":
                in_region(request.outputs.add(name="OUTPUT0"), "resized", 4 * case.count, case.tensor_offset)
            try:
                response = stub.ModelInfer(request, timeout=CALL_TIMEOUT)
                code, error = "OK", None
            except grpc.RpcError as rpc_error:
                error = ClientError.from_rpc_error(rpc_error)
                code = error.code
            ledger.record(request, code)
            outcomes[f"{case.where} {code}"] = outcomes.get(f"{case.where} {code}", 0) + 1
            holds_tensor = case.new_size >= case.end
            assert (code == "OK") == holds_tensor, f"{code} ({error}) for {case}"
            if code == "OK":
                if case.where == "input":
                    assert response.raw_output_contents[0] == values.tobytes()
                else:
                    assert list(response.raw_output_contents) == [b""]
                    assert item.read(case.start, 4 * case.count) == values.tobytes()
            else:
                assert error is not None  # not OK: the call failed
                assert (error.reason, error.domain) == ("invalid_request_error", "slotserve"), error
                tensor_name = "output 'OUTPUT0'" if case.where == "output" else "input 'INPUT0'"
                for phrase in (
                    f"{tensor_name}: shared memory region 'resized'",
                    f"needs bytes {case.start} to {case.end}",
                    f"now holds {case.new_size} bytes",
                ):
                    assert phrase in error.message, f"{phrase!r} not in {error.message!r}"
            assert os.stat(item.path).st_size == case.new_size  # the server never grows an object
        finally:
            stub.SystemSharedMemoryUnregister(
                pb.SystemSharedMemoryUnregisterRequest(name="resized"), timeout=CALL_TIMEOUT
            )
            item.close()
        assert descriptors(item.key) == 0

    one()
    print(f"\nresized-region fuzz: {dict(sorted(outcomes.items()))}")
    assert_server_clean(running, stub, ledger, before)
