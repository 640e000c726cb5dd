"""service/frontends/link.py: typed records framed over a Unix socket pair."""

from __future__ import annotations

import socket
import threading

import pytest

from service.frontends.link import Link, LinkClosed
from service.frontends.messages import CallEnd, CallStart, Readiness, Reply


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    left, right = Link(ours), Link(theirs)
    yield left, right
    left.close()
    right.close()


def test_records_arrive_whole_and_in_order_with_their_types(pair):
    left, right = pair
    big = bytes(range(256)) * 4096  # 1 MiB: more than a socket buffer, written while the reader reads
    sent = [
        CallStart(
            1, "/inference.GRPCInferenceService/ModelInfer", (("authorization", "Bearer t"),), 2.5, "ipv4:x", b"r"
        ),
        Reply(1, big),
        CallEnd(1, 0, "", (("k-bin", b"\x00\x01"),), reply=b"answer"),
        Readiness(True),
    ]
    writer = threading.Thread(target=lambda: [left.send(record) for record in sent])
    writer.start()
    received = [right.receive() for _ in sent]
    writer.join(10)
    assert received == sent
    assert type(received[1]) is Reply and received[1].payload == big


def test_the_end_of_the_other_side_reads_as_none_and_a_later_send_raises(pair):
    left, right = pair
    left.send(Readiness(False))
    left.close()
    assert right.receive() == Readiness(False)  # what was written before the close still arrives
    assert right.receive() is None
    assert right.closed
    with pytest.raises(LinkClosed):
        right.send(Readiness(True))


def test_a_reader_blocked_in_receive_returns_none_when_its_own_end_is_closed(pair):
    left, right = pair
    result: list[object] = []
    reader = threading.Thread(target=lambda: result.append(right.receive()))
    reader.start()
    right.close()
    reader.join(10)
    assert not reader.is_alive() and result == [None]


def test_a_send_on_a_closed_link_raises_link_closed(pair):
    left, _right = pair
    left.close()
    with pytest.raises(LinkClosed):
        left.send(Readiness(True))


def test_a_holding_threads_records_wait_for_its_flush_and_arrive_in_one_read(pair):
    left, right = pair
    left.hold()
    left.send(Reply(1, b"first"))
    left.send(CallEnd(1, 0, "", ()))
    assert not _readable(right)  # nothing written yet
    left.flush()
    assert right.receive() == Reply(1, b"first")
    assert right.has_record()  # one write brought both
    assert right.receive() == CallEnd(1, 0, "", ())


def test_another_threads_record_goes_at_once_after_what_the_holder_held(pair):
    left, right = pair
    left.hold()
    left.send(CallEnd(1, 0, "", ()))  # held
    other = threading.Thread(target=lambda: left.send(Readiness(False)))  # as the supervisor's Exit is sent
    other.start()
    other.join(10)
    assert right.receive() == CallEnd(1, 0, "", ())  # never overtaken by a later record
    assert right.receive() == Readiness(False)


def _readable(link: Link) -> bool:
    """Whether the link's socket has bytes to read now (without taking them)."""
    try:
        return bool(link._socket.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return False


def test_the_holder_flushes_by_itself_before_a_large_record(pair):
    left, right = pair
    big = b"y" * (1 << 20)
    left.hold()
    left.send(Reply(1, b"small"))
    reader_got: list[object] = []
    reader = threading.Thread(target=lambda: reader_got.extend(right.receive() for _ in range(2)))
    reader.start()
    left.send(Reply(1, big))  # not held: what was held goes first, so the call's records keep their order
    reader.join(10)
    assert reader_got == [Reply(1, b"small"), Reply(1, big)]
