"""--model-control-mode through a real server (docs/model-control.md): explicit mode keeps an unloaded model
unloaded until RepositoryModelLoad, none and poll refuse repository load/unload as Triton does, and poll mode picks
up added, changed and removed folders, retrying one still being written, without disturbing the served model.

Polls are driven by calling the server's `control.poll_once()` (the poller's own interval is an hour), except one
test that lets the poller run every 50 ms and waits, with a deadline, for the state it must reach.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from generated import grpc_service_pb2 as pb
from service.testing import serve

from .._support import CALL_TIMEOUT, client_error, demo_subset, rpc_error, stub
from .._support import write_fixture_model as write_declared_model

INPUT = {"INPUT0": np.arange(4, dtype=np.float32)}
HOUR = 3600.0
WAIT = 20.0


def write_model(repository: Path, name: str, extra: str = "") -> Path:
    return write_declared_model(
        repository, name, inputs=[("INPUT0", "FP32", [4])], outputs=[("OUTPUT0", "FP32", [4])], extra=extra
    )


def index(running) -> dict[str, tuple[str, str]]:
    response = stub(running).RepositoryIndex(pb.RepositoryIndexRequest(), timeout=CALL_TIMEOUT)
    return {model.name: (model.state, model.reason) for model in response.models}


def serves(running, name: str) -> bool:
    outputs = running.client.infer(name, INPUT)
    return bool(np.array_equal(outputs["OUTPUT0"], INPUT["INPUT0"]))


def repository_load(running, name: str, **parameters) -> None:
    request = pb.RepositoryModelLoadRequest(model_name=name)
    for key, value in parameters.items():
        request.parameters[key].string_param = value
    stub(running).RepositoryModelLoad(request, timeout=CALL_TIMEOUT)


def repository_unload(running, name: str) -> None:
    stub(running).RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=name), timeout=CALL_TIMEOUT)


def max_batch_size(running, name: str) -> int:
    return stub(running).ModelConfig(pb.ModelConfigRequest(name=name), timeout=CALL_TIMEOUT).config.max_batch_size


# ---- explicit ---------------------------------------------------------------------------------------------------


def test_explicit_mode_loads_only_the_named_models_and_a_request_never_loads_one(tmp_path):
    for name in ("a", "b"):
        write_model(tmp_path, name)
    with serve(tmp_path, model_control_mode="explicit", load_models=("a",), allow_management=True) as running:
        assert index(running)["a"][0] == "READY" and index(running)["b"][0] == "UNAVAILABLE"
        assert serves(running, "a")
        for _ in range(2):  # refused, and still unloaded after the refusal
            error = client_error(running.client.infer, "b", INPUT)
            assert (error.code, error.reason) == ("UNAVAILABLE", "model_not_loaded"), error
            assert "model 'b' is not loaded" in error.message and "--model-control-mode explicit" in error.message
            assert "RepositoryModelLoad" in error.message
            assert index(running)["b"][0] == "UNAVAILABLE"
        repository_load(running, "b")
        assert index(running)["b"][0] == "READY" and serves(running, "b")


def test_explicit_mode_unload_then_infer_stays_unavailable_until_loaded(tmp_path):
    write_model(tmp_path, "a")
    write_model(tmp_path, "other")
    with serve(tmp_path, model_control_mode="explicit", load_models=("*",), allow_management=True) as running:
        assert serves(running, "a") and serves(running, "other")
        repository_unload(running, "a")
        for _ in range(3):
            error = client_error(running.client.infer, "a", INPUT)
            assert (error.code, error.reason) == ("UNAVAILABLE", "model_not_loaded"), error
            assert not running.client.model_ready("a")
        assert index(running)["a"][0] == "UNAVAILABLE"
        assert serves(running, "other")  # untouched
        repository_load(running, "a")
        assert running.client.model_ready("a") and serves(running, "a")


def test_explicit_mode_without_load_model_starts_with_nothing_loaded(tmp_path):
    write_model(tmp_path, "a")
    with serve(tmp_path, model_control_mode="explicit", allow_management=True) as running:
        assert index(running) == {"a": ("UNAVAILABLE", "unloaded")}
        assert running.server.registry.get("a").status().loaded is False


def test_explicit_mode_load_model_naming_no_folder_is_logged_and_the_server_starts(tmp_path, caplog):
    write_model(tmp_path, "a")
    with serve(tmp_path, model_control_mode="explicit", load_models=("missing", "a")) as running:
        assert serves(running, "a")
    assert any(
        "missing" in record.getMessage() and "not loaded at startup" in record.getMessage() for record in caplog.records
    )


def test_lazy_mode_still_loads_on_the_first_request_after_an_unload(tmp_path):
    write_model(tmp_path, "a")
    with serve(tmp_path, allow_management=True) as running:
        repository_unload(running, "a")
        assert serves(running, "a")  # slotserve's own mode: the request loads it


# ---- none -------------------------------------------------------------------------------------------------------


def test_none_mode_refuses_repository_load_and_unload_and_keeps_serving(tmp_path):
    write_model(tmp_path, "a")
    with serve(tmp_path, model_control_mode="none", allow_management=True) as running:
        assert serves(running, "a")
        calls = (
            (stub(running).RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="a")),
            (stub(running).RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name="a")),
        )
        for method, request in calls:
            error = rpc_error(method, request)
            assert (error.code, error.reason) == ("UNAVAILABLE", "model_control_disabled"), error
            assert "explicit model load / unload is not allowed" in error.message
        assert index(running)["a"][0] == "READY" and serves(running, "a")


def test_none_mode_request_never_loads_a_model_unloaded_otherwise(tmp_path):
    """slotserve's own management API stays (with --allow-management); a model it unloads is not loaded again by
    a request."""
    write_model(tmp_path, "a")
    with serve(tmp_path, model_control_mode="none", allow_management=True) as running:
        running.management.unload("a")
        error = client_error(running.client.infer, "a", INPUT)
        assert (error.code, error.reason) == ("UNAVAILABLE", "model_not_loaded"), error
        assert "--model-control-mode none" in error.message
        assert running.server.registry.get("a").status().loaded is False


# ---- poll -------------------------------------------------------------------------------------------------------


@pytest.fixture
def polled(tmp_path):
    repository = tmp_path / "repository"
    write_model(repository, "a")
    with serve(repository, model_control_mode="poll", repository_poll_seconds=HOUR, allow_management=True) as running:
        yield repository, running


def test_poll_mode_refuses_repository_load_as_triton_does(polled):
    _repository, running = polled
    error = rpc_error(stub(running).RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="a"))
    assert (error.code, error.reason) == ("UNAVAILABLE", "model_control_disabled"), error
    assert error.message == "explicit model load / unload is not allowed if polling is enabled"


def test_poll_adds_a_new_folder(polled):
    repository, running = polled
    assert "b" not in index(running)
    write_model(repository, "b")
    assert running.server.control.poll_once() == {"loaded": ["b"], "failed": [], "unloaded": []}
    assert index(running)["b"][0] == "READY" and serves(running, "b")
    # Nothing changed: the next scan does nothing.
    assert running.server.control.poll_once() == {"loaded": [], "failed": [], "unloaded": []}


def test_poll_reloads_a_changed_folder(polled):
    repository, running = polled
    assert max_batch_size(running, "a") == 0
    config = repository / "a" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 0", "max_batch_size: 4"))
    assert running.server.control.poll_once()["loaded"] == ["a"]
    assert max_batch_size(running, "a") == 4 and running.client.model_ready("a")


def test_poll_retries_a_half_written_config_and_the_served_model_keeps_serving(polled):
    repository, running = polled
    config = repository / "a" / "config.pbtxt"
    complete = config.read_text().replace("max_batch_size: 0", "max_batch_size: 4")
    config.write_text(complete[: len(complete) // 2])  # cut mid-way: does not parse
    assert running.server.control.poll_once()["failed"] == ["a"]
    assert running.client.model_ready("a") and serves(running, "a") and max_batch_size(running, "a") == 0
    # Not retried while the folder stays as it is.
    assert running.server.control.poll_once() == {"loaded": [], "failed": [], "unloaded": []}
    config.write_text(complete)
    assert running.server.control.poll_once()["loaded"] == ["a"]
    assert max_batch_size(running, "a") == 4 and running.client.model_ready("a")


def test_poll_retries_a_new_folder_whose_model_file_is_missing(tmp_path):
    repository = demo_subset(tmp_path / "repository")
    with serve(repository, model_control_mode="poll", repository_poll_seconds=HOUR) as running:
        demo = demo_subset(tmp_path / "demo", "simple")
        shutil.copytree(demo / "simple", repository / "simple", ignore=shutil.ignore_patterns("*.onnx"))
        assert running.server.control.poll_once()["failed"] == ["simple"]
        assert not running.client.model_ready("simple")
        for version in (demo / "simple").iterdir():
            if version.is_dir():
                for model in version.glob("*.onnx"):
                    shutil.copy(model, repository / "simple" / version.name / model.name)
        assert running.server.control.poll_once()["loaded"] == ["simple"]
        assert running.client.model_ready("simple")


def test_poll_unloads_a_removed_folder(polled):
    repository, running = polled
    write_model(repository, "b")
    running.server.control.poll_once()
    shutil.rmtree(repository / "b")
    assert running.server.control.poll_once() == {"loaded": [], "failed": [], "unloaded": ["b"]}
    assert not running.client.model_ready("b")
    error = client_error(running.client.infer, "b", INPUT)
    assert (error.code, error.reason) == ("UNAVAILABLE", "model_not_loaded"), error
    assert "--model-control-mode poll" in error.message
    assert serves(running, "a")


def test_the_poller_runs_on_its_own_every_interval(tmp_path):
    write_model(tmp_path, "a")
    with serve(tmp_path, model_control_mode="poll", repository_poll_seconds=0.05) as running:
        write_model(tmp_path, "b")
        deadline = time.monotonic() + WAIT
        while not running.client.model_ready("b"):
            assert time.monotonic() < deadline, "the poller did not load the new folder"
            time.sleep(0.01)  # ordering-free: polls an observable state until a deadline
        assert serves(running, "b")
