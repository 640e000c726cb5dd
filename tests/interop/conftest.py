"""Interop tests: third-party clients drive a slotserve started in this process from a separate process.

tritonclient registers its own copy of the protocol's .proto files in protobuf's default pool, which clashes with
slotserve's generated code, so it is never imported here: client scripts under clients/ run with
`subprocess.run`, assert what they check, and print one JSON object as their last line of stdout.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CLIENTS = Path(__file__).resolve().parent / "clients"
DEFAULT_TIMEOUT = 120.0


def run_process(command: list[str], *, timeout: float = DEFAULT_TIMEOUT, cwd: Path | None = None,
                input: str | None = None) -> subprocess.CompletedProcess:
    """Run `command`, failing the test (with its output) if it outlives `timeout`."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, input=input)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"{command} did not finish within {timeout}s\nstdout:\n{expired.stdout}\nstderr:\n{expired.stderr}")


def last_json_line(completed: subprocess.CompletedProcess) -> dict:
    """The JSON object on the last non-empty line of stdout; the test fails, showing the output, otherwise."""
    lines = [line for line in completed.stdout.splitlines() if line.strip()]
    assert lines, f"no output\nstderr:\n{completed.stderr}"
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        pytest.fail(f"the last line of stdout is not JSON:\n{completed.stdout}\nstderr:\n{completed.stderr}")


@pytest.fixture
def run_client():
    """`run_client(script, *args, timeout=...) -> dict`: run clients/<script> with this interpreter in a new
    process; assert that it exits 0 and return the JSON object it printed last."""
    def run(script: str, *args: str, timeout: float = DEFAULT_TIMEOUT) -> dict:
        completed = run_process([sys.executable, str(CLIENTS / script), *args], timeout=timeout)
        assert completed.returncode == 0, (
            f"{script} {' '.join(args)} exited {completed.returncode}\n"
            f"stdout:\n{completed.stdout}\nstderr:\n{completed.stderr}")
        return last_json_line(completed)
    return run
