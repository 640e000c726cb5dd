"""One front-end process (`python -m service.frontends --link-fd FD --index I`), started by the admission process's
supervisor (service/frontends/supervisor.py) with one end of a Unix socket pair.

It reads its `FrontendConfig` from the link, binds the shared port with SO_REUSEPORT (TLS as configured) and serves
every method of `inference.GRPCInferenceService` and `slotserve.management.v1.ModelManagement` by forwarding it
as bytes over the link (service/frontends/forwarded.py runs it in the admission process). Health (grpc.health.v1,
Check and Watch) is answered here from the readiness the admission process pushes (`Readiness`), NOT_SERVING
whenever the link is down; reflection is answered here too (it is static).

Threads: gRPC's handler threads (one per call: each waits for its call's answer, which the link's reader hands it);
a stream call's pump (reads the client's messages and sends them while it has credit; owned by the call's handler,
joined when it ends); the parent watch. The main thread reads the link.

Ending: on `Exit` (the admission process's shutdown, after `StopListening`) the server stops within the given
time; on the link's end (the admission process died or closed it) or a parent that changed, every call in
progress fails UNAVAILABLE and the process exits at once. SIGINT is ignored (a terminal's Ctrl-C reaches the whole
process group; the admission process decides how the server stops); SIGTERM and SIGKILL end it, and the
supervisor starts another.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from generated import grpc_service_pb2, management_pb2

from ..process.handler_threads import HandlerThreads
from .forwarded import CODES, WAIT_SLICE_SECONDS
from .infer import MODEL_INFER, answer_bytes, infer_call
from .link import Link, LinkClosed
from .messages import (
    CallCancel,
    CallEnd,
    CallHalfClose,
    CallMessage,
    CallStart,
    Credit,
    Exit,
    FrontendConfig,
    InferCall,
    Readiness,
    Reply,
    ReplyWritten,
    Started,
    StartFailed,
    StopListening,
)

_LOG = logging.getLogger("slotserve.frontend")

STREAM_WINDOW = 8  # a client stream's messages sent ahead of what the admission process took
PUMP_JOIN_SECONDS = 5.0
PARENT_CHECK_SECONDS = 1.0
SERVICES = (
    grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"],
    management_pb2.DESCRIPTOR.services_by_name["ModelManagement"],
)
LINK_DOWN = "the server's admission process is not reachable from this front end"


class _Ended:
    """Posted to a call's queue when its RPC ended here, or the link went down."""

    def __init__(self, link_down: bool) -> None:
        self.link_down = link_down


class _Call:
    """One call in flight through this front end: the answers the link's reader posts, and the stream's credit."""

    def __init__(self, call_id: int, context: grpc.ServicerContext) -> None:
        self.call_id = call_id
        self.context = context
        self.answers: queue.SimpleQueue[Reply | CallEnd | _Ended] = queue.SimpleQueue()
        self.credit = threading.Semaphore(STREAM_WINDOW)
        self.status_received = threading.Event()  # the admission process ended the call: nothing to cancel there
        self.over = threading.Event()  # the handler here is done with it (the pump stops)

    def next_answer(self) -> Reply | CallEnd | _Ended:
        """The next answer; waits in slices (the RPC's end, or the link's, posts `_Ended`)."""
        while True:
            try:
                return self.answers.get(timeout=WAIT_SLICE_SECONDS)
            except queue.Empty:
                continue


class Frontend:
    def __init__(self, link: Link, config: FrontendConfig) -> None:
        self._link = link
        self._config = config
        self._calls: dict[int, _Call] = {}
        # Guards _calls and _exiting (dictionary work only); notified by a call's close only while exiting, when
        # run() waits for the calls whose end came to finish their write.
        self._calls_lock = threading.Condition(threading.Lock())
        self._exiting = False
        self._numbers = itertools.count(1)
        self._health = health.HealthServicer()
        self._executor = HandlerThreads(keep=config.max_workers, runners=0, name="frontend-handler")
        self._server: grpc.Server | None = None
        self._set_health(config.serving)

    # ---- serving ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the shared port and serve. Raises RuntimeError when it cannot be bound."""
        config = self._config
        server = grpc.server(
            self._executor,  # type: ignore[arg-type]  # grpcio only calls submit
            options=[*config.grpc_arguments, ("grpc.so_reuseport", 1)],
            maximum_concurrent_rpcs=config.concurrent_rpcs,
        )
        for service in SERVICES:
            handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}"
                if method.client_streaming and method.server_streaming:
                    handlers[method.name] = grpc.stream_stream_rpc_method_handler(self._stream_handler(path))
                elif not method.client_streaming and not method.server_streaming:
                    handlers[method.name] = grpc.unary_unary_rpc_method_handler(self._unary_handler(path))
                else:  # no such method in either service: a new one needs its forwarding written
                    raise RuntimeError(f"{path}: a one-sided stream is not forwarded")
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        if config.reflection:
            names = [service.full_name for service in SERVICES]
            reflection.enable_server_reflection((*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        if config.tls is None:
            port = server.add_insecure_port(config.address)
        else:
            credentials = grpc.ssl_server_credentials(
                [(config.tls.private_key, config.tls.certificate)],
                root_certificates=config.tls.client_ca,
                require_client_auth=config.tls.client_ca is not None,
            )
            port = server.add_secure_port(config.address, credentials)
        if not port:
            raise RuntimeError(f"cannot listen on {config.address}")
        server.start()
        self._server = server

    def run(self) -> int:
        """Read the link until Exit or its end; then stop. Returns the exit status."""
        watch = threading.Thread(target=self._watch_parent, name="frontend-parent-watch", daemon=True)
        watch.start()
        ending: Exit | None = None  # None: the link ended (the admission process is gone)
        while ending is None:
            record = self._link.receive()
            if record is None:
                break
            if isinstance(record, Exit):
                ending = record
            else:
                self._dispatch(record)
        self._set_health(False)
        deadline = time.monotonic() + (0.0 if ending is None else ending.seconds)
        # A call whose end came just before the Exit may not have been written to its client yet: its handler
        # returns (and gRPC sends) in a moment. Ending it now, or stopping gRPC with no grace, failed an answered
        # call with UNAVAILABLE (tests/frontends/test_frontend_shutdown.py, 1 run in 10).
        self._wait_answered_closed(deadline)
        self._end_calls(link_down=True)  # only calls the admission process abandoned are left
        if self._server is not None:
            grace = max(0.0, deadline - time.monotonic())
            self._server.stop(grace).wait(grace + 1.0)
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._link.close()
        return 0

    def _dispatch(self, record: object) -> None:
        if isinstance(record, (Reply, CallEnd, Credit)):
            call = self._find(record.call_id)
            if call is None:
                return  # the call ended here already
            if isinstance(record, Credit):
                for _ in range(record.count):
                    call.credit.release()
                return
            if isinstance(record, CallEnd):
                call.status_received.set()
                if record.cancel:
                    call.context.cancel()  # at once, even while its handler thread is blocked writing
            call.answers.put(record)
        elif isinstance(record, Readiness):
            self._set_health(record.serving)
        elif isinstance(record, StopListening):
            if self._server is not None:
                self._server.stop(record.grace)  # new calls refused now; the rest end within the grace
        else:
            _LOG.warning("front end %d: unexpected link record %r", self._config.index, type(record).__name__)

    def _watch_parent(self) -> None:
        """Exit with the admission process even if the link's end never comes (a process that inherited it)."""
        while not self._link.closed:
            if os.getppid() != self._config.parent_pid:
                _LOG.warning("front end %d: the admission process is gone; exiting", self._config.index)
                self._link.close()
                return
            threading.Event().wait(PARENT_CHECK_SECONDS)

    def _set_health(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", *(service.full_name for service in SERVICES)):
            self._health.set(service, status)

    # ---- calls -----------------------------------------------------------------------------------------------

    def _open(self, context: grpc.ServicerContext) -> _Call:
        call = _Call(next(self._numbers), context)
        with self._calls_lock:
            self._calls[call.call_id] = call
        return call

    def _find(self, call_id: int) -> _Call | None:
        with self._calls_lock:
            return self._calls.get(call_id)

    def _close(self, call: _Call) -> None:
        """The handler is done with `call`: forget it; if its status never came, the admission process cancels it."""
        call.over.set()
        call.credit.release()  # a pump waiting for credit sees `over`
        with self._calls_lock:
            self._calls.pop(call.call_id, None)
            if self._exiting:
                self._calls_lock.notify_all()
        if not call.status_received.is_set():
            self._send(CallCancel(call.call_id))

    def _wait_answered_closed(self, deadline: float) -> None:
        """Block until every call whose end the admission process sent has been closed by its handler (its answer
        handed to gRPC), at most until `deadline` (monotonic)."""
        with self._calls_lock:
            self._exiting = True
            self._calls_lock.wait_for(
                lambda: not any(call.status_received.is_set() for call in self._calls.values()),
                max(0.0, deadline - time.monotonic()),
            )

    def _end_calls(self, *, link_down: bool) -> None:
        with self._calls_lock:
            calls = list(self._calls.values())
        for call in calls:
            call.answers.put(_Ended(link_down))

    def _send(self, record: CallStart | InferCall | CallMessage | CallHalfClose | CallCancel | ReplyWritten) -> bool:
        try:
            self._link.send(record)
        except LinkClosed:
            return False
        return True

    def _begin(self, path: str, context: grpc.ServicerContext, request: bytes | None) -> _Call:
        """Open a call and forward its start (a ModelInfer decoded here when infer.py covers it); the RPC's end
        (any cause) posts `_Ended` to its queue."""
        call = self._open(context)
        if not context.add_callback(lambda: call.answers.put(_Ended(link_down=False))):
            call.answers.put(_Ended(link_down=False))
        remaining = context.time_remaining()
        start = CallStart(
            call.call_id,
            path,
            tuple((key, value) for key, value in context.invocation_metadata() or ()),
            remaining if remaining is not None and remaining < NO_DEADLINE_BEYOND else None,
            context.peer(),
            request,
        )
        try:
            decoded = (
                infer_call(dataclasses.replace(start, request=None), request)
                if path == MODEL_INFER and request is not None
                else None
            )
            sent = self._send(decoded if decoded is not None else start)
        except BaseException:  # (a record over the frame limit): the call must not stay in the table
            self._close(call)
            raise
        if not sent:
            call.answers.put(_Ended(link_down=True))
        return call

    def _unary_handler(self, path: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            call = self._begin(path, context, request)
            try:
                answer = call.next_answer()
            finally:
                self._close(call)
            return _finish(context, answer) or b""

        return handle

    def _stream_handler(self, path: str) -> Callable[[Iterator[bytes], grpc.ServicerContext], Iterator[bytes]]:
        def handle(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            call = self._begin(path, context, None)
            pump = threading.Thread(target=self._pump, args=(call, requests), name="frontend-stream-pump", daemon=True)
            pump.start()
            try:
                while True:
                    answer = call.next_answer()
                    if not isinstance(answer, Reply):
                        _finish(context, answer)
                        return
                    yield answer.payload
                    self._send(ReplyWritten(call.call_id))
            finally:
                self._close(call)
                pump.join(PUMP_JOIN_SECONDS)

        return handle

    def _pump(self, call: _Call, requests: Iterator[bytes]) -> None:
        """Send the client's messages while the call lasts, at most STREAM_WINDOW ahead of what the admission
        process took; then the half-close."""
        try:
            for message in requests:
                while not call.credit.acquire(timeout=WAIT_SLICE_SECONDS):
                    if call.over.is_set():
                        return
                if call.over.is_set() or not self._send(CallMessage(call.call_id, message)):
                    return
            self._send(CallHalfClose(call.call_id))
        except grpc.RpcError:
            return  # the RPC ended (cancelled, deadline): the handler tells the admission process
        except Exception:  # a defect must not pass silently: the call is cancelled there too
            _LOG.exception("front end: a stream's reading failed")
            call.answers.put(_Ended(link_down=False))


# A call without a deadline reports the time left until gRPC's "infinite future" (service/transport/servicers/common.py)
NO_DEADLINE_BEYOND = 365 * 24 * 3600.0


def _finish(context: grpc.ServicerContext, answer: CallEnd | _Ended | Reply) -> bytes | None:
    """End the RPC with the admission process's status (returns a unary call's response), or with UNAVAILABLE when
    the link went down; after the RPC's own end, nothing."""
    if isinstance(answer, _Ended):
        if answer.link_down:
            context.abort(grpc.StatusCode.UNAVAILABLE, LINK_DOWN)
        return None
    if isinstance(answer, Reply):  # a unary call answers in its CallEnd; a stray reply is a defect
        context.abort(grpc.StatusCode.INTERNAL, "a unary call got a stream reply")
    if answer.trailing_metadata:
        context.set_trailing_metadata(answer.trailing_metadata)
    code = CODES.get(answer.code, grpc.StatusCode.UNKNOWN)
    if code is not grpc.StatusCode.OK:
        context.abort(code, answer.details)
    return answer_bytes(answer.answer) if answer.answer is not None else answer.reply


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.frontends", description=__doc__)
    parser.add_argument("--link-fd", type=int, required=True)
    parser.add_argument("--index", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s %(levelname)s front end {args.index}: %(message)s")
    link = Link.from_fd(args.link_fd)
    config = link.receive()
    if not isinstance(config, FrontendConfig):
        return 2  # the admission process went before configuring this one
    frontend = Frontend(link, config)
    try:
        frontend.start()
    except RuntimeError as error:
        try:
            link.send(StartFailed(config.index, str(error)))
        except LinkClosed:
            pass
        return 1
    try:
        link.send(Started(config.index, os.getpid()))
    except LinkClosed:
        return 1
    status = frontend.run()
    logging.shutdown()
    os._exit(status)  # handler threads of calls cut short by the link's end must not hold the exit
