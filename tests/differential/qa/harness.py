"""The QA port's tools: repositories written by the tests, one `Server` facade over Triton 2.51 and slotserve
(the same gRPC calls through the generated stub), tensors to and from the wire, streams read on a thread, and the
two markers that record a case's standing (see README.md).

A case is one test function run twice, once per server (`server` / `launch` parameter "triton" or "slotserve").
`slotserve_fails(cause)` makes the slotserve run an `xfail(strict=True)` (a later fix turns it into a failure
that must drop the marker); `triton_fails(reason)` skips both runs: a case Triton itself fails here is noted,
not counted.
"""

from __future__ import annotations

import _posixshmem
import importlib.util
import json
import os
import py_compile
import queue
import struct
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc

KINDS = ("triton", "slotserve")
CALL_TIMEOUT = 120.0  # a loaded machine; these calls answer in well under a second otherwise
STREAM_TIMEOUT = (
    120.0  # a whole stream's deadline (a loaded machine): a model that never sends its final flag fails the case then
)


def slotserve_fails(cause: str) -> pytest.MarkDecorator:
    """The case fails on slotserve for `cause` (which names the issue item and who fixes it): xfail(strict)."""
    return pytest.mark.qa_slotserve_fails(cause)


def triton_fails(reason: str) -> pytest.MarkDecorator:
    """Triton 2.51 itself fails the case here (`reason`): skipped on both, not counted."""
    return pytest.mark.qa_triton_fails(reason)


# ---- repositories ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Model:
    """A model folder: its config.pbtxt (None: no config file) and files relative to the folder (e.g.
    "1/model.py"; a name ending in "/" is an empty folder)."""

    config: str | None
    files: Mapping[str, str | bytes] = field(default_factory=dict)


def python_model(config: str, source: str, *, extra: Mapping[str, str] | None = None, version: str = "1") -> Model:
    """A python model: `config` (backend python is added when missing) and `source` as <version>/model.py,
    `extra` files beside it in the version folder."""
    if "backend:" not in config and "platform:" not in config:
        config = 'backend: "python"\n' + textwrap.dedent(config)
    files: dict[str, str | bytes] = {f"{version}/model.py": textwrap.dedent(source)}
    for name, text in (extra or {}).items():
        files[f"{version}/{name}"] = textwrap.dedent(text)
    return Model(textwrap.dedent(config), files)


def ensemble(config: str) -> Model:
    """An ensemble: its configuration and an empty version folder 1."""
    return Model(textwrap.dedent(config), {"1/": ""})


def write_repository(root: Path, models: Mapping[str, Model]) -> Path:
    """Write `models` under `root` (created); returns root."""
    root.mkdir(parents=True, exist_ok=True)
    for name, model in models.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        if model.config is not None:
            (folder / "config.pbtxt").write_text(model.config)
        for relative, content in model.files.items():
            path = folder / relative
            if relative.endswith("/"):  # a folder (an ensemble's empty version folder)
                path.mkdir(parents=True, exist_ok=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)
            if path.suffix == ".py":
                _compile(path)
    return root


def _compile(source: Path) -> None:
    """Write a .py file's bytecode now, where Python would write it at its first import: a __pycache__ folder
    appearing in a version folder after a load is a changed model to Triton (it then re-creates every instance,
    or loads the version again, at the next load). The servers' Python is this one's (3.11)."""
    try:
        py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)), doraise=True)
    except py_compile.PyCompileError:
        pass  # a model whose file does not compile on purpose


# ---- tensors -----------------------------------------------------------------------------------------------------

_DATATYPES = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.uint16): "UINT16",
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.int8): "INT8",
    np.dtype(np.int16): "INT16",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16",
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
}
_NUMPY = {name: dtype for dtype, name in _DATATYPES.items()}


@dataclass(frozen=True)
class Tensor:
    """An input given explicitly: its datatype and shape as sent, and its raw bytes (or a shared-memory region)."""

    datatype: str
    shape: tuple[int, ...]
    raw: bytes = b""
    region: tuple[str, int, int] | None = None  # (name, byte_size, offset)


def datatype_of(array: np.ndarray) -> str:
    if array.dtype.kind in "OSU":
        return "BYTES"
    return _DATATYPES[array.dtype]


def to_bytes(array: np.ndarray) -> bytes:
    """The raw wire bytes of an array (BYTES elements: 4-byte little-endian length, then the bytes)."""
    if array.dtype.kind in "OSU":
        parts = []
        for item in array.reshape(-1):
            data = item.encode() if isinstance(item, str) else bytes(item)
            parts.append(struct.pack("<I", len(data)) + data)
        return b"".join(parts)
    return np.ascontiguousarray(array).tobytes()


def tensor(array, datatype: str | None = None, shape: Iterable[int] | None = None) -> Tensor:
    """`array` as an input; `datatype` "BF16" truncates FP32 values; `shape` overrides the array's (a lie the
    server must catch)."""
    array = np.asarray(array)
    if datatype == "BF16":
        raw = (np.ascontiguousarray(array, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    else:
        datatype = datatype or datatype_of(array)
        raw = to_bytes(array)
    return Tensor(datatype, tuple(array.shape if shape is None else shape), raw)


def in_region(name: str, datatype: str, shape: Iterable[int], byte_size: int, offset: int = 0) -> Tensor:
    return Tensor(datatype, tuple(shape), region=(name, byte_size, offset))


def from_bytes(datatype: str, shape: Iterable[int], raw: bytes) -> np.ndarray:
    shape = tuple(shape)
    if datatype == "BYTES":
        items, position = [], 0
        while position < len(raw):
            (length,) = struct.unpack_from("<I", raw, position)
            items.append(raw[position + 4 : position + 4 + length])
            position += 4 + length
        return np.array(items, dtype=np.object_).reshape(shape)
    if datatype == "BF16":
        halves = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
        return halves.view(np.float32).reshape(shape)
    return np.frombuffer(raw, dtype=_NUMPY[datatype]).reshape(shape)


def outputs_of(response: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    """{name: array} of a response (raw outputs, or typed contents for BYTES sent that way)."""
    arrays: dict[str, np.ndarray] = {}
    for index, output in enumerate(response.outputs):
        raw = response.raw_output_contents[index] if index < len(response.raw_output_contents) else None
        if "shared_memory_region" in output.parameters or (raw == b"" and 0 not in output.shape):
            arrays[output.name] = np.empty(0)  # written into its shared-memory region: read it there
        elif raw is not None:
            arrays[output.name] = from_bytes(output.datatype, output.shape, raw)
        elif output.datatype == "BYTES":
            contents = list(output.contents.bytes_contents)
            arrays[output.name] = np.array(contents, dtype=np.object_).reshape(tuple(output.shape))
        else:
            arrays[output.name] = np.zeros(tuple(output.shape))  # in shared memory, or empty
    return arrays


def parameter(value) -> pb.InferParameter:
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int):
        return pb.InferParameter(int64_param=value)
    return pb.InferParameter(string_param=str(value))


def build_request(
    model: str,
    inputs: Mapping[str, Any],
    outputs: Iterable[str] | Mapping[str, tuple[str, int, int]] = (),
    *,
    id: str = "",
    version: str = "",
    parameters: Mapping[str, Any] | None = None,
) -> pb.ModelInferRequest:
    """A ModelInferRequest: `inputs` {name: array | Tensor}, `outputs` names or {name: (region, byte_size,
    offset)} for outputs into shared memory, request `parameters` (sequence_id, sequence_start, ...)."""
    request = pb.ModelInferRequest(model_name=model, model_version=version, id=id)
    for key, value in (parameters or {}).items():
        request.parameters[key].CopyFrom(parameter(value))
    raw = []
    for name, value in inputs.items():
        given = value if isinstance(value, Tensor) else tensor(value)
        entry = request.inputs.add(name=name, datatype=given.datatype, shape=list(given.shape))
        if given.region is not None:
            region, byte_size, offset = given.region
            entry.parameters["shared_memory_region"].string_param = region
            entry.parameters["shared_memory_byte_size"].int64_param = byte_size
            if offset:
                entry.parameters["shared_memory_offset"].int64_param = offset
        else:
            raw.append(given.raw)
    request.raw_input_contents.extend(raw)
    if isinstance(outputs, Mapping):
        for name, (region, byte_size, offset) in outputs.items():
            wanted = request.outputs.add(name=name)
            wanted.parameters["shared_memory_region"].string_param = region
            wanted.parameters["shared_memory_byte_size"].int64_param = byte_size
            if offset:
                wanted.parameters["shared_memory_offset"].int64_param = offset
    else:
        for name in outputs:
            request.outputs.add(name=name)
    return request


# ---- answers -----------------------------------------------------------------------------------------------------


@dataclass
class Answer:
    """One unary call's outcome: code "OK" or the gRPC status name, the error text, the outputs."""

    code: str
    message: str = ""
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    reply: Any = None

    @property
    def ok(self) -> bool:
        return self.code == "OK"

    def __getitem__(self, name: str) -> np.ndarray:
        assert self.ok, f"{self.code}: {self.message}"
        return self.outputs[name]


@dataclass
class StreamItem:
    """One stream message: an error text, or a response with its outputs."""

    error: str
    response: pb.ModelInferResponse
    outputs: dict[str, np.ndarray]

    @property
    def id(self) -> str:
        return self.response.id

    @property
    def final(self) -> bool | None:
        parameters = self.response.parameters
        return parameters["triton_final_response"].bool_param if "triton_final_response" in parameters else None


class Stream:
    """A ModelStreamInfer call: requests go in as `send` is called, replies are read on a thread into a queue.
    `next(timeout)` takes the next one (None when the stream ended, raises TimeoutError); `status` is the call's
    end (None while open). The whole call has `timeout` (its gRPC deadline). Used as a context manager: closing
    sends the end of the requests and waits for the call to end (at once cancelled when the case failed)."""

    _END = object()

    def __init__(self, stub: pb_grpc.GRPCInferenceServiceStub, metadata=(), timeout: float = STREAM_TIMEOUT) -> None:
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._replies: queue.SimpleQueue = queue.SimpleQueue()
        self.status: tuple[str, str] | None = None
        self._call = stub.ModelStreamInfer(iter(self._requests.get, self._END), timeout=timeout, metadata=metadata)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for reply in self._call:
                self._replies.put(
                    StreamItem(reply.error_message, reply.infer_response, outputs_of(reply.infer_response))
                )
            self.status = ("OK", "")
        except grpc.RpcError as error:
            self.status = (error.code().name, error.details() or "")
        self._replies.put(None)

    def send(self, request: pb.ModelInferRequest) -> None:
        self._requests.put(request)

    def next(self, timeout: float = CALL_TIMEOUT) -> StreamItem | None:
        try:
            return self._replies.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no stream reply within {timeout} s") from None

    def take(self, count: int, timeout: float = CALL_TIMEOUT) -> list[StreamItem]:
        """The next `count` replies (fewer if the stream ends first)."""
        deadline = time.monotonic() + timeout
        items: list[StreamItem] = []
        while len(items) < count:
            item = self.next(max(0.0, deadline - time.monotonic()))
            if item is None:
                break
            items.append(item)
        return items

    def rest(self, timeout: float = CALL_TIMEOUT) -> list[StreamItem]:
        """End the requests and return every reply still to come (until the call ends)."""
        self._requests.put(self._END)
        items = []
        while (item := self.next(timeout)) is not None:
            items.append(item)
        return items

    def cancel(self) -> None:
        self._call.cancel()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is not None:  # the case failed: do not wait for what is still to come
            self._call.cancel()
        self._requests.put(self._END)
        self._reader.join(CALL_TIMEOUT)
        if self._reader.is_alive():
            self._call.cancel()
            self._reader.join(CALL_TIMEOUT)


# ---- the servers -------------------------------------------------------------------------------------------------


@dataclass
class Server:
    """One server under test, on `repository`: `kind` "triton" or "slotserve"."""

    kind: str
    address: str
    stub: pb_grpc.GRPCInferenceServiceStub
    metrics_url: str
    repository: Path
    log: Path | None = None  # Triton's log file (slotserve logs into this process)

    # -- inference --

    def infer(
        self, model: str, inputs: Mapping[str, Any], outputs=(), *, timeout: float = CALL_TIMEOUT, **kw
    ) -> Answer:
        return self.send(build_request(model, inputs, outputs, **kw), timeout=timeout)

    def send(self, request: pb.ModelInferRequest, *, timeout: float = CALL_TIMEOUT) -> Answer:
        try:
            reply = self.stub.ModelInfer(request, timeout=timeout)
        except grpc.RpcError as error:
            return Answer(error.code().name, error.details() or "")
        return Answer("OK", "", outputs_of(reply), reply)

    def stream(self, metadata=(), timeout: float = STREAM_TIMEOUT) -> Stream:
        return Stream(self.stub, metadata, timeout)

    def stream_all(
        self, requests: Iterable[pb.ModelInferRequest], metadata=(), timeout=STREAM_TIMEOUT
    ) -> list[StreamItem]:
        """Send `requests` on one stream, end it, and return every reply. Raises AssertionError when the stream's
        deadline (`timeout`) ended it: the replies are then cut short, which no case may read as its answer."""
        with self.stream(metadata, timeout) as stream:
            for request in requests:
                stream.send(request)
            items = stream.rest()
        if stream.status is not None and stream.status[0] == "DEADLINE_EXCEEDED":
            raise AssertionError(f"the stream's {timeout} s deadline passed after {len(items)} replies")
        return items

    # -- control --

    def call(self, method: str, request) -> tuple[str, str, Any]:
        """(code name, details, reply) of a unary control call."""
        try:
            return "OK", "", getattr(self.stub, method)(request, timeout=CALL_TIMEOUT)
        except grpc.RpcError as error:
            return error.code().name, error.details() or "", None

    def ready(self, model: str, version: str = "") -> bool:
        code, _, reply = self.call("ModelReady", pb.ModelReadyRequest(name=model, version=version))
        return code == "OK" and reply.ready

    def load(self, model: str, config: str | None = None, files: Mapping[str, bytes] | None = None) -> tuple[str, str]:
        request = pb.RepositoryModelLoadRequest(model_name=model)
        if config is not None:
            request.parameters["config"].string_param = config
        for name, content in (files or {}).items():
            request.parameters[name].bytes_param = content
        code, message, _ = self.call("RepositoryModelLoad", request)
        return code, message

    def unload(self, model: str) -> tuple[str, str]:
        code, message, _ = self.call("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name=model))
        return code, message

    def index(self) -> dict[str, tuple[str, str, str]]:
        """{name: (version, state, reason)} of RepositoryIndex."""
        _, _, reply = self.call("RepositoryIndex", pb.RepositoryIndexRequest())
        return {m.name: (m.version, m.state, m.reason) for m in reply.models}

    def config(self, model: str) -> Any:
        code, message, reply = self.call("ModelConfig", pb.ModelConfigRequest(name=model))
        assert code == "OK", message
        return reply.config

    def statistics(self, model: str) -> Any:
        code, message, reply = self.call("ModelStatistics", pb.ModelStatisticsRequest(name=model))
        assert code == "OK", message
        return reply.model_stats[0]

    def metrics(self) -> str:
        """The metrics text. Triton starts its metrics server after it answers ready: a case that asks first (run
        alone) waits for it."""
        deadline = time.monotonic() + CALL_TIMEOUT
        while True:
            try:
                with urllib.request.urlopen(self.metrics_url, timeout=CALL_TIMEOUT) as reply:
                    return reply.read().decode()
            except urllib.error.URLError as error:
                if not isinstance(error.reason, ConnectionRefusedError) or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)  # ordering-free: polls until the metrics port listens, within a deadline

    # -- system shared memory --

    def register(self, name: str, key: str, byte_size: int, offset: int = 0) -> tuple[str, str]:
        request = pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=offset, byte_size=byte_size)
        code, message, _ = self.call("SystemSharedMemoryRegister", request)
        return code, message

    def unregister(self, name: str = "") -> tuple[str, str]:
        code, message, _ = self.call("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(name=name))
        return code, message

    def regions(self, name: str = "") -> tuple[str, str, list[str]]:
        code, message, reply = self.call("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(name=name))
        return code, message, sorted(reply.regions) if reply is not None else []


def wait_for(condition, what: str, seconds: float = 60.0, step: float = 0.05) -> None:
    """Poll `condition()` until true (an observable state: a file, a readiness); AssertionError after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(step)  # ordering-free: polls an observable state until a deadline


def json_of(array: np.ndarray) -> Any:
    """The JSON a model returned as a one-element BYTES output."""
    return json.loads(array.reshape(-1)[0])


class ClientRegion:
    """A POSIX shared-memory object a client creates (`key` "/name"), written and read through its descriptor;
    `close()` unlinks it."""

    def __init__(self, key: str, size: int) -> None:
        self.key = key
        self.descriptor = _posixshmem.shm_open(key, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
        os.ftruncate(self.descriptor, size)

    def write(self, array: np.ndarray, offset: int = 0) -> None:
        os.pwrite(self.descriptor, to_bytes(np.asarray(array)), offset)

    def read(self, dtype, count: int, offset: int = 0) -> np.ndarray:
        return np.frombuffer(os.pread(self.descriptor, count * np.dtype(dtype).itemsize, offset), dtype=dtype)

    def close(self) -> None:
        os.close(self.descriptor)
        try:
            _posixshmem.shm_unlink(self.key)
        except FileNotFoundError:
            pass
