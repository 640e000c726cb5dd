"""How a finished request ended, in the words its client saw: `success`, or the ErrorInfo reason of the error
it got (`server_busy`, `residency_limit`, `invalid_request_error`, ...), or `failed` for an internal error.

The request path records an outcome per request (statistics and metrics) and must not import grpc, so the
reasons are repeated here from the one error table, `service/status_codes.py`; tests/unit/test_events.py checks
that the two agree for every class in that table.
"""

from __future__ import annotations

from engine import errors as engine_errors
from engine.interface import CancelToken
from engine.tensor_codec import TensorDecodeError

from . import shared_memory, tensor_memory
from .core import errors

SUCCESS = "success"
FAILED = "failed"  # the client got INTERNAL: the details are only in the log

# The CancelToken reason with which the server cancels calls at the end of its shutdown grace; the same value as
# service.servicers.common.SHUTDOWN (which imports grpc). Cancellation for this reason reaches the client as
# `shutting_down` (servicers.common.as_client_error), so it is counted as such.
SHUTDOWN_CANCEL_REASON = "shutdown"

# exception class -> reason, as in status_codes.TABLE. Lookup walks the error's MRO, so a subclass listed here
# wins over its base (OutOfDeviceMemoryError over ModelLoadError).
_REASONS: dict[type[BaseException], str] = {
    errors.ModelNotFound: "model_not_found",
    errors.InvalidRequest: "invalid_request_error",
    shared_memory.RegionNotFound: "region_not_found",
    shared_memory.SharedMemoryLimit: "shared_memory_limit",
    shared_memory.SharedMemoryUnsupported: "unimplemented",
    tensor_memory.TensorMemoryLimit: "tensor_memory_limit",
    engine_errors.InvalidInputError: "invalid_request_error",
    engine_errors.ModelConfigError: "invalid_request_error",
    TensorDecodeError: "invalid_request_error",
    errors.ManagementDisabled: "management_disabled",
    errors.Unauthenticated: "unauthenticated",
    errors.ServerBusy: "server_busy",
    errors.ResidencyLimit: "residency_limit",
    errors.MemoryLimit: "memory_limit",
    errors.ShuttingDown: "shutting_down",
    errors.ModelNotLoadedYet: "model_not_loaded",
    errors.RequestCancelled: "cancelled",
    engine_errors.ExecutionCancelled: "cancelled",
    errors.ModelLoadFailed: "load_failed",
    engine_errors.BackendUnavailableError: "backend_unavailable",
    engine_errors.OutOfDeviceMemoryError: "out_of_memory",
    engine_errors.OutOfHostMemoryError: "out_of_memory",
    engine_errors.DeviceFailedError: "device_failed",
    engine_errors.ModelLoadError: "load_failed",
}

# Outcomes a model's request counter reports from the start, at zero, so rates over them exist before the first
# such request. Other reasons (out_of_memory, ...) appear once they happen.
STANDARD = (SUCCESS, "server_busy", "residency_limit", "memory_limit", "shutting_down", "invalid_request_error",
            "model_not_found", "cancelled", "load_failed", FAILED)

# Refusals: the request was turned away rather than run and failed. These get a (rate-limited) `rejected` line.
REJECTIONS = frozenset({"server_busy", "residency_limit", "memory_limit", "shutting_down", "invalid_request_error",
                        "model_not_found", "region_not_found", "tensor_memory_limit"})


def outcome_of(error: BaseException, cancel: CancelToken | None = None) -> str:
    """The outcome of a request that raised `error`; `cancel` is the request's token (its reason tells a
    shutdown's cancellation from the client's). A generator closed early (GeneratorExit: the stream went away)
    counts as cancelled."""
    if isinstance(error, GeneratorExit):
        return "cancelled"
    for cls in type(error).__mro__:
        reason = _REASONS.get(cls)
        if reason is not None:
            if reason == "cancelled" and cancel is not None and cancel.reason == SHUTDOWN_CANCEL_REASON:
                return "shutting_down"
            return reason
    return FAILED
