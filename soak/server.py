"""The server under test: `python -m service` as a subprocess, and its /proc figures sampled over time.

It listens on 127.0.0.1:0 with the parallel runtime (--parallel-jobs 2), management allowed,
--max-resident-models 3 (seven loadable models: constant evictions), --idle-unload 4, --admission-timeout 2,
--max-queue 32, --max-workers 32, --no-load-at-startup. `Sampler` reads its VmRSS, Threads and open file
descriptors (/proc/<pid>) every 0.25 s, tagged with the soak's phase.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from .repository import ROOT

MAX_WORKERS = 32
SHUTDOWN_GRACE = 10.0
SERVER_FLAGS = [
    "--parallel-jobs",
    "2",
    "--allow-management",
    "--max-resident-models",
    "3",
    "--idle-unload",
    "4",
    "--admission-timeout",
    "2",
    "--max-queue",
    "32",
    "--max-workers",
    str(MAX_WORKERS),
    "--no-load-at-startup",
    "--shutdown-grace",
    str(SHUTDOWN_GRACE),
    "--stream-write-timeout",
    "10",
    "--enable-test-backends",
]  # its fx_* models are fixture models
WAIT = 30.0  # seconds any wait for a state may take
_LISTENING = re.compile(r"slotserve listening on (\S+)")
_ENV_DROP = ("SLOTSERVE_MANAGEMENT_TOKEN", "SLOTSERVE_INFERENCE_TOKEN")


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _ENV_DROP}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


class Server:
    def __init__(self, repository: Path, log_path: Path) -> None:
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
            *SERVER_FLAGS,
        ]
        self.log_path = log_path
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=self._log, text=True, env=environment()
        )
        self.pid = self.process.pid
        lines: queue.SimpleQueue = queue.SimpleQueue()

        def read() -> None:
            assert self.process.stdout is not None  # started with stdout=PIPE
            for line in self.process.stdout:
                lines.put(line)
            lines.put(None)

        self._reader = threading.Thread(target=read, name="server-stdout", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + 60
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise SystemExit(f"soak: the server did not start within 60 s; see {log_path}") from None
            if line is None:
                self.process.wait(timeout=10)
                raise SystemExit(f"soak: the server exited ({self.process.returncode}); see {log_path}")
            match = _LISTENING.search(line)
            if match:
                self.address = match.group(1)
                break
        if not self.address.startswith("127.0.0.1:"):
            self.kill()
            raise SystemExit(f"soak: the server listens on {self.address}, not 127.0.0.1")

    def proc(self) -> dict[str, int]:
        """VmRSS (KiB), Threads and open fds of the server now."""
        figures = {}
        with open(f"/proc/{self.pid}/status") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "Threads"):
                    figures[key] = int(value.split()[0])
        figures["fds"] = len(os.listdir(f"/proc/{self.pid}/fd"))
        return figures

    def fd_targets(self) -> Counter:
        """What the open fds are: socket, pipe, anon_inode:[eventfd], file paths."""
        kinds: Counter[str] = Counter()
        for fd in os.listdir(f"/proc/{self.pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{self.pid}/fd/{fd}")
                kinds[re.sub(r"\[\d+\]$", "", target)] += 1
        return kinds

    def wait_sockets(self, count: int) -> None:
        """Wait (bounded by WAIT) until the server holds `count` sockets: connections of clients that exited
        close asynchronously on its side."""
        deadline = time.monotonic() + WAIT
        while self.fd_targets()["socket:"] > count and time.monotonic() < deadline:
            time.sleep(0.1)  # ordering-free: re-checks a state predicate

    def thread_names(self) -> Counter:
        names: Counter[str] = Counter()
        for task in os.listdir(f"/proc/{self.pid}/task"):
            with contextlib.suppress(OSError):
                names[Path(f"/proc/{self.pid}/task/{task}/comm").read_text().strip()] += 1
        return names

    def terminate(self) -> tuple[int | None, float]:
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=SHUTDOWN_GRACE + 20)
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        return code, time.monotonic() - started

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
        self._log.close()


class Sampler(threading.Thread):
    """Samples the server's /proc figures every 0.25 s until stopped."""

    def __init__(self, server: Server) -> None:
        super().__init__(name="sampler", daemon=True)
        self.server = server
        self.samples: list[tuple[float, str, dict[str, int]]] = []  # (monotonic time, phase, figures)
        self.phase = "start"
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.25):
            with contextlib.suppress(OSError, ValueError):
                self.samples.append((time.monotonic(), self.phase, self.server.proc()))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)

    def peak(self, key: str, phase: str) -> int:
        values = [figures[key] for _, p, figures in self.samples if p == phase]
        return max(values) if values else 0
