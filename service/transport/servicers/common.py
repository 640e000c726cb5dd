"""What the servicers share: access checks, error handling, cancellation tokens, deadlines and the handler
budget."""

from __future__ import annotations

import enum
import functools
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar, overload

import grpc

from engine.interface import CancelToken

from ...core.errors import SHUTDOWN_CANCEL_REASON, ManagementDisabled, ServerBusy, ServiceError
from ...core.outcomes import seen_by_client
from .. import status_codes
from ..auth import Access, Authenticator

# The reason the server's shutdown cancels every call's token with (CallTracker.cancel_all).
SHUTDOWN = SHUTDOWN_CANCEL_REASON


class CallKind(enum.Enum):
    """Which handler budget a call counts against (see CallTracker)."""

    INFERENCE = "inference"  # bounded: --max-workers minus the control threads
    MANAGEMENT = "management"  # bounded: half the control threads (these calls may wait without limit)
    CONTROL = "control"  # health, readiness, status, metadata: never wait, not bounded


class Servicer(Protocol):
    """What `rpc` reads of the servicer whose method it wraps: its access gate and its call tracker."""

    access: AccessGate
    calls: CallTracker


S = TypeVar("S", bound=Servicer)
Request = TypeVar("Request")
Response = TypeVar("Response")
# An RPC's body, as written: it gets the call's CancelToken as `token`; and the handler gRPC calls.
Body = Callable[[S, Request, grpc.ServicerContext, CancelToken], Response]
Handler = Callable[[S, Request, grpc.ServicerContext], Response]


@overload
def rpc(method: Body[S, Request, Response], /) -> Handler[S, Request, Response]: ...


@overload
def rpc(
    *, inference: bool = False, access: Access = Access.READ
) -> Callable[[Body[S, Request, Response]], Handler[S, Request, Response]]: ...


def rpc(
    method: Body[S, Request, Response] | None = None, /, *, inference: bool = False, access: Access = Access.READ
) -> Handler[S, Request, Response] | Callable[[Body[S, Request, Response]], Handler[S, Request, Response]]:
    """Run a unary handler as a tracked call (see CallTracker): it gets `token`, its CancelToken, and any
    exception becomes the status the table gives it. `inference=True` counts it against the inference
    handler limit; an `Access.MANAGE` call counts against the management limit.

    `access` says who may call it (service.transport.auth): READ by default, so a new RPC is guarded unless it is
    declared OPEN; MANAGE also needs management enabled (permission, then the management token). The check comes
    before the call is tracked, so refused callers never occupy an inference handler slot. The servicer
    holds the gate (AccessGate) as `access` and the tracker as `calls` (the `Servicer` protocol).
    """
    kind = CallKind.INFERENCE if inference else CallKind.MANAGEMENT if access is Access.MANAGE else CallKind.CONTROL

    def wrap(method: Body[S, Request, Response]) -> Handler[S, Request, Response]:
        @functools.wraps(method)
        def handler(self: S, request: Request, context: grpc.ServicerContext) -> Response:
            try:
                self.access.require(access, method.__name__, context)
                token = self.calls.begin(context, kind)
            except ServiceError as error:  # refused (unauthenticated, disabled) or busy
                status_codes.abort(context, error)
            try:
                return method(self, request, context, token)
            except Exception as error:  # every error reaches the client through the one table
                status_codes.abort(context, seen_by_client(error, token))
            finally:
                self.calls.end(token, kind)

        return handler

    return wrap(method) if method is not None else wrap


class CallTracker:
    """Every RPC in progress: its cancel token and whether its handler still runs.

    * `begin` makes the call's CancelToken (fired when the RPC ends for any reason: client cancel, deadline,
      disconnect, completion), and bounds the calls that can hold a handler thread for long, because the sync
      server pins a thread per call: inference calls (waiting for a slot, running, streaming) to
      `inference_limit`, and management calls (waiting for a model's earlier work; a bulk unload waits without
      limit) to `management_limit`, so that --max-workers threads cover them. Health, readiness and status are
      not bounded: every call gets a thread at once (service/process/handler_threads.py, up to --max-concurrent-rpcs),
      so a Kubernetes probe is answered however busy the server is, calls still waiting for their request
      message included. A call beyond its limit is refused at once.
    * At shutdown, `cancel_all` fires every token and `wait_idle` waits, bounded, for handlers to return.
    """

    def __init__(self, inference_limit: int, management_limit: int = 4) -> None:
        self.inference_limit = inference_limit
        self.management_limit = management_limit
        self._cond = threading.Condition(threading.Lock())  # guards: _tokens, _active, _cancelled_reason, _refused
        self._tokens: set[CancelToken] = set()
        self._active = {CallKind.INFERENCE: 0, CallKind.MANAGEMENT: 0}  # bounded kinds in progress
        self._cancelled_reason: str | None = None  # set by cancel_all: later calls are cancelled as they begin
        self._refused = 0  # calls refused for a full budget (server_busy), counted for the metrics

    def _limit(self, kind: CallKind) -> int:
        return self.inference_limit if kind is CallKind.INFERENCE else self.management_limit

    def begin(self, context: grpc.ServicerContext, kind: CallKind = CallKind.CONTROL) -> CancelToken:
        """Register a call; raises ServerBusy at once when every handler thread of its kind is taken.

        The token is cancelled at once when the RPC has already ended (gRPC then refuses the callback) or when
        `cancel_all` ran before this call began: a handler must never hold a token nobody will cancel."""
        token = CancelToken()
        with self._cond:
            if kind in self._active:
                limit = self._limit(kind)
                if self._active[kind] >= limit:
                    self._refused += 1
                    raise ServerBusy(f"server_busy: all {limit} {kind.value} handler threads are in use")
                self._active[kind] += 1
            self._tokens.add(token)
            cancelled_reason = self._cancelled_reason
        if cancelled_reason is not None:
            token.cancel(cancelled_reason)
        # Fires when the RPC ends, whatever ended it; False when it has ended already.
        if not context.add_callback(token.cancel):
            token.cancel()
        return token

    def end(self, token: CancelToken, kind: CallKind = CallKind.CONTROL) -> None:
        """The handler returned (whatever the RPC's fate)."""
        with self._cond:
            self._tokens.discard(token)
            if kind in self._active:
                self._active[kind] -= 1
            if not self._tokens:
                self._cond.notify_all()

    @property
    def refused(self) -> int:
        """Calls refused since the start because every handler thread of their kind was in use."""
        with self._cond:
            return self._refused

    @property
    def active(self) -> int:
        with self._cond:
            return len(self._tokens)

    @property
    def inference_active(self) -> int:
        with self._cond:
            return self._active[CallKind.INFERENCE]

    @property
    def management_active(self) -> int:
        with self._cond:
            return self._active[CallKind.MANAGEMENT]

    def cancel_all(self, reason: str) -> None:
        """Cancel every call in progress, and every call that begins from now on, with `reason`."""
        with self._cond:
            self._cancelled_reason = reason
            tokens = list(self._tokens)
        for token in tokens:
            token.cancel(reason)

    def wait_idle(self, timeout: float) -> bool:
        """Block until no handler runs, at most `timeout` seconds. Returns whether it got there."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._tokens, timeout)


# A call without a deadline reports the time left until gRPC's "infinite future" (about 9e18 s), which no wait
# accepts (threading.TIMEOUT_MAX is about 9e9 s: acquiring a lock with it raises OverflowError). A deadline this
# far away is no deadline.
NO_DEADLINE_BEYOND = 365 * 24 * 3600.0


def client_deadline(context: grpc.ServicerContext) -> float | None:
    """The client's deadline on the monotonic clock, or None when the client set none (or one beyond a year)."""
    remaining = context.time_remaining()
    if remaining is None or remaining > NO_DEADLINE_BEYOND:
        return None
    return time.monotonic() + remaining


class AccessGate:
    """Who may call what, for every RPC of both services: bearer tokens (service.transport.auth) at the access a method
    declares, and for management calls (Access.MANAGE) the permission --allow-management gives too."""

    def __init__(self, allowed: bool, authenticator: Authenticator | None = None) -> None:
        self.allowed = allowed
        self.authenticator = authenticator if authenticator is not None else Authenticator()

    def check(self, operation: str, context: grpc.ServicerContext) -> None:
        """A mutating call: management must be enabled (else PERMISSION_DENIED), then the call must carry the
        token management needs, if any (else UNAUTHENTICATED; see service.transport.auth)."""
        if not self.allowed:
            raise ManagementDisabled(operation)
        self.authenticator.check(Access.MANAGE, operation, context)

    def require(self, access: Access, operation: str, context: grpc.ServicerContext) -> None:
        """Raise ManagementDisabled or Unauthenticated unless the call may run `operation` at `access`."""
        if access is Access.MANAGE:
            self.check(operation, context)
        else:
            self.authenticator.check(access, operation, context)

    def abort_unless(self, access: Access, operation: str, context: grpc.ServicerContext) -> None:
        """`require` for handlers outside `rpc` (streams, unimplemented methods): aborts the RPC when refused."""
        try:
            self.require(access, operation, context)
        except ServiceError as error:
            status_codes.abort(context, error)
