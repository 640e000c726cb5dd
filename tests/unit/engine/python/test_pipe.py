"""The worker's end of its pipe (engine/python/pipe.py), against a fake server on the other end of a real
socketpair: the thread waiting for a message reads the pipe and files what it reads for the others, the reader's
role passes on when its holder has its message, a BLS part nobody keeps is dropped with its file, and a server
that goes away ends every wait."""

from __future__ import annotations

import os
import socket
import threading
from multiprocessing.connection import Connection

import numpy as np
import pytest

from engine.python import transport
from engine.python.messages import BlsPart, Execute, Reply, SegmentName, Stop
from engine.python.pipe import WorkerPipe

WAIT = 30.0


@pytest.fixture
def ends():
    ours, theirs = socket.socketpair()
    server, worker = Connection(ours.detach()), Connection(theirs.detach())
    yield WorkerPipe(worker), server
    server.close()
    worker.close()


def test_orders_read_by_a_thread_waiting_for_its_reply_reach_the_main_thread_in_order(ends):
    pipe, server = ends
    transport.send(server, Execute(1, 0, [], {}))
    transport.send(server, Stop())
    transport.send(server, Reply(7, SegmentName("/dev/shm/grown", 1)))
    assert pipe.answer(7) == SegmentName("/dev/shm/grown", 1)  # read past both orders to get here, and filed them
    assert pipe.next_order() == Execute(1, 0, [], {})
    assert pipe.next_order() == Stop()


def test_the_reading_role_passes_to_the_thread_still_waiting(ends):
    pipe, server = ends
    answers: dict[int, object] = {}
    threads = [threading.Thread(target=lambda tag=tag: answers.update({tag: pipe.answer(tag)})) for tag in (1, 2)]
    for thread in threads:
        thread.start()
    transport.send(server, Reply(2, SegmentName("second", 2)))  # whichever thread reads it, thread 2 gets it
    threads[1].join(WAIT)
    assert answers == {2: SegmentName("second", 2)}
    assert threads[0].is_alive()  # still waiting: it holds the role now, or takes it over
    transport.send(server, Reply(1, SegmentName("first", 1)))
    threads[0].join(WAIT)
    assert answers == {1: SegmentName("first", 1), 2: SegmentName("second", 2)}


def test_a_part_for_a_call_nobody_keeps_is_dropped_with_its_file(ends):
    pipe, server = ends
    pipe.open_call(5)
    kept = transport.write_reply([{"Y": np.arange(3, dtype=np.int32)}])
    dropped = transport.write_reply([{"Y": np.arange(4, dtype=np.int32)}])
    transport.send(server, BlsPart(5, kept, False))
    assert pipe.next_part(5) == BlsPart(5, kept, False)
    assert pipe.close_call(5) == []
    transport.send(server, BlsPart(5, dropped, True))  # the model let go of call 5 before its final part
    transport.send(server, Reply(1, None))
    assert pipe.answer(1) is None  # read past the dropped part
    assert not os.path.exists(dropped.segment.path)  # type: ignore[union-attr]
    os.unlink(kept.segment.path)  # type: ignore[union-attr]  # the worker would map it and unlink it


def test_a_server_that_goes_away_ends_every_wait(ends):
    pipe, server = ends
    pipe.open_call(3)
    results: dict[str, object] = {}

    def ask() -> None:
        try:
            pipe.answer(9)
        except EOFError as error:
            results["answer"] = str(error)

    def part() -> None:
        results["part"] = pipe.next_part(3)

    threads = [threading.Thread(target=ask), threading.Thread(target=part)]
    for thread in threads:
        thread.start()
    server.close()
    for thread in threads:
        thread.join(WAIT)
    assert results == {"answer": "the server is gone", "part": None}
    assert pipe.next_order() is None  # the main thread ends
