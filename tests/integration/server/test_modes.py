"""The runtime mode is chosen once at startup, and the startup banner states its scope."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.contract.harness import write_fixture_model


def _startup_log(repository, *flags: str) -> str:
    process = subprocess.Popen(
        [sys.executable, "-m", "service", "--model-repository", str(repository), "--port", "0", *flags],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        assert process.stdout is not None  # stdout=PIPE
        line = process.stdout.readline()  # printed once serving
        assert "listening on" in line, line
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0
        return stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture
def repository(tmp_path):
    write_fixture_model(tmp_path, "m")
    return tmp_path


def test_parallel_runtime_prints_its_scope(repository):
    log = _startup_log(repository, "--parallel-jobs", "3")
    assert "parallel runtime: 3 slot(s) per model by default" in log
    assert "backends admitting more than one slot: onnxruntime" in log
    assert "not validated: TensorRT on a GPU" in log


def test_without_parallel_jobs_every_model_has_one_slot(repository):
    log = _startup_log(repository)
    assert "one slot per model" in log
    assert "parallel runtime:" not in log


@pytest.mark.parametrize("value", ["0", "17"])
def test_parallel_jobs_outside_1_to_16_is_refused_at_startup(repository, value):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "service",
            "--model-repository",
            str(repository),
            "--port",
            "0",
            "--parallel-jobs",
            value,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--parallel-jobs must be 1..16" in result.stderr
