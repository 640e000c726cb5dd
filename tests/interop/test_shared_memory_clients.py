"""Third-party clients passing tensors in system shared memory, from separate processes: tritonclient's own
shared-memory flows (clients/tritonclient_shm.py) and perf_analyzer `--shared-memory system`.

The server runs in this process, so after each client the test also reads the server's shared-memory registry:
the client's requests took region references, and nothing stays registered, held or open.
"""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.integration._shm import wait_until

from .support import run_process

pytestmark = pytest.mark.interop

SCRIPT = "tritonclient_shm.py"
PERF_ANALYZER = Path(__file__).resolve().parents[2] / "bench" / ".cache" / "perf_analyzer"


@pytest.fixture
def server(slotserve, demo_repository):
    return slotserve(demo_repository, shared_memory="system", parallel_jobs=2)


def assert_nothing_left(server) -> None:
    registry = server.server.shared_memory
    wait_until(lambda: registry.statistics().open_regions == 0, "every region closed")
    statistics = registry.statistics()
    assert (statistics.regions, statistics.holds, statistics.open_bytes) == (0, 0, 0), statistics


def test_tritonclient_simple_flow_with_inputs_and_outputs_in_system_shared_memory(server, run_client):
    result = run_client(SCRIPT, server.address, "simple")
    a, b = (np.asarray(result[name], dtype=np.int32) for name in ("INPUT0", "INPUT1"))
    np.testing.assert_array_equal(np.asarray(result["OUTPUT0"], dtype=np.int32), a + b)
    np.testing.assert_array_equal(np.asarray(result["OUTPUT1"], dtype=np.int32), a - b)
    assert {name: region["byte_size"] for name, region in result["status"].items()} == {
        "input_data": 2 * a.nbytes,
        "output_data": 2 * a.nbytes,
    }
    # Two requests: four region references, then two (INPUT0 and OUTPUT0 of the mixed request).
    assert server.server.shared_memory.statistics().taken == 6
    assert_nothing_left(server)


def test_tritonclient_bytes_flow(server, run_client):
    result = run_client(SCRIPT, server.address, "string")
    assert result["echoed"] == result["sent"] and len(result["sent"]) == 16
    assert server.server.shared_memory.statistics().taken == 2
    assert_nothing_left(server)


def test_tritonclient_sees_the_errors(server, run_client):
    result = run_client(SCRIPT, server.address, "errors")
    assert result["twice"]["status"] == "StatusCode.ALREADY_EXISTS"  # Triton's code and words
    assert "shared memory region 'region' already in manager" in result["twice"]["message"]
    assert result["unknown"]["status"] == "StatusCode.NOT_FOUND"
    assert "Unable to find shared memory region: 'nowhere'" in result["unknown"]["message"]
    assert_nothing_left(server)


@pytest.mark.skipif(not os.access(PERF_ANALYZER, os.X_OK), reason="perf_analyzer is set up by bench/setup.sh")
@pytest.mark.parametrize(
    "model, extra",
    [("simple", []), ("identity_fp32", ["--shape", "INPUT0:65536", "--output-shared-memory-size", str(65536 * 4)])],
)
def test_perf_analyzer_with_system_shared_memory(server, tmp_path, model, extra):
    out = tmp_path / "perf.csv"
    completed = run_process(
        [
            str(PERF_ANALYZER),
            "-i",
            "grpc",
            "-u",
            server.address,
            "-m",
            model,
            "--shared-memory",
            "system",
            "--concurrency-range",
            "2:2",
            "--measurement-interval",
            "500",
            "--stability-percentage",
            "1000",
            "--max-trials",
            "3",
            "-f",
            str(out),
            *extra,
        ],
        timeout=180,
        cwd=tmp_path,
    )
    assert completed.returncode == 0, f"{completed.stdout}\n{completed.stderr}"
    with open(out, newline="") as handle:
        rows = list(csv.DictReader(handle))
    inferences = server.client.statistics(model)[0].inference_stats.success.count
    assert float(rows[0]["Inferences/Second"]) > 0 and inferences > 0
    # Every request it sent named a region for each input and output (a request sending bytes takes no reference).
    tensors = 2 if model == "identity_fp32" else 4
    assert server.server.shared_memory.statistics().taken == inferences * tensors
    assert_nothing_left(server)


def test_the_client_script_is_not_imported_here():
    assert "tritonclient" not in sys.modules
