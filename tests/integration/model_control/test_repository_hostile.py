"""Hostile model names and repositories through a real server (issue 33, items 5, 8 and 9).

Names: every RPC that loads or registers a model checks the name (matched whole: no newline, no `/`, 1-128
characters) before anything touches the disk, and answers INVALID_ARGUMENT; a load with files writes only inside
--model-files-dir, and leaves nothing behind whatever ends it (a refusal, a client that gives up, a shutdown).

Repositories: a `config.pbtxt` that is a folder or a FIFO, a FIFO as a model file, a FIFO anywhere in a model
folder: the server starts, the other models serve, the broken ones are listed with their reason, and the poller
keeps polling.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf import json_format

from engine.testing.fixture import FixtureBackend
from generated import grpc_service_pb2 as pb
from generated import model_config_pb2
from service.testing import serve

from .._support import CALL_TIMEOUT, client_error, rpc_error, stub, write_fixture_model

INPUT = {"INPUT0": np.arange(4, dtype=np.float32)}
HOUR = 3600.0
BAD_NAMES = ["../../escaped", "/abs", "a/b", "m" * 300, "m\n", "m\r\n", "", ".", ".."]


def write_model(repository: Path, name: str) -> Path:
    return write_fixture_model(repository, name, inputs=[("INPUT0", "FP32", [4])], outputs=[("OUTPUT0", "FP32", [4])])


def fixture_config(name: str = "") -> str:
    config = model_config_pb2.ModelConfig(name=name, backend="fixture")
    config.input.add(name="INPUT0", data_type=model_config_pb2.TYPE_FP32, dims=[4])
    config.output.add(name="OUTPUT0", data_type=model_config_pb2.TYPE_FP32, dims=[4])
    return json_format.MessageToJson(config)


def load_request(name: str, files: dict[str, bytes] | None = None, config: str | None = None):
    request = pb.RepositoryModelLoadRequest(model_name=name)
    if config is not None:
        request.parameters["config"].string_param = config
    for key, content in (files or {}).items():
        request.parameters[key].bytes_param = content
    return request


def serves(running, name: str) -> bool:
    return bool(np.array_equal(running.client.infer(name, INPUT)["OUTPUT0"], INPUT["INPUT0"]))


def everything_under(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


@pytest.fixture
def explicit(tmp_path):
    """An explicit-mode server with one model `a`, its files folder at <tmp>/area/files (so that a folder written
    beside it, in <tmp>/area or <tmp>, is seen)."""
    repository = tmp_path / "area" / "repository"
    write_model(repository, "a")
    files_dir = tmp_path / "area" / "files"
    files_dir.mkdir()
    with serve(
        repository,
        model_control_mode="explicit",
        load_models=("a",),
        allow_management=True,
        model_files_dir=files_dir,
    ) as running:
        yield running, tmp_path, files_dir
    assert not list(files_dir.iterdir()), "the private folder outlived the server"


# ---- names ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_bad_name_is_refused_before_anything_is_written(explicit, name):
    running, area, files_dir = explicit
    before = everything_under(area)
    with_files = rpc_error(
        stub(running).RepositoryModelLoad, load_request(name, {"file:1/data": b"x" * 1000}, fixture_config())
    )
    without = rpc_error(stub(running).RepositoryModelLoad, load_request(name))
    for error in (with_files, without):
        assert error.code == "INVALID_ARGUMENT", (name, error)
        assert "invalid model name" in error.message, error.message
    assert everything_under(area) == before  # nothing written, inside --model-files-dir or beside it
    assert serves(running, "a")
    assert running.client.live()


@pytest.mark.parametrize("name", ["m\n", "a/b", "m" * 129])
def test_register_model_refuses_a_bad_name_too(tmp_path, name):
    write_model(tmp_path, "a")
    with serve(tmp_path, allow_management=True) as running:
        error = client_error(running.management.register, name, source="a")
        assert (error.code, error.reason) == ("INVALID_ARGUMENT", "invalid_request_error"), error
        assert "invalid model name" in error.message
        assert [status.model_id for status in running.management.list()] == ["a"]


def test_a_name_with_a_trailing_newline_is_not_a_second_model(explicit):
    running, _area, _files_dir = explicit
    error = rpc_error(stub(running).RepositoryModelLoad, load_request("a\n"))
    assert error.code == "INVALID_ARGUMENT", error
    index = stub(running).RepositoryIndex(pb.RepositoryIndexRequest(), timeout=CALL_TIMEOUT)
    assert [model.name for model in index.models] == ["a"]


# ---- loads with files: nothing left behind -------------------------------------------------------------------------


def test_a_load_whose_client_gives_up_while_queued_leaves_no_folder(tmp_path, controls):
    """The load waits for its exclusive lease behind a request held at `execute`; the client's deadline passes;
    the staged folder goes, the served one stays."""
    files_dir = tmp_path / "files"
    files_dir.mkdir()
    with serve(
        tmp_path / "repository",
        backends={"fixture": FixtureBackend(controls)},
        model_control_mode="explicit",
        allow_management=True,
        model_files_dir=files_dir,
    ) as running:
        stub(running).RepositoryModelLoad(
            load_request("f", {"file:1/first": b"1"}, fixture_config("f")), timeout=CALL_TIMEOUT
        )
        (served,) = files_dir.glob("slotserve-model-files-*/f-*")
        controls.gate("f", "execute").hold()
        busy = threading.Thread(target=running.client.infer, args=("f", INPUT), daemon=True)
        busy.start()
        try:
            controls.gate("f", "execute").wait_blocked(1)
            with pytest.raises(grpc.RpcError) as info:
                stub(running).RepositoryModelLoad(
                    load_request("f", {"file:1/second": b"2" * 1000}, fixture_config("f")), timeout=1.0
                )
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            # The server sees the call end too: its manager leaves the queue while the request still runs.
            admission = running.server.registry.get("f").admission
            deadline = time.monotonic() + CALL_TIMEOUT
            while admission.statistics().queued_managers:
                assert time.monotonic() < deadline, admission.statistics()
                time.sleep(0.01)  # ordering-free: polls an observable state until a deadline
        finally:
            controls.gate("f", "execute").release()
            busy.join(CALL_TIMEOUT)
        # Its folder goes as its call unwinds.
        deadline = time.monotonic() + CALL_TIMEOUT
        while list(files_dir.glob("slotserve-model-files-*/f-*")) != [served]:
            assert time.monotonic() < deadline, list(files_dir.glob("slotserve-model-files-*/*"))
            time.sleep(0.01)  # ordering-free: polls an observable state until a deadline
        assert serves(running, "f")


# ---- hostile repositories at startup, on load and in poll mode -------------------------------------------------------


def hostile_repository(root: Path) -> None:
    """Models `good`, `foldered` (config.pbtxt is a folder), `piped` (config.pbtxt is a FIFO), `pipedfile` (its
    model file is a FIFO), `noisy` (a good model with a FIFO beside its config)."""
    write_model(root, "good")
    (root / "foldered" / "config.pbtxt").mkdir(parents=True)
    (root / "piped").mkdir()
    os.mkfifo(root / "piped" / "config.pbtxt")
    piped_file = root / "pipedfile"
    (piped_file / "1").mkdir(parents=True)
    (piped_file / "config.pbtxt").write_text('name: "pipedfile"\nbackend: "onnxruntime"\n')
    os.mkfifo(piped_file / "1" / "model.onnx")
    write_model(root, "noisy")
    os.mkfifo(root / "noisy" / "notes")


def free_fifos(root: Path) -> None:
    """Open every FIFO under `root` for writing and close it: a reader the old code left blocked gets EOF."""
    for path in root.rglob("*"):
        try:
            if path.is_fifo():
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


@pytest.mark.parametrize("mode", ["lazy", "poll"])
def test_a_hostile_repository_still_starts_and_the_other_models_serve(tmp_path, mode):
    repository = tmp_path / "repository"
    hostile_repository(repository)
    try:
        with serve(repository, model_control_mode=mode, repository_poll_seconds=HOUR) as running:
            assert serves(running, "good") and serves(running, "noisy")
            index = stub(running).RepositoryIndex(pb.RepositoryIndexRequest(), timeout=CALL_TIMEOUT)
            listed = {model.name: (model.state, model.reason) for model in index.models}
            assert listed["foldered"] == (
                "UNAVAILABLE",
                "failed to load: foldered/config.pbtxt is a folder, not a file",
            )
            assert listed["piped"] == (
                "UNAVAILABLE",
                "failed to load: piped/config.pbtxt is a FIFO, not a regular file",
            )
            assert listed["pipedfile"] == (
                "UNAVAILABLE",
                "failed to load: pipedfile/1/model.onnx is a FIFO, not a regular file",
            )
            error = client_error(running.client.infer, "piped", INPUT)
            assert error.code == "UNAVAILABLE" and "is a FIFO" in error.message, error
            if mode == "poll":
                # A scan opens no FIFO: it finishes, and sees a new FIFO as a change of its folder.
                os.mkfifo(repository / "noisy" / "more")
                assert running.server.control.poll_once()["loaded"] == ["noisy"]
                assert serves(running, "noisy")
                write_model(repository, "late")
                assert running.server.control.poll_once()["loaded"] == ["late"]
    finally:
        free_fifos(repository)


def test_a_load_of_a_model_whose_config_became_a_folder_is_refused_and_it_keeps_serving(tmp_path):
    write_model(tmp_path, "a")
    with serve(tmp_path, model_control_mode="explicit", load_models=("a",), allow_management=True) as running:
        config = tmp_path / "a" / "config.pbtxt"
        config.unlink()
        config.mkdir()
        error = rpc_error(stub(running).RepositoryModelLoad, load_request("a"))
        assert error.code == "INVALID_ARGUMENT", error
        assert "a/config.pbtxt is a folder, not a file" in error.message
        assert serves(running, "a")
