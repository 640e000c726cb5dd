"""`--exit-on-error` asked of real Triton 2.51 and of slotserve (issue 35, item 4): the same repository (a python
model whose `initialize` raises, beside one that loads), the same flag, both processes' exit.

Triton's answer, kept here so that a change shows: with `--exit-on-error=true` (its default) it exits with a
non-zero status once the startup loads are done; with `=false` it serves the good model and lists the broken one as
UNAVAILABLE. slotserve gives the same answers to the same flag; only its default differs (false, documented in
docs/migrating-from-triton.md).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from generated import grpc_service_pb2 as pb

from .calls import outcome
from .conftest import INSTALLATION, MISSING_REASON
from .reference import ROOT, _launch, free_ports

EXIT_SECONDS = 120.0  # Triton loads the python stub first: slow on a loaded machine
GOOD = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        outputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", output)]) for output in outputs]
"""
BROKEN = """class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("this model refuses to load")

    def execute(self, requests):
        return []
"""
CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
"""


def write_repository(root):
    repository = root / "models"
    for name, code in (("good", GOOD), ("broken", BROKEN)):
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(CONFIG.format(name=name))
        (repository / name / "1" / "model.py").write_text(code)
    return repository


def triton_exit(repository, folder, *args: str) -> tuple[int | None, str]:
    """Start tritonserver and wait up to EXIT_SECONDS for it to exit: (its status or None if still running, log)."""
    folder.mkdir(parents=True, exist_ok=True)
    grpc_port, http_port, metrics_port = free_ports(3)
    process, log = _launch(INSTALLATION, repository, folder, args, grpc_port, http_port, metrics_port)
    try:
        return process.wait(timeout=EXIT_SECONDS), log.read_text(errors="replace")
    except subprocess.TimeoutExpired:
        return None, log.read_text(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def test_exit_on_error_true_stops_both_servers(tmp_path):
    if INSTALLATION is None:
        pytest.skip(MISSING_REASON)
    repository = write_repository(tmp_path)
    status, log = triton_exit(repository, tmp_path / "triton", "--exit-on-error=true")
    assert status not in (None, 0), log[-3000:]  # Triton's answer
    assert "this model refuses to load" in log
    ours = subprocess.run(
        [sys.executable, "-m", "service", f"--model-repository={repository}", "--grpc-port=0", "--exit-on-error=true"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=EXIT_SECONDS,
    )
    assert ours.returncode not in (None, 0) and "failed to load at startup: 'broken'" in ours.stderr, ours.stderr


def test_exit_on_error_false_serves_the_others_on_both(triton, slotserve_endpoint, tmp_path):
    """Triton needs --strict-readiness=false too (its ServerReady is false while a model failed, and the harness
    waits for ServerReady): slotserve's ServerReady is always that one, and it accepts only that value."""
    repository = write_repository(tmp_path)
    endpoints = (
        triton(repository, "--exit-on-error=false", "--strict-readiness=false"),
        slotserve_endpoint(repository, exit_on_error=False),
    )
    for endpoint in endpoints:
        ready = {
            name: outcome(endpoint.stub.ModelReady, pb.ModelReadyRequest(name=name))[1].ready
            for name in ("good", "broken")
        }
        assert ready == {"good": True, "broken": False}, endpoint.name
