"""The doorbell's write and read at their edges (engine/python/transport.py `ring`, `_read_frame`), against a real
socketpair: a full socket makes `ring` wait for room and then write the frame whole (never a partial frame, never an
error), the socket stays blocking for the pickled messages, and a peer that is gone is an OSError (EPIPE) for the
writer and an EOFError for the reader. Kept as guards for any faster write of the doorbell (docs/speed.md, "Python
models": one that holds the GIL was measured and left out)."""

from __future__ import annotations

import fcntl
import os
import socket
import threading
from multiprocessing.connection import Connection

import pytest

from engine.python import transport
from engine.python.messages import Stop

WAIT = 30.0


@pytest.fixture
def ends():
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # fills after a few KiB
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    writer, reader = Connection(ours.detach()), Connection(theirs.detach())
    yield writer, reader
    writer.close()
    reader.close()


def _fill(descriptor: int) -> int:
    """Write filler bytes until the socket takes no more (without making it non-blocking); returns how many."""
    filler = socket.socket(fileno=os.dup(descriptor))
    total = 0
    try:
        while True:
            try:
                total += filler.send(b"\0" * 512, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return total
    finally:
        filler.close()


def _blocking(descriptor: int) -> bool:
    return not fcntl.fcntl(descriptor, fcntl.F_GETFL) & os.O_NONBLOCK


def test_a_doorbell_crosses_whole_and_leaves_the_socket_blocking(ends):
    writer, reader = ends
    transport.ring(writer, 513)
    assert transport._read_frame(reader.fileno()) == bytes([transport.RING]) + (513).to_bytes(2, "little")
    assert _blocking(writer.fileno()) and _blocking(reader.fileno())
    transport.send(writer, Stop())  # the pickled path after a doorbell, on the same socket
    assert transport.receive(reader) == Stop()


def test_a_full_socket_makes_the_doorbell_wait_for_room_instead_of_failing(ends):
    writer, reader = ends
    filled = _fill(writer.fileno())
    rang: list[BaseException | None] = []

    def ring() -> None:
        try:
            transport.ring(writer, 2)
            rang.append(None)
        except BaseException as error:  # noqa: BLE001 - reported to the test below
            rang.append(error)

    ringer = threading.Thread(target=ring, daemon=True)
    ringer.start()
    drained = 0
    while drained < filled:  # the reader drains; the ringer's blocking write gets room and finishes
        drained += len(os.read(reader.fileno(), filled - drained))
    ringer.join(WAIT)
    assert not ringer.is_alive() and rang == [None]
    assert transport._read_frame(reader.fileno()) == bytes([transport.RING, 2, 0])  # after the filler, whole
    assert _blocking(writer.fileno())


def test_ringing_a_peer_that_is_gone_raises_oserror(ends):
    writer, reader = ends
    reader.close()
    with pytest.raises(OSError) as raised:
        transport.ring(writer, 0)
    assert isinstance(raised.value, BrokenPipeError | ConnectionResetError)


def test_reading_from_a_peer_that_is_gone_raises_eoferror(ends):
    writer, reader = ends
    writer.close()
    with pytest.raises(EOFError):
        transport._read_frame(reader.fileno())


def test_a_reader_that_waits_for_the_doorbell_gets_it_when_it_comes(ends):
    writer, reader = ends
    read: list[bytes] = []
    waiter = threading.Thread(target=lambda: read.append(transport._read_frame(reader.fileno())), daemon=True)
    waiter.start()  # finds nothing there (or is not yet reading): either way the blocking read takes the frame
    transport.ring(writer, 9)
    waiter.join(WAIT)
    assert read == [bytes([transport.RING, 9, 0])]
