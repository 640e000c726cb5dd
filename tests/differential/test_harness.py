"""The harness itself: it finds the reference or says why not, and never writes into the venv."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from generated import grpc_service_pb2 as pb

from . import reference
from .reference import STUB_PYTHON, find_installation, private_backends


def test_a_checkout_without_the_reference_gets_a_reason_naming_the_setup(tmp_path, monkeypatch):
    monkeypatch.delenv("SLOTSERVE_TRITON_VENV", raising=False)
    installation, reason = find_installation(tmp_path)
    assert installation is None
    assert str(tmp_path / "bench" / ".venv-pytriton") in reason and "bench/setup.sh" in reason


def test_the_environment_variable_names_another_venv(tmp_path, monkeypatch):
    monkeypatch.setenv("SLOTSERVE_TRITON_VENV", str(tmp_path / "elsewhere"))
    installation, reason = find_installation(Path("/nonexistent"))
    assert installation is None and str(tmp_path / "elsewhere") in reason


def test_the_stub_goes_into_a_private_copy_of_the_backends(tmp_path):
    installation, reason = find_installation()
    if installation is None:
        pytest.skip(reason)
    backends = private_backends(installation, tmp_path)
    assert (backends / "python" / "triton_python_backend_stub").is_file()
    assert (backends / "python" / "libtriton_python.so").is_file()
    assert not (installation.tritonserver / "backends" / "python" / "triton_python_backend_stub").exists()
    assert (installation.tritonserver / "python_backend_stubs" / STUB_PYTHON).is_dir()


def test_a_port_taken_meanwhile_means_new_ports(tmp_path, monkeypatch):
    """The first ports free_ports() names are held by a listening socket of this test, as another process on the
    machine could do; run_triton notices that its server exited on the bind and starts on new ports."""
    installation, reason = find_installation()
    if installation is None:
        pytest.skip(reason)
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    answers = iter([[taken, *reference.free_ports(2)]])
    real = reference.free_ports
    monkeypatch.setattr(reference, "free_ports", lambda count: next(answers, None) or real(count))
    repository = tmp_path / "empty"
    repository.mkdir()
    try:
        with reference.run_triton(installation, repository, tmp_path) as running:
            assert running.address != f"127.0.0.1:{taken}"
            assert running.stub.ServerReady(pb.ServerReadyRequest(), timeout=60).ready
    finally:
        holder.close()
    first_attempt = (tmp_path / f"tritonserver-{taken}.log").read_text(errors="replace")
    assert "already in use" in first_attempt, first_attempt[-2000:]
