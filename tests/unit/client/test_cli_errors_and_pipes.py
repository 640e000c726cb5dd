"""A newcomer's paper cuts with the ops command line (issue 19), each run as `python -m client ...` in a subprocess:

* a refused connection says how to point the client at another server (`--address`, `$SLOTSERVE_ADDRESS`);
* `python -m client models | head` (a reader that goes away) exits quietly: no BrokenPipeError traceback, no
  error line, exit 141 (128 + SIGPIPE, what a Unix tool killed by SIGPIPE reports);
* a shape error names the shape the client sent, batch dimension included ([1, 2], not [2]).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config.specs import TensorSpec
from engine.errors import InvalidInputError
from engine.interface import ModelMetadata
from tests.integration._support import demo_subset

ROOT = Path(__file__).resolve().parents[3]
RUN_LIMIT = 120.0


def run_client(*args: str, address: str | None = None, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    environment = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SLOTSERVE_ADDRESS", "SLOTSERVE_MANAGEMENT_TOKEN", "SLOTSERVE_INFERENCE_TOKEN")
    }
    if address is not None:
        environment["SLOTSERVE_ADDRESS"] = address
    return subprocess.run(
        [sys.executable, "-m", "client", "--timeout", "30", *args],
        cwd=ROOT,
        env=environment,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=RUN_LIMIT,
    )


def free_port() -> int:
    """A port nothing listens on (bound, then released: a connection to it is refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_a_refused_connection_says_how_to_point_the_client_elsewhere(how):
    address = f"127.0.0.1:{free_port()}"
    done = run_client("--address", address, "health") if how == "flag" else run_client("health", address=address)
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: UNAVAILABLE"), done.stderr
    assert f"no server answers at {address}" in lines[0], lines[0]
    assert "--address HOST:PORT" in lines[0] and "SLOTSERVE_ADDRESS" in lines[0], lines[0]


def test_a_server_side_unavailable_gets_no_address_hint(slotserve, tmp_path):
    """The hint is for connections that fail, not for a server that answers UNAVAILABLE itself."""
    running = slotserve(
        demo_subset(tmp_path / "repository", "simple"), load_at_startup=False, allow_management=True, parallel_jobs=1
    )
    done = run_client("unload", "simple", "ghost", address=running.address)
    assert "SLOTSERVE_ADDRESS" not in done.stderr, done.stderr


def test_output_into_a_closed_pipe_exits_quietly(slotserve, tmp_path):
    """`python -m client models | head`: the reader is gone (here: before the client even starts, so every
    write fails). No traceback, no `error:` line; exit 141 as a Unix tool killed by SIGPIPE."""
    running = slotserve(demo_subset(tmp_path / "repository", "simple", "identity_fp32"))
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = run_client("models", address=running.address, stdout=write_end)
    finally:
        os.close(write_end)
    assert done.stderr == "" and done.returncode == 141, (done.returncode, done.stderr)


def test_a_reader_that_takes_only_the_first_line_leaves_no_traceback(slotserve, tmp_path):
    """The same through a real `head -1` in a shell pipeline (the shell reports the client's status)."""
    running = slotserve(demo_subset(tmp_path / "repository", "simple", "identity_fp32", "simple_identity"))
    environment = dict(os.environ, SLOTSERVE_ADDRESS=running.address)
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {sys.executable} -m client models | head -1"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT,
    )
    assert done.stdout.startswith("NAME"), done.stdout
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr and "error:" not in done.stderr
    assert done.returncode in (0, 141), done  # 0 when the whole table fit in the pipe before head left


def test_a_shape_error_names_the_shape_the_client_sent(slotserve, tmp_path):
    """`simple` batches (max_batch_size 8) over [16]: a [1, 2] input used to be reported as "[2]"."""
    running = slotserve(demo_subset(tmp_path / "repository", "simple"))
    done = run_client(
        "infer", "simple", "--input", "INPUT0=[[1,2]]", "--input", "INPUT1=[[1,2]]", address=running.address
    )
    assert done.returncode == 1 and done.stdout == ""
    assert "input 'INPUT0' has shape [1, 2]; the model expects [-1, 16]" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "max_batch_size, shape, says",
    [
        (8, (1, 2), "input 'x' has shape [1, 2]; the model expects [-1, 16]"),
        (8, (3, 2), "input 'x' has shape [3, 2]; the model expects [-1, 16]"),
        (0, (2,), "input 'x' has shape [2]; the model expects [16]"),
        (0, (1, 16), "input 'x' has shape [1, 16]; the model expects [16]"),
    ],
)
def test_shape_errors_quote_the_whole_shape_sent(max_batch_size, shape, says):
    metadata = ModelMetadata(
        inputs=(TensorSpec("x", "FP32", (16,)),),
        outputs=(TensorSpec("y", "FP32", (16,)),),
        max_batch_size=max_batch_size,
    )
    with pytest.raises(InvalidInputError) as info:
        metadata.check_request({"x": ("FP32", shape)}, [])
    assert says in str(info.value)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--timeout=nan", "health"], "error: argument --timeout: must be a number of seconds more than 0, got nan"),
        (["--timeout=inf", "health"], "got inf"),
        (["--timeout=-1", "health"], "got -1"),
        (["--timeout=0", "health"], "got 0"),
        (["--timeout=soon", "health"], "got soon"),
        (["register", "m", "--slots=-1"], "error: argument --slots: must be a slot count of at least 1, got -1"),
        (["load", "m", "--slots=0"], "got 0"),
    ],
)
def test_hostile_numbers_on_the_client_command_line_are_usage_errors(argv, says):
    """NaN, infinite, zero and negative deadlines used to end every call at once with DEADLINE_EXCEEDED, and a
    negative slot count with "ValueError: Value out of range"; now one usage line naming the flag, exit 2."""
    done = subprocess.run(
        [sys.executable, "-m", "client", "--address", f"127.0.0.1:{free_port()}", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT,
    )
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
