"""Real `python -m service` processes for shutdown tests: start on port 0, read the address the server prints,
send signals, time the exit, and order events through cross-process file gates, the server's status (GetModel /
ListModels through the client) and its log lines, never through sleeps. Every wait is bounded.

    with ServerProcess(repository, "--shutdown-grace", "2") as server:
        gates = FileGates(gate_dir, "m")
        gates.hold("execute")
        call = server.infer_async("m")
        gates.wait_arrived("execute")
        server.signal(signal.SIGTERM)
        ...
        assert server.wait_exit() == 0 and server.exit_seconds < bound

A process still running when the block ends (or the test fails) is killed and reaped.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from client import ClientError, InferenceClient, ManagementClient
from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]
WAIT = 20.0  # seconds any wait may take before the test fails (process start included)
MARGIN = 2.0  # service.process.server.SHUTDOWN_MARGIN: handlers get this long past the grace, twice over at most
# Process slack on top of drain + grace + 2 x MARGIN: the signal handler waking the main thread, closing engines,
# interpreter teardown. Measured exits stay well inside it (see the report printed by the tests).
EXIT_SLACK = 3.0
_LISTENING = re.compile(r"slotserve listening on (\S+)")


def frontends_built() -> bool:
    """Whether this tree's server has `--frontends` (issue 39): ServerOptions names the field."""
    from service.process.options import ServerOptions

    return "frontends" in getattr(ServerOptions, "__dataclass_fields__", {})


def frontend_options(frontends: int) -> dict[str, Any]:
    """The server options (service.testing.serve, ServerOptions) for `frontends` front-end processes: none for
    one, today's default, so that N = 1 runs the server exactly as it runs without the flag."""
    return {} if frontends == 1 else {"frontends": frontends}


def frontend_pids(server) -> list[int]:
    """`Server.frontend_pids()`: the front-end processes' ids in index order (empty with one front end, and on a
    tree without the flag)."""
    pids: Callable[[], list[int]] = getattr(server, "frontend_pids", list)
    return list(pids())


def frontend_flags(frontends: int) -> list[str]:
    """The same as command-line flags of `python -m service`."""
    return [] if frontends == 1 else ["--frontends", str(frontends)]


def exit_bound(drain: float, grace: float) -> float:
    """The most seconds from the signal to the process's exit a test accepts."""
    return drain + grace + 2 * MARGIN + EXIT_SLACK


def write_fixture_model(
    repository: Path, name: str, parameters: dict | None = None, *, inputs: str = "", outputs: str = ""
) -> Path:
    """A fixture-backend model (output = input) with string parameters, e.g. {"gate_dir": ..., "hang": ...}."""
    directory = repository / name
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f'name: "{name}"', 'backend: "fixture"', "max_batch_size: 0"]
    for key, value in (parameters or {}).items():
        lines.append(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}')
    (directory / "config.pbtxt").write_text("\n".join(lines) + "\n" + inputs + outputs)
    return directory


class FileGates:
    """The test side of the fixture's cross-process file gates of one model (see engine/testing/fixture.py)."""

    def __init__(self, directory: Path, model: str) -> None:
        self.directory = Path(directory)
        self.model = model
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, point: str, suffix: str) -> Path:
        return self.directory / f"{self.model}.{point}.{suffix}"

    def hold(self, point: str) -> None:
        self._path(point, "hold").touch()

    def release(self, point: str) -> None:
        self._path(point, "release").touch()

    def arrived(self, point: str) -> bool:
        return self._path(point, "arrived").exists()

    def wait_arrived(self, point: str, timeout: float = WAIT) -> None:
        wait_until(lambda: self.arrived(point), f"{self.model} to arrive at its {point} gate", timeout)


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT, poll: float = 0.005) -> float:
    """Re-check a state predicate until it holds; returns the seconds it took. The order of events comes from the
    predicate, never from the delay. Raises AssertionError after `timeout`."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)  # ordering-free: re-checks a state predicate
    return time.monotonic() - started


def infer_request(model: str, values: np.ndarray | None = None, name: str = "INPUT0") -> pb.ModelInferRequest:
    array = np.asarray(values if values is not None else np.arange(4, dtype=np.float32), dtype=np.float32)
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name=name, datatype="FP32", shape=list(array.shape))
    request.raw_input_contents.append(array.tobytes())
    return request


VALUES = np.array([1.0, 2.0, 3.0], dtype=np.float32)  # the fixture models' usual input (output = input)


def output_of(response) -> np.ndarray:
    return np.frombuffer(response.raw_output_contents[0], dtype=np.float32)


def assert_ok(call, expected=VALUES):
    """The call (see `outcome`) succeeded, with `expected` as its output (None: any); returns its response."""
    code, value = outcome(call)
    assert code == "OK", value
    if expected is not None:
        np.testing.assert_array_equal(output_of(value), expected)
    return value


def assert_shutting_down(call) -> None:
    """The call was refused with UNAVAILABLE `shutting_down`."""
    code, error = outcome(call)
    assert (code, error.reason) == ("UNAVAILABLE", "shutting_down"), error


def outcome(future: futures.Future | grpc.Future, timeout: float = WAIT):
    """("OK", value) or (code name, ClientError) of a call started with `ServerProcess.call_async`/`.future()`."""
    try:
        return "OK", future.result(timeout=timeout)
    except grpc.FutureCancelledError:  # cancelled by this side (grpc.Future.cancel)
        return "CANCELLED", ClientError("CANCELLED", "cancelled by the client")
    except grpc.FutureTimeoutError:
        raise AssertionError(f"the call did not end within {timeout} s") from None
    except grpc.RpcError as error:
        failure = ClientError.from_rpc_error(error)
        return failure.code, failure
    except ClientError as error:
        return error.code, error
    except futures.TimeoutError:
        raise AssertionError(f"the call did not end within {timeout} s") from None


class ServerProcess:
    """One `python -m service` process on 127.0.0.1:<free port>."""

    def __init__(
        self,
        repository: Path,
        *flags: str,
        log_level: str = "INFO",
        test_backends: bool = True,
        frontends: int = 1,
    ) -> None:
        # Shutdown tests hold fixture models' file gates, so the fixture backend is on unless a test says not.
        command = [
            sys.executable,
            "-m",
            "service",
            "--model-repository",
            str(repository),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--log-level",
            log_level,
            *(["--enable-test-backends"] if test_backends else []),
            *frontend_flags(frontends),
            *flags,
        ]
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._log: list[str] = []
        self._log_lock = threading.Lock()  # guards: _log
        sinks = ((self.process.stdout, self._lines.put), (self.process.stderr, self._log_line))
        self._readers = [
            threading.Thread(target=self._read, args=(stream, sink), daemon=True) for stream, sink in sinks
        ]
        for reader in self._readers:
            reader.start()
        self.signalled_at: float | None = None
        self.exited_at: float | None = None
        self._pool = futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="test-call")
        self._channels: list[grpc.Channel] = []
        self.address = self._wait_listening()
        self.client = InferenceClient(self.address, timeout=WAIT)
        self.management = ManagementClient(self.address, timeout=WAIT, token="")
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.client.channel)

    # ---- output ---------------------------------------------------------------------------------------------

    @staticmethod
    def _read(stream, sink) -> None:
        for line in stream:
            sink(line.rstrip("\n"))
        sink(None)

    def _log_line(self, line: str | None) -> None:
        if line is not None:
            with self._log_lock:
                self._log.append(line)

    @property
    def log(self) -> str:
        with self._log_lock:
            return "\n".join(self._log)

    def wait_log(self, text: str, timeout: float = WAIT) -> None:
        """Wait until the server's log (stderr) contains `text`: a state it reports, such as a shutdown step."""
        wait_until(lambda: text in self.log, f"log line {text!r}", timeout)

    def _wait_listening(self) -> str:
        deadline = time.monotonic() + WAIT
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise AssertionError(f"the server did not print its address within {WAIT} s:\n{self.log}") from None
            if line is None:
                self.process.wait(timeout=WAIT)
                raise AssertionError(f"the server exited ({self.process.returncode}) before listening:\n{self.log}")
            match = _LISTENING.search(line)
            if match:
                return match.group(1)

    # ---- calls ----------------------------------------------------------------------------------------------

    def channel(self) -> grpc.Channel:
        """A new channel (a new connection) to the server; closed at the end."""
        channel = grpc.insecure_channel(
            self.address, options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        )
        self._channels.append(channel)
        return channel

    def infer_async(self, model: str, values: np.ndarray | None = None, timeout: float = WAIT) -> grpc.Future:
        """A ModelInfer on its own connection, as a cancellable future (outcome() reads it)."""
        stub = pb_grpc.GRPCInferenceServiceStub(self.channel())
        return stub.ModelInfer.future(infer_request(model, values), timeout=timeout)

    def call_async(self, function: Callable, *args, **kwargs) -> futures.Future:
        """Any blocking client call on a worker thread."""
        return self._pool.submit(function, *args, **kwargs)

    def status(self, model: str):
        return self.management.get(model, timeout=5)

    def wait_status(self, model: str, predicate: Callable[[object], bool], what: str = "", timeout: float = WAIT):
        """Poll GetModel until `predicate(status)` holds; returns that status."""
        seen: list = []

        def check() -> bool:
            seen[:] = [self.status(model)]
            return predicate(seen[0])

        wait_until(check, what or f"status of {model}", timeout, poll=0.01)
        return seen[0]

    def refuses_new_connections(self) -> bool:
        """True when a fresh connection cannot make a call (the listener is closed)."""
        return refuses_new_connections(self.address)

    # ---- signals and exit -----------------------------------------------------------------------------------

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()

    def signal_other_thread(self, signum: int) -> int:
        """Send `signum` to one non-main thread of the server (tgkill), as the kernel may deliver a
        process-directed signal to any thread that does not block it. Returns that thread's id."""
        pid = self.process.pid
        threads = sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid)
        assert threads, "the server has no thread besides the main one"
        tid = threads[-1]
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.tgkill(pid, tid, int(signum)) != 0:
            raise OSError(ctypes.get_errno(), f"tgkill({pid}, {tid}, {signum}) failed")
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()
        return tid

    def wait_exit(self, timeout: float = WAIT) -> int:
        """Wait for the process to exit; returns its exit code. `exit_seconds` is then the time since the first
        signal."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the server did not exit within {timeout} s:\n{self.log}") from None
        if self.exited_at is None:
            self.exited_at = time.monotonic()
        for reader in self._readers:
            reader.join(timeout=5)
        return code

    @property
    def exit_seconds(self) -> float:
        assert self.signalled_at is not None and self.exited_at is not None
        return self.exited_at - self.signalled_at

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass

    def close(self) -> None:
        """Kill the process if it still runs; close clients and channels; let pending call futures finish."""
        self.kill()
        for closeable in (getattr(self, "client", None), getattr(self, "management", None)):
            if closeable is not None:
                closeable.close()
        for channel in self._channels:
            channel.close()
        self._pool.shutdown(wait=True, cancel_futures=True)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def write_slow_onnx_model(repository: Path, name: str = "slow", nodes: int = 1000) -> Path:
    """A real ONNX model that takes long to run: OUTPUT0 = tanh(...tanh(tanh(INPUT0 @ W) @ W)...) with `nodes`
    MatMul+Tanh pairs over ONE shared 512x512 initializer, so the file stays near 1 MiB. INPUT0 is [-1, 512]
    FP32: the run time grows with the number of rows (about 4 ms per row for 1000 nodes on one thread of a
    current CPU), so the same model answers a few rows at once and runs for seconds on a thousand.
    intra_op_num_threads = 1 keeps one run on one core."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = (np.random.default_rng(0).standard_normal((512, 512)) / np.sqrt(512)).astype(np.float32)
    graph_nodes, previous = [], "INPUT0"
    for index in range(nodes):
        graph_nodes.append(helper.make_node("MatMul", [previous, "W"], [f"mm{index}"]))
        output = "OUTPUT0" if index == nodes - 1 else f"th{index}"
        graph_nodes.append(helper.make_node("Tanh", [f"mm{index}"], [output]))
        previous = output
    graph = helper.make_graph(
        graph_nodes,
        name,
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [-1, 512])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [-1, 512])],
        [numpy_helper.from_array(weights, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    directory = repository / name
    (directory / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(directory / "1" / "model.onnx"))
    (directory / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        'input { name: "INPUT0" data_type: TYPE_FP32 dims: -1 dims: 512 }\n'
        'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: -1 dims: 512 }\n'
        'parameters { key: "intra_op_num_threads" value { string_value: "1" } }\n'
    )
    return directory


def slow_rows(count: int) -> np.ndarray:
    return np.full((count, 512), 0.5, dtype=np.float32)


# ---- in-process servers (service.testing.serve) ------------------------------------------------------------------


class Background:
    """A blocking call on its own thread (e.g. Server.shutdown); `result()` is bounded."""

    def __init__(self, function: Callable, *args, **kwargs) -> None:
        self._future: futures.Future = futures.Future()

        def run() -> None:
            try:
                self._future.set_result(function(*args, **kwargs))
            except BaseException as error:  # handed to the test through result()
                self._future.set_exception(error)

        self.thread = threading.Thread(target=run, daemon=True)
        self.started_at = time.monotonic()
        self.thread.start()

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float = WAIT):
        try:
            return self._future.result(timeout=timeout)
        except futures.TimeoutError:
            raise AssertionError(f"the call did not return within {timeout} s") from None


def refuses_new_connections(address: str) -> bool:
    """True when a fresh connection to `address` cannot make a call (the listener is closed)."""
    with InferenceClient(address, timeout=5) as probe:
        try:
            probe.live()
        except ClientError as error:
            return error.code == "UNAVAILABLE"
    return False


def wait_stopped_accepting(address: str, timeout: float = WAIT) -> None:
    """Wait until the server at `address` no longer accepts connections (shutdown step 3 has begun)."""
    wait_until(lambda: refuses_new_connections(address), f"{address} to stop accepting", timeout, poll=0.01)


class InProcess:
    """An in-process server (service.testing.serve) over fixture models whose in-process gates the test holds.

    `client`/`management` go through gRPC (status as clients see it); `core_status` reads the registry directly,
    which keeps working while the server shuts down and after. `close()` releases every gate first, so no
    handler is left blocked, then stops the server.

    `frontends=N` (issue 39) serves the port from N front-end processes: this process stays the admission
    process (registry, admission, engines, the fixture's in-process gates), the front ends are its children.
    `controls` shares the test's FixtureControls with a fixture backend of its own passed in `backends`.
    """

    def __init__(
        self,
        root: Path,
        models: dict[str, dict],
        backends: dict | None = None,
        *,
        frontends: int = 1,
        controls=None,
        **options,
    ) -> None:
        from engine.testing.fixture import FixtureBackend, FixtureControls
        from service.testing import serve

        for name, parameters in models.items():
            write_fixture_model(root, name, parameters)
        self.controls = controls if controls is not None else FixtureControls()
        self.frontends = frontends
        self._stack = contextlib.ExitStack()
        self.running = self._stack.enter_context(
            serve(
                root,
                backends={"fixture": FixtureBackend(self.controls), **(backends or {})},
                **frontend_options(frontends),
                **options,
            )
        )
        self.server = self.running.server
        self.address = self.running.address
        self.client = self.running.client
        self.management = self.running.management
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.client.channel)
        self._pool = futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="test-call")

    def gate(self, model: str, point: str):
        return self.controls.gate(model, point)

    def frontend_pids(self) -> list[int]:
        """The front-end processes' ids, in index order; empty with one front end (the server itself)."""
        return frontend_pids(self.server) if self.frontends > 1 else []

    def infer(self, model: str, values: np.ndarray | None = None, timeout: float = WAIT) -> grpc.Future:
        """A ModelInfer as a cancellable future (`outcome()` reads it)."""
        return self.stub.ModelInfer.future(infer_request(model, values), timeout=timeout)

    def call(self, function: Callable, *args, **kwargs) -> futures.Future:
        return self._pool.submit(function, *args, **kwargs)

    def status(self, model: str):
        """GetModel through the client."""
        return self.management.get(model, timeout=5)

    def wait_status(self, model: str, predicate: Callable[..., bool], what: str = "", timeout: float = WAIT) -> float:
        """Poll GetModel until `predicate(status)` holds; returns the seconds it took."""
        return wait_until(lambda: predicate(self.status(model)), what or f"status of {model}", timeout, poll=0.002)

    def core_status(self, model: str):
        """The registry's own status (service.core.lifecycle.ModelStatus), readable at any time."""
        return self.server.registry.get(model).status()

    def wait_core(self, model: str, predicate: Callable[..., bool], what: str = "", timeout: float = WAIT) -> float:
        return wait_until(lambda: predicate(self.core_status(model)), what or f"status of {model}", timeout, poll=0.002)

    def shutdown(self, *, drain: float = 0.0, grace: float = 10.0, margin: float = MARGIN) -> Background:
        """Start Server.shutdown on its own thread; `.result()` is its ShutdownReport."""
        return Background(self.server.shutdown, drain_seconds=drain, grace=grace, margin=margin)

    def close(self) -> None:
        self.controls.release_all()
        try:
            self._stack.close()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)


# Real processes record their measured exits here; tests/shutdown/conftest.py prints them at the end.
MEASURED_EXITS: list[tuple[str, float, float]] = []  # (test, seconds from signal to exit, bound)


def record_exit(name: str, server: ServerProcess, bound: float) -> None:
    MEASURED_EXITS.append((name, server.exit_seconds, bound))


__all__ = [
    "ServerProcess",
    "FileGates",
    "Background",
    "wait_until",
    "outcome",
    "exit_bound",
    "frontends_built",
    "frontend_options",
    "frontend_flags",
    "frontend_pids",
    "write_fixture_model",
    "write_slow_onnx_model",
    "slow_rows",
    "infer_request",
    "record_exit",
    "refuses_new_connections",
    "wait_stopped_accepting",
    "InProcess",
    "MEASURED_EXITS",
    "WAIT",
    "MARGIN",
]
