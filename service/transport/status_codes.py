"""The one table from error reasons to gRPC status codes, and the helper that aborts an RPC with it.

Every error a client can see passes through `describe`: its class names its reason, the table gives the code.
Client-facing errors carry a google.rpc.ErrorInfo (domain "slotserve") whose reason names the contract's category
(`invalid_request_error`, `server_busy`, `residency_limit`, `memory_limit`, ...). Anything not in the table is an
internal error: the client gets a generic message with a reference, the log gets the traceback.
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import NamedTuple, NoReturn, cast

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from engine import errors as engine_errors
from engine.tensor_codec import TensorDecodeError

from ..core import errors
from ..core.outcomes import reason_of

# Their error classes are among those reasoned_classes finds.
from ..request_path import model_control, model_files  # noqa: F401
from . import shared_memory, tensor_memory  # noqa: F401

_LOG = logging.getLogger(__name__)

DOMAIN = "slotserve"

# A status message travels twice in the trailers (grpc-message percent-encoded, up to 3 bytes per byte, and the
# google.rpc.Status in base64), and gRPC clients refuse trailers past 8 KiB (soft) / 16 KiB (hard) with
# RESOURCE_EXHAUSTED: a request that quotes a 10 000-character model name back would lose its real status.
# So quoted request strings are shortened, and the whole message is capped in UTF-8 bytes.
MAX_QUOTED_CHARS = 120
MAX_MESSAGE_BYTES = 1024
# Every quoted string, paired left to right (short ones too: matching only long ones would pair the closing quote
# of one short name with the opening quote of the next, and shorten the text between them).
_QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"")

# The one table from an error's reason (its class's `error_reason`: service/core/errors.py, engine/errors.py,
# service/transport/shared_memory.py, service/transport/tensor_memory.py) to the status code its client gets. A reason
# not here is a bug: a test checks every class's reason has a row.
TABLE: dict[str, grpc.StatusCode] = {
    "model_not_found": grpc.StatusCode.NOT_FOUND,
    "invalid_request_error": grpc.StatusCode.INVALID_ARGUMENT,
    "region_not_found": grpc.StatusCode.NOT_FOUND,  # Triton's code for it
    "region_exists": grpc.StatusCode.ALREADY_EXISTS,  # re-registering a name: Triton's code for it
    "shared_memory_limit": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "tensor_memory_limit": grpc.StatusCode.RESOURCE_EXHAUSTED,  # --max-request-tensor-bytes / --max-inflight-...
    "unimplemented": grpc.StatusCode.UNIMPLEMENTED,
    "management_disabled": grpc.StatusCode.PERMISSION_DENIED,
    # A missing token and a wrong one get the same status (docs/security.md): a caller probing for a token learns
    # nothing from the code; the message says which of the two it was, never a token.
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
    "server_busy": grpc.StatusCode.UNAVAILABLE,
    "residency_limit": grpc.StatusCode.UNAVAILABLE,
    "memory_limit": grpc.StatusCode.UNAVAILABLE,
    "shutting_down": grpc.StatusCode.UNAVAILABLE,
    "wait_exceeds_deadline": grpc.StatusCode.UNAVAILABLE,  # --refuse-predicted-wait (no Triton counterpart)
    "model_not_loaded": grpc.StatusCode.UNAVAILABLE,
    "model_control_disabled": grpc.StatusCode.UNAVAILABLE,  # Triton's code for load/unload in none or poll mode
    "load_files_limit": grpc.StatusCode.RESOURCE_EXHAUSTED,  # --max-load-file-bytes
    "repository_poll_failed": grpc.StatusCode.INTERNAL,  # Triton's code for a load of no folder, or bad file: paths
    "cancelled": grpc.StatusCode.CANCELLED,
    "load_failed": grpc.StatusCode.FAILED_PRECONDITION,
    "backend_unavailable": grpc.StatusCode.FAILED_PRECONDITION,
    "out_of_memory": grpc.StatusCode.RESOURCE_EXHAUSTED,
    # The GPU's CUDA context broke under this request: retryable once the model is rebuilt (a later request does).
    "device_failed": grpc.StatusCode.UNAVAILABLE,
    # A python model's own errors (engine.errors.ModelError): its message, and the code of its TritonError.
    "model_error": grpc.StatusCode.INTERNAL,
    "model_error_unknown": grpc.StatusCode.UNKNOWN,
    "model_error_not_found": grpc.StatusCode.NOT_FOUND,
    "model_error_invalid_argument": grpc.StatusCode.INVALID_ARGUMENT,
    "model_error_unavailable": grpc.StatusCode.UNAVAILABLE,
    "model_error_unsupported": grpc.StatusCode.UNIMPLEMENTED,
    "model_error_already_exists": grpc.StatusCode.ALREADY_EXISTS,
}

# Overload refusals (docs/errors.md, "Overload"): the reasons whose client gets a retry hint, the trailing metadata
# `grpc-retry-pushback-ms` of gRFC A6 (client retries), which a gRPC client with a retry policy for the status code
# honours: it retries after that many milliseconds, or not at all when the value is negative. The hint is the error's
# `retry_after` when the core computed one (service/core/service_rate.py: the model's predicted wait; NO_RETRY when
# no retry can succeed), else the reason's default here (seconds).
PUSHBACK_HEADER = "grpc-retry-pushback-ms"
DEFAULT_RETRY_AFTER: dict[str, float] = {
    # A model's queue (service_rate's hint when its model is known); the handler budget frees when any call ends.
    "server_busy": 0.1,
    # Another model must go idle (or its load end) before this one fits.
    "residency_limit": 1.0,
    "memory_limit": 1.0,
    # The requests in flight must finish (a request larger than a limit alone is marked NO_RETRY where refused).
    "tensor_memory_limit": 0.1,
    # This server stops: a retry that reaches another address of the channel (or this one restarted) may succeed.
    "shutting_down": 1.0,
    "wait_exceeds_deadline": errors.NO_RETRY,  # its own deadline ends before its turn: not within this call
}
_MAX_PUSHBACK_MS = 2**31 - 1  # the header is a signed 32-bit integer


def pushback_ms(error: BaseException) -> int | None:
    """The `grpc-retry-pushback-ms` value for `error`: milliseconds, -1 for "do not retry", None when it is not an
    overload refusal (no hint is sent)."""
    reason = reason_of(error)
    if reason not in DEFAULT_RETRY_AFTER:
        return None
    after = getattr(error, "retry_after", None)
    if not isinstance(after, (int, float)):
        after = DEFAULT_RETRY_AFTER[reason]
    if after < 0:
        return -1
    return min(_MAX_PUSHBACK_MS, round(after * 1000))


# Where the error classes live: every class under these roots that sets its own `error_reason` is one a client
# may see (docs/errors.md names each; tests/docs checks it).
ERROR_ROOTS: tuple[type[BaseException], ...] = (errors.ServiceError, engine_errors.EngineError, TensorDecodeError)


def reasoned_classes() -> dict[type[BaseException], str]:
    """Every error class that names a reason of its own, with that reason (subclasses inherit it silently)."""
    found: dict[type[BaseException], str] = {}
    pending = list(ERROR_ROOTS)
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        reason = cls.__dict__.get("error_reason")
        if isinstance(reason, str):
            found[cls] = reason
    return found


# Errors whose own message could reveal internals: the client gets this instead.
_GENERIC = {engine_errors.ExecutionError: "the model failed to execute this request; see the server log"}


def describe(error: BaseException) -> tuple[grpc.StatusCode, str, str | None]:
    """(code, client message, reason) for `error`. Unknown errors are logged with a reference id."""
    reason = reason_of(error)
    if reason is not None and reason in TABLE:
        return TABLE[reason], bounded_message(str(error)), reason
    for cls in type(error).__mro__:
        if cls in _GENERIC:
            _LOG.error("request failed: %s", error, exc_info=error.__cause__ or error)
            return grpc.StatusCode.INTERNAL, _GENERIC[cls], "internal"
    reference = uuid.uuid4().hex[:12]
    _LOG.error("internal error (reference %s)", reference, exc_info=error)
    return grpc.StatusCode.INTERNAL, f"internal error (reference {reference}); see the server log", "internal"


def bounded_message(message: str) -> str:
    """`message` with overlong quoted strings shortened to head...tail and at most MAX_MESSAGE_BYTES of UTF-8."""
    message = _QUOTED.sub(_shorten_quoted, message)
    encoded = message.encode("utf-8")
    if len(encoded) <= MAX_MESSAGE_BYTES:
        return message
    return encoded[: MAX_MESSAGE_BYTES - 40].decode("utf-8", "ignore") + f"... ({len(encoded)} bytes, cut)"


def _shorten_quoted(match: re.Match[str]) -> str:
    text = match.group(0)
    quote, inner = text[0], text[1:-1]
    if len(inner) < MAX_QUOTED_CHARS + 3:  # shortened to head...tail it would be no shorter
        return text
    keep = MAX_QUOTED_CHARS // 2
    return f"{quote}{inner[:keep]}...{inner[-keep:]}{quote} ({len(inner)} characters)"


class _Status(NamedTuple):
    """A grpc.Status (abort_with_status reads these three attributes) whose trailers may carry a retry hint."""

    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...]


def rich_status(code: grpc.StatusCode, message: str, reason: str | None, pushback: int | None = None) -> grpc.Status:
    """The status to end a call with: `code`, `message`, an ErrorInfo naming `reason`, and `pushback` (ms, see
    pushback_ms) as grpc-retry-pushback-ms when given."""
    status = status_pb2.Status(code=code.value[0], message=message)
    if reason:
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN))
        status.details.append(detail)
    converted = rpc_status.to_status(status)
    if pushback is None:
        return converted
    trailers = (*converted.trailing_metadata, (PUSHBACK_HEADER, str(pushback)))
    return cast(grpc.Status, _Status(converted.code, converted.details, trailers))


def abort(context: grpc.ServicerContext, error: BaseException) -> NoReturn:
    """End the RPC with `error`'s status, and a retry hint when it is an overload refusal. Raises (as grpc's abort
    does)."""
    code, message, reason = describe(error)
    context.abort_with_status(rich_status(code, message, reason, pushback_ms(error)))
