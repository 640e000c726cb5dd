"""Real Triton as the reference: find the tritonserver that `bench/setup.sh` installs (nvidia-pytriton 0.7.0,
Triton 2.51 with its python backend), start it on free ports of 127.0.0.1, wait until it is ready, stop it.

Nothing is written into the venv: the backends folder is copied into a private folder, with the python backend's
stub for this Python (`python_backend_stubs/3.11/`) put into `backends/python/` there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]
VENV_NAME = ".venv-pytriton"
STUB_PYTHON = "3.11"  # the python backend's stub must match the venv's Python (bench/setup.sh uses python3.11)
READY_SECONDS = 120.0  # Triton starts in ~5-20 s; a loaded machine gets a wide margin
STOP_SECONDS = 30.0
PORT_ATTEMPTS = 3  # other processes on this machine pick free ports too


@dataclass(frozen=True)
class Installation:
    """Where the parts of one nvidia-pytriton install are."""

    venv: Path
    tritonserver: Path  # .../pytriton/tritonserver
    python_libdir: str  # libpython the stub links

    @property
    def binary(self) -> Path:
        return self.tritonserver / "bin" / "tritonserver"

    def library_path(self) -> str:
        """LD_LIBRARY_PATH for the server and its python stub: libpython, then the wheel's bundled libraries
        (`external_libs` in older wheels, `nvidia_pytriton.libs` beside the package in 0.7.0)."""
        site = self.tritonserver.parent.parent
        candidates = [self.tritonserver / "external_libs", site / "nvidia_pytriton.libs"]
        return ":".join([self.python_libdir, *(str(path) for path in candidates if path.is_dir())])


def find_installation(root: Path = ROOT) -> tuple[Installation | None, str]:
    """The checkout's bench/.venv-pytriton (or $SLOTSERVE_TRITON_VENV), or None with the reason it is unusable."""
    venv = Path(os.environ.get("SLOTSERVE_TRITON_VENV") or root / "bench" / VENV_NAME)
    hint = "real Triton is set up by bench/setup.sh (bench/.venv-pytriton) or named by $SLOTSERVE_TRITON_VENV"
    matches = sorted(venv.glob("lib/python3*/site-packages/pytriton/tritonserver"))
    if not matches:
        return None, f"{venv} has no pytriton/tritonserver: {hint}"
    tritonserver = matches[0]
    if not os.access(tritonserver / "bin" / "tritonserver", os.X_OK):
        return None, f"{tritonserver}/bin/tritonserver is not executable: {hint}"
    if not (tritonserver / "python_backend_stubs" / STUB_PYTHON / "triton_python_backend_stub").is_file():
        return None, f"{tritonserver} has no python backend stub for Python {STUB_PYTHON}: {hint}"
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    venv_python = venv / "bin" / "python"
    if venv_python.exists():  # the venv's own Python decides which libpython the stub needs
        completed = subprocess.run(
            [str(venv_python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        libdir = completed.stdout.strip() or libdir
    return Installation(venv, tritonserver, libdir), ""


def private_backends(installation: Installation, folder: Path) -> Path:
    """A copy of the backends folder with the python stub beside libtriton_python.so; the venv stays untouched."""
    backends = folder / "backends"
    if not backends.exists():
        shutil.copytree(installation.tritonserver / "backends", backends, ignore=shutil.ignore_patterns("__pycache__"))
        stub = installation.tritonserver / "python_backend_stubs" / STUB_PYTHON / "triton_python_backend_stub"
        shutil.copy2(stub, backends / "python" / "triton_python_backend_stub")
    return backends


def free_ports(count: int) -> list[int]:
    """Ports free now on 127.0.0.1 (held open together so that they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class RunningTriton:
    address: str  # host:port of its gRPC service
    metrics_url: str  # Prometheus text
    channel: grpc.Channel
    stub: pb_grpc.GRPCInferenceServiceStub
    process: subprocess.Popen
    log: Path

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class PortTaken(RuntimeError):
    """Another process took one of the ports between free_ports() and tritonserver's bind."""


def _wait_ready(stub: pb_grpc.GRPCInferenceServiceStub, process: subprocess.Popen, log: Path, port: int) -> None:
    """Poll until this process's log says its gRPC service started on `port` and ServerReady says true (the log
    line first, so that another server that holds the port is never taken for this one). Raises PortTaken if it
    exits because a port is in use, RuntimeError (with the log's tail) if it exits otherwise or the deadline
    passes. In explicit mode with nothing loaded Triton is ready at once, so this also covers that case."""
    started = f"Started GRPCInferenceService at 127.0.0.1:{port}"
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = _tail(log)
            error = PortTaken if "already in use" in tail else RuntimeError
            raise error(f"tritonserver exited {process.returncode}:\n{tail}")
        try:
            if (
                started in log.read_text(errors="replace")
                and stub.ServerReady(pb.ServerReadyRequest(), timeout=2).ready
            ):
                return
        except grpc.RpcError:
            pass
        time.sleep(0.2)  # ordering-free: polls an observable state until a deadline
    raise RuntimeError(f"tritonserver not ready within {READY_SECONDS}s:\n{_tail(log)}")


def _wait_metrics(url: str, process: subprocess.Popen, log: Path) -> None:
    """Block until Triton's metrics endpoint answers: tritonserver opens it after its gRPC port is ready, and a
    test that scraped it at once was refused the connection on a loaded machine (test_priorities' ensemble case).
    Raises RuntimeError with the log's tail after READY_SECONDS or when the process ends."""
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            pass
        time.sleep(0.1)  # ordering-free: polls an observable state until a deadline
    raise RuntimeError(f"tritonserver's metrics at {url} not answering within {READY_SECONDS}s:\n{_tail(log)}")


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def _stop(process: subprocess.Popen) -> None:
    """SIGINT (Triton's graceful stop), then SIGKILL after STOP_SECONDS; always reaps the process."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_SECONDS)


@contextlib.contextmanager
def run_triton(installation: Installation, repository: Path, folder: Path, *args: str) -> Iterator[RunningTriton]:
    """Start tritonserver on `repository` with extra command-line `args` (e.g. "--model-control-mode=explicit"),
    its log in `folder`/tritonserver-<port>.log; yield it once it is ready; stop it when the block ends, even when
    the test fails. A port taken by another process meanwhile means new ports (PORT_ATTEMPTS in all). Raises
    RuntimeError with the log's tail when it does not start."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        grpc_port, http_port, metrics_port = free_ports(3)
        process, log = _launch(installation, repository, folder, args, grpc_port, http_port, metrics_port)
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        try:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            try:
                _wait_ready(stub, process, log, grpc_port)
            except PortTaken:
                if attempt == PORT_ATTEMPTS:
                    raise
                continue
            metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
            if not any(arg.replace(" ", "=") == "--allow-metrics=false" for arg in args):
                _wait_metrics(metrics_url, process, log)
            yield RunningTriton(f"127.0.0.1:{grpc_port}", metrics_url, channel, stub, process, log)
            return
        finally:
            channel.close()
            _stop(process)


def _launch(installation, repository, folder, args, grpc_port, http_port, metrics_port):
    """Start the process (not waiting for it): (Popen, log path)."""
    backends = private_backends(installation, folder)
    log = folder / f"tritonserver-{grpc_port}.log"
    command = [
        str(installation.binary),
        f"--model-repository={repository}",
        f"--backend-directory={backends}",
        f"--grpc-port={grpc_port}",
        f"--http-port={http_port}",
        f"--metrics-port={metrics_port}",
        "--grpc-address=127.0.0.1",
        "--http-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        *args,
    ]
    environment = {
        **os.environ,
        "LD_LIBRARY_PATH": installation.library_path(),
        # The python stub takes its site-packages from the `python` on PATH: the venv's numpy 1.x, which the
        # stub was built for (with numpy 2 its output tensors come back empty, or are refused as the wrong size).
        "PATH": f"{installation.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=environment)
    return process, log
