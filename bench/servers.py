"""The servers under test, as subprocesses on free loopback ports: slotserve and the bare grpcio server."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc

from .common import BENCH, DEMO_REPOSITORY, LOGS, ROOT, log


class ServerProcess:
    """A server subprocess on a free loopback port (it is started with --port 0 and prints its address)."""

    def __init__(self, label: str, argv: list[str], cwd: Path) -> None:
        self.label = label
        self.argv = argv
        self.cwd = cwd
        self.process: subprocess.Popen | None = None
        self.environment: dict[str, str] = {}  # added to this process's environment
        self.address = ""
        self.startup_s = float("nan")
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", label)
        self.stdout_path = LOGS / f"{slug}.out"
        self.stderr_path = LOGS / f"{slug}.log"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 120.0) -> ServerProcess:
        LOGS.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.environment)
        started = time.perf_counter()
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(
                self.argv, cwd=self.cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env
            )
        deadline = started + timeout
        while time.perf_counter() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.label} exited with {self.process.returncode} before listening; see {self.stderr_path}"
                )
            match = re.search(r"listening on (\S+):(\d+)", self.stdout_path.read_text(errors="replace"))
            if match:
                host = match.group(1).strip("[]")
                self.address = f"{host}:{match.group(2)}"
                break
            time.sleep(0.02)
        else:
            self.stop()
            raise RuntimeError(f"{self.label} did not print its address within {timeout:.0f} s")
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            while time.perf_counter() < deadline:
                try:
                    if stub.ServerReady(pb.ServerReadyRequest(), timeout=5).ready:
                        break
                except grpc.RpcError:
                    pass
                time.sleep(0.02)
            else:
                self.stop()
                raise RuntimeError(f"{self.label} was not ready within {timeout:.0f} s")
        self.startup_s = time.perf_counter() - started
        log(f"started {self.label} (pid {self.pid}) on {self.address} in {self.startup_s:.2f} s")
        return self

    def explain(self, message: str) -> str:
        """For an "internal error (reference X)" from slotserve: the exception line its log has for X."""
        match = re.search(r"reference ([0-9a-f]+)", message)
        if not match or not self.stderr_path.exists():
            return message
        text = self.stderr_path.read_text(errors="replace")
        start = text.find(f"reference {match.group(1)}")
        if start < 0:
            return message
        for line in text[start:].splitlines()[1:80]:
            if re.match(r"^[A-Za-z_.]+(Error|Exception|Exit|Interrupt)\b", line):
                return f"{line.strip()} (server log {self.stderr_path.relative_to(ROOT)}; perf_analyzer: {message})"
        return message

    def rss_kib(self) -> int:
        return _status_kib(self.pid, "VmRSS")

    def hwm_kib(self) -> int:
        return _status_kib(self.pid, "VmHWM")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            log(f"{self.label} ignored SIGTERM for 20 s: killing it")
            self.process.kill()
            self.process.wait(timeout=10)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {key}")


class Launcher:
    """Builds the command lines of the servers under test."""

    def __init__(self, slotserve_root: Path, slotserve_args: list[str]) -> None:
        self.slotserve_root = slotserve_root
        self.slotserve_args = slotserve_args

    def slotserve(
        self, label: str, repository: Path, extra: tuple[str, ...] | list[str] = (), *, default_args: bool = True
    ):
        argv = [
            sys.executable,
            "-m",
            "service",
            "--model-repository",
            str(repository),
            "--port",
            "0",
            *(self.slotserve_args if default_args else []),
            *extra,
        ]
        return ServerProcess(label, argv, self.slotserve_root)

    def bare(self, label: str = "bare"):
        argv = [
            sys.executable,
            str(BENCH / "bare_server.py"),
            "--port",
            "0",
            "--model-repository",
            str(DEMO_REPOSITORY),
            "--models",
            "simple,identity_fp32",
        ]
        return ServerProcess(label, argv, ROOT)


# ------------------------------------------------------------------------------------------- perf_analyzer
