"""Helpers shared by the integration tests: raw stubs, error capture, fixture-model repositories, wire bytes.

Expected values in these tests are computed here with numpy and struct, never with the server's own codec
(engine.tensor_codec), so a codec bug cannot hide behind a matching bug in the expectation.
"""

from __future__ import annotations

import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import grpc
import numpy as np
import pytest

from client import ClientError
from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]
DEMO_REPOSITORY = ROOT / "demo" / "model_repository"
CALL_TIMEOUT = 60.0  # seconds: bounds every raw-stub call so a broken server fails a test instead of hanging it

# KServe datatype -> numpy dtype (little-endian), written out here independently of engine.datatypes.
NUMPY_DTYPE = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}


def numpy_dtype(datatype: str) -> np.dtype:
    if datatype == "BF16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if datatype == "BYTES":
        return np.dtype(object)
    return NUMPY_DTYPE[datatype]


def require_demo() -> Path:
    if not (DEMO_REPOSITORY / "simple").exists():
        pytest.fail("the demo repository is missing: run `make models` (make test does it)")
    return DEMO_REPOSITORY


def demo_subset(directory: Path, *names: str) -> Path:
    """A repository at `directory` holding only the named demo models (copies: a symbolic link out of the
    repository is refused unless the server allows the demo's folder with --allow-model-root)."""
    demo = require_demo()
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copytree(demo / name, directory / name)
    return directory


def stub(running) -> pb_grpc.GRPCInferenceServiceStub:
    """A raw inference stub over the running server's client channel (for messages the client won't build)."""
    return pb_grpc.GRPCInferenceServiceStub(running.client.channel)


def rpc_error(method: Callable, request, **kwargs) -> ClientError:
    """Call a raw stub method that must fail; the failure as a ClientError (code, message, reason)."""
    with pytest.raises(grpc.RpcError) as info:
        method(request, timeout=CALL_TIMEOUT, **kwargs)
    return ClientError.from_rpc_error(info.value)


def client_error(function: Callable, *args, **kwargs) -> ClientError:
    """Call a client method that must fail; its ClientError."""
    with pytest.raises(ClientError) as info:
        function(*args, **kwargs)
    return info.value


# ---- repositories of fixture models ---------------------------------------------------------------------------


def _tensor_block(kind: str, name: str, config_type: str, dims: Sequence[int]) -> str:
    dims_text = "".join(f" dims: {d}" for d in dims)
    return f'{kind} {{ name: "{name}" data_type: {config_type}{dims_text} }}\n'


def write_fixture_model(
    repository: Path,
    name: str,
    *,
    inputs: Iterable[tuple[str, str, Sequence[int]]],
    outputs: Iterable[tuple[str, str, Sequence[int]]],
    max_batch_size: int = 0,
    extra: str = "",
) -> Path:
    """Write `<repository>/<name>/config.pbtxt` for a fixture-backend model (output i = input i cast to output i's
    datatype). Tensors are (name, KServe datatype, dims)."""
    directory = repository / name
    directory.mkdir(parents=True, exist_ok=True)
    text = f'name: "{name}"\nbackend: "fixture"\nmax_batch_size: {max_batch_size}\n'
    for tensor_name, datatype, dims in inputs:
        text += _tensor_block("input", tensor_name, config_type(datatype), dims)
    for tensor_name, datatype, dims in outputs:
        text += _tensor_block("output", tensor_name, config_type(datatype), dims)
    text += extra
    (directory / "config.pbtxt").write_text(text)
    return directory


def config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


# ---- wire bytes, written independently of the server's codec ---------------------------------------------------


def raw_bytes(array: np.ndarray, datatype: str) -> bytes:
    """Raw contents of `array` as the protocol defines them."""
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(element)) + element for element in array.reshape(-1))
    return np.ascontiguousarray(array, dtype=numpy_dtype(datatype)).tobytes()


def from_raw(buffer: bytes, datatype: str, shape: Sequence[int]) -> np.ndarray:
    """Parse raw contents (a copy, independent of the server's codec)."""
    shape = tuple(shape)
    if datatype != "BYTES":
        return np.frombuffer(buffer, dtype=numpy_dtype(datatype)).reshape(shape).copy()
    elements, offset = [], 0
    while offset < len(buffer):
        (length,) = struct.unpack_from("<I", buffer, offset)
        offset += 4
        elements.append(bytes(buffer[offset : offset + length]))
        offset += length
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array.reshape(shape)


def same_values(actual: np.ndarray, expected: np.ndarray) -> bool:
    """Exact equality: bit for bit for fixed-size types (so NaN payloads and -0.0 count), element-wise for BYTES."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False
    if expected.dtype == object:
        return all(a == e for a, e in zip(actual.reshape(-1), expected.reshape(-1), strict=True))
    return actual.tobytes() == expected.tobytes()


def simple_request(
    batch: int = 1, *, request_id: str = "", model: str = "simple"
) -> tuple[pb.ModelInferRequest, np.ndarray, np.ndarray]:
    """A valid raw request for the demo `simple` model (INT32 [batch, 16] x2) and its two inputs."""
    rng = np.random.default_rng(batch)
    first = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    second = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    for name, array in (("INPUT0", first), ("INPUT1", second)):
        request.inputs.add(name=name, datatype="INT32", shape=array.shape)
        request.raw_input_contents.append(array.astype("<i4").tobytes())
    return request, first, second


def check_simple_response(response: pb.ModelInferResponse, first: np.ndarray, second: np.ndarray) -> None:
    """`simple` returns OUTPUT0 = sum and OUTPUT1 = difference, raw."""
    outputs = {
        tensor.name: from_raw(raw, tensor.datatype, tensor.shape)
        for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True)
    }
    assert len(response.raw_output_contents) == len(response.outputs) == 2
    np.testing.assert_array_equal(outputs["OUTPUT0"], first + second)
    np.testing.assert_array_equal(outputs["OUTPUT1"], first - second)


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 10.0, poll: float = 0.001) -> None:
    """Poll `predicate` until it holds; fails the test naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll)  # ordering-free: re-checks a state predicate


def in_background(target: Callable[[], object]) -> tuple[threading.Thread, list]:
    """Run `target` on a daemon thread; the list gets its value or the exception it raised."""
    box: list = []

    def run() -> None:
        try:
            box.append(target())
        except BaseException as error:  # inspected by the test
            box.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box
