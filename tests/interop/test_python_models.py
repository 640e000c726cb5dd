"""Python models (backend "python") driven by stock tritonclient from a separate process
(clients/python_models_cases.py), on a real server of tests/python_models/repository."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from tests.python_models import REPOSITORY

pytestmark = pytest.mark.interop

SCRIPT = "python_models_cases.py"
CODES = {
    "UNKNOWN": "UNKNOWN",
    "INTERNAL": "INTERNAL",
    "NOT_FOUND": "NOT_FOUND",
    "INVALID_ARG": "INVALID_ARGUMENT",
    "UNAVAILABLE": "UNAVAILABLE",
    "UNSUPPORTED": "UNIMPLEMENTED",
    "ALREADY_EXISTS": "ALREADY_EXISTS",
    "CANCELLED": "CANCELLED",
}


@pytest.fixture
def server(slotserve):
    return slotserve(REPOSITORY, parallel_jobs=2)


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.02)  # ordering-free: polls an observable state until a deadline


def test_unary_add_sub(server, run_client):
    result = run_client(SCRIPT, server.address, "unary")
    a, b = np.asarray(result["INPUT0"]), np.asarray(result["INPUT1"])
    np.testing.assert_array_equal(result["OUTPUT0"], a + b)
    np.testing.assert_array_equal(result["OUTPUT1"], a - b)
    assert result["only"] == ["OUTPUT1"]


def test_auto_complete_config_declares_the_tensors_and_bytes_round_trip(server, run_client):
    result = run_client(SCRIPT, server.address, "autocomplete")
    texts = [b"ab", b"\x00\xffz", "grüße".encode()]
    assert result["lengths"] == [len(t) for t in texts]
    assert result["upper"] == [t.upper().hex() for t in texts]
    assert result["inputs"] == [["TEXT", "BYTES", [-1]]]
    assert result["outputs"] == [["LENGTHS", "INT32"], ["UPPER", "BYTES"]]


def test_a_batch_reaches_execute_as_a_list_of_requests_with_one_response_each(server, run_client):
    result = run_client(SCRIPT, server.address, "batched", "3")
    for index in range(3):
        entry = result[str(index)]
        np.testing.assert_array_equal(entry["OUTPUT0"], np.full((1, 4), 2.0 * (index + 1)))
        # preferred_batch_size 3 and a 2 s queue delay: the three requests were one execute call of 3 requests
        assert entry["requests"] == 3


def test_exception_and_triton_error_codes_reach_the_client(server, run_client):
    result = run_client(SCRIPT, server.address, "errors")
    assert result["raise"] == ["INTERNAL", "model 'probe' raised ValueError: the value 42 is bad"]
    for code, status in CODES.items():
        assert result[code] == [status, f"refused with {code}"], code  # the model's words as they are (Triton's)
    assert "pid" in result["after"]  # the model is still serving


def test_exception_traceback_goes_to_the_log_not_the_client(caplog, server, run_client):
    result = run_client(SCRIPT, server.address, "errors")
    assert "Traceback" not in result["raise"][1]

    def logged() -> bool:  # the worker's record, read from its stderr by the server's reader thread
        texts = [r.getMessage() for r in caplog.records]
        return any("Traceback" in text and "ValueError: the value 42 is bad" in text for text in texts)

    wait_for(logged, "the traceback in the server's log")
    (record,) = [r for r in caplog.records if "ValueError: the value 42 is bad" in r.getMessage()]
    assert record.levelname == "ERROR" and record.model == "probe"  # type: ignore[attr-defined]


def test_worker_death_fails_only_its_request_and_the_slot_gets_a_new_worker(server, run_client):
    before = {answer["pid"] for answer in run_client(SCRIPT, server.address, "pids", "6")["answers"]}
    assert len(before) == 2, before  # two slots, two worker processes
    died = run_client(SCRIPT, server.address, "exit", "7")["exit"]
    assert died[0] == "INTERNAL"
    assert "model 'probe'" in died[1] and "exited with code 7" in died[1], died
    after = run_client(SCRIPT, server.address, "pids", "6")["answers"]
    assert all("pid" in answer for answer in after), after  # every later request succeeds
    pids = {answer["pid"] for answer in after}
    survivors, new = pids & before, pids - before
    assert len(survivors) == 1 and len(new) == 1, (before, pids)  # the other slot kept its worker


def test_a_gil_holding_model_runs_on_two_slots_at_once(server, run_client, tmp_path):
    result = run_client(SCRIPT, server.address, "overlap", str(tmp_path))
    # each worker spun in pure Python until it saw the other's file: both saw the other while still running
    assert [answer["text"] for answer in result["answers"]] == ["peer", "peer"], result
    assert len({answer["pid"] for answer in result["answers"]}) == 2
    assert len(os.listdir(tmp_path)) == 2


def test_a_cancelled_request_shows_is_cancelled_to_the_model(server, run_client, tmp_path):
    marker = tmp_path / "saw-cancel"
    result = run_client(SCRIPT, server.address, "cancel", str(marker))
    assert result["answer"][0] == "DEADLINE_EXCEEDED", result
    wait_for(marker.exists, "the model seeing is_cancelled()")


def test_shutdown_with_a_hung_model_is_bounded_and_ends_its_worker(slotserve, tmp_path):
    running = slotserve(REPOSITORY, parallel_jobs=2)
    marker = tmp_path / "hanging"
    import threading

    def hang() -> None:
        mode, arg = np.array([b"hang"], dtype=object), np.array([str(marker).encode()], dtype=object)
        try:
            running.client.infer("probe", {"MODE": mode, "ARG": arg}, timeout=120)
        except Exception:  # noqa: BLE001 - the shutdown ends it with an error; the test checks the bound
            pass

    caller = threading.Thread(target=hang, daemon=True)
    caller.start()
    wait_for(marker.exists, "the model starting its endless loop")
    workers = _worker_pids()
    assert workers, "no python worker process found"
    started = time.monotonic()
    report = running.server.shutdown(drain_seconds=0.0, grace=0.5, margin=2.0)
    elapsed = time.monotonic() - started
    assert elapsed < 0.5 + 2 * 2.0 + 1.0, elapsed  # drain + grace + 2 x margin, with a second to spare
    assert report.abandoned_calls == 0  # the hung worker was killed, so its call returned
    caller.join(10)
    assert not caller.is_alive()
    wait_for(lambda: not (set(workers) & set(_worker_pids())), "every worker ending", timeout=10)


def _worker_pids() -> list[int]:
    """Live python-model worker processes that are children of this process."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and b"engine.python.worker" in command:
            pids.append(int(entry.name))
    return pids


def test_a_decoupled_model_streams_its_responses_to_tritonclient(server, run_client):
    result = run_client(SCRIPT, server.address, "decoupled")
    assert result["streams"] == {"three": [0, 1, 2], "none": [], "negative": [], "threaded": [0, 1], "one": [0]}
    (error,) = result["errors"]
    assert "n must be >= 0, got -1" in error
    code, message = result["unary"]
    assert code == "UNIMPLEMENTED"
    assert message == "ModelInfer RPC doesn't support models with decoupled transaction policy"
