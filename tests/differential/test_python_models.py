"""The same model.py files (tests/python_models/repository) on slotserve and on real Triton 2.51 (the
tritonserver with its python backend inside bench/.venv-pytriton's nvidia-pytriton wheel): the same tritonclient
calls (tests/interop/clients/python_models_cases.py, and for BLS clients/bls_cases.py) must get the same answers and
the same status codes (BLS error codes excepted, on purpose: see OUR_BLS_CODES).

Skips, naming the reason, where the reference is not set up (`bench/setup.sh` builds it; `ln -s
/work/main/bench/.venv-pytriton bench/` in a worktree). The starter here is small and local; the shared harness
of tests/differential/ may replace it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tests.interop.support import last_json_line, run_process
from tests.python_models import REPOSITORY

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "tests" / "interop" / "clients" / "python_models_cases.py"
BLS_CLIENT = ROOT / "tests" / "interop" / "clients" / "bls_cases.py"
READY_SECONDS = 180.0

pytestmark = pytest.mark.interop


def _installation() -> tuple[Path | None, Path | None, str]:
    venv = Path(os.environ.get("SLOTSERVE_TRITON_VENV") or ROOT / "bench" / ".venv-pytriton")
    found = sorted(venv.glob("lib/python3*/site-packages/pytriton/tritonserver"))
    if not found or not os.access(found[0] / "bin" / "tritonserver", os.X_OK):
        return None, None, f"no tritonserver under {venv} (bench/setup.sh installs it; or set $SLOTSERVE_TRITON_VENV)"
    server = found[0]
    stub = server / "backends" / "python" / "triton_python_backend_stub"
    spare = server / "python_backend_stubs" / "3.11" / "triton_python_backend_stub"
    if not stub.is_file() and not spare.is_file():
        return None, None, f"{server} has no python backend stub for Python 3.11"
    return venv, server, ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ready(process: subprocess.Popen, address: str, log: Path) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"tritonserver exited {process.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        completed = subprocess.run(
            [sys.executable, "-c", _READY_PROBE, address], capture_output=True, text=True, timeout=60
        )
        if completed.returncode == 0:
            return
        time.sleep(0.5)  # ordering-free: polls an observable state until a deadline
    pytest.fail(f"tritonserver not ready within {READY_SECONDS} s:\n{log.read_text(errors='replace')[-3000:]}")


_READY_PROBE = """
import sys, tritonclient.grpc as g
client = g.InferenceServerClient(sys.argv[1])
MODELS = ("add_sub", "batched", "probe", "autocomplete", "repeat", "bls", "bls_async")
sys.exit(0 if all(client.is_model_ready(m) for m in MODELS) else 1)
"""


@contextlib.contextmanager
def triton(folder: Path):
    venv, server, reason = _installation()
    if venv is None or server is None:
        pytest.skip(reason)
    backends = folder / "backends"
    shutil.copytree(server / "backends", backends, ignore=shutil.ignore_patterns("__pycache__"))
    stub = backends / "python" / "triton_python_backend_stub"
    if not stub.is_file():
        shutil.copy2(server / "python_backend_stubs" / "3.11" / "triton_python_backend_stub", stub)
    libdir = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip() or (sysconfig.get_config_var("LIBDIR") or "")
    libraries = [libdir, *(str(p) for p in (server / "external_libs", server.parent.parent / "nvidia_pytriton.libs"))]
    port = _free_port()
    environment = {
        **os.environ,
        "LD_LIBRARY_PATH": ":".join(libraries),
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",  # the stub's python: the venv's numpy
    }
    log = folder / "tritonserver.log"
    command = [
        str(server / "bin" / "tritonserver"),
        f"--model-repository={REPOSITORY}",
        f"--backend-directory={backends}",
        f"--grpc-port={port}",
        "--grpc-address=127.0.0.1",
        "--allow-http=false",
        "--allow-metrics=false",
    ]
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=environment)
    try:
        _ready(process, f"127.0.0.1:{port}", log)
        yield f"127.0.0.1:{port}"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """(slotserve's address, Triton's address), both serving tests/python_models/repository with 2 slots."""
    from service.testing import serve

    with triton(tmp_path_factory.mktemp("triton")) as reference:
        with serve(REPOSITORY, parallel_jobs=2) as running:
            yield running.address, reference


def ask(address: str, *args: str, client: Path = CLIENT) -> dict:
    completed = run_process([sys.executable, str(client), address, *args], timeout=180)
    assert completed.returncode == 0, f"{args}: exited {completed.returncode}\n{completed.stderr[-3000:]}"
    return last_json_line(completed)


def test_unary_answers_are_the_same(both):
    ours, theirs = (ask(address, "unary") for address in both)
    assert ours == theirs


def test_auto_completed_metadata_and_bytes_answers_are_the_same(both):
    ours, theirs = (ask(address, "autocomplete") for address in both)
    assert ours == theirs


def test_a_batch_is_one_execute_call_of_its_requests_on_both(both):
    ours, theirs = (ask(address, "batched", "3") for address in both)
    assert ours == theirs


def test_exception_and_triton_error_codes_are_the_same(both):
    ours, theirs = (ask(address, "errors") for address in both)
    for case in ours:
        if case == "after":
            assert "pid" in ours[case] and "pid" in theirs[case]
            continue
        assert ours[case][0] == theirs[case][0], (case, ours[case], theirs[case])
        # the model's own text reaches the client on both (the wording around it differs)
        text = "the value 42 is bad" if case == "raise" else f"refused with {case}"
        assert text in ours[case][1] and text in theirs[case][1], (case, ours[case], theirs[case])


# ---- BLS (tests/python_models/repository/bls and bls_async; clients/bls_cases.py) ------------------------------
# Before the fault tests below: a probe instance Triton lost to them fails its later requests ("not healthy").


def test_bls_answers_are_the_same(both):
    """exec() to a python model, several calls in one execute, a call from a thread, exec(decoupled=True) with its
    empty final response, zero responses."""
    ours, theirs = (ask(address, "calls", client=BLS_CLIENT) for address in both)
    assert ours == theirs


def test_async_exec_in_an_async_execute_answers_the_same(both):
    ours, theirs = (ask(address, "async", client=BLS_CLIENT) for address in both)
    assert ours == theirs


def test_request_ids_parameters_and_sequence_fields_look_the_same_to_the_model(both):
    """request_id(), parameters() (the client's own, without sequence_id & co.), correlation_id() and flags(), for
    a client's request and for a BLS call carrying its own."""
    ours, theirs = (ask(address, "info", client=BLS_CLIENT) for address in both)
    assert ours == theirs


# Where the callee's failure shows in the message on both servers (the wording around it differs).
BLS_ERROR_WORDS = {
    "unknown": "no_such_model",
    "bad_input": "FP32",
    "callee_error": "refused by the callee",
    "callee_unavailable": "refused by the callee",
    "callee_raise": "ValueError: the callee is broken",
    "stream_error": "n must be >= 0, got -1",
}
# slotserve's codes, on purpose: Triton 2.51 gives every BLS error the code INTERNAL (1), whatever the callee said.
OUR_BLS_CODES = {
    "unknown": 2,
    "bad_input": 3,
    "callee_error": 3,
    "callee_unavailable": 4,
    "callee_raise": 1,
    "stream_error": 3,
}


def test_callee_failures_are_error_responses_on_both_with_the_callees_code_kept_here(both):
    ours, theirs = (ask(address, "errors", client=BLS_CLIENT) for address in both)
    assert set(ours) == set(theirs) == set(BLS_ERROR_WORDS)
    for case, words in BLS_ERROR_WORDS.items():
        mine, reference = ours[case], theirs[case]
        if case == "stream_error":  # a decoupled callee's error response ends its responses: one, no empty final
            assert len(mine) == len(reference) == 1, (mine, reference)
            mine, reference = mine[0], reference[0]
        assert words in mine["error"][1] and words in reference["error"][1], (case, mine, reference)
        assert reference["error"][0] == 1, (case, reference)  # Triton: INTERNAL for all
        assert mine["error"][0] == OUR_BLS_CODES[case], (case, mine)


# ---- faults ---------------------------------------------------------------------------------------------------


def test_a_gil_holding_model_overlaps_its_two_instances_on_both(both, tmp_path):
    for index, address in enumerate(both):
        folder = tmp_path / str(index)
        folder.mkdir()
        assert [a["text"] for a in ask(address, "overlap", str(folder))["answers"]] == ["peer", "peer"]


def test_a_dying_worker_fails_its_request_with_the_same_code(both):
    ours, theirs = (ask(address, "exit", "7")["exit"] for address in both)
    assert ours[0] == theirs[0] == "INTERNAL", (ours, theirs)
    # A difference, on purpose: slotserve starts a new worker for the slot's next request, while Triton 2.51 fails
    # the instance's later requests ("Stub process 'probe_0_1' is not healthy.") and serves on the other one.
    ours_after, theirs_after = (ask(address, "pids", "4")["answers"] for address in both)
    assert all("pid" in answer for answer in ours_after), ours_after
    assert all("pid" in answer or "is not healthy" in answer[1] for answer in theirs_after), theirs_after


def test_a_decoupled_models_streams_and_its_unary_refusal_are_the_same(both):
    ours, theirs = (ask(address, "decoupled") for address in both)
    assert ours["streams"] == theirs["streams"]
    assert ours["unary"] == theirs["unary"]
    # the model's own text reaches the client on both
    assert len(ours["errors"]) == len(theirs["errors"]) == 1
    assert theirs["errors"][0] in ours["errors"][0], (ours, theirs)
