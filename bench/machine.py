"""What the benchmark ran on: CPU, memory, kernel, library versions and the git commit."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import grpc
import numpy as np

from .common import ROOT
from .perf_analyzer import perf_analyzer_version


def machine_info() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        memory = Path("/proc/meminfo").read_text().splitlines()[0].split(":", 1)[1].strip()
    except (OSError, IndexError):
        pass
    versions = {"python": platform.python_version(), "grpcio": grpc.__version__, "numpy": np.__version__}
    for module in ("onnxruntime", "google.protobuf", "onnx"):
        try:
            versions[module] = __import__(module, fromlist=["__version__"]).__version__
        except ImportError:
            pass
    versions["perf_analyzer"] = perf_analyzer_version()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    )
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "memory": memory,
        "kernel": platform.release(),
        "loadavg_start": list(os.getloadavg()),
        "versions": versions,
        "git": (commit.stdout.strip() or "unknown") + ("+dirty" if dirty.stdout.strip() else ""),
    }
