"""The worker's end of its pipe to the server, read by whichever of its threads is waiting for a message.

No thread of its own reads the pipe. A thread that needs a message (the main thread its next order, a thread
in `ask` its reply, a BLS caller the next part of its call) takes the reader's role if no other thread holds it,
and reads, filing every message it reads for the thread it belongs to, until its own has come; then it gives the
role up and wakes the others, one of which takes it over if it still waits (leader/follower). So a small request
costs one wake-up in the worker (the main thread, woken by the pipe), where a reader thread handing orders to the
main thread costs two and a switch of the GIL between them.

While no thread waits, nobody reads: the server only sends what a worker thread asked for (a reply, a BLS call's
parts) or an order the main thread reads once it is idle. A BLS part nobody is waiting for yet stays in the pipe;
should the pipe fill, the server's sender blocks until a waiting thread (or the idle main thread) reads on.

Messages are engine/python/messages.py's records: orders (Execute, Stop) for the main thread, Replies for the
thread that asked (by tag), BlsParts for the thread of their BLS call (by tag). The common Execute comes packed in
its lane's control area behind a doorbell on the pipe (engine/python/transport.py `ring`): the reader reads it out
there as it takes the doorbell off the pipe, so it is filed in its place among the pickled messages.

Lock: `_changed` guards every field below it; nothing else is taken while it is held, and the pipe is read
without it (the role, `_reading`, makes the reader the pipe's only reader).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection

from . import transport
from .messages import BlsPart, CallReply, Execute, Message, Reply, ReplyPayload, Stop

Order = Execute | Stop  # what the main thread is told to do


class WorkerPipe:
    """The worker's end of its pipe (see the module's docstring). Every method may be called from any thread."""

    def __init__(self, connection: Connection, packed: Callable[[int], Message] | None = None) -> None:
        self._connection = connection
        self._packed = packed  # reads the Execute a doorbell announces out of its lane's control area
        self._send_lock = threading.Lock()  # guards: writing on the pipe (a message is written whole)
        self._changed = threading.Condition(threading.Lock())  # guards: the fields below; notified on every change
        self._reading = False  # a thread holds the reader's role
        # Threads in `_changed.wait()`: notified only when there are some (a Condition's notify_all is Python code, on
        # every message of the common call, whose main thread is the pipe's only reader).
        self._waiting = 0
        self._closed = False  # the pipe closed: the server is gone
        self._orders: deque[Order] = deque()  # for the main thread
        self._answers: dict[int, ReplyPayload] = {}  # replies to `ask`, by tag
        self._parts: dict[int, deque[BlsPart]] = {}  # an open BLS call's parts, by its tag

    def send(self, message: Message) -> None:
        """Write one message (blocks while the pipe is full). Raises OSError when the server is gone."""
        with self._send_lock:
            transport.send(self._connection, message)

    def ring(self, lane: int) -> None:
        """Tell the server that a message lies packed in `lane`'s control area (transport.ring): in line with every
        message sent before it. Raises OSError when the server is gone."""
        with self._send_lock:
            transport.ring(self._connection, lane)

    def next_order(self) -> Order | None:
        """The server's next Execute or Stop (blocks, without a timeout: the server's watchdog ends a worker whose
        server is gone; reads the pipe meanwhile); None once the server is gone."""
        with self._changed:
            if self._orders:
                return self._orders.popleft()
            mine = not self._reading and not self._closed
            if mine:
                self._reading = True
        if mine:  # the common case: the idle main thread reads the pipe, and its next order is the next it files
            return self._read_order()
        self._wait(lambda: bool(self._orders))
        with self._changed:
            return self._orders.popleft() if self._orders else None

    def _read_order(self) -> Order | None:
        """`next_order` for the thread that took the reader's role with no order filed: the first order it reads is
        the next (no other thread files orders while it reads), returned without filing it; what comes before it is
        filed for its threads."""
        try:
            while True:
                try:
                    message = transport.receive(self._connection, self._packed)
                except (EOFError, OSError):
                    with self._changed:
                        self._closed = True
                    return None
                if type(message) is Execute or type(message) is Stop:
                    return message
                with self._changed:
                    dropped = self._file(message)
                    if self._waiting:
                        self._changed.notify_all()
                if dropped is not None:
                    unlink_reply(dropped)
        finally:
            with self._changed:
                self._reading = False
                if self._waiting:
                    self._changed.notify_all()  # a thread still waiting takes the role over

    def answer(self, tag: int) -> ReplyPayload:
        """The payload of the Reply to the question sent with `tag` (blocks, without a timeout). Raises EOFError
        when the server is gone first."""
        self._wait(lambda: tag in self._answers)
        with self._changed:
            if tag not in self._answers:
                raise EOFError("the server is gone")
            return self._answers.pop(tag)

    def open_call(self, tag: int) -> None:
        """Keep the parts that arrive for BLS call `tag` (until `close_call`). Never blocks."""
        with self._changed:
            self._parts[tag] = deque()

    def next_part(self, tag: int) -> BlsPart | None:
        """The next part of open call `tag` (blocks, without a timeout: the server bounds the call by the calling
        request's deadline); None when the server is gone first."""
        self._wait(lambda: bool(self._parts[tag]))
        with self._changed:
            parts = self._parts[tag]
            return parts.popleft() if parts else None

    def close_call(self, tag: int) -> list[BlsPart]:
        """Stop keeping call `tag`'s parts; returns those not taken (their reply files are the caller's to unlink).
        Parts that arrive later are dropped, their files unlinked. Never blocks."""
        with self._changed:
            return list(self._parts.pop(tag, ()))

    def _wait(self, ready: Callable[[], bool]) -> None:
        """Return once `ready()` (called with the lock held) is true or the pipe has closed. While it is not, this
        thread waits, or reads the pipe if no other thread does."""
        with self._changed:
            while not (ready() or self._closed):
                if not self._reading:
                    self._reading = True
                    break
                self._waiting += 1
                try:
                    self._changed.wait()
                finally:
                    self._waiting -= 1
            else:
                return
        try:
            self._read_until(ready)
        finally:
            with self._changed:
                self._reading = False
                if self._waiting:
                    self._changed.notify_all()  # a thread still waiting takes the role over

    def _read_until(self, ready: Callable[[], bool]) -> None:
        while True:
            try:
                message = transport.receive(self._connection, self._packed)
            except (EOFError, OSError):
                with self._changed:
                    self._closed = True
                return
            with self._changed:
                dropped = self._file(message)
                if self._waiting:
                    self._changed.notify_all()
                done = ready()
            if dropped is not None:
                unlink_reply(dropped)
            if done:
                return

    def _file(self, message: Message) -> CallReply | None:
        """Put `message` where its thread looks (lock held). Returns the reply of a part nobody keeps any more."""
        if isinstance(message, BlsPart):
            parts = self._parts.get(message.tag)
            if parts is None:
                return message.reply  # the model let go of that call's responses
            parts.append(message)
        elif isinstance(message, Reply):
            self._answers[message.tag] = message.payload
        elif isinstance(message, Execute | Stop):
            self._orders.append(message)
        else:
            raise ValueError(f"a worker got a message the server never sends: {type(message).__name__}")
        return None


def unlink_reply(reply: CallReply) -> None:
    """Remove a BLS reply's segment file (nobody will map it). Never raises for a file already gone."""
    if reply.segment is not None:
        try:
            os.unlink(reply.segment.path)
        except FileNotFoundError:
            pass
