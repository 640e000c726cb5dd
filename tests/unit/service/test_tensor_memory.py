"""The tensor memory account (service/tensor_memory.py) and the estimate it is given (tensors.decoded_bytes)."""

from __future__ import annotations

import struct
import threading

import numpy as np
import pytest

from generated import grpc_service_pb2 as pb
from service.core.errors import InvalidRequest
from service.dataplane import output_bytes
from service.shared_memory import RegionInfo, RegionNotFound
from service.tensor_memory import TensorMemory, TensorMemoryLimit
from service.tensors import decode_request, decoded_bytes

COST = 56  # per decoded BYTES element beyond its contents, written out here
COPIES = 4  # a BYTES element is reserved for itself and three copies an engine makes of it (written out here)


# ---- the account ----------------------------------------------------------------------------------------------


def test_reservations_add_up_and_come_back():
    account = TensorMemory(request_limit=100, in_flight_limit=150)
    first = account.reserve(100)
    second = account.reserve(50)
    statistics = account.statistics()
    assert (statistics.in_flight_bytes, statistics.requests, statistics.peak_bytes) == (150, 2, 150)
    first.release()
    first.release()  # idempotent
    second.release()
    statistics = account.statistics()
    assert (statistics.in_flight_bytes, statistics.requests, statistics.peak_bytes) == (0, 0, 150)


def test_a_request_over_the_per_request_limit_is_refused_by_name():
    account = TensorMemory(request_limit=100, in_flight_limit=1000)
    with pytest.raises(TensorMemoryLimit) as info:
        account.reserve(101)
    assert str(info.value) == (
        "the request's tensors take about 101 bytes decoded, more than "
        "--max-request-tensor-bytes (100) allows one request"
    )
    statistics = account.statistics()
    assert (statistics.in_flight_bytes, statistics.requests, statistics.refused_request) == (0, 0, 1)


def test_a_request_that_would_pass_the_in_flight_limit_is_refused_with_what_is_held():
    account = TensorMemory(request_limit=0, in_flight_limit=100)
    held = account.reserve(70)
    with pytest.raises(TensorMemoryLimit) as info:
        account.reserve(31)
    assert str(info.value) == (
        "the request's tensors take about 31 bytes decoded, and the requests in flight hold 70 "
        "of the 100 bytes --max-inflight-tensor-bytes allows them together; retry when fewer "
        "are running"
    )
    assert account.reserve(30).nbytes == 30  # exactly at the limit is allowed
    held.release()
    assert account.statistics().refused_in_flight == 1


def test_a_request_larger_than_the_in_flight_limit_alone_says_so():
    account = TensorMemory(request_limit=0, in_flight_limit=100)
    with pytest.raises(TensorMemoryLimit) as info:
        account.reserve(101)
    assert "more than --max-inflight-tensor-bytes (100) allows all requests together" in str(info.value)


def test_zero_means_no_limit():
    account = TensorMemory()
    account.reserve(1 << 60).release()
    assert account.statistics().in_flight_bytes == 0
    with pytest.raises(ValueError):
        TensorMemory(request_limit=-1)


def test_outputs_are_counted_never_refused_and_replace_the_previous_ones():
    account = TensorMemory(request_limit=100, in_flight_limit=100)
    reservation = account.reserve(60)
    reservation.count_outputs(80)  # past the limit: the memory is already taken, so it is counted, not refused
    assert account.statistics().in_flight_bytes == 140
    with pytest.raises(TensorMemoryLimit):
        account.reserve(1)
    reservation.count_outputs(10)  # a streaming model's next answer
    assert account.statistics().in_flight_bytes == 70
    reservation.release()
    reservation.count_outputs(99)  # after the end: ignored
    assert account.statistics().in_flight_bytes == 0


def test_concurrent_reservations_never_pass_the_limit():
    account = TensorMemory(in_flight_limit=1000)
    granted, barrier = [], threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        for _ in range(500):
            try:
                reservation = account.reserve(300)
            except TensorMemoryLimit:
                continue
            granted.append(account.statistics().in_flight_bytes)
            reservation.release()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert granted and max(granted) <= 1000
    statistics = account.statistics()
    assert (statistics.in_flight_bytes, statistics.requests) == (0, 0) and statistics.peak_bytes <= 1000


# ---- the estimate ---------------------------------------------------------------------------------------------


def _bytes_raw(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(element)) + element for element in elements)


def _request(*tensors) -> pb.ModelInferRequest:
    """tensors: (name, datatype, shape, raw bytes or None)."""
    request = pb.ModelInferRequest(model_name="m")
    for name, datatype, shape, raw in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        if raw is not None:
            request.raw_input_contents.append(raw)
    return request


def test_fixed_size_inputs_count_their_nbytes():
    request = _request(("A", "FP32", [2, 3], bytes(24)), ("B", "INT64", [5], bytes(40)), ("C", "BF16", [4], bytes(8)))
    assert decoded_bytes(request) == 24 + 40 + 8


def test_typed_fixed_size_inputs_count_their_nbytes():
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="A", datatype="INT16", shape=[3]).contents.int_contents.extend([1, 2, 3])
    assert decoded_bytes(request) == 6


def test_bytes_inputs_count_each_element_and_their_contents():
    elements = [b"ab", b"", b"x" * 100]
    request = _request(("S", "BYTES", [3], _bytes_raw(elements)))
    assert decoded_bytes(request) == COPIES * (3 * COST + 102)


def test_typed_bytes_count_each_element_and_at_least_their_contents():
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="S", datatype="BYTES", shape=[3]).contents.bytes_contents.extend([b"ab", b"", b"x" * 100])
    # the contents' serialized size: a tag and a length each beyond the bytes
    assert COPIES * (3 * COST + 102) <= decoded_bytes(request) <= COPIES * (3 * COST + 102 + 3 * 6)


class _Regions:
    """The one call decoded_bytes makes of the shared-memory registry: status(name)."""

    def __init__(self, **sizes: int) -> None:
        self.sizes = sizes

    def status(self, name: str):
        if name not in self.sizes:
            raise RegionNotFound(name)
        return [RegionInfo(name, "/key", 0, self.sizes[name])]


def _in_region(request, name: str, datatype: str, region: str, size: int, offset: int = 0):
    tensor = request.inputs.add(name=name, datatype=datatype, shape=[10])
    tensor.parameters["shared_memory_region"].string_param = region
    tensor.parameters["shared_memory_byte_size"].int64_param = size
    tensor.parameters["shared_memory_offset"].int64_param = offset


def test_inputs_in_shared_memory_count_what_reading_them_allocates():
    """Regions are read into the server's own memory (never mapped), so a fixed-size input there costs its
    nbytes like a raw one, and a BYTES one its elements and contents."""
    request = pb.ModelInferRequest(model_name="m")
    _in_region(request, "F", "FP32", "r", 40)
    _in_region(request, "S", "BYTES", "r", 60)
    assert decoded_bytes(request, shared_memory=_Regions(r=4096)) == 40 + COPIES * (10 * COST + 60 - 40)


def test_a_fixed_size_region_input_counts_no_more_than_the_region_holds():
    request = pb.ModelInferRequest(model_name="m")
    _in_region(request, "F", "FP32", "r", 40, offset=16)
    assert decoded_bytes(request, shared_memory=_Regions(r=36)) == 20
    assert decoded_bytes(request, shared_memory=_Regions(other=1 << 30)) == 0


def test_a_region_slice_counts_no_more_than_the_region_holds():
    """A byte size past the region (which decode refuses) counts only what the region holds past the offset; an
    unknown region, or shared memory off, counts nothing (decode refuses those too)."""
    request = pb.ModelInferRequest(model_name="m")
    _in_region(request, "S", "BYTES", "r", 2**63 - 1, offset=8)
    assert decoded_bytes(request, shared_memory=_Regions(r=58)) == COPIES * (10 * COST + 50 - 40)
    assert decoded_bytes(request, shared_memory=_Regions(other=1 << 30)) == 0
    assert decoded_bytes(request) == 0


def test_a_bytes_shape_counts_no_more_elements_than_its_contents_can_hold():
    request = _request(("S", "BYTES", [10**9], _bytes_raw([b"ab"])))
    assert decoded_bytes(request) == COPIES * (1 * COST + 2)


def test_the_estimate_bounds_what_decoding_keeps():
    """The objects decoding leaves (as tracemalloc counts them, which is below RSS) stay within the estimate."""
    import tracemalloc

    for elements in ([b"ab"] * 50_000, [b"a" * (i % 40) for i in range(50_000)]):
        request = _request(("S", "BYTES", [len(elements)], _bytes_raw(elements)))
        tracemalloc.start()
        decoded = decode_request(request)
        kept, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert decoded.inputs["S"].shape == (len(elements),)
        assert kept <= decoded_bytes(request)


def test_a_bytes_shape_decode_refuses_is_refused_the_same_way():
    """A BYTES input's element count comes from its shape, so a shape decode refuses is refused here already (a
    fixed-size raw input counts its entry's length and leaves its shape to decode)."""
    with pytest.raises(InvalidRequest, match="65 dimensions"):
        decoded_bytes(_request(("A", "BYTES", [1] * 65, _bytes_raw([b"a"]))))
    with pytest.raises(InvalidRequest, match="negative dimension"):
        decoded_bytes(_request(("A", "BYTES", [-2], b"")))
    assert decoded_bytes(_request(("A", "FP32", [1] * 65, bytes(4)))) == 4


def test_unknown_datatypes_and_missing_contents_count_nothing():
    assert decoded_bytes(_request(("A", "FP33", [1000], bytes(4)), ("B", "FP32", [1000], None))) == 0


def test_output_bytes():
    strings = np.empty(4, dtype=object)
    strings[:] = [b"a", b"b", b"c", b"d"]
    assert output_bytes({"F": np.zeros((2, 3), np.float32), "S": strings}) == 24 + 4 * COST
