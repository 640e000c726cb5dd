"""slotserve's `triton_python_backend_utils`: the API a Triton python-backend `model.py` imports.

Written from Triton's documented python_backend API (its README). A worker process puts this module into
`sys.modules` under the name `triton_python_backend_utils` before it imports a model.py, so
`import triton_python_backend_utils as pb_utils` works without installing anything. It imports only numpy, so
unit tests (and model code) can use it outside a worker.

What Triton has and slotserve does not is refused by name, never missing silently: custom metrics
(`MetricFamily`, `Metric`), DLPack and GPU tensors (see docs/python-models.md). A decoupled model's response
senders are the worker's (engine/python/worker.py): each `send` reaches the client before it returns. BLS calls
(`InferenceRequest(...).exec()`, `async_exec`) run through the worker too (`_bls_caller`); outside a worker they
are refused by name.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import sys
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# TRITONSERVER_DataType values, as numpy_to_triton_type and triton_to_numpy_type use them.
_TRITON_TYPES: tuple[tuple[int, str, object], ...] = (
    (1, "TYPE_BOOL", np.bool_),
    (2, "TYPE_UINT8", np.uint8),
    (3, "TYPE_UINT16", np.uint16),
    (4, "TYPE_UINT32", np.uint32),
    (5, "TYPE_UINT64", np.uint64),
    (6, "TYPE_INT8", np.int8),
    (7, "TYPE_INT16", np.int16),
    (8, "TYPE_INT32", np.int32),
    (9, "TYPE_INT64", np.int64),
    (10, "TYPE_FP16", np.float16),
    (11, "TYPE_FP32", np.float32),
    (12, "TYPE_FP64", np.float64),
    (13, "TYPE_STRING", np.object_),
)
_STRING_TO_NUMPY = {name: dtype for (_, name, dtype) in _TRITON_TYPES}
_ENUM_TO_NUMPY = {value: dtype for (value, _, dtype) in _TRITON_TYPES}


# The worker's BLS call (engine/python/worker.py Worker.bls): (request, decoupled) -> list of InferenceResponse.
_bls_caller: Callable | None = None


def _refuse(what: str) -> TritonModelException:
    return TritonModelException(f"{what} is not supported by slotserve's python backend yet")


class TritonModelException(Exception):
    """Raised by the API on misuse, as Triton's pb_utils raises it."""


class TritonError:
    """An error a model returns in an InferenceResponse (or raises): its code reaches the client."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        if code not in range(8):
            raise TritonModelException(f"TritonError code must be one of TritonError's codes 0..7, got {code!r}")
        self._message = str(message)
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class Tensor:
    """A named numpy array. BYTES tensors are numpy object arrays of `bytes` (str elements are accepted in
    outputs and sent UTF-8 encoded)."""

    def __init__(self, name: str, array) -> None:
        if not isinstance(name, str):
            raise TritonModelException(f"a Tensor's name must be a str, got {type(name).__name__}")
        if not isinstance(array, np.ndarray):
            raise TritonModelException(
                f"Tensor '{name}' must be built from a numpy array, got {type(array).__name__}"
                " (GPU tensors and DLPack are not supported)"
            )
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        value = numpy_to_triton_type(self._array.dtype)
        assert value is not None  # a Tensor holds only arrays of the protocol's datatypes
        return value

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self):
        raise _refuse("Tensor.to_dlpack (DLPack)")

    @staticmethod
    def from_dlpack(name, capsule):
        raise _refuse("Tensor.from_dlpack (DLPack)")

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={list(self._array.shape)}, dtype={self._array.dtype})"


class InferenceResponse:
    """One request's answer: output tensors, or an error."""

    def __init__(self, output_tensors=None, error: TritonError | None = None, parameters=None) -> None:
        tensors = list(output_tensors or [])
        for tensor in tensors:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"InferenceResponse output_tensors must be pb_utils.Tensor objects, got {type(tensor).__name__}"
                )
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException(f"InferenceResponse error must be a TritonError, got {type(error).__name__}")
        self._tensors = tensors
        self._error = error
        self._parameters = parameters

    def output_tensors(self) -> list[Tensor]:
        return list(self._tensors)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


class InferenceResponseSender:
    """The response sender of a model that is not decoupled: it takes exactly one response, which must carry
    TRITONSERVER_RESPONSE_COMPLETE_FINAL (or be followed by a final `send(flags=...)` without a response). A
    decoupled model's requests get the worker's streaming sender instead."""

    def __init__(self) -> None:
        self.response: InferenceResponse | None = None
        self.closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self.closed:
            raise TritonModelException("the response sender was closed: a response with the final flag was sent")
        if response is not None:
            if not isinstance(response, InferenceResponse):
                raise TritonModelException(f"send() takes an InferenceResponse, got {type(response).__name__}")
            if self.response is not None:
                raise TritonModelException(
                    "this model is not decoupled: a request takes one response (a model with "
                    "model_transaction_policy { decoupled: true } may send several)"
                )
            self.response = response
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.closed = True

    def is_cancelled(self) -> bool:
        return False


class InferenceRequest:
    """A request handed to `execute` (built by the worker), or a BLS request a model builds and runs.

    Built by a model: `InferenceRequest(model_name=..., inputs=[...], requested_output_names=[...])`, then
    `exec()` (blocks; returns an InferenceResponse, whose `has_error()` tells a failed call: errors are not
    raised), `exec(decoupled=True)` (an iterator of every response of the callee, then an empty one for a final
    flag sent alone), or `await async_exec()` (the same, without blocking the event loop: calls awaited together
    overlap). Raises
    TritonModelException for a call that cannot be made (outside execute, an input no datatype fits)."""

    def __init__(
        self,
        model_name: str = "",
        inputs=None,
        requested_output_names=None,
        request_id: str = "",
        correlation_id=0,
        flags: int = 0,
        parameters=None,
        timeout: int = 0,
        model_version: int = -1,
        preferred_memory=None,
        trace=None,
        *,
        _cancelled: Callable[[], bool] | None = None,
    ) -> None:
        self._model_name = model_name
        self._inputs = list(inputs or [])
        self._requested = list(requested_output_names or [])
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        if isinstance(parameters, dict):
            parameters = json.dumps(parameters)
        elif parameters is not None and not isinstance(parameters, str):
            raise TritonModelException(f"parameters must be a dict or a JSON string, got {type(parameters).__name__}")
        self._parameters = parameters or "{}"
        self._timeout = timeout
        self._model_version = model_version
        self._cancelled = _cancelled
        self._sender: InferenceResponseSender | None = None

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def requested_output_names(self) -> list[str]:
        return list(self._requested)

    def parameters(self) -> str:
        """The request's parameters as a JSON string, as in Triton."""
        return self._parameters

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self):
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def is_cancelled(self) -> bool:
        """True once the request's caller gave up (cancelled, deadline passed, server stopping)."""
        return bool(self._cancelled is not None and self._cancelled())

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            self._sender = InferenceResponseSender()
        return self._sender

    def exec(self, decoupled: bool = False):
        """Run this request on model `model_name` of the server (BLS). Returns its InferenceResponse (an error is
        `has_error()`, not raised), or with `decoupled` an iterator of its responses, ending with an empty one when
        the callee's final flag came alone (as Triton's). Blocks until the callee answered (or the caller's
        deadline, or the callee's admission timeout)."""
        if _bls_caller is None:
            raise _refuse("BLS outside a worker (InferenceRequest.exec)")
        responses = _bls_caller(self, bool(decoupled))
        return responses if decoupled else responses[0]

    def async_exec(self, decoupled: bool = False):
        """`exec` as an awaitable, for `async def execute`: it runs on the event loop's thread pool, so calls
        awaited together (asyncio.gather) are in flight at once."""

        async def call():
            # In the caller's context: the worker reads there which request the call belongs to.
            exec_here = functools.partial(contextvars.copy_context().run, self.exec, decoupled)
            return await asyncio.get_running_loop().run_in_executor(None, exec_here)

        return call()


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def _config_entry(model_config, kind: str, name: str) -> dict | None:
    if isinstance(model_config, str):
        model_config = json.loads(model_config)
    for entry in model_config.get(kind, []):
        if entry.get("name") == name:
            return entry
    return None


def get_input_config_by_name(model_config, name: str) -> dict | None:
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config, name: str) -> dict | None:
    return _config_entry(model_config, "output", name)


def triton_string_to_numpy(triton_type_string: str):
    """numpy type of a config data_type ("TYPE_FP32" -> np.float32). Raises KeyError for an unknown one."""
    return _STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int):
    """numpy type of a TRITONSERVER_DataType value (11 -> np.float32); None for an unknown value."""
    return _ENUM_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: npt.DTypeLike) -> int | None:
    """TRITONSERVER_DataType value of a numpy type (np.float32 -> 11); None when none fits."""
    dtype = np.dtype(data_type)
    if dtype.kind in ("O", "S", "U"):
        return 13
    for value, _, candidate in _TRITON_TYPES:
        if candidate is not np.object_ and np.dtype(candidate) == dtype:  # type: ignore[call-overload]  # a numpy type
            return value
    return None


def using_decoupled_model_transaction_policy(model_config) -> bool:
    if isinstance(model_config, str):
        model_config = json.loads(model_config)
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


class ModelConfig:
    """The configuration handed to `auto_complete_config`: read it with `as_dict`, complete it with the
    setters; the server uses what comes back. Setters refuse what contradicts the configuration."""

    def __init__(self, model_config: dict) -> None:
        self._config = model_config

    def as_dict(self) -> dict:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        if not isinstance(max_batch_size, int) or max_batch_size < 0:
            raise TritonModelException(f"max_batch_size must be an integer >= 0, got {max_batch_size!r}")
        current = int(self._config.get("max_batch_size", 0) or 0)
        if current not in (0, max_batch_size):
            raise TritonModelException(
                f"the configuration sets max_batch_size {current}; auto_complete_config asked for {max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict) -> None:
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise TritonModelException(f"model_transaction_policy has no field '{key}'")
        current = self._config.get("model_transaction_policy")
        if current and bool(current.get("decoupled")) != bool(transaction_policy_dict.get("decoupled")):
            raise TritonModelException("the configuration already sets model_transaction_policy differently")
        self._config["model_transaction_policy"] = dict(transaction_policy_dict)

    def add_input(self, input: dict) -> None:
        self._add("input", input)

    def add_output(self, output: dict) -> None:
        self._add("output", output)

    def _add(self, kind: str, tensor: dict) -> None:
        allowed = {"name", "data_type", "dims", "optional", "is_shape_tensor"}
        unknown = set(tensor) - allowed
        if "name" not in tensor:
            raise TritonModelException(f"add_{kind}: the tensor has no 'name'")
        if unknown:
            raise TritonModelException(f"add_{kind}: unknown fields {sorted(unknown)} for '{tensor['name']}'")
        entries = self._config.setdefault(kind, [])
        for entry in entries:
            if entry.get("name") != tensor["name"]:
                continue
            for key in ("data_type", "dims"):
                if key in tensor and key in entry and _normalized(entry[key]) != _normalized(tensor[key]):
                    raise TritonModelException(
                        f"{kind} '{tensor['name']}' has {key} {entry[key]} in the configuration; "
                        f"auto_complete_config gave {tensor[key]}"
                    )
                if key in tensor and key not in entry:
                    entry[key] = tensor[key]
            return
        entries.append(dict(tensor))


def _normalized(value):
    return [int(v) for v in value] if isinstance(value, list | tuple) else value


class MetricFamily:
    """Custom metrics: refused by name."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, *args, **kwargs) -> None:
        raise _refuse("custom metrics (MetricFamily)")


class Metric:
    def __init__(self, *args, **kwargs) -> None:
        raise _refuse("custom metrics (Metric)")


class Logger:
    """Writes to the server's log (the worker's stderr, which the server's process shares)."""

    class LogLevel:
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    _levels = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}

    @staticmethod
    def log(message: str, level: int = 0) -> None:
        logging.getLogger("slotserve.python_model").log(Logger._levels.get(level, logging.INFO), "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, Logger.LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, Logger.LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, Logger.LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, Logger.LogLevel.VERBOSE)


def _install() -> None:
    """Make this module importable as `triton_python_backend_utils` (the worker calls it)."""
    sys.modules.setdefault("triton_python_backend_utils", sys.modules[__name__])
