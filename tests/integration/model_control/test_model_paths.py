"""Model files stay inside the model repository (issue 19, item 11), through a real server.

Every path a model names resolves, symbolic links followed, inside the repository, or inside a root the
operator allowed with --allow-model-root: its directory (RegisterModel's `source`, or the folder named after it),
config.pbtxt, the model file (`default_model_filename`, in config.pbtxt or a request's `config_json`) and a
backend's file parameters (TensorRT's `trt_cache_dir`). Anything else is refused with INVALID_ARGUMENT naming the
field, before any file is opened, and the server and its models are as they were.

Each test keeps a valid ONNX model *outside* the repository (`<tmp>/outside/stray/`): before the fix the server
loaded and served it, so "refused" and "not loaded" are checked against a file that would have worked. Messages
to clients name paths relative to the repository and never contain the server's absolute paths.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from client import ClientError
from engine.tensorrt import TensorRTBackend
from engine.testing.tensorrt_double import FakeDevice
from service.cli import build_parser, option_fields, security_lines
from service.options import ServerOptions
from service.testing import serve

from .._support import ROOT, client_error

WIDTH = 4
# An absolute path's folder part ("/x/y/"), not preceded by a character that would make it part of a relative one.
ABSOLUTE_FOLDERS = re.compile(r"(?<![\w.~-])/(?:[^\s/'\"]+/)+")
OUTSIDE_RULE = "must be inside the model repository or a root allowed with --allow-model-root"


def write_model(directory: Path, *, config: str | None = None, filename: str = "model.onnx") -> Path:
    """`directory/1/<filename>`: Y = X + 1 (FP32 [4]), and a config.pbtxt (backend onnxruntime, no name, so the
    folder may be registered under any id) unless `config` gives another text."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "ONE"], ["Y"])],
        "add_one",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [WIDTH])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [WIDTH])],
        [helper.make_tensor("ONE", TensorProto.FLOAT, [WIDTH], [1.0] * WIDTH)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    (directory / "1").mkdir(parents=True)
    (directory / "1" / filename).write_bytes(model.SerializeToString())
    (directory / "config.pbtxt").write_text(config if config is not None else 'backend: "onnxruntime"\n')
    return directory


def add_one_works(running, model: str) -> bool:
    x = np.arange(WIDTH, dtype=np.float32)
    return bool(np.array_equal(running.client.infer(model, {"X": x})["Y"], x + 1))


def assert_no_server_path(text: str, tmp_path: Path) -> None:
    """`text` (a message a client got) holds no absolute path of the server's."""
    for root in {str(tmp_path), str(tmp_path.resolve())}:
        assert root not in text, text
    assert ABSOLUTE_FOLDERS.search(text) is None, text


@pytest.fixture
def layout(tmp_path):
    """(repository with the model `good`, the folder outside it holding the model `stray`)."""
    repository, outside = tmp_path / "repository", tmp_path / "outside"
    write_model(repository / "good")
    write_model(outside / "stray")
    return repository, outside


def assert_refused(error: ClientError, field: str) -> None:
    assert (error.code, error.reason) == ("INVALID_ARGUMENT", "invalid_request_error"), error
    assert field in error.message and OUTSIDE_RULE in error.message, error.message


def assert_unharmed(running) -> None:
    """The refusal changed nothing: `good` is ready and serves, nothing else was registered."""
    assert [status.model_id for status in running.management.list()] == ["good"]
    assert running.management.get("good").loaded
    assert add_one_works(running, "good")


# ---- default_model_filename ----------------------------------------------------------------------------------


def stray_filenames(outside: Path) -> list[str]:
    # From <repository>/good/1: three levels up is <tmp>, where `outside` is.
    return [str(outside / "stray" / "1" / "model.onnx"), "../../../outside/stray/1/model.onnx"]


@pytest.mark.parametrize("which", ["absolute", "dot-dot"])
def test_a_default_model_filename_outside_the_repository_in_a_register_call_is_refused_by_name(layout, which):
    repository, outside = layout
    filename = dict(zip(["absolute", "dot-dot"], stray_filenames(outside), strict=True))[which]
    with serve(repository, allow_management=True) as running:
        error = client_error(
            running.management.register,
            "probe",
            source="good",
            config_json={"backend": "onnxruntime", "default_model_filename": filename},
        )
        assert_refused(error, "default_model_filename")
        assert_unharmed(running)
        # A reconfiguration of a loaded model is refused the same way, and the model keeps serving as it was.
        error = client_error(
            running.management.register,
            "good",
            config_json={"backend": "onnxruntime", "default_model_filename": filename},
        )
        assert_refused(error, "default_model_filename")
        assert_unharmed(running)
        assert running.management.get("good").last_error == ""


def test_a_default_model_filename_outside_the_repository_in_config_pbtxt_is_refused_by_name(layout, tmp_path):
    repository, _ = layout
    (repository / "escapes").mkdir()
    (repository / "escapes" / "1").mkdir()
    (repository / "escapes" / "config.pbtxt").write_text(
        'backend: "onnxruntime"\ndefault_model_filename: "../../../outside/stray/1/model.onnx"\n'
    )
    with serve(repository, allow_management=True) as running:
        # At startup it was not registered (its configuration is refused), and the index says why.
        index = {model.name: model for model in running.client.repository_index()}
        assert index["escapes"].state == "UNAVAILABLE"
        assert index["escapes"].reason.startswith("failed to load: ") and OUTSIDE_RULE in index["escapes"].reason
        assert_no_server_path(index["escapes"].reason, tmp_path)
        error = client_error(running.client.load, "escapes")
        assert_refused(error, "default_model_filename")
        assert_no_server_path(error.message, tmp_path)
        assert_unharmed(running)


# ---- source ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["absolute", "dot-dot"])
def test_a_source_outside_the_repository_is_refused_by_name(layout, which):
    repository, outside = layout
    source = str(outside / "stray") if which == "absolute" else "../outside/stray"
    with serve(repository, allow_management=True) as running:
        error = client_error(running.management.register, "stray", source=source)
        assert_refused(error, "source")
        assert_unharmed(running)
        # An existing model cannot be moved there either.
        error = client_error(running.management.register, "good", source=source)
        assert_refused(error, "source")
        assert_unharmed(running)


def test_an_absolute_source_inside_the_repository_is_accepted(layout):
    repository, _ = layout
    with serve(repository, allow_management=True) as running:
        status = running.management.register("again", source=str(repository.resolve() / "good"))
        assert status.loaded and add_one_works(running, "again")


# ---- symbolic links ------------------------------------------------------------------------------------------


def test_symbolic_links_inside_the_repository_that_lead_outside_are_refused(layout, tmp_path):
    repository, outside = layout
    (repository / "linked").symlink_to(outside / "stray", target_is_directory=True)
    (repository / "filelink" / "1").mkdir(parents=True)
    (repository / "filelink" / "config.pbtxt").write_text('backend: "onnxruntime"\n')
    (repository / "filelink" / "1" / "model.onnx").symlink_to(outside / "stray" / "1" / "model.onnx")
    with serve(repository, allow_management=True) as running:
        index = {model.name: model for model in running.client.repository_index()}
        assert "symbolic link" in index["linked"].reason
        assert "model file 'filelink/1/model.onnx'" in index["filelink"].reason
        for model in ("linked", "filelink"):
            assert index[model].reason.startswith("failed to load: "), index[model]
            assert_no_server_path(index[model].reason, tmp_path)
        error = client_error(running.management.register, "linked")
        assert_refused(error, "model directory 'linked'")
        assert "symbolic link" in error.message
        error = client_error(running.management.register, "filelink")
        assert_refused(error, "model file 'filelink/1/model.onnx'")
        for message in (error.message, client_error(running.management.register, "linked").message):
            assert_no_server_path(message, tmp_path)
        assert_unharmed(running)


def test_an_allowed_root_admits_a_source_and_links_into_it(layout):
    repository, outside = layout
    (repository / "linked").symlink_to(outside / "stray", target_is_directory=True)
    with serve(repository, allow_management=True, allowed_model_roots=[outside]) as running:
        assert running.management.get("linked").loaded and add_one_works(running, "linked")
        status = running.management.register("stray", source=str(outside / "stray"))
        assert status.loaded and status.source == str(outside / "stray")
        assert add_one_works(running, "stray")
        # The allowed root is not a hole for the rest of the file system.
        error = client_error(running.management.register, "other", source=str(outside.parent))
        assert_refused(error, "source")


# ---- what a failed load tells the client ---------------------------------------------------------------------


def test_a_failed_load_names_paths_relative_to_the_repository_and_no_absolute_path(layout, tmp_path):
    repository, _ = layout
    write_model(repository / "broken")
    (repository / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    with serve(repository, allow_management=True, load_at_startup=False) as running:
        error = client_error(running.client.infer, "broken", {"X": np.zeros(WIDTH, np.float32)})
        assert (error.code, error.reason) == ("FAILED_PRECONDITION", "load_failed"), error
        reason = {model.name: model for model in running.client.repository_index()}["broken"].reason
        last_error = running.management.get("broken").last_error
        registered = client_error(running.management.register, "broken")
        missing = client_error(running.management.register, "missing", source="nowhere/missing")
        for message in (error.message, reason, last_error, registered.message, missing.message):
            assert message
            assert_no_server_path(message, tmp_path)
        # What they name instead: the file, and the folder asked for, relative to the repository.
        for message in (error.message, reason, last_error, registered.message):
            assert "could not load broken/1/model.onnx" in message, message
        assert "'nowhere/missing'" in missing.message, missing.message
        assert_unharmed_with(running, "broken")


def test_external_data_outside_the_model_folder_is_refused_without_absolute_paths(layout, tmp_path):
    """ONNX Runtime itself refuses external data outside the model's folder; its message quotes absolute paths,
    which the client gets relative to the repository (or as bare names, for places outside it)."""
    repository, outside = layout
    (outside / "w.bin").write_bytes(np.ones(WIDTH, np.float32).tobytes())
    weight = onnx.TensorProto(name="ONE", data_type=TensorProto.FLOAT, dims=[WIDTH], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "../../../outside/w.bin"), ("offset", "0"), ("length", str(4 * WIDTH))):
        weight.external_data.add(key=key, value=value)
    write_model(repository / "external")
    model = onnx.load(str(repository / "external" / "1" / "model.onnx"))
    model.graph.ClearField("initializer")
    model.graph.initializer.append(weight)
    (repository / "external" / "1" / "model.onnx").write_bytes(model.SerializeToString())
    with serve(repository, allow_management=True, load_at_startup=False) as running:
        error = client_error(running.management.register, "external")
        assert error.code == "INVALID_ARGUMENT" and "could not load external/1/model.onnx" in error.message, error
        assert_no_server_path(error.message, tmp_path)
        assert_no_server_path(running.management.get("external").last_error, tmp_path)
        assert_unharmed_with(running, "external")


def assert_unharmed_with(running, *others: str) -> None:
    assert sorted(status.model_id for status in running.management.list()) == sorted(["good", *others])
    assert add_one_works(running, "good")


# ---- TensorRT: the plan cache ------------------------------------------------------------------------------


@pytest.fixture
def tensorrt_layout(tmp_path):
    """A repository with `good` (ONNX Runtime) and `trt` (ONNX built into an engine by the TensorRT double), and
    the double's backend (its default plan cache is the operator's, outside the repository)."""
    from tests.tensorrt import support

    repository, outside = tmp_path / "repository", tmp_path / "outside"
    write_model(repository / "good")
    support.write_add_sub_onnx(repository, name="trt")
    (repository / "trt" / "config.pbtxt").write_text(
        'backend: "tensorrt"\nmax_batch_size: 8\n'
        'parameters { key: "trt_memory_reserve_bytes" value { string_value: "0" } }\n'
    )
    outside.mkdir()
    device = FakeDevice(total_memory=64 << 20)
    backend = TensorRTBackend(
        trt_module=device.trt,
        cudart_module=device.cudart,
        cuda_utils_module=device.cuda_utils,
        cache_dir=tmp_path / "operator-cache",
    )
    return repository, outside, backend


def test_a_trt_cache_dir_outside_the_repository_is_refused_and_nothing_is_written_there(tensorrt_layout):
    repository, outside, backend = tensorrt_layout
    with serve(repository, allow_management=True, backends={"tensorrt": backend}) as running:
        assert running.management.get("trt").loaded  # built into the operator's cache, which is not restricted
        for value in (str(outside), "../outside"):
            error = client_error(running.management.register, "trt", options={"trt_cache_dir": value})
            assert_refused(error, "trt_cache_dir")
            assert list(outside.iterdir()) == []
        assert running.management.get("trt").loaded
        assert add_one_works(running, "good")
        # A relative cache folder is taken inside the repository.
        status = running.management.register("trt", options={"trt_cache_dir": "plan-cache"})
        assert status.loaded
        assert [path.suffix for path in (repository / "plan-cache").iterdir()].count(".plan") == 1


# ---- the flag ----------------------------------------------------------------------------------------------


def test_allow_model_root_is_repeatable_and_the_banner_names_the_roots(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    args = build_parser().parse_args(
        ["--model-repository", str(tmp_path), "--allow-model-root", str(first), "--allow-model-root", str(second)]
    )
    options = ServerOptions(**option_fields(args))
    assert options.allowed_model_roots == (first, second)
    assert f"model files: inside the repository and {first}, {second} (--allow-model-root)" in security_lines(options)
    assert "model files: inside the repository only" in security_lines(ServerOptions(model_repository=tmp_path))


def test_an_allowed_root_that_is_not_a_folder_stops_startup_with_one_line(tmp_path):
    missing = tmp_path / "no-such-folder"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "service",
            "--model-repository",
            str(tmp_path),
            "--port",
            "0",
            "--allow-model-root",
            str(missing),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"slotserve: --allow-model-root {missing} is not a folder"
