"""The examples of README.md and docs/*.md work as written, each in its own process against a real server.

* README "Calling it": every grpcurl, tritonclient and `client` example runs against a server started as `make run`
  starts it (the demo repository, default options) and prints what the section says.
* README "Using slotserve in your own tests": both examples run as a pytest session of their own.
* The `make ...` lines (README "Two commands", docs/command-line.md): each target exists, and the server command
  line `make run` builds from them (`make -n`) parses and validates as the server's own would.
* The sessions that start with `make run ARGS="..."` (docs/lifecycle.md, residency.md, security.md,
  shared-memory.md): the lines before it run first, then a server starts with exactly those flags (parsed by the
  server's own command line), then the lines after it run; the residency session's output must match the table
  the page shows.
* Configuration (`pbtxt`) blocks parse as config.pbtxt does, with no field slotserve would skip; the JSON log line
  is one.

`test_every_runnable_block_is_exercised` fails when a page gains a section with a block no test here runs.
Only the address (the pages' 127.0.0.1:8001, or SLOTSERVE_ADDRESS for the CLI), the venv's path and /tmp/ (a test
folder) are substituted."""

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
from engine.config.repository import parse_config_text
from service.process.cli import build_parser, option_fields
from service.process.options import ServerOptions
from service.testing import serve
from tests.docs.markdown import DOCS, README, ROOT, TOP, fenced_blocks, name, pages, section_blocks, sections

from .support import run_process

pytestmark = pytest.mark.interop

PAGE_ADDRESS = "127.0.0.1:8001"
VENV_BIN = ".venv/bin/"
A = np.arange(1, 17, dtype=np.int32)  # the examples' INPUT0 ...
B = np.ones(16, dtype=np.int32)  # ... and INPUT1

MAKE_RUN = re.compile(r'^make run ARGS="([^"]*)"\n', flags=re.M)
RUNNABLE = ("bash", "python", "pbtxt", "json")

# Every section of a page that holds a runnable block, and the test that runs its blocks.
EXERCISED = {
    ("README.md", "Two commands"): "test_the_make_lines_name_real_targets_and_build_a_valid_server_command",
    ("README.md", "Calling it"): "test_the_section_has_the_four_examples",
    ("README.md", "Using slotserve in your own tests"): "test_the_in_process_examples_pass_as_a_pytest_session",
    ("docs/command-line.md", TOP): "test_the_make_lines_name_real_targets_and_build_a_valid_server_command",
    ("docs/errors.md", "Overload"): "test_the_retry_policy_channel_serves_requests",
    ("docs/observability.md", "Custom metrics from python models"): "test_the_custom_metrics_model_serves_its_metrics",
    ("docs/lifecycle.md", "Management"): "test_the_management_session_resizes_and_unloads",
    ("docs/residency.md", "An example"): "test_the_residency_session_prints_the_table_the_page_shows",
    ("docs/security.md", "Authentication"): "test_the_authentication_session_unloads_with_the_token_and_not_without",
    ("docs/shared-memory.md", "An example"): "test_the_shared_memory_session_passes_tensors_in_regions",
    ("docs/model-repository.md", "`config.pbtxt`: every field"): "test_configuration_blocks_parse_as_config_pbtxt",
    ("docs/model-repository.md", "Dynamic batching"): "test_configuration_blocks_parse_as_config_pbtxt",
    ("docs/tensorrt.md", "Configuration"): "test_configuration_blocks_parse_as_config_pbtxt",
    ("docs/operations.md", "Logs"): "test_the_json_log_line_has_the_fixed_keys",
    ("docs/migrating-from-triton.md", "The check"): "test_the_migration_pages_check_commands_parse",
    ("docs/migrating-from-triton.md", "Walkthrough"): "test_the_migration_pages_check_commands_parse",
}


def page(relative: str) -> Path:
    return ROOT / relative


def calling_it_blocks() -> list[tuple[str, str]]:
    return section_blocks(README, "Calling it")


def block(predicate) -> str:
    found = [code for language, code in calling_it_blocks() if predicate(language, code)]
    assert len(found) == 1, f"expected one such block in README 'Calling it', found {len(found)}"
    return found[0]


def as_written(code: str, address: str, *, names_the_address: bool = True) -> str:
    if names_the_address:
        assert PAGE_ADDRESS in code, "the example no longer uses the address `make run` serves on"
    return code.replace(PAGE_ADDRESS, address).replace(VENV_BIN, f"{Path(sys.executable).parent}/")


def run_bash(code: str, **environment: str) -> subprocess.CompletedProcess:
    completed = run_process(
        ["bash", "-euo", "pipefail", "-c", code], cwd=ROOT, timeout=60, env={**os.environ, **environment}
    )
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


def test_every_runnable_block_is_exercised():
    found = {
        (name(p), title)
        for p in pages()
        for title, text in sections(p).items()
        if any(language in RUNNABLE for language, _ in fenced_blocks(text))
    }
    assert found == set(EXERCISED), (
        f"sections with runnable blocks no test runs: {sorted(found - set(EXERCISED))}; "
        f"listed but gone: {sorted(set(EXERCISED) - found)}"
    )
    assert all(test in globals() for test in EXERCISED.values())
    unmarked = [
        (name(p), title)
        for p in pages()
        for title, text in sections(p).items()
        for language, code in fenced_blocks(text)
        if not language and re.search(r"^(\.venv/bin/|make |python )", code, flags=re.M)
    ]
    assert not unmarked, f"blocks of commands without a language (so no test runs them): {unmarked}"


# ---- README: calling it -------------------------------------------------------------------------------------


def test_the_section_has_the_four_examples():
    languages = [language for language, _ in calling_it_blocks()]
    assert languages.count("bash") == 2 and languages.count("python") == 2, languages


def test_grpcurl_lists_the_services_and_runs_simple(address):
    code = block(lambda language, code: language == "bash" and "grpcurl" in code)
    output = run_bash(as_written(code, address)).stdout
    assert "inference.GRPCInferenceService" in output and "grpc.health.v1.Health" in output
    response = json.loads(output[output.index("{") :])
    names = [tensor["name"] for tensor in response["outputs"]]
    raw = dict(zip(names, response["raw_output_contents"], strict=True))
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
    assert CLI_DEFAULT_ADDRESS == PAGE_ADDRESS
    output = run_bash(as_written(code, address, names_the_address=False), **{ADDRESS_ENV: address}).stdout
    assert re.search(r"^health\s+SERVING$", output, flags=re.M)
    assert re.search(r"^simple\s+READY\s", output, flags=re.M)
    sums, differences = output.split("OUTPUT0", 1)[1].split("OUTPUT1", 1)
    assert integers(sums)[3:] == (A + B).tolist()  # after "INT32 [1, 16]"
    assert integers(differences)[3:] == (A - B).tolist()


def test_the_client_library_example_runs(address):
    code = block(lambda language, code: language == "python" and "from client import" in code)
    run_python(as_written(code, address) + "\nassert outputs['OUTPUT0'].tolist() == [[2] * 16], outputs\n")


# ---- README: using slotserve in your own tests ----------------------------------------------------------------


def test_the_in_process_examples_pass_as_a_pytest_session(tmp_path):
    """The `serve` example is a test module; the fixture example says which line goes into conftest.py. Both run
    as written, from the project's root (where `demo/model_repository` is), and pass."""
    (language, serve_example), (fixture_language, fixture_example) = section_blocks(
        README, "Using slotserve in your own tests"
    )
    assert language == fixture_language == "python"
    conftest = re.match(r"# conftest\.py: (.+)\n", fixture_example)
    assert conftest, "the fixture example no longer starts with the line for conftest.py"
    (tmp_path / "conftest.py").write_text(conftest.group(1) + "\n")
    (tmp_path / "test_serve_example.py").write_text(serve_example)
    (tmp_path / "test_fixture_example.py").write_text(fixture_example)
    completed = run_process(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=ROOT,
        timeout=120,
    )
    assert completed.returncode == 0, f"{completed.stdout}\n{completed.stderr}"
    assert re.search(r"\b2 passed\b", completed.stdout), completed.stdout


# ---- make lines ------------------------------------------------------------------------------------------------


def make_lines() -> list[str]:
    lines = []
    for relative, title in [
        key
        for key, test in EXERCISED.items()
        if test == "test_the_make_lines_name_real_targets_and_build_a_valid_server_command"
    ]:
        for language, code in section_blocks(page(relative), title):
            assert language == "bash"
            lines += [line.split("#", 1)[0].strip() for line in code.splitlines() if line.startswith("make ")]
    return lines


def test_the_make_lines_name_real_targets_and_build_a_valid_server_command():
    """Each `make` line of the pages names a target of the Makefile; each `make run` line, dry-run, builds a
    `python -m service` command line that the server's parser and option checks accept, with the values the
    line gives."""
    lines = make_lines()
    assert "make run" in lines and "make test" in lines and any("ARGS=" in line for line in lines), lines
    phony = re.search(r"^\.PHONY: (.*)$", (ROOT / "Makefile").read_text(), flags=re.M).group(1).split()
    for line in lines:
        words = shlex.split(line)
        targets = [word for word in words[1:] if "=" not in word]
        assert targets and set(targets) <= set(phony), f"{line}: not a target of the Makefile ({phony})"
        if targets != ["run"]:
            continue
        dry = run_process(
            ["make", "--no-print-directory", "-n", *words[1:]],
            cwd=ROOT,
            timeout=60,
            env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")},
        )
        assert dry.returncode == 0, f"{line}\n{dry.stdout}\n{dry.stderr}"
        commands = [shlex.split(step) for step in dry.stdout.splitlines() if " -m service " in step]
        assert commands, f"{line}: `make -n` shows no server command\n{dry.stdout}"
        command = commands[-1]
        assert command[1:3] == ["-m", "service"], command
        arguments = command[3:]
        parsed = build_parser().parse_args(arguments)
        ServerOptions(**option_fields(parsed))  # raises ValueError for values the server would refuse
        variables = dict(word.split("=", 1) for word in words[1:] if "=" in word)
        assert shlex.split(variables.get("ARGS", "")) == arguments[6:], (line, arguments)
        assert parsed.port == int(variables.get("PORT", 8001)), line
        assert parsed.host == variables.get("HOST", "127.0.0.1"), line
        assert str(parsed.model_repository) == variables.get("REPOSITORY", "demo/model_repository"), line


# ---- sessions that start a server with `make run ARGS="..."` ---------------------------------------------------


@contextlib.contextmanager
def session(code: str, repository: Path, folder: Path):
    """Run a block of the form `<lines>; make run ARGS="..."; <lines>`: yields (running server, output of the
    lines after `make run`)."""
    code = code.replace("/tmp/", f"{folder}/")
    match = MAKE_RUN.search(code)
    assert match, 'the block no longer starts its server with make run ARGS="..."'
    before, after = code[: match.start()], code[match.end() :]
    if before.strip():
        run_bash(as_written(before, "", names_the_address=False))
    parsed = build_parser().parse_args(["--model-repository", str(repository), *shlex.split(match.group(1))])
    fields = {
        name: value for name, value in option_fields(parsed).items() if name not in ("model_repository", "host", "port")
    }
    for kind in ("management", "inference"):  # serve() wants the token itself, to give it to its own clients
        path = getattr(parsed, f"{kind}_token_file")
        if path is not None:
            fields[f"{kind}_token"] = Path(path).read_text().strip()
    with serve(repository, **fields) as running:
        output = run_bash(
            as_written(after, running.address, names_the_address=False), **{ADDRESS_ENV: running.address}
        ).stdout
        yield running, output


def model_rows(output: str) -> dict[str, list[str]]:
    """`client models` table rows by name: the columns before MEMORY, and REASON where there is one."""
    lines = output[output.index("NAME ") :].splitlines()[1:]
    rows = {}
    for line in filter(str.strip, lines):
        cells = line.split()
        reason = cells[-1] if cells[1] != "READY" else ""
        rows[cells[0]] = cells[:6] + [reason]
    return rows


def test_the_residency_session_prints_the_table_the_page_shows(demo_repository, tmp_path, caplog):
    blocks = section_blocks(DOCS / "residency.md", "An example")
    (language, code), (_, shown) = blocks[0], blocks[1]
    assert language == "bash" and code.startswith("make run")
    with caplog.at_level(logging.INFO, logger="service"):
        with session(code, demo_repository, tmp_path) as (running, output):
            assert model_rows(output) == model_rows(shown)
            assert not running.management.get("simple").loaded
    assert "model 'simple': evicted to make room for model 'matmul_chain'" in caplog.text


def test_the_management_session_resizes_and_unloads(demo_repository, tmp_path):
    [(language, code)] = section_blocks(DOCS / "lifecycle.md", "Management")
    assert language == "bash"
    with session(code, demo_repository, tmp_path) as (running, output):
        assert model_rows(output)["matmul_chain"][:3] == ["matmul_chain", "READY", "2"]
        assert running.management.get("matmul_chain").slots == 2
        assert not running.management.get("simple").loaded
        assert not running.management.get("identity_fp32").loaded
        assert running.management.get("silero_vad").loaded  # only the named models were unloaded


def test_the_authentication_session_unloads_with_the_token_and_not_without(demo_repository, tmp_path):
    [(language, code)] = section_blocks(DOCS / "security.md", "Authentication")
    assert language == "bash"
    with session(code, demo_repository, tmp_path) as (running, _output):
        assert not running.management.get("simple").loaded
        refused = run_process(
            [sys.executable, "-m", "client", "unload", "simple_identity"],
            cwd=ROOT,
            timeout=60,
            env={**os.environ, ADDRESS_ENV: running.address, "SLOTSERVE_MANAGEMENT_TOKEN": ""},
        )
        assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr + refused.stdout
        assert running.management.get("simple_identity").loaded


def test_the_shared_memory_session_passes_tensors_in_regions(demo_repository, tmp_path):
    [(language, code)] = section_blocks(DOCS / "shared-memory.md", "An example")
    assert language == "bash"
    with session(code, demo_repository, tmp_path) as (running, output):
        sums, differences = output.split("]]")[:2]
        a = np.arange(16, dtype=np.int32)
        assert integers(sums) == (a + 1).tolist() and integers(differences) == (a - 1).tolist()
        statistics = running.server.shared_memory.statistics()
        assert statistics.taken == 4  # both inputs and both outputs travelled in the regions
        assert statistics.regions == 0  # the example unregisters what it registered


# ---- configuration and log examples ----------------------------------------------------------------------------


def test_configuration_blocks_parse_as_config_pbtxt(caplog):
    """Every pbtxt block parses as config.pbtxt does, and names no field slotserve would skip with a warning."""
    checked = 0
    for relative, title in [
        key for key, test in EXERCISED.items() if test == "test_configuration_blocks_parse_as_config_pbtxt"
    ]:
        for language, code in section_blocks(page(relative), title):
            if language != "pbtxt":
                continue
            with caplog.at_level(logging.WARNING, logger="engine.config.repository"):
                caplog.clear()
                parse_config_text(code, f"{relative} '{title}'")
            assert not caplog.records, f"{relative} '{title}': {caplog.text}"
            checked += 1
    assert checked == 3


def test_the_json_log_line_has_the_fixed_keys():
    [(language, line)] = [b for b in section_blocks(DOCS / "operations.md", "Logs") if b[0] == "json"]
    record = json.loads(line)
    assert list(record)[:6] == ["time", "level", "logger", "event", "model", "message"]


def test_the_migration_pages_check_commands_parse():
    """The check's command lines on docs/migrating-from-triton.md parse with the check's own parser (the
    walkthrough's outputs are generated by `make docs` from a real run: tests/docs/test_migration_page.py)."""
    from service.process.check import build_parser

    seen = 0
    for title in ("The check", "Walkthrough"):
        for language, code in section_blocks(page("docs/migrating-from-triton.md"), title):
            for line in code.splitlines():
                command = line.split("#", 1)[0].strip().removeprefix("$ ")
                if language in ("bash", "console") and command.startswith("python -m service check "):
                    build_parser().parse_args(shlex.split(command)[4:])
                    seen += 1
    assert seen >= 4


def test_the_retry_policy_channel_serves_requests(address):
    """docs/errors.md's channel with a retry policy (the service config gRPC reads the pushback with) is accepted by
    grpcio and carries a ModelInfer of the demo's `simple` to the server as written."""
    [(language, code)] = section_blocks(DOCS / "errors.md", "Overload")
    assert language == "python"
    call = """
import numpy as np
from generated import grpc_service_pb2 as pb, grpc_service_pb2_grpc as pb_grpc
request = pb.ModelInferRequest(model_name="simple")
for tensor in ("INPUT0", "INPUT1"):
    request.inputs.add(name=tensor, datatype="INT32", shape=[1, 16])
    request.raw_input_contents.append(np.ones(16, dtype=np.int32).tobytes())
answer = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
assert np.frombuffer(answer.raw_output_contents[0], dtype=np.int32).tolist() == [2] * 16, answer
"""
    run_python(as_written(code, address) + call)


CUSTOM_METRICS_CONFIG = """backend: "python"
input [ { name: "IMAGE" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "TOTAL" data_type: TYPE_FP64 dims: [ 1 ] } ]
"""


def test_the_custom_metrics_model_serves_its_metrics(tmp_path):
    """docs/observability.md's model.py, served as written: its counter and histogram are on the metrics page with
    what its one request did, and `value()` answered what the counter holds."""
    import urllib.request

    [(language, model), (_, shown)] = section_blocks(DOCS / "observability.md", "Custom metrics from python models")
    assert language == "python"
    (tmp_path / "metrics_example" / "1").mkdir(parents=True)
    (tmp_path / "metrics_example" / "1" / "model.py").write_text(model)
    (tmp_path / "metrics_example" / "config.pbtxt").write_text(CUSTOM_METRICS_CONFIG)
    with serve(tmp_path, metrics_port=0) as running:
        outputs = running.client.infer("metrics_example", {"IMAGE": np.ones(224 * 224, np.float32)})
        address = f"http://127.0.0.1:{running.server.metrics_port}/metrics"
        with urllib.request.urlopen(address, timeout=30) as response:
            page = response.read().decode()
    counter = re.search(r'^preprocess_latency_ns\{route="/classify"\} (\S+)$', page, re.M)
    assert counter and float(counter.group(1)) > 0, page
    assert float(counter.group(1)) == outputs["TOTAL"][0]
    histogram = [line for line in page.splitlines() if line.startswith("image_pixels")]
    shown_lines = [line for line in shown.splitlines() if line.startswith("image_pixels")]
    assert shown_lines[:4] == histogram[:4], page  # the count, the sum and the first buckets as the page shows them
    for heading in ("# HELP preprocess_latency_ns", "# TYPE preprocess_latency_ns counter", "# TYPE image_pixels"):
        assert heading in page and heading in shown
