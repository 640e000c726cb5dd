"""The ops command line's `metadata`, `config`, `stats` and `register`, run as `python -m client ...` in a
subprocess against a real in-process server (service.testing) serving the demo repository.

The address comes from $SLOTSERVE_ADDRESS, as an operator's shell would give it. Expected figures are the demo
models' declared tensors (demo/build_repository.py) and what each test itself sent; a registration is checked
again through the management client, not only through what the command printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from client import ClientError
from demo.build_repository import MODEL_NAMES

ROOT = Path(__file__).resolve().parents[3]
RUN_LIMIT = 120.0  # seconds a CLI process may take before the test fails (interpreter start included)


@pytest.fixture
def cli(monkeypatch):
    """`cli(running, *args) -> (exit status, stdout, stderr)` of `python -m client --timeout 30 *args`, with
    $SLOTSERVE_ADDRESS pointing at `running` and no token from the test's environment."""

    def run(running, *args: str) -> tuple[int, str, str]:
        environment = dict(os.environ, SLOTSERVE_ADDRESS=running.address)
        for name in ("SLOTSERVE_MANAGEMENT_TOKEN", "SLOTSERVE_INFERENCE_TOKEN"):
            environment.pop(name, None)
        done = subprocess.run(
            [sys.executable, "-m", "client", "--timeout", "30", *args],
            cwd=ROOT,
            env=environment,
            capture_output=True,
            text=True,
            timeout=RUN_LIMIT,
        )
        return done.returncode, done.stdout, done.stderr

    return run


def assert_one_error_line(code: int, out: str, err: str, *, starts: str) -> None:
    assert code == 1 and out == ""
    assert err.startswith(f"error: {starts}") and err.endswith("\n") and err.count("\n") == 1, err


def simple_inputs(rows: int) -> dict[str, np.ndarray]:
    values = np.arange(rows * 16, dtype=np.int32).reshape(rows, 16)
    return {"INPUT0": values, "INPUT1": values}


def test_metadata_prints_the_models_inputs_and_outputs(slotserve, demo_repository, cli):
    running = slotserve(demo_repository, load_at_startup=False)
    code, out, err = cli(running, "metadata", "simple")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["model", "simple"]
    assert lines[1].split() == ["platform", "onnxruntime_onnx"]
    assert lines[2].split() == ["versions", "1"]
    assert lines[3:] == [
        "inputs:",
        "  NAME    DATATYPE  SHAPE",
        "  INPUT0  INT32     [-1, 16]",
        "  INPUT1  INT32     [-1, 16]",
        "outputs:",
        "  NAME     DATATYPE  SHAPE",
        "  OUTPUT0  INT32     [-1, 16]",
        "  OUTPUT1  INT32     [-1, 16]",
    ]
    code, out, err = cli(running, "metadata", "matmul_chain", "--json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert (data["name"], data["versions"]) == ("matmul_chain", ["1"])
    assert data["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [384, 64]}]
    assert data["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [384, 64]}]


def test_metadata_of_an_unknown_model_is_one_error_line(slotserve, demo_repository, cli):
    running = slotserve(demo_repository, load_at_startup=False)
    code, out, err = cli(running, "metadata", "no_such_model")
    assert_one_error_line(code, out, err, starts="NOT_FOUND (model_not_found): ")
    assert "'no_such_model'" in err


def test_config_prints_the_model_configuration_as_text(slotserve, demo_repository, cli):
    running = slotserve(demo_repository, load_at_startup=False, parallel_jobs=3)
    code, out, err = cli(running, "config", "simple_identity")
    assert (code, err) == (0, "")
    assert 'name: "simple_identity"' in out.splitlines()
    assert "max_batch_size: 8" in out.splitlines()
    assert 'backend: "onnxruntime"' in out.splitlines()
    squeezed = " ".join(out.split())
    assert 'input { name: "INPUT0" data_type: TYPE_STRING dims: -1 }' in squeezed
    assert 'output { name: "OUTPUT0" data_type: TYPE_STRING dims: -1 }' in squeezed
    assert (
        'instance_group { name: "simple_identity" count: 3 kind: KIND_CPU }' in squeezed
    )  # the server's slot count (parallel_jobs)
    code, out, err = cli(running, "--json", "config", "simple")
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert (data["name"], data["max_batch_size"]) == ("simple", 8)
    assert [(t["name"], t["data_type"], t["dims"]) for t in data["input"]] == [
        ("INPUT0", "TYPE_INT32", ["16"]),
        ("INPUT1", "TYPE_INT32", ["16"]),
    ]
    assert [t["name"] for t in data["output"]] == ["OUTPUT0", "OUTPUT1"]


def test_config_of_an_unknown_model_is_one_error_line(slotserve, demo_repository, cli):
    running = slotserve(demo_repository, load_at_startup=False)
    code, out, err = cli(running, "config", "no_such_model")
    assert_one_error_line(code, out, err, starts="NOT_FOUND (model_not_found): ")
    assert "'no_such_model'" in err


def test_stats_counts_what_the_test_sent(slotserve, demo_repository, cli):
    running = slotserve(demo_repository, load_at_startup=False)
    running.client.infer("simple", simple_inputs(2))
    running.client.infer("simple", simple_inputs(1))
    with pytest.raises(ClientError) as refused:
        running.client.infer("simple", {"INPUT0": simple_inputs(1)["INPUT0"]})  # INPUT1 missing: a failure
    assert refused.value.reason == "invalid_request_error"
    code, out, err = cli(running, "stats", "simple")
    assert (code, err) == (0, "")
    header, *rows = out.splitlines()
    assert header.split() == [
        "MODEL",
        "VERSION",
        "INFERENCES",
        "EXECUTIONS",
        "SUCCESS",
        "FAIL",
        "QUEUE",
        "AVG",
        "INFER",
        "AVG",
    ]
    assert len(rows) == 1
    cells = rows[0].split()
    # inferences add each request's batch size (2 + 1); executions and successes count requests.
    assert cells[:6] == ["simple", "1", "3", "2", "2", "1"]
    assert cells[6:8][1] == "ms" and cells[8:10][1] == "ms"

    # Every model by default, each once, in the repository's order; the untouched ones at zero.
    code, out, err = cli(running, "stats", "--json")
    assert (code, err) == (0, "")
    by_name = {item["name"]: item for item in json.loads(out)}
    assert sorted(by_name) == sorted(MODEL_NAMES)
    simple = by_name["simple"]
    assert (simple["inference_count"], simple["execution_count"]) == ("3", "2")
    assert simple["inference_stats"]["success"]["count"] == "2"
    assert simple["inference_stats"]["fail"]["count"] == "1"
    assert "inference_count" not in by_name["matmul_chain"]  # proto3 JSON leaves zero counts out


def test_stats_of_an_unknown_model_is_one_error_line(slotserve, demo_repository, cli):
    running = slotserve(demo_repository, load_at_startup=False)
    code, out, err = cli(running, "stats", "no_such_model")
    assert_one_error_line(code, out, err, starts="NOT_FOUND (model_not_found): ")
    assert "'no_such_model'" in err


def test_register_loads_the_model_with_the_slots_asked_for(slotserve, demo_repository, cli):
    running = slotserve(demo_repository, load_at_startup=False, allow_management=True, parallel_jobs=4)
    assert running.management.get("simple_identity").loaded is False
    code, out, err = cli(running, "register", "simple_identity", "--slots", "2")
    assert (code, err) == (0, "")
    block = dict(line.split(None, 1) for line in out.splitlines() if not line.startswith("admission"))
    assert block["model"] == "simple_identity"
    assert block["state"] == "READY (loaded)"
    assert block["slots"].startswith("2 (active 0, queued 0, max parallel ")
    assert block["backend"] == "onnxruntime"
    # The server agrees: loaded, with two slots.
    status = running.management.get("simple_identity")
    assert (status.loaded, status.slots) == (True, 2)
    # --json reconfigures in place and prints the status as data.
    code, out, err = cli(running, "register", "simple_identity", "--slots", "3", "--json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert (data["model_id"], data["state"], data["loaded"], data["slots"]) == ("simple_identity", "READY", True, 3)
    assert running.management.get("simple_identity").slots == 3


def test_register_of_a_model_without_a_directory_is_one_error_line(slotserve, demo_repository, cli):
    running = slotserve(demo_repository, load_at_startup=False, allow_management=True, parallel_jobs=4)
    code, out, err = cli(running, "register", "no_such_model", "--slots", "1")
    assert_one_error_line(code, out, err, starts="INVALID_ARGUMENT (invalid_request_error): ")
    assert "model 'no_such_model': no model directory" in err
    assert "no_such_model" not in {status.model_id for status in running.management.list()}
