"""Domain errors of the server core. They carry no transport data. Each class a client may see names its reason
(`error_reason`, the word of the google.rpc.ErrorInfo the client gets and of the request's outcome in statistics,
metrics and log lines; a subclass without one has its base's); `service/transport/status_codes.py` maps each reason to a
gRPC status code in one table.

Messages are written for the client: they name the model and the problem, never internal details.
"""

from __future__ import annotations

from typing import TypeVar

# The CancelToken reason with which the server cancels calls at the end of its shutdown grace: work cut short with
# it is reported as `shutting_down`, not as the client's cancellation (service/core/outcomes.py seen_by_client).
SHUTDOWN_CANCEL_REASON = "shutdown"

# An overload refusal's `retry_after` that tells its client not to retry this call at all (the edge sends it as a
# negative grpc-retry-pushback-ms, gRFC A6's "do not retry"): retrying cannot succeed.
NO_RETRY = -1.0


class ServiceError(Exception):
    """Base of the server core's errors. One without an `error_reason` of its own or of a base is internal.

    `retry_after`, on an overload refusal: seconds after which a retry may be served (service/core/service_rate.py
    computes it from the model's service rate and queue), NO_RETRY when it cannot be, None when nothing was computed
    (the edge then sends its reason's default hint; docs/errors.md, "Overload")."""

    error_reason: str | None = None
    retry_after: float | None = None


E = TypeVar("E", bound=ServiceError)


class ModelNotFound(ServiceError):
    error_reason = "model_not_found"

    def __init__(self, name: str, version: str = "") -> None:
        # Triton's wording: stock clients and examples look for "Request for unknown model".
        what = f"'{name}' version {version}" if version else f"'{name}'"
        super().__init__(f"Request for unknown model: {what} is not found")
        self.model = name


class InvalidRequest(ServiceError):
    """The request is malformed or asks for something the model or server cannot do (INVALID_ARGUMENT,
    reason invalid_request_error)."""

    error_reason = "invalid_request_error"


class UnsupportedSlotCount(InvalidRequest):
    """A slot count outside 1..16, above the model's capacity, or given without --parallel-jobs."""


class BackendNotAvailable(InvalidRequest):
    """A model names a backend this server does not run: a test backend on a server started without
    --enable-test-backends, or a backend an embedding server left out."""


class ManagementDisabled(ServiceError):
    error_reason = "management_disabled"

    def __init__(self, operation: str) -> None:
        super().__init__(f"{operation} needs management enabled: start the server with --allow-management")


class Unauthenticated(ServiceError):
    """A token is required and the call had none or a wrong one (UNAUTHENTICATED, reason unauthenticated).
    The message never contains a token."""

    error_reason = "unauthenticated"


class ServerBusy(ServiceError):
    """Admission refused or timed out (UNAVAILABLE, reason server_busy)."""

    error_reason = "server_busy"


class AdmissionTimeout(ServerBusy):
    pass


class QueueFull(ServerBusy):
    pass


class OverdueBlockers(ServerBusy):
    pass


class WaitExceedsDeadline(ServiceError):
    """Refused at arrival (--refuse-predicted-wait): the model's predicted wait is longer than the time the request
    has left before its deadline (UNAVAILABLE, reason wait_exceeds_deadline; never retried within the call)."""

    error_reason = "wait_exceeds_deadline"
    retry_after = NO_RETRY


class ResidencyLimit(ServiceError):
    """No resident model could be retired to make room (UNAVAILABLE, reason residency_limit)."""

    error_reason = "residency_limit"


class MemoryLimit(ServiceError):
    """The pool would exceed --memory-budget (UNAVAILABLE, reason memory_limit)."""

    error_reason = "memory_limit"


class ShuttingDown(ServiceError):
    """The server is stopping and no longer admits this work (UNAVAILABLE, reason shutting_down)."""

    error_reason = "shutting_down"


class RequestCancelled(ServiceError):
    """The caller gave up (client cancellation, deadline or disconnect)."""

    error_reason = "cancelled"


class ModelNotLoadedYet(ServiceError):
    """Metadata was asked of a model whose inputs are only known once it has loaded (UNAVAILABLE)."""

    error_reason = "model_not_loaded"


class ModelConfigFailed(ModelNotLoadedYet):
    """A repository model whose configuration could not be read or was refused: it stays listed (RepositoryIndex)
    with its reason, and a request for it gets UNAVAILABLE naming the reason rather than "unknown model"."""

    error_reason = "model_not_loaded"

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"model '{name}' failed to load: {reason}")
        self.model = name


class ModelNotLoadedByControl(ServiceError):
    """A request for an unloaded model in a model-control mode where requests do not load models (none,
    explicit, poll: service/request_path/model_control.py). UNAVAILABLE; `why` names the mode and what loads the
    model."""

    error_reason = "model_not_loaded"

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"model '{name}' is not loaded ({why})")
        self.model = name


class ModelLoadFailed(ServiceError):
    """A request needed the model loaded and the load failed. Wraps the engine error's message."""

    error_reason = "load_failed"

    def __init__(self, name: str, cause: Exception) -> None:
        super().__init__(f"model '{name}' failed to load: {cause}")
        self.model = name
        self.cause = cause


def never_retried(error: E) -> E:
    """`error` marked as an overload refusal that no retry can change (a request larger than a limit allows)."""
    error.retry_after = NO_RETRY
    return error


def own_copy(error: BaseException) -> BaseException:
    """`error` as a new object, for one more caller to raise. Raising one object on several threads (the waiters
    of a failed cold load, the members of a failed batch) would make its traceback collect every thread's
    frames (and the tensors they hold). Built without calling __init__, whose signature varies (ModelLoadFailed
    takes a name and a cause)."""
    copy = type(error).__new__(type(error))
    copy.args = error.args
    copy.__dict__.update(error.__dict__)
    copy.__cause__, copy.__suppress_context__ = error.__cause__, error.__suppress_context__
    return copy
