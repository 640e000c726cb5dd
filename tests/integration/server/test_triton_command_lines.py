"""A tritonserver command line starts slotserve (issue 35, item 4), as real processes: Triton's names for our flags
serve, and `--exit-on-error` has Triton's meaning (a model that fails at startup stops the server, exit 1) with
slotserve's default (false: the others serve, the failed one is listed with its reason).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from generated import grpc_service_pb2 as pb
from tests.integration._support import client_error
from tests.shutdown.harness import ROOT, WAIT, ServerProcess, wait_until, write_fixture_model

BROKEN = 'name: "broken"\nbackend: "no-such-backend"\n'


def repository_with_a_broken_model(tmp_path):
    repository = tmp_path / "models"
    write_fixture_model(repository, "good")
    (repository / "broken" / "1").mkdir(parents=True)
    (repository / "broken" / "config.pbtxt").write_text(BROKEN)
    return repository


def test_exit_on_error_stops_the_server_when_a_model_fails_at_startup(tmp_path):
    repository = repository_with_a_broken_model(tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "service",
            "--model-store",
            str(repository),
            "--grpc-port",
            "0",
            "--enable-test-backends",
            "--exit-on-error=true",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT * 3,
    )
    assert done.returncode == 1, done.stderr
    assert "slotserve listening" not in done.stdout
    assert done.stderr.splitlines()[-1].startswith(
        "slotserve: --exit-on-error: 1 model(s) failed to load at startup: 'broken' (the log says why)"
    ), done.stderr
    assert "model 'broken': not loaded at startup" in done.stderr


def test_exit_on_error_in_explicit_mode_counts_the_models_named_by_load_model(tmp_path):
    repository = repository_with_a_broken_model(tmp_path)
    command = [sys.executable, "-m", "service", "--model-repository", str(repository), "--port", "0"]
    command += ["--enable-test-backends", "--exit-on-error", "--model-control-mode=explicit", "--load-model=broken"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=WAIT * 3)
    assert done.returncode == 1 and "failed to load at startup: 'broken'" in done.stderr, done.stderr


def test_by_default_a_model_that_fails_at_startup_leaves_the_others_serving(tmp_path):
    repository = repository_with_a_broken_model(tmp_path)
    with ServerProcess(repository) as server:
        assert server.client.model_ready("good")
        index = {model.name: model for model in server.client.repository_index()}
        assert index["broken"].state == "UNAVAILABLE" and "no-such-backend" in index["broken"].reason


def test_a_tritonserver_command_line_serves(tmp_path):
    """Flags as a Triton Helm chart passes them (values in both forms), on top of the harness's own."""
    repository = tmp_path / "models"
    write_fixture_model(repository, "good")
    flags = [
        "--grpc-port=0",
        "--grpc-address",
        "127.0.0.1",
        "--allow-http=false",
        "--allow-grpc=true",
        "--allow-metrics=false",
        "--exit-timeout-secs=5",
        "--repository-poll-secs=5",
        "--model-control-mode=poll",
        "--strict-model-config=false",
        "--log-verbose=1",
        "--exit-on-error=false",
        "--grpc-keepalive-time=10000",
        "--grpc-keepalive-timeout=5000",
        "--model-load-thread-count=2",
    ]
    with ServerProcess(repository, *flags) as server:
        assert server.stub.ServerReady(pb.ServerReadyRequest(), timeout=WAIT).ready
        assert server.client.model_ready("good")
        # --log-verbose 1 is DEBUG, where every rejected request has a line (at INFO: one per model every 10 s)
        for _ in range(2):
            assert client_error(server.client.infer, "good", {"NO_SUCH_INPUT": np.zeros(1, np.float32)})
        wait_until(lambda: server.log.count("rejected a request (invalid_request_error)") == 2, "two rejected lines")
