"""The messages between the server and a python worker (engine/python/messages.py): every record comes back from the
pipe as itself, a request's path carries plain tuples only (no record class for pickle to write), each kind has
one record, and bytes that are no message are refused by name."""

from __future__ import annotations

import pickle
import socket
from multiprocessing.connection import Connection

import pytest

from engine.python import transport
from engine.python.error_codes import TritonCode, for_status
from engine.python.messages import (
    BlsCall,
    BlsPart,
    CallReply,
    CallRequest,
    Descriptor,
    Done,
    ErrorResult,
    Execute,
    Failed,
    FamilyNew,
    Grow,
    GrowRefused,
    Init,
    Kind,
    LoadFailed,
    MetricAction,
    MetricAnswer,
    MetricCall,
    MetricKind,
    MetricNew,
    MetricRead,
    MetricUpdate,
    Ready,
    Released,
    Reply,
    Request,
    Response,
    SegmentName,
    Stop,
    Tensors,
    decode,
)

X = Descriptor("X", "INT32", (2, 3), 0, 24)
Y = Descriptor("Y", "BYTES", (1,), 64, 9)
REQUEST = Request([X, Y], ["OUT"], "id-1", 7, 1, {"k": "v"})

MESSAGES = [
    Init({"model_name": "m", "cancel_board": SegmentName("/dev/shm/b", 64)}),
    Ready('{"name": "m"}', True),
    LoadFailed("ValueError: no"),
    Execute(3, 1, [REQUEST, Request([], [], "", "seq", 0, {})], {"request": SegmentName("/dev/shm/r", 1 << 16)}),
    Done(3, [Tensors([X]), ErrorResult(TritonCode.NOT_FOUND, "gone"), Released(2, 2)], 1234),
    Failed(3, "RuntimeError: boom"),
    Response(9, 3, 1, Tensors([Y]), False),
    Response(10, 3, 1, ErrorResult(TritonCode.INTERNAL, "bad"), True),
    Response(11, 3, 0, None, True),
    Grow(12, 3, 1 << 20),
    Reply(12, SegmentName("/dev/shm/g", 1 << 21)),
    Reply(13, GrowRefused("no room")),
    Reply(9, None),
    Stop(),
    BlsCall(14, 3, CallRequest("callee", "2", REQUEST, SegmentName("/dev/shm/c", 128), True, 2500)),
    BlsPart(
        14, CallReply((Tensors((X,)), ErrorResult(TritonCode.CANCELLED, "late")), SegmentName("/dev/shm/p", 64)), True
    ),
    Released(1, 2, 3),
    MetricCall(15, FamilyNew("requests", "what it counts", MetricKind.COUNTER)),
    MetricCall(16, MetricNew("latency", (("a", "1"), ("b", "2")), (0.5, 1.0))),
    MetricCall(17, MetricUpdate("requests", (), MetricAction.INCREMENT, 2.5)),
    MetricCall(18, MetricRead("requests", (("a", "1"),))),
    Reply(18, MetricAnswer(3.5)),
    Reply(15, MetricAnswer(error="Invalid metric name")),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda message: type(message).__name__)
def test_every_message_crosses_a_real_pipe_as_itself(message):
    ours, theirs = socket.socketpair()
    sender, receiver = Connection(ours.detach()), Connection(theirs.detach())
    try:
        transport.send(sender, message)
        received = transport.receive(receiver)
    finally:
        sender.close()
        receiver.close()
    assert type(received) is type(message) and received == message
    if isinstance(received, Execute):  # nested records come back as records, read by field
        assert received.requests[0].inputs[0].name == "X" and received.requests[0].parameters == {"k": "v"}
    if isinstance(received, Done):
        assert [type(result) for result in received.results] == [Tensors, ErrorResult, Released]


def _classes(value: object) -> set[type]:
    """The classes pickle would have to name to write `value` (beyond the plain builtins)."""
    if isinstance(value, tuple | list):
        found = set() if type(value) in (tuple, list) else {type(value)}
        for item in value:
            found |= _classes(item)
        return found
    if isinstance(value, dict):
        found = set()
        for key, item in value.items():
            found |= _classes(key) | _classes(item)
        return found
    return set() if type(value) in (int, str, bool, float, bytes, type(None)) else {type(value)}


@pytest.mark.parametrize("message", [m for m in MESSAGES if isinstance(m, Execute | Done | Response | Failed)])
def test_a_requests_path_travels_as_plain_tuples(message):
    if isinstance(message, Execute):  # the common call: no segment replaced (a replaced one is named by a record)
        message = message._replace(segments={})
    wire = message.to_wire()
    assert wire[0] == message_kind(message) and type(wire[0]) is int  # not the enum member: pickle would call it
    assert _classes(wire) == set()
    assert b"engine.python" not in pickle.dumps(wire, pickle.HIGHEST_PROTOCOL)


def message_kind(message: object) -> int:
    return int(
        Kind[{"Execute": "EXECUTE", "Done": "DONE", "Response": "RESPONSE", "Failed": "FAILED"}[type(message).__name__]]
    )


def test_each_kind_has_one_record_and_every_record_its_own_kind():
    kinds = {message.to_wire()[0] for message in MESSAGES}
    assert kinds == {int(kind) for kind in Kind} - {Kind.TENSORS, Kind.ERROR}  # those two are results, not messages
    for message in MESSAGES:
        assert type(decode(message.to_wire())) is type(message)


@pytest.mark.parametrize("wire", [("done", 1, []), (), (99, 1), "execute", None])
def test_what_is_no_message_is_refused_by_name(wire):
    with pytest.raises(ValueError, match="not a python-worker message"):
        decode(wire)  # type: ignore[arg-type]


def test_error_codes_are_one_named_table():
    from engine.python import triton_python_backend_utils as pb_utils

    assert [pb_utils.TritonError.UNKNOWN, pb_utils.TritonError.CANCELLED] == [TritonCode.UNKNOWN, TritonCode.CANCELLED]
    assert pb_utils.TritonError("m", pb_utils.TritonError.NOT_FOUND).code() == 2  # a plain number compares equal
    assert for_status("DEADLINE_EXCEEDED") is TritonCode.UNAVAILABLE and for_status("?") is TritonCode.INTERNAL
    with pytest.raises(pb_utils.TritonModelException, match="0..7"):
        pb_utils.TritonError("m", 8)
