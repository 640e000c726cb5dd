"""The one table from exceptions to gRPC status codes, and the helper that aborts an RPC with it.

Every error a client can see passes through `describe`. Client-facing errors carry a google.rpc.ErrorInfo
(domain "slotserve") whose reason names the contract's category (`invalid_request_error`, `server_busy`,
`residency_limit`, `memory_limit`, ...). Anything not in the table is an internal error: the client gets a
generic message with a reference, the log gets the traceback.
"""

from __future__ import annotations

import logging
import re
import uuid

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from engine import errors as engine_errors
from engine.tensor_codec import TensorDecodeError

from . import shared_memory, tensor_memory
from .core import errors

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

# (exception class, status code, ErrorInfo reason or None). Lookup walks each error's MRO, so subclasses
# listed here win over their bases.
TABLE: tuple[tuple[type[BaseException], grpc.StatusCode, str | None], ...] = (
    (errors.ModelNotFound, grpc.StatusCode.NOT_FOUND, "model_not_found"),
    (errors.InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error"),
    (shared_memory.RegionNotFound, grpc.StatusCode.NOT_FOUND, "region_not_found"),  # Triton's code for it
    (shared_memory.SharedMemoryLimit, grpc.StatusCode.RESOURCE_EXHAUSTED, "shared_memory_limit"),
    (shared_memory.SharedMemoryUnsupported, grpc.StatusCode.UNIMPLEMENTED, "unimplemented"),
    (tensor_memory.TensorMemoryLimit, grpc.StatusCode.RESOURCE_EXHAUSTED, "tensor_memory_limit"),
    (engine_errors.InvalidInputError, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error"),
    (engine_errors.ModelConfigError, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error"),
    (TensorDecodeError, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error"),
    (errors.ManagementDisabled, grpc.StatusCode.PERMISSION_DENIED, "management_disabled"),
    # A missing token and a wrong one get the same status (DESIGN §5); the message says which, never a token.
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED, "unauthenticated"),
    (errors.ServerBusy, grpc.StatusCode.UNAVAILABLE, "server_busy"),
    (errors.ResidencyLimit, grpc.StatusCode.UNAVAILABLE, "residency_limit"),
    (errors.MemoryLimit, grpc.StatusCode.UNAVAILABLE, "memory_limit"),
    (errors.ShuttingDown, grpc.StatusCode.UNAVAILABLE, "shutting_down"),
    (errors.ModelNotLoadedYet, grpc.StatusCode.UNAVAILABLE, "model_not_loaded"),
    (errors.RequestCancelled, grpc.StatusCode.CANCELLED, "cancelled"),
    (engine_errors.ExecutionCancelled, grpc.StatusCode.CANCELLED, "cancelled"),
    (errors.ModelLoadFailed, grpc.StatusCode.FAILED_PRECONDITION, "load_failed"),
    (engine_errors.BackendUnavailableError, grpc.StatusCode.FAILED_PRECONDITION, "backend_unavailable"),
    (engine_errors.OutOfDeviceMemoryError, grpc.StatusCode.RESOURCE_EXHAUSTED, "out_of_memory"),
    (engine_errors.OutOfHostMemoryError, grpc.StatusCode.RESOURCE_EXHAUSTED, "out_of_memory"),
    # The GPU's CUDA context broke under this request: retryable once the model is rebuilt (a later request does).
    (engine_errors.DeviceFailedError, grpc.StatusCode.UNAVAILABLE, "device_failed"),
    (engine_errors.ModelLoadError, grpc.StatusCode.FAILED_PRECONDITION, "load_failed"),
)

_BY_CLASS = {cls: (code, reason) for cls, code, reason in TABLE}

# Errors whose own message could reveal internals: the client gets this instead.
_GENERIC = {engine_errors.ExecutionError: "the model failed to execute this request; see the server log"}


def describe(error: BaseException) -> tuple[grpc.StatusCode, str, str | None]:
    """(code, client message, reason) for `error`. Unknown errors are logged with a reference id."""
    for cls in type(error).__mro__:
        if cls in _BY_CLASS:
            code, reason = _BY_CLASS[cls]
            return code, bounded_message(str(error)), reason
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
    return encoded[:MAX_MESSAGE_BYTES - 40].decode("utf-8", "ignore") + f"... ({len(encoded)} bytes, cut)"


def _shorten_quoted(match: re.Match[str]) -> str:
    text = match.group(0)
    quote, inner = text[0], text[1:-1]
    if len(inner) < MAX_QUOTED_CHARS + 3:  # shortened to head...tail it would be no shorter
        return text
    keep = MAX_QUOTED_CHARS // 2
    return f"{quote}{inner[:keep]}...{inner[-keep:]}{quote} ({len(inner)} characters)"


def rich_status(code: grpc.StatusCode, message: str, reason: str | None) -> grpc.Status:
    status = status_pb2.Status(code=code.value[0], message=message)
    if reason:
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN))
        status.details.append(detail)
    return rpc_status.to_status(status)


def abort(context: grpc.ServicerContext, error: BaseException) -> None:
    """End the RPC with `error`'s status. Raises (as grpc's abort does)."""
    code, message, reason = describe(error)
    context.abort_with_status(rich_status(code, message, reason))
