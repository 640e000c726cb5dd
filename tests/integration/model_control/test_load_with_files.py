"""Loads with files (Triton's model-repository extension) through a real server: RepositoryModelLoad's `config`
and `file:<path>` parameters. The files go to a private folder under --model-files-dir that the server removes when
the model no longer uses it; every refusal (no config, a bad name, too many bytes) writes nothing and leaves the
server and its models as they were."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import json_format, text_format

from generated import grpc_service_pb2 as pb
from generated import model_config_pb2
from service.testing import serve

from .._support import CALL_TIMEOUT, client_error, demo_subset, require_demo, rpc_error, stub

IDENTITY = "identity_fp32"
VALUES = np.arange(6, dtype=np.float32).reshape(1, 6)


def identity_config(name: str) -> str:
    text = (require_demo() / IDENTITY / "config.pbtxt").read_text()
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    config.name = name
    return json_format.MessageToJson(config)


def identity_bytes() -> bytes:
    return (require_demo() / IDENTITY / "1" / "model.onnx").read_bytes()


def load_request(name: str, files: dict[str, bytes], config: str | None) -> pb.RepositoryModelLoadRequest:
    request = pb.RepositoryModelLoadRequest(model_name=name)
    if config is not None:
        request.parameters["config"].string_param = config
    for path, content in files.items():
        request.parameters[path].bytes_param = content
    return request


def load(running, name: str, files: dict[str, bytes], config: str | None = "") -> None:
    config = identity_config(name) if config == "" else config
    stub(running).RepositoryModelLoad(load_request(name, files, config), timeout=CALL_TIMEOUT)


def refused(running, name: str, files: dict[str, bytes], config: str | None = ""):
    config = identity_config(name) if config == "" else config
    return rpc_error(stub(running).RepositoryModelLoad, load_request(name, files, config))


def folders(files_dir: Path, model: str) -> list[Path]:
    return sorted(files_dir.glob(f"slotserve-model-files-*/{model}-*"))


def identity_serves(running, name: str) -> bool:
    outputs = running.client.infer(name, {"INPUT0": VALUES})
    return bool(np.array_equal(outputs["OUTPUT0"], VALUES))


@pytest.fixture
def served(tmp_path):
    repository = demo_subset(tmp_path / "repository", IDENTITY)
    files_dir = tmp_path / "files"
    files_dir.mkdir()
    with serve(
        repository,
        model_control_mode="explicit",
        load_models=("*",),
        allow_management=True,
        model_files_dir=files_dir,
        max_load_file_bytes=len(identity_bytes()) + 300,
    ) as running:
        yield running, files_dir
    assert not list(files_dir.iterdir()), "the private folder outlived the server"


def test_a_load_with_files_serves_from_a_private_folder_and_unload_removes_it(served):
    running, files_dir = served
    model = identity_bytes()
    load(running, "fresh", {"file:1/model.onnx": model})
    assert identity_serves(running, "fresh")
    (first,) = folders(files_dir, "fresh")
    assert (first / "1" / "model.onnx").read_bytes() == model
    assert (first.parent.stat().st_mode & 0o777) == 0o700
    # A second load with files replaces the first folder.
    load(running, "fresh", {"file:1/model.onnx": model})
    (second,) = folders(files_dir, "fresh")
    assert second != first and identity_serves(running, "fresh")
    # A load without files reads the repository, which has no `fresh`: refused, and the files load keeps serving.
    error = rpc_error(stub(running).RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="fresh"))
    assert error.code == "INVALID_ARGUMENT" and "failed to load 'fresh'" in error.message, error
    assert folders(files_dir, "fresh") == [second] and identity_serves(running, "fresh")
    stub(running).RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="fresh"), timeout=CALL_TIMEOUT)
    assert folders(files_dir, "fresh") == []
    error = client_error(running.client.infer, "fresh", {"INPUT0": VALUES})
    assert (error.code, error.reason) == ("UNAVAILABLE", "model_not_loaded"), error
    assert identity_serves(running, IDENTITY)


def test_a_repository_model_loaded_with_files_then_without_reads_its_folder_again(served):
    running, files_dir = served
    load(running, IDENTITY, {"file:1/model.onnx": identity_bytes()})
    assert len(folders(files_dir, IDENTITY)) == 1
    stub(running).RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=IDENTITY), timeout=CALL_TIMEOUT)
    assert folders(files_dir, IDENTITY) == []  # served from the repository again: the files are gone
    assert running.server.registry.get(IDENTITY).settings.source == IDENTITY
    assert identity_serves(running, IDENTITY)


BAD_NAMES = {
    "file:": "empty",
    "file:/tmp/model.onnx": "absolute",
    "file:../model.onnx": "'..'",
    "file:1/../../model.onnx": "'..'",
    "file:./.": "only '.' steps",
    "file:1//model.onnx": "empty components",
    "file:1/model.onnx/": "empty components",
    "file:1/" + "m" * 256: "NAME_MAX (255)",
    "file:1/a\x00b": "NUL",
}


@pytest.mark.parametrize("key", sorted(BAD_NAMES))
def test_a_bad_file_name_is_refused_and_nothing_is_written(served, key):
    running, files_dir = served
    load(running, "kept", {"file:1/model.onnx": identity_bytes()})
    error = refused(running, "kept", {"file:1/model.onnx": identity_bytes(), key: b"x"})
    # Triton's code and words for a file: path it cannot write (issue 34, item 8), then the reason.
    assert (error.code, error.reason) == ("INTERNAL", "repository_poll_failed"), error
    assert error.message.startswith("failed to load 'kept', failed to poll from model repository: "), error
    assert BAD_NAMES[key] in error.message, error
    assert len(folders(files_dir, "kept")) == 1  # the served load's folder only
    assert identity_serves(running, "kept") and identity_serves(running, IDENTITY)


def test_dot_steps_are_accepted_as_triton_does(served):
    running, files_dir = served
    load(running, "dotted", {"file:./1/./model.onnx": identity_bytes()})
    (folder,) = folders(files_dir, "dotted")
    assert (folder / "1" / "model.onnx").is_file() and identity_serves(running, "dotted")


def test_a_component_of_exactly_name_max_bytes_is_accepted(served):
    running, files_dir = served
    name = "é" * 127 + "x"  # 255 bytes in UTF-8
    load(running, "long", {"file:1/model.onnx": identity_bytes(), f"file:1/{name}": b"x"})
    (folder,) = folders(files_dir, "long")
    assert (folder / "1" / name).read_bytes() == b"x"


def test_files_without_config_are_refused(served):
    running, files_dir = served
    error = refused(running, "noconfig", {"file:1/model.onnx": identity_bytes()}, config=None)
    assert (error.code, error.reason) == ("INTERNAL", "repository_poll_failed"), error  # Triton's code and words
    assert error.message.startswith("failed to load 'noconfig', failed to poll from model repository: "), error
    assert "'config' parameter" in error.message, error
    assert folders(files_dir, "noconfig") == [] and "noconfig" not in [
        e.name for e in running.server.registry.entries()
    ]
    assert identity_serves(running, IDENTITY)


def test_files_over_the_byte_limit_are_refused_before_writing(served):
    running, files_dir = served
    limit = running.server.options.max_load_file_bytes
    model = identity_bytes()
    padding = b"\0" * (limit - len(model) + 1)
    error = refused(running, "big", {"file:1/model.onnx": model, "file:1/padding": padding})
    assert (error.code, error.reason) == ("RESOURCE_EXHAUSTED", "load_files_limit"), error
    assert f"--max-load-file-bytes ({limit})" in error.message and str(limit + 1) in error.message, error
    assert folders(files_dir, "big") == []
    load(running, "big", {"file:1/model.onnx": model, "file:1/padding": padding[:-1]})  # exactly the limit
    assert identity_serves(running, "big") and identity_serves(running, IDENTITY)


def test_a_file_sent_as_a_string_is_refused(served):
    running, files_dir = served
    request = load_request("text", {}, identity_config("text"))
    request.parameters["file:1/model.onnx"].string_param = "not bytes"
    error = rpc_error(stub(running).RepositoryModelLoad, request)
    assert error.code == "INVALID_ARGUMENT" and "bytes_param" in error.message, error
    assert folders(files_dir, "text") == []


def test_a_load_whose_files_do_not_load_leaves_no_folder_and_keeps_the_served_one(served):
    running, files_dir = served
    load(running, "kept", {"file:1/model.onnx": identity_bytes()})
    (served_folder,) = folders(files_dir, "kept")
    error = refused(running, "kept", {"file:1/model.onnx": b"not an onnx model"})
    assert error.message.startswith("load failed for model 'kept': version 1 is at UNAVAILABLE state: "), error
    assert str(files_dir) not in error.message and str(files_dir.resolve()) not in error.message, error
    assert folders(files_dir, "kept") == [served_folder] and identity_serves(running, "kept")


def test_lazy_mode_loads_with_files_too_and_shutdown_removes_them(tmp_path):
    repository = demo_subset(tmp_path / "repository")
    files_dir = tmp_path / "files"
    files_dir.mkdir()
    with serve(repository, allow_management=True, model_files_dir=files_dir) as running:
        load(running, "fresh", {"file:1/model.onnx": identity_bytes()})
        assert identity_serves(running, "fresh") and len(folders(files_dir, "fresh")) == 1
    assert not list(files_dir.iterdir())


def test_poll_and_none_modes_refuse_loads_with_files(tmp_path):
    repository = demo_subset(tmp_path / "repository")
    files_dir = tmp_path / "files"
    files_dir.mkdir()
    for mode in ("none", "poll"):
        with serve(repository, allow_management=True, model_control_mode=mode, model_files_dir=files_dir) as running:
            error = refused(running, "fresh", {"file:1/model.onnx": identity_bytes()})
            assert (error.code, error.reason) == ("UNAVAILABLE", "model_control_disabled"), error
    assert not list(files_dir.iterdir())


def test_unusable_files_dir_is_refused_at_startup(tmp_path):
    from service.options import ServerOptions

    (tmp_path / "a-file").write_text("")
    with pytest.raises(ValueError, match="--model-files-dir .* is not a folder"):
        ServerOptions(model_repository=tmp_path, model_files_dir=tmp_path / "a-file")


def test_a_missing_files_dir_is_made_by_the_first_load_with_files_not_at_startup(tmp_path):
    """Nothing is written at startup (a read-only root filesystem starts: tests/unit/deploy/test_manifests_start.py);
    the folder is made when a load with files needs it."""
    repository = demo_subset(tmp_path / "repository")
    files_dir = tmp_path / "volume" / "model-files"
    with serve(repository, allow_management=True, model_files_dir=files_dir) as running:
        assert not (tmp_path / "volume").exists()
        load(running, "fresh", {"file:1/model.onnx": identity_bytes()})
        assert identity_serves(running, "fresh") and len(folders(files_dir, "fresh")) == 1
