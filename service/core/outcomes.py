"""How a finished request ended, in the words its client saw: `success`, the reason of the error it got
(`server_busy`, `residency_limit`, `invalid_request_error`, ...), or `failed` for an internal error.

The vocabulary of reasons is the errors' own: every error class a client may see names its reason in the class
attribute `error_reason` (service/core/errors.py, engine/errors.py, service/transport/shared_memory.py); a subclass that
sets none has its base's. `reason_of` reads it here, and the edge's one table (service/transport/status_codes.py) maps
each reason to a gRPC status code. Adding a reason is: set it on the class, give it a row there.

The core records an outcome per request (statistics, metrics, log lines) and imports nothing of the transport.
"""

from __future__ import annotations

from engine.interface import CancelToken

from .errors import SHUTDOWN_CANCEL_REASON, ServiceError, ShuttingDown
from .service_rate import RATED_REASONS, RatedModel, retry_after

SUCCESS = "success"
FAILED = "failed"  # the client got INTERNAL: the details are only in the log

# Outcomes a model's request counter reports from the start, at zero, so rates over them exist before the first
# such request. Other reasons (out_of_memory, ...) appear once they happen.
STANDARD = (
    SUCCESS,
    "server_busy",
    "residency_limit",
    "memory_limit",
    "shutting_down",
    "invalid_request_error",
    "model_not_found",
    "cancelled",
    "load_failed",
    FAILED,
)

# Refusals: the request was turned away rather than run and failed. These get a (rate-limited) `rejected` line.
REJECTIONS = frozenset(
    {
        "server_busy",
        "residency_limit",
        "memory_limit",
        "shutting_down",
        "invalid_request_error",
        "model_not_found",
        "region_not_found",
        "tensor_memory_limit",
        "wait_exceeds_deadline",
    }
)


def reason_of(error: BaseException) -> str | None:
    """The reason `error`'s class (or its nearest base that names one) gives, or None: an internal error. A
    generator closed early (GeneratorExit: the stream went away) is the caller's cancellation."""
    if isinstance(error, GeneratorExit):
        return "cancelled"
    reason = getattr(type(error), "error_reason", None)
    return reason if isinstance(reason, str) else None


def seen_by_client(error: BaseException, cancel: CancelToken | None) -> BaseException:
    """The error a client is told: work that the server's own shutdown cut short (its token cancelled with
    SHUTDOWN_CANCEL_REASON) is `shutting_down`, not the client's cancellation; anything else is itself."""
    if cancel is not None and cancel.reason == SHUTDOWN_CANCEL_REASON and reason_of(error) == "cancelled":
        shutting_down = ShuttingDown("shutting_down: the server stopped this call at the end of its shutdown grace")
        shutting_down.__cause__ = error
        return shutting_down
    return error


def outcome_of(error: BaseException, cancel: CancelToken | None = None) -> str:
    """The outcome of a request that raised `error`; `cancel` is the request's token (its reason tells a
    shutdown's cancellation from the client's)."""
    return reason_of(seen_by_client(error, cancel)) or FAILED


def add_retry_hint(error: BaseException, model: RatedModel) -> None:
    """Give a refusal by `model`'s own queue (service_rate.RATED_REASONS: a full queue, a queue timeout) the retry
    hint its model's service rate and queue predict (service/core/service_rate.py), unless its raiser set one; the
    edge sends it as grpc-retry-pushback-ms. Other errors are left alone. Never raises."""
    if isinstance(error, ServiceError) and error.retry_after is None and reason_of(error) in RATED_REASONS:
        error.retry_after = retry_after(model)
