"""The admission process's front ends (`--frontends N`, N > 1): reserve the port, start N front-end processes,
hand their calls to the servicers, replace a front end that dies, stop them at shutdown.

* **The port.** `start` binds a socket to the address with SO_REUSEPORT and never listens on it (the kernel hands
  connections only to listening sockets): that reserves the port (port 0 becomes a real one) for as long as the
  server lives, so each front end, the replacements included, binds that port with gRPC's `grpc.so_reuseport`.
* **The processes.** Each front end is `python -m service.frontends` started with subprocess (never a fork of
  this threaded process), one end of a Unix socket pair passed as its link (service/frontends/link.py). It gets
  its `FrontendConfig` first and answers `Started` once it listens; `start` returns when all N do.
* **Calls.** Each front end's link has a reader thread here: a `CallStart` becomes a `ForwardedContext`, run on
  the server's handler threads (`executor`: service/process/handler_threads.py, as direct calls are) by
  service/frontends/forwarded.py; the other records reach their call by id.
* **A front end that dies** (its link ends while the server is not stopping): its calls in flight end here (their
  CancelTokens fire, so leases and tensor reservations are released; no other front end's call is touched), it is
  waited for, a replacement starts at the same index, and `frontend_replaced` is logged.
* **Stop.** `stop_listening(grace)` has every front end refuse new calls at once (health NOT_SERVING was pushed
  before); `close(seconds)`, once the calls have drained, tells them to exit, waits within `seconds`, kills any
  left, and joins the threads. A front end also exits by itself when this process goes (its link ends).

Threads: one reader per live front end (started here, joined by `close`). Locking: `_lock` guards the front-end
table and the stopping flag (dictionary work; never held across a start, a send or a wait); each link's call
table has its own lock (`_Running._calls_lock`), a leaf.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

from engine.python.transport import remove_own_at_exit, segments_of

from ..core.events import log_event
from .forwarded import (
    ForwardedContext,
    HandlerTable,
    InferRunner,
    InlineGate,
    run_call,
    run_handed_off,
    run_inline,
)
from .infer import MODEL_INFER
from .link import Link, LinkClosed
from .messages import (
    CallCancel,
    CallHalfClose,
    CallMessage,
    CallStart,
    Exit,
    FrontendConfig,
    InferCall,
    Readiness,
    ReplyWritten,
    Started,
    StartFailed,
    StopListening,
    TlsMaterial,
)

_LOG = logging.getLogger("slotserve.frontends")

START_TIMEOUT_SECONDS = 60.0  # a front end imports grpc and the protocol, then binds: seconds on a loaded machine
REAP_SECONDS = 5.0  # a front end whose link ended is waited for this long before it is killed
# The share of its time to exit a front end is told it has (its gRPC stop grace); the rest is the wait for its exit.
EXIT_SHARE = 0.8


@dataclass(frozen=True)
class FrontendSettings:
    """What every front end is started with (FrontendConfig without the index and the address)."""

    grpc_arguments: tuple[tuple[str, int], ...]
    concurrent_rpcs: int
    max_workers: int
    reflection: bool
    tls: TlsMaterial | None


class FrontendStartError(RuntimeError):
    """A front end could not start (it said why, or it exited or stayed silent past START_TIMEOUT_SECONDS)."""


class _Running:
    """One live front end: its process, its link and reader thread, the calls it forwarded that are running."""

    def __init__(self, index: int, process: subprocess.Popen[bytes], link: Link) -> None:
        self.index = index
        self.process = process
        self.link = link
        self.started = threading.Event()  # Started or StartFailed came, or the link ended
        self.start_error: str | None = None
        self.reader: threading.Thread | None = None
        # guards: _calls, _streams (dictionary work only; a leaf); notified when _calls is empty
        self._calls_lock = threading.Condition()
        self._calls: dict[int, ForwardedContext] = {}
        self._streams: set[int] = set()  # the calls of `_calls` that are client streams

    def add(self, call: ForwardedContext, *, stream: bool = False) -> None:
        with self._calls_lock:
            self._calls[call.call_id] = call
            if stream:
                self._streams.add(call.call_id)

    @property
    def streams_open(self) -> int:
        """The client-stream calls of this front end that have not ended."""
        with self._calls_lock:
            return len(self._streams)

    def forget(self, call_id: int) -> None:
        """The call ended: its CallEnd was sent (ForwardedContext._end sends before it forgets)."""
        with self._calls_lock:
            self._calls.pop(call_id, None)
            self._streams.discard(call_id)
            if not self._calls:
                self._calls_lock.notify_all()

    def wait_answered(self, timeout: float) -> bool:
        """Block until every call of this front end has sent its end, at most `timeout` seconds."""
        with self._calls_lock:
            return self._calls_lock.wait_for(lambda: not self._calls, timeout)

    def find(self, call_id: int) -> ForwardedContext | None:
        with self._calls_lock:
            return self._calls.get(call_id)

    def take_all(self) -> list[ForwardedContext]:
        with self._calls_lock:
            calls, self._calls = list(self._calls.values()), {}
            self._streams.clear()
        return calls


class Frontends:
    """The supervisor of N front ends (see the module docstring)."""

    def __init__(
        self,
        count: int,
        handlers: HandlerTable,
        executor: futures.Executor,
        settings: FrontendSettings,
        serving: Callable[[], bool],
        infer: InferRunner,
    ) -> None:
        self.count = count
        self._infer = infer  # runs the ModelInfers the front ends decoded
        self._gate = InlineGate(infer)  # which of them a link's reader runs itself
        self._handlers = handlers
        self._executor = executor
        self._settings = settings
        self._serving = serving  # the health a new front end starts with
        self._address = ""
        self._reservation: socket.socket | None = None
        self._lock = threading.Lock()  # guards: _running, _stopping, _readers
        self._running: dict[int, _Running] = {}
        self._readers: list[threading.Thread] = []
        self._stopping = False

    # ---- start -----------------------------------------------------------------------------------------------

    def start(self, host: str, port: int) -> int:
        """Reserve host:port, start the N front ends and wait until every one listens. Returns the port. Raises
        FrontendStartError (a RuntimeError) when the port cannot be reserved or a front end cannot start; what was
        started is stopped first."""
        self._reservation, port = _reserve(host, port)
        remove_own_at_exit()  # large answers' segments a front end died before taking (service/frontends/infer.py)
        self._address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
        try:
            for index in range(self.count):
                self._launch(index)
        except BaseException:
            self.close(0.0)
            raise
        return port

    def _launch(self, index: int) -> _Running:
        """Start the front end `index` and wait until it listens. Raises FrontendStartError."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "service.frontends", "--link-fd", str(theirs.fileno()), "--index", str(index)],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=_environment(),
            )
        except OSError as error:
            ours.close()
            raise FrontendStartError(f"cannot start front end {index}: {error}") from None
        finally:
            theirs.close()
        running = _Running(index, process, Link(ours))
        reader = threading.Thread(target=self._read, args=(running,), name=f"frontend-{index}-link", daemon=True)
        running.reader = reader
        with self._lock:
            stopping = self._stopping
            if not stopping:  # registered, or never: a replacement racing `close` must not outlive the server
                self._running[index] = running
                self._readers.append(reader)
        if stopping:
            running.link.close()
            _kill(running.process)
            raise FrontendStartError(f"front end {index} not started: the server is stopping")
        reader.start()
        try:
            running.link.send(
                FrontendConfig(
                    index,
                    self._address,
                    self._settings.grpc_arguments,
                    self._settings.concurrent_rpcs,
                    self._settings.max_workers,
                    self._settings.reflection,
                    self._settings.tls,
                    self._serving(),
                    os.getpid(),
                )
            )
        except LinkClosed:
            pass  # it died at once: the wait below says so
        if not running.started.wait(START_TIMEOUT_SECONDS) or running.start_error is not None:
            why = running.start_error or f"it did not listen within {START_TIMEOUT_SECONDS:g} s"
            running.link.close()
            _kill(running.process)
            raise FrontendStartError(f"front end {index} could not start: {why}")
        return running

    # ---- the links -------------------------------------------------------------------------------------------

    def _read(self, running: _Running) -> None:
        """A front end's link, until it ends: then its calls end and, unless the server stops, it is replaced."""
        link = running.link
        link.hold()  # the answers of the calls run here from one read go in one write
        while (record := link.receive()) is not None:
            try:
                self._dispatch(running, record)
            except Exception:  # a defect in one record must not end every call of the front end
                _LOG.exception("front end %d: a link record failed", running.index)
            if not link.has_record():
                link.flush()  # before the reader waits for the next read
        if not running.started.is_set():
            running.start_error = running.start_error or "it exited before listening"
            running.started.set()
        for call in running.take_all():
            call.client_gone()  # their CancelTokens fire: leases and reservations go back
        code = _reap(running.process)
        _remove_segments(running.process.pid)  # requests it wrote that this process never took
        with self._lock:
            replace = not self._stopping and self._running.get(running.index) is running and running.start_error is None
        if replace:
            self._replace(running, code)

    def _dispatch(self, running: _Running, record: object) -> None:
        if isinstance(record, InferCall):
            call = ForwardedContext(running.link, record.start, running.forget)
            running.add(call)
            if self._gate.inline(record, running.streams_open):
                run_inline(self._gate, call, self._infer, record)  # on this thread: it takes a slot at once
            else:
                self._hand_off(call, record, None)
        elif isinstance(record, CallStart):
            call = ForwardedContext(running.link, record, running.forget)
            running.add(call, stream=record.request is None)
            if record.method == MODEL_INFER:  # the generic path's: its model is unknown until it is decoded
                self._hand_off(call, None, self._handlers.find(record.method))
            else:
                self._executor.submit(run_call, call, self._handlers.find(record.method))
        elif isinstance(record, (CallMessage, CallHalfClose, CallCancel, ReplyWritten)):
            found = running.find(record.call_id)
            if found is None:
                return  # ended here already
            if isinstance(record, CallMessage):
                found.feed(record.payload)
            elif isinstance(record, CallHalfClose):
                found.half_close()
            elif isinstance(record, CallCancel):
                found.client_gone()
            else:
                found.written()
        elif isinstance(record, Started):
            running.started.set()
        elif isinstance(record, StartFailed):
            running.start_error = record.error
            running.started.set()

    def _hand_off(self, call: ForwardedContext, record: InferCall | None, handler: Any) -> None:
        """Run a ModelInfer on a handler thread (`record` None: a generic-path one, run by `handler`), counted by
        the inline gate until it ends."""
        model = record.model if record is not None else None
        self._gate.handed_off(model)
        try:
            self._executor.submit(run_handed_off, self._gate, call, self._infer, record, handler)
        except BaseException:
            self._gate.released(model)
            raise

    def _replace(self, dead: _Running, code: int | None) -> None:
        """Start a front end at `dead`'s index (on its finished reader's thread) and log it."""
        try:
            new = self._launch(dead.index)
        except FrontendStartError as error:
            with self._lock:
                stopping = self._stopping
            if not stopping:
                _LOG.error("front end %d died and could not be replaced: %s", dead.index, error)
            return
        log_event(
            _LOG,
            "frontend_replaced",
            index=dead.index,
            old_pid=dead.process.pid,
            new_pid=new.process.pid,
            exit_code=code if code is not None and code >= 0 else None,
            signal=signal.Signals(-code).name if code is not None and code < 0 else None,
        )

    # ---- what the server asks --------------------------------------------------------------------------------

    def pids(self) -> list[int]:
        """The live front ends' process ids, in index order."""
        with self._lock:
            running = [self._running[index] for index in sorted(self._running)]
        return [each.process.pid for each in running if each.started.is_set() and each.process.poll() is None]

    def set_serving(self, serving: bool) -> None:
        """Push the health (every front end's Check and Watch) to every front end."""
        self._broadcast(Readiness(serving))

    def stop_listening(self, grace: float) -> None:
        """Shutdown: no front end is replaced any more, each refuses new calls from now on; calls in progress may
        run `grace` seconds more (then gRPC cancels them there, which cancels them here)."""
        with self._lock:
            self._stopping = True
        self._broadcast(StopListening(grace))

    def close(self, seconds: float) -> None:
        """Tell every front end to exit within `seconds`, wait (bounded), kill what is left, join the readers, free
        the port. Idempotent."""
        deadline = time.monotonic() + seconds
        with self._lock:
            self._stopping = True
            running = list(self._running.values())
            self._running = {}
        for each in running:
            # A handler's call has left the call tracker (the shutdown's drain is over) a moment before its end
            # is sent: Exit must follow every CallEnd on the link, or the front end fails an answered call.
            each.wait_answered(max(0.0, deadline - time.monotonic()))
            try:
                # Most of what is left, not all of it less a fixed margin: a short shutdown margin (0.5 s or less)
                # gave the front end 0 s, and its gRPC stop with no grace cut answers already in hand.
                each.link.send(Exit(max(0.0, deadline - time.monotonic()) * EXIT_SHARE))
            except LinkClosed:
                pass
        for each in running:
            try:
                each.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill(each.process)
            each.link.close()
        with self._lock:
            readers, self._readers = self._readers, []
        for reader in readers:
            if reader is not threading.current_thread():
                reader.join(max(0.1, deadline - time.monotonic()))
        if self._reservation is not None:
            self._reservation.close()
            self._reservation = None

    def _broadcast(self, record: Readiness | StopListening) -> None:
        with self._lock:
            running = list(self._running.values())
        for each in running:
            try:
                each.link.send(record)
            except LinkClosed:
                pass  # that one is being replaced; a new one starts with the current health


def _reserve(host: str, port: int) -> tuple[socket.socket, int]:
    """A socket bound to host:port with SO_REUSEPORT, never listening. Raises FrontendStartError."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        reservation = socket.socket(family, kind, proto)
    except OSError as error:
        raise FrontendStartError(f"cannot listen on {host}:{port}: {error}") from None
    try:
        reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        reservation.bind(address)
    except OSError as error:
        reservation.close()
        raise FrontendStartError(f"cannot listen on {host}:{port}: {error}") from None
    return reservation, int(reservation.getsockname()[1])


def _remove_segments(pid: int) -> None:
    """Unlink the shared-memory files a dead front end made (service/frontends/infer.py: large requests)."""
    for path in segments_of(pid):
        try:
            os.unlink(path)
        except OSError:
            pass  # taken meanwhile


def _reap(process: subprocess.Popen[Any]) -> int | None:
    """Wait for a front end whose link ended (killed after REAP_SECONDS); its exit status."""
    try:
        return process.wait(REAP_SECONDS)
    except subprocess.TimeoutExpired:
        _kill(process)
        return process.returncode


def _kill(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.kill()
        try:
            process.wait(REAP_SECONDS)
        except subprocess.TimeoutExpired:
            _LOG.error("front end (pid %d) did not die after SIGKILL", process.pid)


def _environment() -> dict[str, str]:
    """This process's environment, with the folder `service` is imported from first on PYTHONPATH, so that
    `python -m service.frontends` runs this very code whatever the working folder."""
    import service

    root = os.path.dirname(os.path.dirname(os.path.abspath(service.__file__)))
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, (root, environment.get("PYTHONPATH"))))
    return environment


def tls_material(cert: Any, key: Any, client_ca: Any) -> TlsMaterial | None:
    """The TLS files' bytes (already checked by service/transport/tls.py), or None for plaintext."""
    if cert is None or key is None:
        return None
    from pathlib import Path

    return TlsMaterial(
        Path(key).read_bytes(), Path(cert).read_bytes(), None if client_ca is None else Path(client_ca).read_bytes()
    )
