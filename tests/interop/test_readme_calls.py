"""The README's "Calling it" section works as written: every grpcurl, tritonclient and `client` example in it
runs, in its own process, against a server started as `make run` starts it (the demo repository, default
options), and prints what the section says. Only the address (the README's 127.0.0.1:8001) and the venv's path
are substituted."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from client.cli import ADDRESS_ENV
from client.cli import DEFAULT_ADDRESS as CLI_DEFAULT_ADDRESS

from .support import run_process

pytestmark = pytest.mark.interop

ROOT = Path(__file__).resolve().parents[2]
README_ADDRESS = "127.0.0.1:8001"
VENV_BIN = ".venv/bin/"
A = np.arange(1, 17, dtype=np.int32)  # the examples' INPUT0 ...
B = np.ones(16, dtype=np.int32)  # ... and INPUT1


def calling_it_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block in the README's "## Calling it" section, in order."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Calling it\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```(\w+)\n(.*?)^```$", section, flags=re.S | re.M)


def block(predicate) -> str:
    found = [code for language, code in calling_it_blocks() if predicate(language, code)]
    assert len(found) == 1, f"expected one such block in README 'Calling it', found {len(found)}"
    return found[0]


def as_written(code: str, address: str, *, names_the_address: bool = True) -> str:
    if names_the_address:
        assert README_ADDRESS in code, "the example no longer uses the address `make run` serves on"
    return code.replace(README_ADDRESS, address).replace(VENV_BIN, f"{Path(sys.executable).parent}/")


def run_bash(code: str, **environment: str) -> subprocess.CompletedProcess:
    completed = run_process(["bash", "-euo", "pipefail", "-c", code], cwd=ROOT, timeout=60,
                            env={**os.environ, **environment})
    assert completed.returncode == 0, f"exit {completed.returncode}\n{completed.stdout}\n{completed.stderr}"
    return completed


def run_python(code: str) -> subprocess.CompletedProcess:
    completed = run_process([sys.executable, "-c", code], cwd=ROOT, timeout=60)
    assert completed.returncode == 0, f"exit {completed.returncode}\n{completed.stdout}\n{completed.stderr}"
    return completed


def integers(text: str) -> list[int]:
    return [int(value) for value in re.findall(r"-?\d+", text)]


@pytest.fixture
def address(slotserve, demo_repository):
    return slotserve(demo_repository).address  # the options `make run` uses: none


def test_the_section_has_the_four_examples():
    languages = [language for language, _ in calling_it_blocks()]
    assert languages.count("bash") == 2 and languages.count("python") == 2, languages


def test_grpcurl_lists_the_services_and_runs_simple(address):
    code = block(lambda language, code: language == "bash" and "grpcurl" in code)
    output = run_bash(as_written(code, address)).stdout
    assert "inference.GRPCInferenceService" in output and "grpc.health.v1.Health" in output
    response = json.loads(output[output.index("{"):])
    names = [tensor["name"] for tensor in response["outputs"]]
    raw = dict(zip(names, response["raw_output_contents"]))
    assert np.frombuffer(base64.b64decode(raw["OUTPUT0"]), "<i4").tolist() == (A + B).tolist()
    assert np.frombuffer(base64.b64decode(raw["OUTPUT1"]), "<i4").tolist() == (A - B).tolist()


def test_tritonclient_prints_the_sum_and_the_difference(address):
    code = block(lambda language, code: language == "python" and "tritonclient" in code)
    lines = run_python(as_written(code, address)).stdout.split("]]")
    a = np.arange(16, dtype=np.int32)  # this example's own inputs: arange(16) and ones
    assert integers(lines[0]) == (a + 1).tolist() and integers(lines[1]) == (a - 1).tolist()


def test_the_client_cli_reports_health_models_and_the_outputs(address):
    code = block(lambda language, code: language == "bash" and "-m client" in code)
    # The CLI's default address is the one `make run` serves on; SLOTSERVE_ADDRESS points it at this server.
    assert CLI_DEFAULT_ADDRESS == README_ADDRESS
    output = run_bash(as_written(code, address, names_the_address=False), **{ADDRESS_ENV: address}).stdout
    assert re.search(r"^health\s+SERVING$", output, flags=re.M)
    assert re.search(r"^simple\s+READY\s", output, flags=re.M)
    sums, differences = output.split("OUTPUT0", 1)[1].split("OUTPUT1", 1)
    assert integers(sums)[3:] == (A + B).tolist()  # after "INT32 [1, 16]"
    assert integers(differences)[3:] == (A - B).tolist()


def test_the_client_library_example_runs(address):
    code = block(lambda language, code: language == "python" and "from client import" in code)
    run_python(as_written(code, address) + "\nassert outputs['OUTPUT0'].tolist() == [[2] * 16], outputs\n")
