"""slotserve's `triton_python_backend_utils`: the API a Triton python-backend `model.py` imports.

Written from Triton's documented python_backend API (its README). A worker process puts this module into
`sys.modules` under the name `triton_python_backend_utils` before it imports a model.py, so
`import triton_python_backend_utils as pb_utils` works without installing anything. It imports only numpy (and
its siblings dlpack.py, over numpy's DLPack, error_codes.py, Triton's error codes, and messages.py, the worker's
records), so unit tests (and model
code) can use it outside a worker. Arguments are checked as Triton's binding checks them, and misuse is refused in
Triton's words where its clients and tests read them.

What Triton has and slotserve does not is refused by name, never missing silently: GPU tensors (see
docs/python-models.md). Custom metrics (`MetricFamily`, `Metric`) go to the server's registry through the worker
(`_metrics_caller`; service/process/custom_metrics.py), each operation answered before it returns. A decoupled
model's response senders are the worker's (engine/python/worker.py): each `send` reaches the client before it
returns. BLS calls (`InferenceRequest(...).exec()`, `async_exec`) run through the worker too (`_bls_caller`);
outside a worker both are refused by name.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import functools
import json
import logging
import sys
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from .error_codes import TritonCode
from .messages import (
    FamilyNew,
    Labels,
    MetricAction,
    MetricAnswer,
    MetricKind,
    MetricNew,
    MetricOp,
    MetricRead,
    MetricUpdate,
)

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
_bls_caller: Callable[[InferenceRequest, bool], list[InferenceResponse] | Iterator[InferenceResponse]] | None = None


def _refuse(what: str) -> TritonModelException:
    return TritonModelException(f"{what} is not supported by slotserve's python backend yet")


class TritonModelException(Exception):
    """Raised by the API on misuse, as Triton's pb_utils raises it."""


class TritonError:
    """An error a model returns in an InferenceResponse (or raises): its code reaches the client."""

    # engine/python/error_codes.py's table, under the names Triton's TritonError gives them.
    UNKNOWN = TritonCode.UNKNOWN
    INTERNAL = TritonCode.INTERNAL
    NOT_FOUND = TritonCode.NOT_FOUND
    INVALID_ARG = TritonCode.INVALID_ARG
    UNAVAILABLE = TritonCode.UNAVAILABLE
    UNSUPPORTED = TritonCode.UNSUPPORTED
    ALREADY_EXISTS = TritonCode.ALREADY_EXISTS
    CANCELLED = TritonCode.CANCELLED

    def __init__(self, message: str, code: int = TritonCode.INTERNAL) -> None:
        if code not in range(len(TritonCode)):
            raise TritonModelException(f"TritonError code must be one of TritonError's codes 0..7, got {code!r}")
        self._message = str(message)
        self._code = int(code)

    def message(self) -> str:
        """The error's message."""
        return self._message

    def code(self) -> int:
        """The error's code (a TritonCode value; compare it with TritonError.NOT_FOUND and the like)."""
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class Tensor:
    """A named numpy array. BYTES tensors are numpy object arrays of `bytes` (str elements are accepted in
    outputs and sent UTF-8 encoded)."""

    def __init__(self, name: str, array: np.ndarray) -> None:
        if not isinstance(name, str):
            raise TypeError(f"a Tensor's name must be a str, got {type(name).__name__}")  # pybind's TypeError
        if not isinstance(array, np.ndarray):
            raise TypeError(
                f"Tensor '{name}' must be built from a numpy array, got {type(array).__name__} (a DLPack tensor: "
                "Tensor.from_dlpack; GPU tensors are not supported)"
            )
        if name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        self._name = name
        self._array = array

    @classmethod
    def _served(cls, name: str, array: np.ndarray) -> Tensor:
        """A request's input as the worker hands it to `execute`: its name and array are the server's, checked
        already, so the constructor's checks are skipped (every request's every input passes here)."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        return tensor

    def name(self) -> str:
        """The tensor's name."""
        return self._name

    def as_numpy(self) -> np.ndarray:
        """The tensor's numpy array (an input's is a read-only view, valid during execute)."""
        return self._array

    def shape(self) -> list[int]:
        """The tensor's shape, as a list."""
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        """The tensor's TRITONSERVER_DataType value (TYPE_FP32: 11)."""
        value = numpy_to_triton_type(self._array.dtype)
        assert value is not None  # a Tensor holds only arrays of the protocol's datatypes
        return value

    def is_cpu(self) -> bool:
        """Always True: slotserve's python models have CPU tensors only."""
        return True

    def to_dlpack(self) -> object:
        """A DLPack capsule of the tensor's data (a read-only or strided array is copied first). BF16 tensors too."""
        from . import dlpack

        return dlpack.export(self._array)

    def __dlpack__(self, stream: object = None) -> object:
        if stream is not None:
            raise TritonModelException("a CPU tensor takes no stream in __dlpack__ (stream must be None)")
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        from . import dlpack

        return (dlpack.CPU, 0)

    @staticmethod
    def from_dlpack(name: str, capsule: object) -> Tensor:
        """A Tensor over a DLPack capsule's memory, or an object with `__dlpack__` (numpy, torch, a Tensor); CPU
        and C-contiguous only, as in Triton. Raises TritonModelException in Triton's words."""
        from . import dlpack

        if not isinstance(name, str):
            raise TypeError(f"a Tensor's name must be a str, got {type(name).__name__}")
        if name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        try:
            return Tensor(name, dlpack.import_(capsule))
        except (TypeError, ValueError) as error:
            raise TritonModelException(str(error)) from None

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={list(self._array.shape)}, dtype={self._array.dtype})"


class InferenceResponse:
    """One request's answer: output tensors, or an error."""

    def __init__(
        self, output_tensors: Iterable[Tensor] | None = (), error: TritonError | None = None, parameters: object = None
    ) -> None:
        if output_tensors is None:
            raise TypeError("InferenceResponse output_tensors must be a list of pb_utils.Tensor, got None")
        tensors = list(output_tensors)
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
        """The response's output tensors (a copy of the list)."""
        return list(self._tensors)

    def has_error(self) -> bool:
        """Whether the response carries an error."""
        return self._error is not None

    def error(self) -> TritonError | None:
        """The response's TritonError, or None."""
        return self._error


class InferenceResponseSender:
    """The response sender of a model that is not decoupled: it takes one response, then the final flag
    (TRITONSERVER_RESPONSE_COMPLETE_FINAL, with the response or alone after it), from `execute` or from a thread
    after `execute` returned None (the worker then waits for it). Misuse raises TritonModelException in Triton's
    words. A decoupled model's requests get the worker's streaming sender instead."""

    def __init__(self, notify: Callable[[], None] | None = None) -> None:
        self.response: InferenceResponse | None = None
        self.closed = False
        self._notify = notify  # the worker's: a response or the final flag came
        self._lock = threading.Lock()  # guards: response, closed (sends may come from several threads)

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Keep `response` (at most one) and, with TRITONSERVER_RESPONSE_COMPLETE_FINAL, close the sender; the worker
        sends it when execute is done. Never blocks. Raises TritonModelException in Triton's words on misuse (a
        second response, the final flag first, a closed sender, a bad flag)."""
        final = _check_send(response, flags)
        with self._lock:
            if response is not None and self.response is not None:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one response."
                )
            if response is None and final and self.response is None:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final before sending a response."
                )
            if self.closed:
                raise TritonModelException(SENDER_CLOSED)
            if response is not None:
                self.response = response
            if final:
                self.closed = True
        if self._notify is not None:
            self._notify()

    def is_cancelled(self) -> bool:
        """Always False for a model that is not decoupled (its request's `is_cancelled` tells)."""
        return False


SENDER_CLOSED = "Unable to send response. Response sender has been closed."  # Triton's words


def _check_send(response: object, flags: int) -> bool:
    """Triton's checks of `send`'s arguments. Returns whether the final flag is set. Raises TritonModelException."""
    if response is not None and not isinstance(response, InferenceResponse):
        raise TritonModelException(f"send() takes an InferenceResponse, got {type(response).__name__}")
    if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
        raise TritonModelException("Unable to send response. Unsupported flag provided.")
    if flags == 0 and response is None:
        raise TritonModelException("Inference Response object must be provided when the response flags is set to zero.")
    return flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL


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
        model_name: str | bytes = "",
        inputs: Iterable[Tensor] | None = (),
        requested_output_names: Iterable[str | bytes] | None = (),
        request_id: str | bytes = "",
        correlation_id: int | str = 0,
        flags: int = 0,
        parameters: dict[str, Any] | str | None = None,
        timeout: int = 0,
        model_version: int = -1,
        preferred_memory: object = None,
        trace: object = None,
        *,
        _cancelled: Callable[[], bool] | None = None,
    ) -> None:
        # Triton's binding checks its arguments: None (or a wrong type) is a TypeError, a list element that is not
        # a Tensor a TritonModelException; a bytes name is taken as its UTF-8 text, as its std::string is.
        self._model_name = _text(model_name, "model_name")
        if inputs is None:
            raise TypeError("InferenceRequest inputs must be a list of pb_utils.Tensor, got None")
        self._inputs = list(inputs)
        for tensor in self._inputs:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"InferenceRequest inputs must be pb_utils.Tensor objects, got {type(tensor).__name__}"
                )
        if requested_output_names is None:
            raise TypeError("InferenceRequest requested_output_names must be a list of str, got None")
        self._requested = [_text(name, "requested_output_names") for name in requested_output_names]
        self._request_id = _text(request_id, "request_id")
        if correlation_id is None or isinstance(correlation_id, bool):
            raise TypeError(f"InferenceRequest correlation_id must be an int or a str, got {correlation_id!r}")
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        self._correlation_id = correlation_id
        for name, value in (("flags", flags), ("timeout", timeout), ("model_version", model_version)):
            if not isinstance(value, int | np.integer) or isinstance(value, bool):
                raise TypeError(f"InferenceRequest {name} must be an int, got {value!r}")
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
        self._sender_taken = False
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL  # set_release_flags (engine/python/rescheduling.py)

    @classmethod
    def _served(
        cls,
        model_name: str,
        inputs: list[Tensor],
        requested_output_names: list[str],
        request_id: str,
        correlation_id: int | str,
        flags: int,
        parameters: str,
        cancelled: Callable[[], bool],
    ) -> InferenceRequest:
        """A request as the worker hands it to `execute`: every field comes from the server, checked and typed
        already, so the constructor's checks (a model's BLS request's) are skipped; the fields are the same."""
        request = cls.__new__(cls)
        request._model_name = model_name
        request._inputs = inputs
        request._requested = requested_output_names
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._flags = flags
        request._parameters = parameters
        request._timeout = 0
        request._model_version = -1
        request._cancelled = cancelled
        request._sender = None
        request._sender_taken = False
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return request

    def inputs(self) -> list[Tensor]:
        """The request's input tensors (a copy of the list)."""
        return list(self._inputs)

    def requested_output_names(self) -> list[str]:
        """The outputs the client asked for (empty: all of them)."""
        return list(self._requested)

    def parameters(self) -> str:
        """The request's parameters as a JSON string, as in Triton."""
        return self._parameters

    def request_id(self) -> str:
        """The request's id ('' when the client set none)."""
        return self._request_id

    def correlation_id(self) -> int | str:
        """The request's sequence correlation id (0 when it belongs to none), an int or a str."""
        return self._correlation_id

    def flags(self) -> int:
        """The request's flags (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, _END)."""
        return self._flags

    def timeout(self) -> int:
        """The request's own timeout in microseconds (0: none); a BLS call's bounds its wait."""
        return self._timeout

    def model_name(self) -> str:
        """The model the request is for."""
        return self._model_name

    def model_version(self) -> int:
        """The version a BLS call asks for (-1: the highest ready one)."""
        return self._model_version

    def is_cancelled(self) -> bool:
        """True once the request's caller gave up (cancelled, deadline passed, server stopping)."""
        return bool(self._cancelled is not None and self._cancelled())

    def set_release_flags(self, flags: int) -> None:
        """TRITONSERVER_REQUEST_RELEASE_RESCHEDULE hands the request back unfinished: on a model with
        sequence_batching { iterative_sequence: true } it runs again later (return None for it; a decoupled model
        sets it before execute returns). engine/python/rescheduling.py."""
        self._release_flags = int(flags)

    def get_response_sender(self) -> InferenceResponseSender:
        """The request's response sender (the same one each time). Never blocks."""
        if self._sender is None:
            self._sender = InferenceResponseSender()
        self._sender_taken = True  # the worker waits only for the senders a model took
        return self._sender

    def exec(self, decoupled: bool = False) -> InferenceResponse | Iterator[InferenceResponse]:
        """Run this request on model `model_name` of the server (BLS). Returns its InferenceResponse (an error is
        `has_error()`, not raised), or with `decoupled` an iterator of its responses, ending with an empty one when
        the callee's final flag came alone (as Triton's). Blocks until the callee answered (or the caller's
        deadline, its cancellation, or the callee's admission timeout). Raises TritonModelException for a call that
        cannot be made (outside execute or a worker, an input no datatype fits, the server gone)."""
        if _bls_caller is None:
            raise _refuse("BLS outside a worker (InferenceRequest.exec)")
        responses = _bls_caller(self, bool(decoupled))
        if isinstance(responses, list):  # an ordinary call (not decoupled): its one response
            return responses[0]
        return responses

    def async_exec(
        self, decoupled: bool = False
    ) -> Coroutine[Any, Any, InferenceResponse | Iterator[InferenceResponse]]:
        """`exec` as an awaitable, for `async def execute`: it runs on the event loop's thread pool, so calls
        awaited together (asyncio.gather) are in flight at once."""

        async def call() -> InferenceResponse | Iterator[InferenceResponse]:
            # In the caller's context: the worker reads there which request the call belongs to.
            exec_here = functools.partial(contextvars.copy_context().run, self.exec, decoupled)
            return await asyncio.get_running_loop().run_in_executor(None, exec_here)

        return call()


def _text(value: object, what: str) -> str:
    """A str argument of Triton's binding: str, or bytes taken as UTF-8 text; TypeError otherwise."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise TypeError(f"InferenceRequest {what} must be UTF-8 text, got {value!r}") from None
    if not isinstance(value, str):
        raise TypeError(f"InferenceRequest {what} must be a str, got {type(value).__name__}")
    return value


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input named `name`; None when it has none."""
    for tensor in request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output named `name`; None when it has none."""
    for tensor in response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def _config_entry(model_config: dict[str, Any] | str, kind: str, name: str) -> dict[str, Any] | None:
    config: dict[str, Any] = json.loads(model_config) if isinstance(model_config, str) else model_config
    entries: list[dict[str, Any]] = config.get(kind, [])
    for entry in entries:
        if entry.get("name") == name:
            return entry
    return None


def get_input_config_by_name(model_config: dict[str, Any] | str, name: str) -> dict[str, Any] | None:
    """The configuration of input `name` (the configuration as a dict or its JSON); None when it has none."""
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any] | str, name: str) -> dict[str, Any] | None:
    """The configuration of output `name` (the configuration as a dict or its JSON); None when it has none."""
    return _config_entry(model_config, "output", name)


def triton_string_to_numpy(triton_type_string: str) -> object:
    """numpy type of a config data_type ("TYPE_FP32" -> np.float32). Raises KeyError for an unknown one."""
    return _STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> object:
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


def using_decoupled_model_transaction_policy(model_config: dict[str, Any] | str) -> bool:
    """Whether the configuration (a dict or its JSON) says `model_transaction_policy { decoupled: true }`."""
    config: dict[str, Any] = json.loads(model_config) if isinstance(model_config, str) else model_config
    return bool(config.get("model_transaction_policy", {}).get("decoupled", False))


class ModelConfig:
    """The configuration handed to `auto_complete_config`: read it with `as_dict`, complete it with the
    setters; the server uses what comes back. Setters refuse what contradicts the configuration."""

    def __init__(self, model_config: dict[str, Any]) -> None:
        self._config = model_config

    def as_dict(self) -> dict[str, Any]:
        """The configuration as a dict (the one the setters change)."""
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set max_batch_size. Raises TritonModelException for a negative value or one the configuration contradicts."""
        if not isinstance(max_batch_size, int) or max_batch_size < 0:
            raise TritonModelException(f"max_batch_size must be an integer >= 0, got {max_batch_size!r}")
        current = int(self._config.get("max_batch_size", 0) or 0)
        if current not in (0, max_batch_size):
            raise TritonModelException(
                f"the configuration sets max_batch_size {current}; auto_complete_config asked for {max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Turn dynamic batching on (an empty dynamic_batching section, unless there is one)."""
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Set model_transaction_policy ({'decoupled': bool}). Raises TritonModelException for another key or a
        policy the configuration contradicts."""
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise TritonModelException(f"model_transaction_policy has no field '{key}'")
        current = self._config.get("model_transaction_policy")
        if current and bool(current.get("decoupled")) != bool(transaction_policy_dict.get("decoupled")):
            raise TritonModelException("the configuration already sets model_transaction_policy differently")
        self._config["model_transaction_policy"] = dict(transaction_policy_dict)

    def add_input(self, input: dict[str, Any]) -> None:
        """Add an input (name, data_type, dims, optional), or complete the one of that name. Raises
        TritonModelException for an unknown field or a datatype or shape the configuration contradicts."""
        self._add("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        """Add an output, as `add_input`."""
        self._add("output", output)

    def _add(self, kind: str, tensor: dict[str, Any]) -> None:
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


def _normalized(value: object) -> object:
    return [int(v) for v in value] if isinstance(value, list | tuple) else value


# ---- custom metrics ------------------------------------------------------------------------------------------

# The worker's custom-metrics call (engine/python/worker.py Worker.metric): a messages.MetricOp -> the server's
# MetricAnswer; None outside a worker. `_instance_name` is the worker's model instance, which Triton's refusals name.
_metrics_caller: Callable[[MetricOp], MetricAnswer] | None = None
_instance_name = ""

_FAMILY_DELETED = (  # Triton's words (python_backend's metric.cc)
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The 'MetricFamily' object "
    "should be deleted AFTER its corresponding 'Metric' objects have been deleted."
)


def _metric_call(op: MetricOp, failing: str) -> MetricAnswer:
    """Send `op` to the server's registry (blocks for its answer). Raises TritonModelException "`failing`: <the
    server's refusal>" when the server refuses, or outside a worker."""
    caller = _metrics_caller
    if caller is None:
        raise TritonModelException(f"{failing}: custom metrics need a server (pb_utils runs outside a python worker)")
    answer = caller(op)
    if answer.error:
        raise TritonModelException(f"{failing}: {_refused(answer.error)}")
    return answer


def _refused(reason: str) -> str:
    """A refusal of the server's registry as Triton's python backend words one."""
    return f"Failed to process the request for model '{_instance_name}', message: {reason}"


def _metric_value(value: object, method: str) -> float:
    """`value` as a float, as Triton's binding converts it; TypeError (pybind's, in our words) for another type."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(
            f"{method}(): incompatible function arguments. The following argument types are supported: "
            f"(self: Metric, arg0: float) -> None; got {type(value).__name__} {value!r:.80}"
        )
    return float(value)


class MetricFamily:
    """A family of custom metrics (Prometheus): `MetricFamily(name=, description=, kind=MetricFamily.COUNTER)`,
    served on the server's metrics port beside its own. Made in the server's registry (which refuses a bad or taken
    name, another kind for a name that exists, and more than its bounds: docs/observability.md); a second family of
    the same name and kind is the first one (its first description is kept), as on Triton.

    Deleting the family (its last reference) makes its Metric objects refuse every operation, as Triton's do; the
    series stay on /metrics, with their values, until the model unloads (on Triton they go with the family)."""

    Kind = MetricKind
    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        if not isinstance(name, str) or not isinstance(description, str) or not isinstance(kind, MetricKind):
            raise TypeError(  # pybind's words for its constructor, then what was given
                "__init__(): incompatible constructor arguments. The following argument types are supported: "
                "MetricFamily(name: str, description: str, kind: MetricKind); got "
                f"name={name!r:.80}, description={description!r:.80}, kind={kind!r}"
            )
        self._name = name
        self._kind = kind
        self._metrics: weakref.WeakSet[Metric] = weakref.WeakSet()
        _metric_call(FamilyNew(name, description, kind), "Error when creating MetricFamily")

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:  # noqa: N802 - Triton's name
        """The metric of `labels` in this family (made, or the one that exists: two Metric objects of the same
        labels share one value). `buckets` (a list of strictly increasing upper bounds) is required for a
        histogram and refused otherwise. Raises TritonModelException in Triton's words."""
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        pairs = _labels(labels or {})
        bounds: tuple[float, ...] | None = None
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if self._kind != MetricKind.HISTOGRAM:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            bounds = tuple(_bucket(bound) for bound in buckets)
        elif self._kind == MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        _metric_call(MetricNew(self._name, pairs, bounds), "Error when creating Metric")
        metric = Metric(_made_by_family=(self._name, pairs))
        self._metrics.add(metric)
        return metric

    def __del__(self) -> None:
        # As Triton's family clears its metrics when it goes: they refuse every operation after this.
        for metric in list(getattr(self, "_metrics", ())):
            metric._cleared = True


def _labels(labels: dict[Any, Any]) -> Labels:
    """The labels as the record carries them, sorted by name (Prometheus' order). Raises TritonModelException for
    a value that is not a str, in Triton's words (its JSON reader's), then ours."""
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            what = f"label {key!r:.80}" if not isinstance(key, str) else f"label '{key}' is {type(value).__name__}"
            raise TritonModelException(
                "Error when creating Metric: "
                + _refused(f"attempt to access JSON non-string as string ({what}: label names and values must be str)")
            )
    return tuple(sorted(labels.items()))


def _bucket(bound: object) -> float:
    if isinstance(bound, bool) or not isinstance(bound, int | float | np.integer | np.floating):
        raise RuntimeError(
            f"Unable to cast Python instance to C++ type (a bucket bound must be a number, got {bound!r:.80})"
        )
    return float(bound)


class Metric:
    """One metric (a labelled series) of a MetricFamily, made by `family.Metric(...)`; every operation goes to the
    server, so each worker of the model (and a worker that replaced a dead one) sees one value. Raises
    TritonModelException in Triton's words for what its kind does not support (set or observe on a counter, a
    negative increment of a counter, increment, set or value on a histogram, observe on a gauge) and after its
    family was deleted."""

    def __init__(self, *args: object, _made_by_family: tuple[str, Labels] | None = None, **kwargs: object) -> None:
        if _made_by_family is None:  # Triton's Metric has no constructor of its own either
            raise TypeError("Metric objects are made by MetricFamily.Metric(labels=..., buckets=...)")
        self._family, self._labels = _made_by_family
        self._cleared = False

    def increment(self, value: float) -> None:
        """Add `value` (a gauge may go down; a counter refuses a negative value). Blocks for the server's answer."""
        self._update(MetricAction.INCREMENT, _metric_value(value, "increment"), "Failed to increment metric value")

    def set(self, value: float) -> None:
        """Set a gauge to `value`. Blocks for the server's answer."""
        self._update(MetricAction.SET, _metric_value(value, "set"), "Failed to set metric value")

    def observe(self, value: float) -> None:
        """Count `value` in a histogram. Blocks for the server's answer."""
        self._update(MetricAction.OBSERVE, _metric_value(value, "observe"), "Failed to observe metric value")

    def value(self) -> float:
        """The counter's or gauge's value, as the server holds it (every worker's updates). Blocks for it."""
        failing = "Failed to get metric value"
        self._check_alive(failing)
        return _metric_call(MetricRead(self._family, self._labels), failing).value

    def _update(self, action: MetricAction, value: float, failing: str) -> None:
        self._check_alive(failing)
        _metric_call(MetricUpdate(self._family, self._labels, action, value), failing)

    def _check_alive(self, failing: str) -> None:
        if self._cleared:
            raise TritonModelException(f"{failing}: {_FAMILY_DELETED}")


class Logger:
    """Writes to the server's log (the worker's stderr, which the server's process shares). Levels are
    `Logger.LogLevel` members (also `Logger.INFO` ...), as in Triton: a plain number is refused (TypeError)."""

    class LogLevel(enum.Enum):
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    _levels = {LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING, LogLevel.ERROR: logging.ERROR,
               LogLevel.VERBOSE: logging.DEBUG}  # fmt: skip

    @staticmethod
    def log(message: str, level: Logger.LogLevel = LogLevel.INFO) -> None:
        """Log `message` at `level`: one record on the worker's stderr, which the server reads into its log
        (engine/python/output.py). Raises TypeError for a message that is not a str or a level that is not a
        LogLevel."""
        if not isinstance(message, str):
            raise TypeError(f"Logger.log takes a str message, got {type(message).__name__}")
        if not isinstance(level, Logger.LogLevel):
            raise TypeError(f"Logger.log takes a Logger.LogLevel, got {level!r}")
        logging.getLogger("slotserve.python_model").log(Logger._levels[level], "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        """`log` at INFO."""
        Logger.log(message, Logger.LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        """`log` at WARNING."""
        Logger.log(message, Logger.LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        """`log` at ERROR."""
        Logger.log(message, Logger.LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        """`log` at VERBOSE (the server's DEBUG)."""
        Logger.log(message, Logger.LogLevel.VERBOSE)


def _install() -> None:
    """Make this module importable as `triton_python_backend_utils` (the worker calls it)."""
    sys.modules.setdefault("triton_python_backend_utils", sys.modules[__name__])
