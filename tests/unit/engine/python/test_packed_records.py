"""A request's path without pickling (engine/python/messages.py `pack_into`/`unpack_from`, transport.py `ring`): an
Execute and its Done are packed into their lane's control area and announced by a doorbell on the pipe; every record
comes back as itself, one that is not of the common kind travels pickled instead, doorbells and pickled messages keep
their order on the pipe, and a real worker answers both ways."""

from __future__ import annotations

import pickle
import shutil
import socket
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import pytest

from engine.config.repository import ModelRepository
from engine.interface import CancelToken, RequestInfo
from engine.python import backend, transport
from engine.python.error_codes import TritonCode
from engine.python.messages import (
    Descriptor,
    Done,
    ErrorResult,
    Execute,
    Grow,
    Released,
    Request,
    SegmentName,
    Stop,
    Tensors,
)

X = Descriptor("INPUT0", "INT32", (1, 16), transport.CONTROL_BYTES, 64)
Y = Descriptor("ünïcode name", "BYTES", (), transport.CONTROL_BYTES + 64, 9)
Z = Descriptor("Z", "BF16", (2, 0, 3), transport.CONTROL_BYTES + 128, 0)
MODELS = Path(__file__).resolve().parents[3] / "python_models" / "repository"


@pytest.fixture
def control():
    return memoryview(bytearray(transport.CONTROL_BYTES))


def _as_plain(record: object) -> object:
    """A record with its sequences as tuples (a packed record reads lists back where the sender may have had tuples)."""
    if isinstance(record, list | tuple):
        return tuple(_as_plain(item) for item in record)
    if isinstance(record, dict):
        return {key: _as_plain(value) for key, value in record.items()}
    return record


@pytest.mark.parametrize(
    "execute",
    [
        Execute(7, 0, [Request([X], (), "", 0, 0, {})], {}),
        Execute(
            2**40, 3, [Request([X, Y, Z], ("OUT", "ÖUT"), "id-ü", 2**64 - 1, 3, {}), Request([], (), "", 5, 1, {})], {}
        ),  # fmt: skip
        Execute(1, 0, [], {}),
    ],
    ids=["one", "several", "none"],
)
def test_an_execute_comes_back_as_itself(control, execute):
    assert execute.pack_into(control)
    unpacked = Execute.unpack_from(control)
    assert type(unpacked) is Execute and _as_plain(unpacked) == _as_plain(execute)
    for request in unpacked.requests:  # nested records are records, read by field
        assert all(type(descriptor) is Descriptor for descriptor in request.inputs)
        assert all(type(dim) is int for descriptor in request.inputs for dim in descriptor.shape)


def test_a_done_comes_back_as_itself(control):
    done = Done(9, [Tensors((X, Y)), ErrorResult(TritonCode.NOT_FOUND, "gone: ünïcode"), Tensors(())], 12345)
    assert done.pack_into(control)
    unpacked = Done.unpack_from(control)
    assert type(unpacked) is Done and _as_plain(unpacked) == _as_plain(done)
    assert [type(result) for result in unpacked.results] == [Tensors, ErrorResult, Tensors]


@pytest.mark.parametrize(
    "record",
    [
        Execute(1, 0, [Request([X], (), "", 0, 0, {})], {"request": SegmentName("/dev/shm/r", 1 << 16)}),
        Execute(1, 0, [Request([X], (), "", 0, 0, {"key": "value"})], {}),
        Execute(1, 0, [Request([X], (), "", "sequence-a", 0, {})], {}),
        Execute(1, 0, [Request([X], (), "", -1, 0, {})], {}),
        Execute(1, 0, [Request([X] * 200, (), "", 0, 0, {})], {}),
        Done(1, [Released(0, 2)], 0),
        Done(1, [ErrorResult(TritonCode.INTERNAL, "x" * transport.CONTROL_BYTES)], 0),
    ],
    ids=["segment handed over", "parameters", "string sequence id", "negative id", "too large", "released", "long"],
)
def test_what_is_not_the_common_kind_is_not_packed_and_travels_pickled(control, record):
    assert not record.pack_into(control)
    ours, theirs = socket.socketpair()
    sender, receiver = Connection(ours.detach()), Connection(theirs.detach())
    try:
        transport.send(sender, record)
        assert transport.receive(receiver) == record
    finally:
        sender.close()
        receiver.close()


def test_records_of_a_shape_already_packed_come_back_each_with_its_own_fields(control):
    """Each process remembers what a shape of record packed and read back (messages.py, _EXECUTES_WRITTEN and the
    others): a later record of the same shape carries its own run, model_ns, offsets and dims, never the first's."""
    first = Execute(1, 0, [Request((X,), (), "", 0, 0, {})], {})
    later = [
        first._replace(run=2),
        first._replace(run=3, requests=[Request((X._replace(offset=X.offset + 64),), (), "", 0, 0, {})]),
        first._replace(run=4, requests=[Request((X._replace(shape=(2, 8)),), (), "", 0, 0, {})]),
        first._replace(run=5, lane=1),
    ]
    for execute in [first, *later, first._replace(run=6)]:
        assert execute.pack_into(control)
        assert _as_plain(Execute.unpack_from(control)) == _as_plain(execute)
    done = Done(1, [Tensors((X,))], 10)
    for answer in [done, done._replace(run=2, model_ns=20), Done(3, [Tensors((X._replace(nbytes=32),))], 30), done]:
        assert answer.pack_into(control)
        assert _as_plain(Done.unpack_from(control)) == _as_plain(answer)


def test_a_request_with_parameters_is_not_packed_after_one_of_its_shape_without(control):
    assert Execute(1, 0, [Request((X,), (), "", 0, 0, {})], {}).pack_into(control)
    assert not Execute(2, 0, [Request((X,), (), "", 0, 0, {"key": "value"})], {}).pack_into(control)


def test_records_read_back_share_nothing_a_reader_could_change(control):
    execute = Execute(1, 0, [Request((X,), (), "", 0, 0, {})], {})
    assert execute.pack_into(control)
    first = Execute.unpack_from(control)
    first.requests.append(Request((Y,), (), "", 0, 0, {}))  # the reader's list is its own
    assert execute._replace(run=2).pack_into(control)
    assert _as_plain(Execute.unpack_from(control)) == _as_plain(execute._replace(run=2))


def test_a_control_area_without_the_record_is_refused_by_name(control):
    with pytest.raises(ValueError, match="control area"):
        Execute.unpack_from(control)  # all zeroes: no record
    Done(1, [], 0).pack_into(control)
    with pytest.raises(ValueError, match="not of kind"):
        Execute.unpack_from(control)


def test_doorbells_and_pickled_messages_arrive_in_the_order_sent(control):
    """One channel per direction: a doorbell is a frame of the pipe, so a Grow sent before a packed Done is read
    before it, and a message after it after it."""
    done = Done(4, [Tensors((X,))], 1)
    assert done.pack_into(control)
    grow = Grow(1, 4, 1 << 20)  # pickled messages before, between and after two doorbells
    inputs = [X._replace(name=f"input {index}") for index in range(3000)]
    long_message = Execute(5, 0, [Request(inputs, (), "", 0, 0, {})], {})  # over 64 KiB pickled
    ours, theirs = socket.socketpair()
    sender, receiver = Connection(ours.detach()), Connection(theirs.detach())
    try:
        transport.send(sender, grow)
        transport.ring(sender, 2)
        transport.send(sender, long_message)
        transport.ring(sender, 2)
        transport.send(sender, Stop())
        lanes: list[int] = []

        def packed(lane: int) -> Done:
            lanes.append(lane)
            return Done.unpack_from(control)

        received = [transport.receive(receiver, packed) for _ in range(5)]
    finally:
        sender.close()
        receiver.close()
    assert _as_plain(received) == _as_plain([grow, done, long_message, done, Stop()]) and lanes == [2, 2]
    assert len(pickle.dumps(long_message.to_wire(), pickle.HIGHEST_PROTOCOL)) > 1 << 16


def test_a_doorbell_where_none_is_expected_is_refused_and_a_closed_pipe_is_eof():
    ours, theirs = socket.socketpair()
    sender, receiver = Connection(ours.detach()), Connection(theirs.detach())
    try:
        transport.ring(sender, 0)
        with pytest.raises(ValueError, match="doorbell"):
            transport.receive(receiver)  # no reader of packed records was given
        sender.close()
        with pytest.raises(EOFError):
            transport.receive(receiver)
    finally:
        receiver.close()


@pytest.fixture
def probe(tmp_path):
    shutil.copytree(MODELS / "probe", tmp_path / "probe")
    model = backend.PythonBackend().load(ModelRepository(tmp_path).read("probe"))
    context = model.create_context()
    yield model, context
    context.close()
    model.close()


def _text(value: str) -> np.ndarray:
    return np.array([value.encode()], dtype=np.object_)


def test_a_worker_answers_packed_calls_and_pickled_ones_alike(probe, monkeypatch):
    """A plain request's Execute and Done cross packed; a request with parameters (its Execute pickled) and an
    answer too long for the control area (its Done pickled) are answered the same way, in turn on one worker."""
    model, context = probe
    pickled: list[str] = []
    packed_answers: list[int] = []
    send, packed_done = transport.send, backend.WorkerProcess._packed_done
    monkeypatch.setattr(transport, "send", lambda connection, message: (pickled.append(type(message).__name__),
                                                                         send(connection, message)))  # fmt: skip
    monkeypatch.setattr(
        backend.WorkerProcess,
        "_packed_done",
        lambda self, lane: (packed_answers.append(lane), packed_done(self, lane))[1],
    )

    def call(arg: str, request: RequestInfo | None = None) -> dict[str, np.ndarray]:
        token = CancelToken()
        token.request = request
        return context.execute({"MODE": _text("echo"), "ARG": _text(arg)}, [], token)

    assert call("plain")["TEXT"][0] == b"plain"
    assert pickled == [] and packed_answers == [0]  # both ways packed: nothing pickled
    assert call("with parameters", RequestInfo("id-1", {"key": "value"}))["TEXT"][0] == b"with parameters"
    assert pickled == ["Execute"] and packed_answers == [0, 0]
    with pytest.raises(backend.ModelErrorInvalidArgument) as raised:  # an error of 8 KiB: its Done is pickled
        context.execute({"MODE": _text("error"), "ARG": _text("INVALID_ARG:" + "w" * 8192)}, [], CancelToken())
    assert str(raised.value) == "w" * 2000  # the server keeps 2,000 characters of a model's words
    assert packed_answers == [0, 0]
    with pytest.raises(backend.ModelErrorNotFound, match="^short$"):  # a short one crosses packed
        context.execute({"MODE": _text("error"), "ARG": _text("NOT_FOUND:short")}, [], CancelToken())
    assert packed_answers == [0, 0, 0]
    assert call("again")["TEXT"][0] == b"again" and pickled == ["Execute"]


def test_a_frame_shorter_than_any_message_is_refused_by_name():
    ours, theirs = socket.socketpair()
    sender, receiver = Connection(ours.detach()), Connection(theirs.detach())
    try:
        sender.send_bytes(b"\x80")  # one byte: no record is that short
        transport.send(sender, Stop())
        with pytest.raises(ValueError, match="a frame of 1 bytes"):
            transport.receive(receiver)
    finally:
        sender.close()
        receiver.close()
