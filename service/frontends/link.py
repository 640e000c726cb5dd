"""A front end's link to the admission process: records (service/frontends/messages.py) framed over one end of a
Unix socket pair.

Frame: a 4-byte big-endian length, then the record pickled (protocol 5: a payload's bytes are copied once into the
frame, never escaped). Both ends are this server's own processes on a private socket pair (no path on disk,
nothing else can connect), so unpickling reads only what the other end wrote.

A reader may `hold` its own small records and `flush` them once it has no more records to read: under load the answers
to several calls go in one write. Blocking and errors: `receive` blocks until a whole record arrives and returns None
at the end of the stream (the other process exited or closed it). `send` writes a whole frame under the link's send
lock, a leaf held only for that write; the peer's reader never stops draining the socket, and the socket's send
timeout (SEND_TIMEOUT_SECONDS) bounds the write if the peer hangs: then, as on any failure to write, the link is
closed and `LinkClosed` raised, which ends every call on it.
"""

from __future__ import annotations

import pickle
import socket
import struct
import threading

from .messages import ToAdmission, ToFrontend

SEND_TIMEOUT_SECONDS = 30.0
_HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = (1 << 32) - 1
SMALL_FRAME_BYTES = 64 << 10
RECEIVE_BYTES = 256 << 10
HELD_RECORDS = 32  # a holding thread writes once it holds this many records


class LinkClosed(ConnectionError):
    """The link is closed: the other process exited, or a write failed or timed out."""


class Link:
    """One end of a link. Thread-safe: any thread may send; one thread (the link's reader) receives."""

    def __init__(self, sock: socket.socket) -> None:
        self._socket = sock
        seconds = int(SEND_TIMEOUT_SECONDS)
        # SO_SNDTIMEO (not settimeout, which would bound the reader's wait for the next record too).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, 0))
        self._send_lock = threading.Lock()  # guards: the socket's writes (one frame at a time)
        self._closed = threading.Event()
        self._buffer = bytearray()  # received, not yet returned (the reader's only)
        self._start = 0  # where the next record's frame begins in `_buffer`
        self._holder: int | None = None  # the thread whose small records wait in `_held` for `flush` (`hold`)
        self._held: list[bytes] = []  # guarded by the send lock: written by `flush`, or before any other record

    @classmethod
    def from_fd(cls, fd: int) -> Link:
        return cls(socket.socket(fileno=fd))

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def fileno(self) -> int:
        return self._socket.fileno()

    def send(self, record: ToFrontend | ToAdmission) -> None:
        """Write one record (the holding thread's small ones wait for its `flush`). Raises LinkClosed when the link
        is (or becomes) closed."""
        frame = pickle.dumps(record, protocol=5)
        if len(frame) > MAX_FRAME_BYTES:
            raise ValueError(f"a link record of {len(frame)} bytes is over the frame limit of {MAX_FRAME_BYTES}")
        if self._closed.is_set():
            raise LinkClosed("the link is closed")
        small = len(frame) < SMALL_FRAME_BYTES
        header = _HEADER.pack(len(frame))
        try:
            with self._send_lock:
                if small and self._holder == threading.get_ident() and len(self._held) < HELD_RECORDS:
                    self._held.append(header + frame)
                    return
                # What the holder held goes first, whoever sends now: a record sent (or held) earlier is never
                # overtaken (a held CallEnd by the supervisor's Exit, a call's records by each other).
                held = b"".join(self._held)
                self._held.clear()
                if small:  # one write (a small record is copied once more, cheaply)
                    self._socket.sendall(held + header + frame)
                else:  # a large payload is not copied again
                    self._socket.sendall(held + header)
                    self._socket.sendall(frame)
        except OSError as error:
            self.close()
            raise LinkClosed(f"the link broke: {error}") from None

    def hold(self) -> None:
        """From now on this thread's small records wait until it calls `flush` (at most HELD_RECORDS of them), or
        until any thread sends a record that is not held (they go first): the reader answering several calls from
        one read sends their answers in one write. The holder must flush before it blocks (its records would wait
        for the next one to come)."""
        self._holder = threading.get_ident()

    def flush(self) -> None:
        """Write what the holding thread held, in one write. Never raises: a link that broke is closed (its calls
        end as the link's end ends them)."""
        try:
            with self._send_lock:
                if not self._held:
                    return
                held = b"".join(self._held)
                self._held.clear()
                self._socket.sendall(held)
        except OSError:
            self.close()

    def has_record(self) -> bool:
        """Whether a whole record was read already (the next `receive` returns without waiting). Reader only."""
        buffer, start = self._buffer, self._start
        if len(buffer) - start < _HEADER.size:
            return False
        (size,) = _HEADER.unpack_from(buffer, start)
        return len(buffer) >= start + _HEADER.size + int(size)

    def receive(self) -> ToFrontend | ToAdmission | None:
        """The next record, or None at the end of the stream (the link is then closed). Blocks; one reader only.

        Reads what the socket has (up to RECEIVE_BYTES at once) and keeps the rest for the next call: under load
        one system call brings several records, and a record never costs more than one."""
        while True:
            record = self._buffered_record()
            if record is not None:
                return record
            if not self._fill():
                return None

    def _buffered_record(self) -> ToFrontend | ToAdmission | None:
        buffer, start = self._buffer, self._start
        if len(buffer) - start < _HEADER.size:
            return None
        (size,) = _HEADER.unpack_from(buffer, start)
        end = start + _HEADER.size + size
        if len(buffer) < end:
            return None
        with memoryview(buffer) as view:
            record: ToFrontend | ToAdmission = pickle.loads(view[start + _HEADER.size : end])
        if end == len(buffer):
            buffer.clear()  # the usual case: everything read was used
            self._start = 0
        else:
            self._start = end
        return record

    def _fill(self) -> bool:
        """Read more of the stream into the buffer (at least the rest of a large record's frame). False at its end."""
        buffer = self._buffer
        if self._start:
            del buffer[: self._start]  # keep only what is not used yet
            self._start = 0
        wanted = RECEIVE_BYTES
        if len(buffer) >= _HEADER.size:
            wanted = max(wanted, _HEADER.size + _HEADER.unpack_from(buffer, 0)[0] - len(buffer))
        try:
            data = self._socket.recv(wanted)
        except OSError:
            data = b""
        if not data:
            self._release()
            return False
        buffer += data
        return True

    def close(self) -> None:
        """Shut both directions (idempotent): a reader blocked in `receive` gets None, a later send LinkClosed. The
        descriptor itself is closed by the reader when it sees the end (`_release`), never under its feet."""
        self._closed.set()
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the other end went first, or the reader released it already

    def _release(self) -> None:
        """The reader saw the end: close the descriptor (under the send lock: no write is using it)."""
        self._closed.set()
        with self._send_lock:
            self._socket.close()
