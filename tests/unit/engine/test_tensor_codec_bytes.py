"""BYTES contents (engine/tensor_codec.py): 4-byte little-endian lengths and element bytes, both ways, and what
decoding and encoding millions of short elements cost. Expected bytes are built here with struct."""

from __future__ import annotations

import struct
import tracemalloc

import numpy as np
import pytest

from engine.tensor_codec import BYTES_ELEMENT_COST, TensorDecodeError, deserialize_bytes, serialize_bytes


def wire(elements) -> bytes:
    return b"".join(struct.pack("<I", len(element)) + element for element in elements)


def objects(elements) -> np.ndarray:
    array = np.empty(len(elements), dtype=object)
    array[:] = list(elements)
    return array


CASES = {
    "uniform": [b"ab"] * 7,
    "uniform_with_nuls": [b"\x00\x00", b"a\x00", b"\x00b"],  # trailing NULs are kept (numpy's S dtype drops them)
    "all_empty": [b""] * 5,
    "mixed": [b"", b"\x00", b"abc", bytes(range(256)), b"\xff" * 3],
    "one": [b"x" * 1000],
    "none": [],
}


@pytest.mark.parametrize("elements", CASES.values(), ids=CASES.keys())
def test_round_trip(elements):
    data = wire(elements)
    decoded = deserialize_bytes(memoryview(data), len(elements), "S")
    assert decoded.dtype == object and decoded.shape == (len(elements),)
    assert [type(element) for element in decoded] == [bytes] * len(elements)
    assert list(decoded) == elements
    assert serialize_bytes(objects(elements)) == data
    assert serialize_bytes(objects(elements).reshape(-1, 1) if elements else objects(elements)) == data


def test_serialize_encodes_str_and_other_values_as_text():
    assert serialize_bytes(objects(["h\u00e9", b"b", 12, bytearray(b"z")])) == wire(
        ["h\u00e9".encode(), b"b", b"12", b"z"]
    )
    assert serialize_bytes(np.array([b"ab", b"cd"])) == wire([b"ab", b"cd"])  # numpy S arrays too


@pytest.mark.parametrize(
    "data,count,message",
    [
        (wire([b"ab"]) + b"\x01\x00", 2, "BYTES element 1 has a truncated length prefix"),
        (wire([b"ab"]) + struct.pack("<I", 9) + b"abc", 2, "BYTES element 1 declares 9 bytes, only 3 remain"),
        (wire([b"ab", b"cd"]), 1, "shape holds 1 BYTES elements, the contents hold more than 1"),
        (wire([b"ab", b"cd"]), 3, "shape holds 3 BYTES elements, the contents hold 2"),
        (wire([b"a", b"b"]), 0, "shape holds 0 BYTES elements, the contents hold more than 0"),
        (wire([b"ab", b"c"]), 2 * 10**9, "shape holds 2000000000 BYTES elements, the contents hold 2"),
    ],
)
def test_malformed_contents_are_refused_by_name(data, count, message):
    with pytest.raises(TensorDecodeError) as info:
        deserialize_bytes(data, count, "S")
    assert str(info.value) == f"input 'S': {message}"


def test_equal_lengths_that_do_not_match_the_prefixes_are_split_by_the_prefixes():
    """12 bytes for 2 elements look like two records of 2 bytes each (numpy's fast path), but the second prefix says
    0: the elements are b"ab" and b"", and 2 bytes are left over, which the walk refuses."""
    data = wire([b"ab"]) + struct.pack("<I", 0) + b"\x00\x00"
    with pytest.raises(TensorDecodeError, match="the contents hold more than 2|element 2 has a truncated"):
        deserialize_bytes(data, 2, "S")


def test_a_shape_claiming_billions_of_elements_allocates_nothing_for_them():
    data = wire([b"ab"] * 3)
    tracemalloc.start()
    try:
        with pytest.raises(TensorDecodeError):
            deserialize_bytes(data, 10**10, "S")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize("lengths", ["uniform", "mixed"])
def test_short_elements_cost_no_more_than_the_stated_cost(lengths):
    """Decoding keeps one bytes object and one pointer per element (tracemalloc counts the sizes asked of the
    allocator: 33 + length, + 8), within BYTES_ELEMENT_COST, and never holds a per-element list on the way; encoding
    holds a few bytes per element besides its result (a join of per-element parts held ~200)."""
    count = 100_000
    elements = [b"ab"] * count if lengths == "uniform" else [b"ab", b"abc"] * (count // 2)
    data = wire(elements)
    tracemalloc.start()
    try:
        decoded = deserialize_bytes(memoryview(data), count, "S")
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    contents = len(data) - 4 * count
    assert kept <= count * BYTES_ELEMENT_COST + contents
    assert peak - kept < count * 2, "decoding held a per-element intermediate"
    tracemalloc.start()
    try:
        encoded = serialize_bytes(decoded)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert encoded == data
    assert peak < 2 * len(data) + count * 12
