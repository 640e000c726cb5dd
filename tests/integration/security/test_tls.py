"""TLS (`--tls-cert/--tls-key`) and mutual TLS (`--tls-client-ca`), with certificates made at test time.

A TLS server serves TLS clients end to end and nothing else: a plaintext client, a client that does not trust
the server's CA, and (with mutual TLS) a client without a certificate or with one from another CA all fail,
and the server keeps serving. Unusable certificate files stop startup with a message naming the flag and file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from client import ClientError, InferenceClient, ManagementClient
from client import cli as client_cli
from service.testing import serve
from service.tls import TLSConfigError

from .._certs import OTHER_NAME, make_pki
from .._support import ROOT, demo_subset

PROBE_TIMEOUT = 10.0  # a refused handshake fails at once; this only bounds a broken test
CALL_TIMEOUT = 60.0
TOKEN = "tls-mgmt-T0ken"
INPUTS = {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16), "INPUT1": np.full((1, 16), 3, np.int32)}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def repository(tmp_path):
    return demo_subset(tmp_path / "repository", "simple")


pytestmark = pytest.mark.usefixtures("no_token_environment")


def infers(client: InferenceClient) -> None:
    outputs = client.infer("simple", INPUTS, timeout=CALL_TIMEOUT)
    np.testing.assert_array_equal(outputs["OUTPUT0"], INPUTS["INPUT0"] + 3)
    np.testing.assert_array_equal(outputs["OUTPUT1"], INPUTS["INPUT0"] - 3)


def fails_to_connect(address: str, **client_options) -> ClientError:
    with InferenceClient(address, timeout=PROBE_TIMEOUT, **client_options) as client:
        with pytest.raises(ClientError) as info:
            client.live()
    assert info.value.code == "UNAVAILABLE", info.value
    return info.value


def test_tls_end_to_end(repository, pki):
    with serve(
        repository,
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        tls_ca=pki.ca.cert,
        allow_management=True,
        management_token=TOKEN,
    ) as running:
        infers(running.client)
        assert [item["OUTPUT0"][0, 1] for item in running.client.stream_infer("simple", [INPUTS] * 2)] == [4, 4]
        assert running.client.health() == "SERVING"
        assert running.management.unload("simple").loaded is False  # the token travels inside TLS
        assert running.management.register("simple").loaded
        # PEM bytes work as well as paths, and "localhost" (also in the certificate) as the checked name.
        with InferenceClient(
            running.address, tls_ca=pki.ca.cert.read_bytes(), tls_server_name="localhost", timeout=CALL_TIMEOUT
        ) as other:
            infers(other)
        with ManagementClient(running.address, tls_ca=pki.ca.cert, token=TOKEN, timeout=CALL_TIMEOUT) as manager:
            assert manager.get("simple").loaded


def test_tls_refuses_plaintext_and_untrusting_clients(repository, pki):
    with serve(repository, tls_cert=pki.server.cert, tls_key=pki.server.key, tls_ca=pki.ca.cert) as running:
        fails_to_connect(running.address)  # plaintext
        infers(running.client)
        fails_to_connect(running.address, tls_ca=pki.rogue_ca.cert)  # does not trust the server's CA
        fails_to_connect(running.address, tls_ca=pki.ca.cert, tls_server_name="elsewhere.test")  # wrong name
        infers(running.client)


def test_target_name_override(repository, pki):
    """A certificate naming only slotserve.test, dialed at 127.0.0.1: verified against the overridden name."""
    with serve(
        repository,
        tls_cert=pki.other_name_server.cert,
        tls_key=pki.other_name_server.key,
        tls_ca=pki.ca.cert,
        tls_server_name=OTHER_NAME,
    ) as running:
        infers(running.client)
        fails_to_connect(running.address, tls_ca=pki.ca.cert)  # without the override the name does not match
        infers(running.client)


def test_mutual_tls(repository, pki):
    with serve(
        repository,
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        tls_client_ca=pki.ca.cert,
        tls_ca=pki.ca.cert,
        tls_client_cert=pki.client.cert,
        tls_client_key=pki.client.key,
    ) as running:
        infers(running.client)
        fails_to_connect(running.address, tls_ca=pki.ca.cert)  # no client certificate
        infers(running.client)
        fails_to_connect(
            running.address, tls_ca=pki.ca.cert, tls_cert=pki.rogue_client.cert, tls_key=pki.rogue_client.key
        )  # a certificate from another CA
        fails_to_connect(running.address)  # plaintext
        with InferenceClient(running.address, **running.client_options) as another:
            infers(another)
        assert (
            client_cli.main(
                [
                    "--address",
                    running.address,
                    "--timeout",
                    "30",
                    "--tls-ca",
                    str(pki.ca.cert),
                    "--tls-cert",
                    str(pki.client.cert),
                    "--tls-key",
                    str(pki.client.key),
                    "health",
                ]
            )
            == 0
        )
        assert (
            client_cli.main(["--address", running.address, "--timeout", "30", "--tls-ca", str(pki.ca.cert), "health"])
            == 1
        )


def test_client_tls_arguments_are_checked(pki, tmp_path, capsys):
    with pytest.raises(ValueError, match="go together"):
        InferenceClient("127.0.0.1:1", tls_cert=pki.client.cert)
    with pytest.raises(OSError):
        InferenceClient("127.0.0.1:1", tls_ca=tmp_path / "missing.pem")
    assert client_cli.main(["--tls-ca", str(tmp_path / "missing.pem"), "health"]) == 2
    assert "missing.pem" in capsys.readouterr().err


def _bad_tls_cases(pki, tmp_path):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(pki.server.key), "-aes256", "-passout", "pass:secret", "-out", str(encrypted)],
        check=True,
        capture_output=True,
    )
    server = (pki.server.cert, pki.server.key)
    return [
        ((tmp_path / "missing.pem", pki.server.key, None), "--tls-cert", "cannot read"),
        ((garbage, pki.server.key, None), "--tls-cert", "not a PEM certificate"),
        ((empty, pki.server.key, None), "--tls-cert", "empty"),
        ((pki.server.cert, tmp_path / "missing.key", None), "--tls-key", "cannot read"),
        ((pki.server.cert, garbage, None), "--tls-key", "not a usable PEM private key"),
        ((pki.server.cert, pki.client.key), "--tls-key", "does not match"),
        ((pki.server.cert, encrypted, None), "--tls-key", "encrypted"),
        ((*server, garbage), "--tls-client-ca", "not a PEM certificate"),
        ((*server, tmp_path / "missing-ca.pem"), "--tls-client-ca", "cannot read"),
    ]


def test_bad_tls_files_stop_startup(repository, pki, tmp_path):
    for files, flag, problem in _bad_tls_cases(pki, tmp_path):
        cert, key, client_ca = (*files, None)[:3]
        with pytest.raises(TLSConfigError) as info:
            with serve(repository, tls_cert=cert, tls_key=key, tls_client_ca=client_ca):
                pass
        message = str(info.value)
        assert message.startswith(flag) and problem in message, message
    # Options that cannot work together are refused before any file is read.
    with pytest.raises(ValueError, match="go together"):
        with serve(repository, tls_cert=pki.server.cert):
            pass
    with pytest.raises(ValueError, match="--tls-client-ca needs"):
        with serve(repository, tls_client_ca=pki.ca.cert):
            pass


def test_server_command_line_with_tls(repository, pki, tmp_path):
    """The flags end to end, and a mismatched key as the command line reports it (exit 1, one line)."""
    command = [
        sys.executable,
        "-m",
        "service",
        "--model-repository",
        str(repository),
        "--port",
        "0",
        "--no-load-at-startup",
        "--tls-cert",
        str(pki.server.cert),
    ]
    result = subprocess.run(
        command + ["--tls-key", str(pki.client.key)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1, result.stderr
    assert f"slotserve: --tls-key {pki.client.key} does not match the certificate" in result.stderr
    process = subprocess.Popen(
        command + ["--tls-key", str(pki.server.key), "--tls-client-ca", str(pki.ca.cert)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = process.stdout.readline()
        assert "listening on" in line, process.stderr.read() if process.poll() is not None else line
        address = line.split("listening on")[1].strip()
        with InferenceClient(
            address, tls_ca=pki.ca.cert, tls_cert=pki.client.cert, tls_key=pki.client.key, timeout=CALL_TIMEOUT
        ) as client:
            infers(client)
        fails_to_connect(address, tls_ca=pki.ca.cert)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert "transport: mutual TLS" in stderr
