"""The README's examples work as written, each in its own process against a real server.

* "Calling it": every grpcurl, tritonclient and `client` example runs against a server started as `make run`
  starts it (the demo repository, default options) and prints what the section says.
* The sessions that start with `make run ARGS="..."` (residency, management, authentication): the lines before
  it run first, then a server starts with exactly those flags (parsed by the server's own command line), then
  the lines after it run; the residency session's output must match the table the README shows.

Only the address (the README's 127.0.0.1:8001, or SLOTSERVE_ADDRESS for the CLI), the venv's path and /tmp/
(a test folder) are substituted."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from client.cli import ADDRESS_ENV
from client.cli import DEFAULT_ADDRESS as CLI_DEFAULT_ADDRESS
from service.cli import build_parser, option_fields
from service.testing import serve

from .support import run_process

pytestmark = pytest.mark.interop

ROOT = Path(__file__).resolve().parents[2]
README_ADDRESS = "127.0.0.1:8001"
VENV_BIN = ".venv/bin/"
A = np.arange(1, 17, dtype=np.int32)  # the examples' INPUT0 ...
B = np.ones(16, dtype=np.int32)  # ... and INPUT1


MAKE_RUN = re.compile(r'^make run ARGS="([^"]*)"\n', flags=re.M)


def section_blocks(title: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block in the README section "## <title>", in order ("" for a block
    without a language, such as shown output)."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```(\w*)\n(.*?)^```$", section, flags=re.S | re.M)


def calling_it_blocks() -> list[tuple[str, str]]:
    return section_blocks("Calling it")


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


# ---- sessions that start a server with `make run ARGS="..."` ---------------------------------------------------

@contextlib.contextmanager
def session(code: str, repository: Path, folder: Path):
    """Run a README block of the form `<lines>; make run ARGS="..."; <lines>`: yields (running server, output of
    the lines after `make run`)."""
    code = code.replace("/tmp/", f"{folder}/")
    match = MAKE_RUN.search(code)
    assert match, 'the block no longer starts its server with make run ARGS="..."'
    before, after = code[:match.start()], code[match.end():]
    if before.strip():
        run_bash(as_written(before, "", names_the_address=False))
    parsed = build_parser().parse_args(["--model-repository", str(repository), *shlex.split(match.group(1))])
    fields = {name: value for name, value in option_fields(parsed).items()
              if name not in ("model_repository", "host", "port")}
    for kind in ("management", "inference"):  # serve() wants the token itself, to give it to its own clients
        path = getattr(parsed, f"{kind}_token_file")
        if path is not None:
            fields[f"{kind}_token"] = Path(path).read_text().strip()
    with serve(repository, **fields) as running:
        output = run_bash(as_written(after, running.address, names_the_address=False),
                          **{ADDRESS_ENV: running.address}).stdout
        yield running, output


def model_rows(output: str) -> dict[str, list[str]]:
    """`client models` table rows by name: the columns before MEMORY, and REASON where there is one."""
    lines = output[output.index("NAME "):].splitlines()[1:]
    rows = {}
    for line in filter(str.strip, lines):
        cells = line.split()
        reason = cells[-1] if cells[1] != "READY" else ""
        rows[cells[0]] = cells[:6] + [reason]
    return rows


def test_the_residency_session_prints_the_table_the_readme_shows(demo_repository, tmp_path, caplog):
    blocks = section_blocks("Residency: many registered, some resident")
    (language, code), (_, shown) = blocks[0], blocks[1]
    assert language == "bash" and code.startswith("make run")
    with caplog.at_level(logging.INFO, logger="service"):
        with session(code, demo_repository, tmp_path) as (running, output):
            assert model_rows(output) == model_rows(shown)
            assert not running.management.get("simple").loaded
    assert "model 'simple': evicted to make room for model 'matmul_chain'" in caplog.text


def test_the_management_session_resizes_and_unloads(demo_repository, tmp_path):
    [(language, code)] = section_blocks("Management")
    assert language == "bash"
    with session(code, demo_repository, tmp_path) as (running, output):
        assert model_rows(output)["matmul_chain"][:3] == ["matmul_chain", "READY", "2"]
        assert running.management.get("matmul_chain").slots == 2
        assert not running.management.get("simple").loaded
        assert not running.management.get("identity_fp32").loaded
        assert running.management.get("silero_vad").loaded  # only the named models were unloaded


def test_the_authentication_session_unloads_with_the_token_and_not_without(demo_repository, tmp_path):
    [(language, code)] = section_blocks("Authentication")
    assert language == "bash"
    with session(code, demo_repository, tmp_path) as (running, _output):
        assert not running.management.get("simple").loaded
        refused = run_process([sys.executable, "-m", "client", "unload", "simple_identity"], cwd=ROOT, timeout=60,
                              env={**os.environ, ADDRESS_ENV: running.address, "SLOTSERVE_MANAGEMENT_TOKEN": ""})
        assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr + refused.stdout
        assert running.management.get("simple_identity").loaded


def test_the_shared_memory_session_passes_tensors_in_regions(demo_repository, tmp_path):
    [(language, code)] = [block for block in section_blocks("Shared memory") if "make run" in block[1]]
    assert language == "bash"
    with session(code, demo_repository, tmp_path) as (running, output):
        sums, differences = output.split("]]")[:2]
        a = np.arange(16, dtype=np.int32)
        assert integers(sums) == (a + 1).tolist() and integers(differences) == (a - 1).tolist()
        statistics = running.server.shared_memory.statistics()
        assert statistics.taken == 4  # both inputs and both outputs travelled in the regions
        assert statistics.regions == 0  # the example unregisters what it registered
