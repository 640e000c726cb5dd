"""Interop tests: third-party clients drive a slotserve started in this process from a separate process.

tritonclient registers its own copy of the protocol's .proto files in protobuf's default pool, which clashes with
slotserve's generated code, so it is never imported here: client scripts under clients/ run with
`subprocess.run`, assert what they check, and print one JSON object as their last line of stdout.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .support import DEFAULT_TIMEOUT, last_json_line, run_process

CLIENTS = Path(__file__).resolve().parent / "clients"


@pytest.fixture
def run_client():
    """`run_client(script, *args, timeout=...) -> dict`: run clients/<script> with this interpreter in a new
    process; assert that it exits 0 and return the JSON object it printed last."""

    def run(script: str, *args: str, timeout: float = DEFAULT_TIMEOUT) -> dict:
        completed = run_process([sys.executable, str(CLIENTS / script), *args], timeout=timeout)
        assert completed.returncode == 0, (
            f"{script} {' '.join(args)} exited {completed.returncode}\n"
            f"stdout:\n{completed.stdout}\nstderr:\n{completed.stderr}"
        )
        return last_json_line(completed)

    return run
