"""A Triton user's first-day paper cuts (issue 35, item 5), each against a real server:

* the client command line could not call a decoupled model: `python -m client stream` sends one request on
  ModelStreamInfer and prints every response as it arrives (and `infer` on such a model says to use it);
* a client without TLS against a TLS server heard "no server answers at ..." (a server does): it now hints at TLS,
  and a TLS client against a plaintext server says the server does not speak TLS;
* management enabled without a token was logged at INFO: it is a WARNING.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from service.testing import serve
from tests.integration._certs import make_pki
from tests.integration._support import demo_subset
from tests.python_models import REPOSITORY as PYTHON_MODELS
from tests.shutdown.harness import ServerProcess, write_fixture_model
from tests.unit.client.test_cli_errors_and_pipes import run_client


@pytest.fixture(scope="module")
def decoupled(tmp_path_factory):
    repository = tmp_path_factory.mktemp("decoupled") / "models"
    shutil.copytree(PYTHON_MODELS / "repeat", repository / "repeat")
    with serve(repository) as running:
        yield running


def test_stream_prints_every_response_of_a_decoupled_model(decoupled, tmp_path):
    done = run_client("--address", decoupled.address, "stream", "repeat", "--input", "IN=[3]")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line for line in lines if line.startswith("response")] == ["response 1:", "response 2:", "response 3:"]
    assert lines[-1] == "3 response(s)" and "[2]" in done.stdout
    saved = run_client(
        "--address", decoupled.address, "stream", "repeat", "--input", "IN=[2]", "--output-dir", str(tmp_path)
    )
    assert saved.returncode == 0, saved.stderr
    assert [np.load(tmp_path / str(n) / "OUT.npy").tolist() for n in (1, 2)] == [[0], [1]]


def test_stream_json_is_one_object_per_response(decoupled):
    done = run_client("--address", decoupled.address, "stream", "repeat", "--input", "IN=[2]", "--json")
    assert done.returncode == 0, done.stderr
    objects = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(item["response"], item["outputs"]["OUT"]["data"]) for item in objects] == [(1, [0]), (2, [1])]


def test_stream_reports_an_error_response_and_exits_1(decoupled):
    done = run_client("--address", decoupled.address, "stream", "repeat", "--input", "IN=[-1]")
    assert done.returncode == 1
    assert done.stderr.splitlines() == ["error: response 1: UNKNOWN: n must be >= 0, got -1"]  # the model's words
    assert done.stdout.splitlines()[-1] == "1 response(s), 1 of them error(s)"


def test_infer_on_a_decoupled_model_points_at_stream(decoupled):
    done = run_client("--address", decoupled.address, "infer", "repeat", "--input", "IN=[3]")
    assert done.returncode == 1
    assert "(call it with: python -m client stream repeat --input ...)" in done.stderr, done.stderr


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_a_plaintext_client_of_a_tls_server_hears_about_tls(pki, tmp_path):
    repository = demo_subset(tmp_path / "repository", "simple")
    with serve(repository, tls_cert=pki.server.cert, tls_key=pki.server.key, tls_ca=pki.ca.cert) as running:
        done = run_client("--address", running.address, "health")
    assert done.returncode == 1
    assert "no server answers" not in done.stderr
    assert f"a server at {running.address} closed the connection at once: it may speak TLS only" in done.stderr
    assert "--tls-ca FILE" in done.stderr


def test_a_tls_client_of_a_plaintext_server_hears_it_does_not_speak_tls(pki, tmp_path):
    repository = demo_subset(tmp_path / "repository", "simple")
    with serve(repository) as running:
        done = run_client("--address", running.address, "--tls-ca", str(pki.ca.cert), "health")
    assert done.returncode == 1
    assert f"the server at {running.address} does not speak TLS" in done.stderr, done.stderr


def test_a_refused_connection_still_says_no_server_answers(pki, tmp_path):
    repository = demo_subset(tmp_path / "repository", "simple")
    with serve(repository) as running:
        address = running.address
    done = run_client("--address", address, "--tls-ca", str(pki.ca.cert), "health")
    assert done.returncode == 1 and f"no server answers at {address}" in done.stderr, done.stderr


def test_management_without_a_token_is_a_warning(tmp_path):
    repository = tmp_path / "models"
    write_fixture_model(repository, "m")
    with ServerProcess(repository, "--allow-management") as server:
        lines = [line for line in server.log.splitlines() if "management: ENABLED WITHOUT A TOKEN" in line]
    assert len(lines) == 1 and " WARNING slotserve: " in lines[0], lines


def test_management_with_a_token_stays_info(tmp_path):
    repository = tmp_path / "models"
    write_fixture_model(repository, "m")
    with ServerProcess(repository, "--allow-management", "--management-token", "t0ken-for-test") as server:
        lines = [line for line in server.log.splitlines() if "management: enabled, bearer token required" in line]
    assert len(lines) == 1 and " INFO slotserve: " in lines[0], lines
