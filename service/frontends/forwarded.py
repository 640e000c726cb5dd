"""The admission process's side of a forwarded call: the servicers' own handlers, run behind a `ForwardedContext`.

A front end forwards each call as bytes (service/frontends/messages.py). Here it is deserialized with the
servicer's own request deserializer, run by the very method a direct gRPC call runs (the `rpc` wrapper's access
check, handler budget and CancelToken included: service/transport/servicers/common.py), and its answer serialized
with the servicer's response serializer and sent back. `HandlerTable` stands in for grpc.Server when the servicers
register, so nothing in them knows whether a call came directly or through a front end.

`ForwardedContext` is what the servicers use of grpc.ServicerContext: invocation_metadata, peer, time_remaining
(from the time the client had left when the front end forwarded the call), is_active, add_callback (run when the
call ends for any reason, as gRPC runs them), cancel (the RPC is cancelled in the front end, even while its thread
writes), abort / abort_with_status (the status and its trailing metadata, rich error details included, go back
as they are), set_code / set_details / set_trailing_metadata. A client stream's messages come as the front end
sends them, each taken one returning a credit (backpressure crosses the link); a response stream's next message
is made only once the front end wrote the previous one (so the stream write timeout still covers the client).

Locking: `ForwardedContext._lock` is a leaf (its state and the stream's inbox); callbacks run and records are sent
with it released. Every wait is bounded by a slice (WAIT_SLICE_SECONDS) and ends when the call does.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, NoReturn, Protocol, cast

import grpc

from .link import Link, LinkClosed
from .messages import CallEnd, CallStart, Credit, InferAnswer, InferCall, Metadata, Reply

_LOG = logging.getLogger(__name__)

WAIT_SLICE_SECONDS = 1.0  # a wait re-checks the call's state at least this often
CODES = {code.value[0]: code for code in grpc.StatusCode}


class CallAborted(Exception):
    """Raised by ForwardedContext.abort, as gRPC's abort raises: the status is the context's."""


class StreamCancelled(grpc.RpcError):
    """A client stream read after its call ended (as gRPC's request iterator raises)."""


class _CallDetails(NamedTuple):
    """grpc.HandlerCallDetails for a generic handler's lookup."""

    method: str
    invocation_metadata: Metadata


class HandlerTable:
    """The servicers' method handlers by full method name (`/package.Service/Method`): what they register on a
    grpc.Server (the generated `add_*_to_server` calls and service/transport/servicers/inference.py's own) is kept
    here instead."""

    def __init__(self) -> None:
        self._registered: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        self._generic: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        for name, handler in handlers.items():
            self._registered[f"/{service}/{name}"] = handler

    def find(self, method: str) -> grpc.RpcMethodHandler[Any, Any] | None:
        """The handler of `method`, or None for a method no servicer has."""
        handler = self._registered.get(method)
        if handler is not None:
            return handler
        for generic in self._generic:
            found = generic.service(_CallDetails(method, ()))  # type: ignore[arg-type]  # duck-typed details
            if found is not None:
                return found
        return None


class ForwardedContext:
    """One forwarded call in the admission process: the servicer's grpc.ServicerContext, and the call's plumbing
    (its client stream's inbox, its replies' acknowledgements). Made by the link's reader, run on a handler thread
    (`run_call`)."""

    def __init__(self, link: Link, start: CallStart, on_end: Callable[[int], None]) -> None:
        self.call_id = start.call_id
        self.method = start.method
        self._link = link
        self._metadata = start.metadata
        self._peer = start.peer
        self.pending_request = start.request  # a unary call's request; None for a client stream
        self._deadline = None if start.time_remaining is None else time.monotonic() + start.time_remaining
        self._on_end = on_end  # the link's call table forgets the call
        # guards: every field below; a leaf (a plain lock: never taken twice by one thread, cheaper than an RLock)
        self._lock = threading.Condition(threading.Lock())
        self._ended = False
        self._callbacks: list[Callable[[], None]] = []
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._trailing: Metadata = ()
        self._inbox: collections.deque[bytes] = collections.deque()
        self._half_closed = False
        self._replies_sent = 0
        self._replies_written = 0

    # ---- grpc.ServicerContext, as the servicers use it -----------------------------------------------------

    def invocation_metadata(self) -> Metadata:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def is_active(self) -> bool:
        with self._lock:
            return not self._ended

    def add_callback(self, callback: Callable[[], None]) -> bool:
        """Run `callback` when the call ends; False (not kept) when it has ended already, as gRPC answers."""
        with self._lock:
            if self._ended:
                return False
            self._callbacks.append(callback)
            return True

    def cancel(self) -> None:
        """Cancel the RPC: the client gets CANCELLED, the front end cancels it at once."""
        self._end(grpc.StatusCode.CANCELLED, "Cancelled", (), cancel=True)

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        with self._lock:
            self._code, self._details = code, details
        raise CallAborted(details)

    def abort_with_status(self, status: grpc.Status) -> NoReturn:
        self.set_trailing_metadata(status.trailing_metadata)
        self.abort(status.code, status.details)

    def set_code(self, code: grpc.StatusCode) -> None:
        with self._lock:
            self._code = code

    def set_details(self, details: str) -> None:
        with self._lock:
            self._details = details

    def set_trailing_metadata(self, trailing_metadata: Metadata) -> None:
        with self._lock:
            self._trailing = tuple((key, value) for key, value in trailing_metadata)

    def trailing_metadata(self) -> Metadata:
        with self._lock:
            return self._trailing

    def code(self) -> grpc.StatusCode | None:
        with self._lock:
            return self._code

    def details(self) -> str:
        with self._lock:
            return self._details

    def send_initial_metadata(self, initial_metadata: Metadata) -> None:
        """Not forwarded: no servicer sends initial metadata."""

    def set_compression(self, compression: grpc.Compression) -> None:
        """The front end's gRPC server compresses as configured; a per-call choice is not forwarded."""

    def disable_next_message_compression(self) -> None:
        """See set_compression."""

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    # ---- the call's plumbing ---------------------------------------------------------------------------------

    def client_gone(self) -> None:
        """The RPC ended in the front end (CallCancel), or the front end died: the callbacks run (the call's
        CancelToken fires) and nothing more is sent."""
        self._end(grpc.StatusCode.CANCELLED, "Cancelled", (), send=False)

    def feed(self, payload: bytes) -> None:
        """A client stream's next message (the link's reader)."""
        with self._lock:
            self._inbox.append(payload)
            self._lock.notify_all()

    def half_close(self) -> None:
        with self._lock:
            self._half_closed = True
            self._lock.notify_all()

    def written(self) -> None:
        """The front end wrote a reply of the stream (ReplyWritten)."""
        with self._lock:
            self._replies_written += 1
            self._lock.notify_all()

    def requests(self) -> Iterator[bytes]:
        """The client stream's messages as they come; ends when the client half-closes, raises StreamCancelled when
        the call has ended. Each message taken gives the front end a credit for one more."""
        while True:
            with self._lock:
                while not self._inbox and not self._half_closed and not self._ended:
                    self._lock.wait(WAIT_SLICE_SECONDS)
                if self._ended:
                    raise StreamCancelled()
                if not self._inbox:
                    return
                payload = self._inbox.popleft()
            self._send(Credit(self.call_id, 1))
            yield payload

    def reply(self, payload: bytes) -> bool:
        """Send one message of a response stream, then wait until the front end wrote it or the call ended (the
        handler's own write timeout cancels the call: then this returns). Returns whether the call goes on."""
        if not self._send(Reply(self.call_id, payload)):
            return False
        with self._lock:
            self._replies_sent += 1
            while self._replies_written < self._replies_sent and not self._ended:
                self._lock.wait(WAIT_SLICE_SECONDS)
            return not self._ended

    def finish(self, reply: bytes | None = None, answer: InferAnswer | None = None) -> None:
        """The handler returned: send its status (OK unless it set one) with the unary `reply` (or a forwarded
        ModelInfer's `answer`), then run the callbacks."""
        with self._lock:
            code = self._code if self._code is not None else grpc.StatusCode.OK
            details, trailing = self._details, self._trailing
        self._end(code, details, trailing, reply=reply, answer=answer)

    def fail(self, code: grpc.StatusCode, details: str) -> None:
        self._end(code, details, ())

    def _end(
        self,
        code: grpc.StatusCode,
        details: str,
        trailing: Metadata,
        *,
        reply: bytes | None = None,
        answer: InferAnswer | None = None,
        cancel: bool = False,
        send: bool = True,
    ) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
            callbacks, self._callbacks = self._callbacks, []
            self._lock.notify_all()
        if send:
            self._send(CallEnd(self.call_id, code.value[0], details, trailing, cancel, reply, answer))
        self._on_end(self.call_id)
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a callback's defect must not keep the others from running
                _LOG.exception("a forwarded call's callback failed")

    def _send(self, record: Credit | Reply | CallEnd) -> bool:
        try:
            self._link.send(record)
        except LinkClosed:
            self.client_gone()  # the front end is gone: its calls end (the supervisor replaces it)
            return False
        return True


def run_call(context: ForwardedContext, handler: grpc.RpcMethodHandler[Any, Any] | None) -> None:
    """Run one forwarded call to its end on this (handler) thread: deserialize, call the servicer's method,
    serialize, send. Never raises: every outcome becomes the call's status, as gRPC's server makes it."""
    if handler is None:
        context.fail(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        return
    try:
        request = _request(context, handler)
    except Exception:
        _LOG.exception("cannot deserialize a forwarded request of %s", context.method)
        context.fail(grpc.StatusCode.INTERNAL, "Exception deserializing request!")
        return
    # grpc's stubs type the context as grpc.ServicerContext; a ForwardedContext is one by duck typing.
    behavior = cast(
        Callable[[Any, ForwardedContext], Any],
        (handler.stream_stream if handler.request_streaming else handler.unary_stream)
        if handler.response_streaming
        else (handler.stream_unary if handler.request_streaming else handler.unary_unary),
    )
    try:
        if handler.response_streaming:
            _stream_replies(context, behavior(request, context), handler.response_serializer)
            context.finish()
        else:
            response = behavior(request, context)
            serialize = handler.response_serializer
            context.finish(serialize(response) if serialize is not None else response)
    except CallAborted:
        context.finish()
    except Exception as error:
        _LOG.exception("a forwarded call of %s failed", context.method)
        context.fail(grpc.StatusCode.UNKNOWN, f"Exception calling application: {error}")


class InferRunner(Protocol):
    """service/frontends/infer.py's ForwardedInfer, as run_infer and InlineGate call it."""

    def admits_now(self, call: InferCall) -> bool: ...

    def take(self, call: InferCall) -> Any: ...

    def ModelInfer(self, taken: Any, context: Any) -> InferAnswer: ...


def run_infer(context: ForwardedContext, runner: InferRunner, call: InferCall) -> None:
    """Run a ModelInfer the front end decoded (service/frontends/infer.py) to its end on this thread. Never
    raises. Its shared memory, if any, is taken first, whatever becomes of the call (no file is left behind)."""
    try:
        taken = runner.take(call)
    except OSError as error:
        _LOG.error("a forwarded ModelInfer's shared memory is gone: %s", error)
        context.fail(grpc.StatusCode.INTERNAL, "the request's tensors were lost between processes; see the log")
        return
    try:
        context.finish(answer=runner.ModelInfer(taken, context))
    except CallAborted:
        context.finish()
    except Exception as error:
        _LOG.exception("a forwarded ModelInfer failed")
        context.fail(grpc.StatusCode.UNKNOWN, f"Exception calling application: {error}")


INLINE_BUDGET_SECONDS = 0.25  # an inline ModelInfer that took longer (wall time) hands its model off...
SLOW_RETRY_SECONDS = 1.0  # ...for this long, then tries inline again


class InlineGate:
    """Which forwarded ModelInfers a link's reader runs itself (inline: no hand-off to a handler thread and back,
    about 40 us of CPU a call saved) and which it hands off.

    A call runs inline only when it would not wait, and never before a call that reached this process first:
    * its model admits it at once (`InferRunner.admits_now`: READY, idle, no batching, no sequence);
    * no ModelInfer of that model was handed off and is still running (a handed-off call may not have reached
      the model's queue yet: an inline run must not overtake it; FIFO per model is the order calls reach this
      process's admission), and no generic-path ModelInfer is (its model is not known before it is decoded);
    * its link has no stream call open (a stream's handler may wait for that reader's ReplyWritten while it
      holds a slot: the reader must never wait behind it);
    * the model is quick: an inline call that took INLINE_BUDGET_SECONDS or more hands its model's calls off for
      SLOW_RETRY_SECONDS (a slow model must not hold up the reader, hence the other calls of its front end and
      their cancellations, more than once in that time).
    A peek can be stale (another reader's call took the slot meanwhile): the inline call then queues as any call
    does, its wait bounded by a quick model's run. Thread-safe: `_lock` is a leaf, held for counting only.
    """

    def __init__(self, runner: InferRunner) -> None:
        self._runner = runner
        self._lock = threading.Lock()  # guards: the three fields below; a leaf
        self._handed_off: collections.Counter[str] = collections.Counter()  # model -> handed-off calls running
        self._generic = 0  # generic-path ModelInfers handed off and running
        self._slow: dict[str, float] = {}  # model -> until when its calls are handed off (an inline run was slow)

    def inline(self, call: InferCall, streams_open: int) -> bool:
        """Whether the reader runs `call` now (see the class docstring). When false, the caller hands it off and
        must call `handed_off` first."""
        if streams_open:
            return False
        with self._lock:
            if self._generic or self._handed_off.get(call.model):
                return False
            if call.model in self._slow:
                if time.monotonic() < self._slow[call.model]:
                    return False
                del self._slow[call.model]  # try it inline again: a run that is quick now clears it
        return self._runner.admits_now(call)

    def handed_off(self, model: str | None) -> None:
        """A ModelInfer of `model` (None: a generic-path one) is handed to a handler thread: until `ended`, no
        inline run of that model (of any model, for None)."""
        with self._lock:
            if model is None:
                self._generic += 1
            else:
                self._handed_off[model] += 1

    def ran_inline(self, model: str, seconds: float) -> None:
        """An inline call of `model` took `seconds` (wall time on the reader: it had the slot at once, so this is
        about its run): over the budget, the model's calls are handed off for SLOW_RETRY_SECONDS."""
        if seconds >= INLINE_BUDGET_SECONDS:
            with self._lock:
                self._slow[model] = time.monotonic() + SLOW_RETRY_SECONDS

    def released(self, model: str | None) -> None:
        """A call counted by `handed_off` ended."""
        with self._lock:
            if model is None:
                self._generic -= 1
            else:
                self._handed_off[model] -= 1
                if not self._handed_off[model]:
                    del self._handed_off[model]


def run_inline(gate: InlineGate, context: ForwardedContext, runner: InferRunner, call: InferCall) -> None:
    """A forwarded ModelInfer run on the link's reader (run_infer), its time told to `gate`."""
    started = time.monotonic()
    run_infer(context, runner, call)
    gate.ran_inline(call.model, time.monotonic() - started)


def run_handed_off(
    gate: InlineGate, context: ForwardedContext, runner: InferRunner, call: InferCall | None, handler: Any = None
) -> None:
    """A ModelInfer on a handler thread (run_infer, or run_call for a generic-path one: `call` None), its end
    told to `gate` (counted by `handed_off` before it was submitted)."""
    try:
        if call is not None:
            run_infer(context, runner, call)
        else:
            run_call(context, handler)
    finally:
        gate.released(call.model if call is not None else None)


def _request(context: ForwardedContext, handler: grpc.RpcMethodHandler[Any, Any]) -> Any:
    deserialize = handler.request_deserializer
    if handler.request_streaming:
        return (deserialize(payload) if deserialize is not None else payload for payload in context.requests())
    payload = context.pending_request or b""
    return deserialize(payload) if deserialize is not None else payload


def _stream_replies(
    context: ForwardedContext, responses: Iterator[Any], serialize: Callable[[Any], bytes] | None
) -> None:
    """Send a response stream, one message at a time; a call that ended closes the handler's generator (as gRPC
    does: its `finally` clauses run on this thread)."""
    try:
        for response in responses:
            if not context.reply(serialize(response) if serialize is not None else response):
                return
    finally:
        close = getattr(responses, "close", None)
        if close is not None:
            close()
