"""The test doubles stay out of production: a server started without --enable-test-backends neither imports
engine/testing/ nor serves a fixture model, and refuses one by name; the wheel leaves the package out."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from client import ClientError, InferenceClient
from tests.conftest import ROOT
from tests.shutdown.harness import ServerProcess, write_fixture_model


def test_a_production_server_refuses_a_fixture_model_naming_the_flag(tmp_path):
    write_fixture_model(tmp_path, "m")
    with ServerProcess(tmp_path, test_backends=False) as server:
        with InferenceClient(server.address) as client:
            with pytest.raises(ClientError) as refused:
                client.infer("m", {"INPUT0": np.ones(3, np.float32)})
            assert "backend 'fixture' is a test backend" in str(refused.value)
            assert "--enable-test-backends" in str(refused.value)
            assert client.live()  # the refusal left the server serving


def test_with_the_flag_the_same_model_serves(tmp_path):
    write_fixture_model(tmp_path, "m")
    with ServerProcess(tmp_path, test_backends=True) as server:
        with InferenceClient(server.address) as client:
            outputs = client.infer("m", {"INPUT0": np.arange(3, dtype=np.float32)})
            np.testing.assert_array_equal(outputs["OUTPUT0"], np.arange(3, dtype=np.float32))


def test_building_a_production_server_imports_no_test_double():
    code = (
        "import sys; from service.server import default_backends; backends = default_backends(); "
        "assert 'fixture' not in backends, backends; "
        "leaked = sorted(m for m in sys.modules if m.startswith('engine.testing')); "
        "assert not leaked, leaked; print('clean')"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "clean", result.stderr


def test_the_wheel_leaves_the_test_doubles_out():
    import tomllib

    from setuptools import find_packages

    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = find_packages(str(ROOT), include=settings["include"], exclude=settings["exclude"])
    assert "engine" in packages and "engine.tensorrt" in packages
    assert not [name for name in packages if name.startswith("engine.testing")], packages
