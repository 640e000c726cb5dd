"""Errors raised by engines and the model repository.

Engines raise these; they carry no transport data. Each class a client may see names its reason (`error_reason`,
as the server core's errors do: service/core/errors.py); the server maps each reason to a status code in one table
(`service/status_codes.py`). One without a reason (EngineError, ExecutionError) reaches the client as INTERNAL
with a generic message. Messages name the problem for the client: they must not contain stack traces or
internal paths beyond the model's own files.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every engine and repository error."""

    error_reason: str | None = None


class ModelConfigError(EngineError):
    """A model's configuration or files are invalid (bad config.pbtxt, missing model file, I/O that does not
    match the model). Maps to INVALID_ARGUMENT for management calls."""

    error_reason: str | None = "invalid_request_error"


class ModelLoadError(EngineError):
    """Loading the engine or creating a slot's context failed for a reason that is not the request's fault."""

    error_reason: str | None = "load_failed"


class BackendUnavailableError(EngineError):
    """The backend cannot run on this machine (no CUDA device, TensorRT not installed).
    Maps to FAILED_PRECONDITION."""

    error_reason: str | None = "backend_unavailable"


class OutOfDeviceMemoryError(ModelLoadError):
    """An engine or context could not be allocated (for example TensorRT returned None for a context)."""

    error_reason: str | None = "out_of_memory"


class OutOfHostMemoryError(ModelLoadError):
    """Host memory for a context could not be allocated (for example TensorRT's pinned staging buffers:
    cudaHostAlloc failed). Maps like OutOfDeviceMemoryError, with a message that names host memory."""

    error_reason: str | None = "out_of_memory"


class OutOfSharedMemoryError(EngineError):
    """The shared memory that carries a python model's tensors to and from its worker (/dev/shm) has no room for
    a request's or a response's: that request is refused (the message names /dev/shm and its free space), and
    nothing else is lost."""

    error_reason: str | None = "out_of_memory"


class InvalidInputError(EngineError):
    """A request's tensors do not fit the model (unknown or missing input, wrong datatype or shape).
    Maps to INVALID_ARGUMENT."""

    error_reason: str | None = "invalid_request_error"


class ExecutionError(EngineError):
    """The backend failed while executing a request. Maps to INTERNAL with a generic message."""


class ModelError(ExecutionError):
    """A python model's own failure, with its message for the client: execute raised (INTERNAL, the exception's
    type and message; the traceback is in the log only), returned a TritonError, or its worker process died
    under the request. The subclasses carry the other TritonError codes."""

    error_reason: str | None = "model_error"


class ModelErrorUnknown(ModelError):
    error_reason: str | None = "model_error_unknown"


class ModelErrorNotFound(ModelError):
    error_reason: str | None = "model_error_not_found"


class ModelErrorInvalidArgument(ModelError):
    error_reason: str | None = "model_error_invalid_argument"


class ModelErrorUnavailable(ModelError):
    error_reason: str | None = "model_error_unavailable"


class ModelErrorUnsupported(ModelError):
    error_reason: str | None = "model_error_unsupported"


class ModelErrorAlreadyExists(ModelError):
    error_reason: str | None = "model_error_already_exists"


class DeviceFailedError(ExecutionError):
    """The model's device can no longer run anything (a sticky CUDA error corrupted its context): this request
    failed, and every later one would. The server takes the model out of service (the next request or load
    rebuilds it). Maps to UNAVAILABLE."""

    error_reason: str | None = "device_failed"


class ExecutionCancelled(EngineError):
    """The caller gave up and the backend stopped (or skipped) the run."""

    error_reason: str | None = "cancelled"


class RequestRescheduled(EngineError):
    """An engine's answer for a request of an iterative sequence that its model released with Triton's
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: the request is not finished (no answer, or a streaming model's answers
    so far), and the sequence runs it again, with the same inputs, after the requests queued before it. Never
    reaches a client: service/core/sequences.py takes it (a model without iterative_sequence gets a ModelError
    from its backend instead)."""
