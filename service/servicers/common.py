"""What the servicers share: error handling, cancellation tokens, deadlines and the handler budget."""

from __future__ import annotations

import functools
import threading
import time

import grpc

from engine.interface import CancelToken

from .. import status_codes
from ..errors import ManagementDisabled, ServerBusy


def rpc(method):
    """Turn any exception of a unary handler into the status the table gives it."""
    @functools.wraps(method)
    def handler(self, request, context):
        try:
            return method(self, request, context)
        except Exception as error:  # every error reaches the client through the one table
            status_codes.abort(context, error)
    return handler


def cancel_token(context: grpc.ServicerContext) -> CancelToken:
    """A token that fires when the RPC ends for any reason (cancel, deadline, disconnect, completion)."""
    token = CancelToken()
    context.add_callback(token.cancel)
    return token


def client_deadline(context: grpc.ServicerContext) -> float | None:
    """The client's deadline on the monotonic clock, or None when the client set none."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


class HandlerBudget:
    """Bounds how many inference calls occupy handler threads (the sync server pins a thread per waiting
    call), so that health, status and management calls always find a free thread."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()  # guards: _in_use
        self._in_use = 0

    def enter(self) -> None:
        """Take a place or raise ServerBusy at once."""
        with self._lock:
            if self._in_use >= self.limit:
                raise ServerBusy(f"server_busy: all {self.limit} inference handler threads are in use")
            self._in_use += 1

    def exit(self) -> None:
        with self._lock:
            self._in_use -= 1

    @property
    def in_use(self) -> int:
        return self._in_use


class ManagementGate:
    """Checks that management is enabled before a mutating call."""

    def __init__(self, allowed: bool) -> None:
        self.allowed = allowed

    def check(self, operation: str, context: grpc.ServicerContext) -> None:
        if not self.allowed:
            raise ManagementDisabled(operation)
