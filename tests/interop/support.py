"""Helpers the interop tests share: running a separate process with a timeout, reading its JSON answer."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

DEFAULT_TIMEOUT = 120.0


def run_process(
    command: list[str],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    cwd: Path | None = None,
    input: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run `command`, failing the test (with its output) if it outlives `timeout`."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, input=input, env=env)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(
            f"{command} did not finish within {timeout}s\nstdout:\n{expired.stdout!s}\nstderr:\n{expired.stderr!s}"
        )


def last_json_line(completed: subprocess.CompletedProcess) -> dict:
    """The JSON object on the last non-empty line of stdout; the test fails, showing the output, otherwise."""
    lines = [line for line in completed.stdout.splitlines() if line.strip()]
    assert lines, f"no output\nstderr:\n{completed.stderr}"
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        pytest.fail(f"the last line of stdout is not JSON:\n{completed.stdout}\nstderr:\n{completed.stderr}")
