"""The harness itself: it finds the reference or says why not, and never writes into the venv."""

from __future__ import annotations

from pathlib import Path

import pytest

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
