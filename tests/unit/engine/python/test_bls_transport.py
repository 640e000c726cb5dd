"""The BLS messages of the python-model transport (engine/python/transport.py): a call's inputs and a reply's
outputs through segments of their own, their files unlinked once mapped, the codes errors carry."""

from __future__ import annotations

import os

import numpy as np
import pytest

from engine.python import transport
from engine.python.error_codes import TritonCode, for_status
from engine.python.messages import CallRequest, ErrorResult, Request


def named(path: str) -> bool:
    return os.path.exists(path)


def test_a_call_moves_its_inputs_through_a_segment_the_server_views_without_copying():
    tensors = [
        ("F", np.arange(12, dtype=np.float32).reshape(3, 4)),
        ("S", np.array([b"ab", b"", "\u00e9".encode()], dtype=object)),
        ("EMPTY", np.zeros((0, 2), dtype=np.int64)),
    ]
    segment, descriptors = transport.write_call(tensors)
    assert segment is not None and [d.name for d in descriptors] == ["F", "S", "EMPTY"]
    request = CallRequest("m", "", Request(descriptors, ("OUT",), "", 0, 0, {"k": 1}), segment.name)
    mapped, inputs = transport.read_call(request)
    assert not named(segment.path)  # the server unlinks the file as soon as it has it mapped
    np.testing.assert_array_equal(inputs["F"], tensors[0][1])
    assert not inputs["F"].flags.writeable and not inputs["F"].flags.owndata  # a view of the segment, read-only
    assert inputs["S"].tolist() == [b"ab", b"", "\u00e9".encode()]
    assert inputs["EMPTY"].shape == (0, 2) and inputs["EMPTY"].dtype == np.int64
    segment.view[descriptors[0].offset : descriptors[0].offset + 4] = np.float32(9).tobytes()
    assert inputs["F"][0, 0] == 9  # the same memory: no copy on the server's side
    del inputs
    mapped.close()
    segment.close()


def test_a_call_without_inputs_needs_no_segment():
    segment, descriptors = transport.write_call([])
    assert segment is None and descriptors == ()
    assert transport.read_call(CallRequest("m", "", Request((), (), "", 0, 0, {}), None)) == (None, {})


def test_an_input_no_datatype_fits_is_refused_by_name():
    with pytest.raises(ValueError, match="tensor 'C' has numpy dtype complex64, which has no Triton datatype"):
        transport.write_call([("C", np.zeros(2, dtype=np.complex64))])
    with pytest.raises(ValueError, match="tensor 'L' is a list, not a numpy array"):
        transport.write_call([("L", [1, 2])])  # type: ignore[list-item]


def test_a_reply_carries_responses_and_errors_in_order_as_writable_arrays():
    first = {"OUT": np.array([[1, 2], [3, 4]], dtype=np.int32), "TEXT": np.array([b"x"], dtype=object)}
    second = {"OUT": np.array([5], dtype=np.int32)}
    reply = transport.write_reply([first, second, ErrorResult(TritonCode.INVALID_ARG, "n must be >= 0")])
    assert reply.segment is not None and named(reply.segment.path)  # kept until the worker maps it
    results = transport.read_reply(reply)
    assert not named(reply.segment.path)  # the worker unlinks it once mapped
    ok, other, error = results
    assert isinstance(ok, dict) and isinstance(other, dict)
    np.testing.assert_array_equal(ok["OUT"], first["OUT"])
    assert ok["TEXT"].tolist() == [b"x"]
    assert other["OUT"].tolist() == [5]
    assert error == ErrorResult(3, "n must be >= 0")
    ok["OUT"] += 1  # the model's own array
    assert ok["OUT"].tolist() == [[2, 3], [4, 5]]


def test_a_reply_of_empty_tensors_or_errors_only_needs_no_segment():
    reply = transport.write_reply([{"OUT": np.zeros((0,), dtype=np.float32)}, ErrorResult(7, "cancelled")])
    assert reply.segment is None
    (ok, error) = transport.read_reply(reply)
    assert isinstance(ok, dict) and ok["OUT"].shape == (0,) and ok["OUT"].dtype == np.float32
    assert error == ErrorResult(TritonCode.CANCELLED, "cancelled")


def test_status_names_become_triton_error_codes():
    codes = {
        name: for_status(name)
        for name in ("NOT_FOUND", "INVALID_ARGUMENT", "UNAVAILABLE", "UNIMPLEMENTED", "CANCELLED", "INTERNAL")
    }
    assert codes == {
        "NOT_FOUND": 2,
        "INVALID_ARGUMENT": 3,
        "UNAVAILABLE": 4,
        "UNIMPLEMENTED": 5,
        "CANCELLED": 7,
        "INTERNAL": 1,
    }
    assert for_status("PERMISSION_DENIED") is TritonCode.INTERNAL  # no Triton code for it


def test_segments_of_a_process_are_found_by_its_pid():
    segment = transport.Segment.create(10)
    try:
        assert segment.path in transport.segments_of(os.getpid())
        assert segment.path not in transport.segments_of(os.getpid() + 1_000_000)
    finally:
        segment.unlink()
        segment.close()
    assert segment.path not in transport.segments_of(os.getpid())
