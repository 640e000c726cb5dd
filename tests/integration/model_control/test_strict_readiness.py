"""--strict-readiness true (Triton's default; slotserve's is false): ServerReady is false while any model is loading or
has failed to load, and true again once every model is ready or simply not loaded. A model that is not loaded
(lazy mode, or unloaded) does not hold it back. Without the flag ServerReady says only whether the server serves.
NVIDIA's QA test_parse_error_model_no_version asks it of Triton (tests/differential/qa/test_lifecycle.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.errors import ModelLoadError
from engine.testing.fixture import FixtureBackend, FixtureControls
from generated import grpc_service_pb2 as pb
from service.testing import serve

from .._support import CALL_TIMEOUT, client_error, stub, write_fixture_model

TENSORS = {"inputs": [("X", "FP32", [4])], "outputs": [("Y", "FP32", [4])]}
BROKEN_CONFIG = 'name: "broken"\nbackend: "fixture"\ninput [ { name: "X" '


def server_ready(running) -> bool:
    return stub(running).ServerReady(pb.ServerReadyRequest(), timeout=CALL_TIMEOUT).ready


def serves(running, model: str) -> bool:
    x = np.arange(4, dtype=np.float32)
    return bool(np.array_equal(running.client.infer(model, {"X": x})["Y"], x))


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "repository"
    write_fixture_model(root, "good", **TENSORS)
    broken = write_fixture_model(root, "broken", **TENSORS)
    (broken / "config.pbtxt").write_text(BROKEN_CONFIG)
    return root


@pytest.mark.parametrize("strict", [True, False])
def test_a_model_that_cannot_be_read_keeps_a_strict_server_not_ready_until_it_is_fixed(repository, strict):
    with serve(repository, allow_management=True, strict_readiness=strict) as running:
        assert server_ready(running) is not strict
        assert serves(running, "good")  # the others serve meanwhile, either way
        (repository / "broken" / "config.pbtxt").write_text(
            (repository / "good" / "config.pbtxt").read_text().replace('"good"', '"broken"')
        )
        running.client.load("broken", timeout=CALL_TIMEOUT)
        assert server_ready(running) and serves(running, "broken")


def test_a_failed_load_keeps_a_strict_server_not_ready_and_an_unload_does_not(tmp_path):
    write_fixture_model(tmp_path, "m", **TENSORS)
    write_fixture_model(tmp_path, "lazy", **TENSORS)
    controls = FixtureControls()
    backends = {"fixture": FixtureBackend(controls)}
    with serve(
        tmp_path, backends=backends, load_at_startup=False, allow_management=True, strict_readiness=True
    ) as running:
        assert server_ready(running)  # nothing loaded yet, nothing failed
        controls.gate("m", "load").fail_next(ModelLoadError("fixture: no engine today"))
        error = client_error(running.client.load, "m", timeout=CALL_TIMEOUT)
        assert "no engine today" in error.message, error
        assert not server_ready(running)
        assert serves(running, "lazy") and not server_ready(running)  # the others serve (and load) meanwhile
        running.client.load("m", timeout=CALL_TIMEOUT)
        assert server_ready(running)
        running.client.unload("m", timeout=CALL_TIMEOUT)
        assert server_ready(running)  # unloaded is not failed


def test_a_strict_server_is_not_ready_while_a_model_loads(tmp_path):
    write_fixture_model(tmp_path, "m", **TENSORS)
    controls = FixtureControls()
    load = controls.gate("m", "load").hold()
    backends = {"fixture": FixtureBackend(controls)}
    with serve(
        tmp_path, backends=backends, load_at_startup=False, allow_management=True, strict_readiness=True
    ) as running:
        assert server_ready(running)
        loader = threading.Thread(target=running.client.load, args=("m",), kwargs={"timeout": CALL_TIMEOUT})
        loader.start()
        try:
            load.wait_blocked(1)
            assert not server_ready(running)
        finally:
            load.release()
            loader.join(CALL_TIMEOUT)
        assert not loader.is_alive() and server_ready(running) and serves(running, "m")
