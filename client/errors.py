"""The one exception the client library raises for failed calls: ClientError.

A ClientError carries the gRPC status code name, the server's message and, when the server attached a
`google.rpc.Status` with a `google.rpc.ErrorInfo` detail (slotserve always does for its own refusals), that
detail's reason and domain. `str(error)` is one line meant for a terminal or a log:

    UNAVAILABLE (server_busy): admission timed out after 5.0 s
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

# The trailing-metadata key that carries a serialized google.rpc.Status (grpc_status uses the same key).
_STATUS_DETAILS_KEY = "grpc-status-details-bin"


class ClientError(Exception):
    """A call failed: the server refused it, the channel broke, or a tensor could not be encoded or decoded.

    Attributes:
        code: a `grpc.StatusCode` name such as "UNAVAILABLE" or "INVALID_ARGUMENT". Problems found on this
            side use the code a server would have used: "INVALID_ARGUMENT" for inputs the client cannot encode,
            "INTERNAL" for a response the client cannot decode, "UNKNOWN" for a stream's per-request
            `error_message` (the protocol sends no code with it).
        message: the server's status message (or the client's description), possibly empty.
        reason: `ErrorInfo.reason` from the rich status details (e.g. "server_busy"), or None.
        domain: `ErrorInfo.domain` (e.g. "slotserve"), or None.
        request_id: the request id a stream echoed with a per-request error, or None.
    """

    def __init__(
        self,
        code: str,
        message: str = "",
        reason: str | None = None,
        *,
        domain: str | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(code, message, reason)
        self.code = code
        self.message = message
        self.reason = reason
        self.domain = domain
        self.request_id = request_id

    def __str__(self) -> str:
        head = f"{self.code} ({self.reason})" if self.reason else self.code
        # One line, whatever the server put in its message.
        message = " ".join(self.message.split())
        if self.reason and message.startswith(f"{self.reason}: "):
            message = message[len(self.reason) + 2 :]  # slotserve's messages name their reason first: once is enough
        return f"{head}: {message}" if message else head

    def __repr__(self) -> str:
        return f"ClientError(code={self.code!r}, message={self.message!r}, reason={self.reason!r})"

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> ClientError:
        """The ClientError for a failed call. Never raises, whatever the error holds."""
        code = _code_name(error)
        message = _details(error)
        info = _error_info(error)
        if info is None:
            return cls(code, message)
        return cls(code, message, info.reason or None, domain=info.domain or None)


def _code_name(error: grpc.RpcError) -> str:
    code = error.code() if callable(getattr(error, "code", None)) else None
    return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"


def _details(error: grpc.RpcError) -> str:
    details = error.details() if callable(getattr(error, "details", None)) else None
    return details or ""


def _error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The first ErrorInfo in the call's rich status details, or None."""
    status = _rich_status(error)
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None


def _rich_status(error: grpc.RpcError) -> status_pb2.Status | None:
    if not callable(getattr(error, "trailing_metadata", None)):
        return None
    try:
        return rpc_status.from_call(error)  # type: ignore[arg-type]  # an RpcError from a call is also a grpc.Call
    except ValueError:
        # from_call refuses a status whose code or message differs from the call's (a proxy may rewrite the
        # message); the reason in it is still the server's, so read it anyway.
        return _parse_status(error.trailing_metadata())
    except Exception:  # noqa: BLE001 - a malformed detail must not hide the call's own error
        return None


def _parse_status(metadata: Iterable[Any] | None) -> status_pb2.Status | None:
    """The rich status in a call's trailing metadata: its (key, value) pairs (grpc's stubs type them otherwise)."""
    for key, value in metadata or ():
        if key == _STATUS_DETAILS_KEY:
            try:
                return status_pb2.Status.FromString(value)
            except Exception:  # noqa: BLE001 - see _rich_status
                return None
    return None
