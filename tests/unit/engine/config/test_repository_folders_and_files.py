"""Hostile and unlucky repositories (issue 33, items 8 and 9): the repository reader opens only regular files. A
`config.pbtxt` that is a folder, a FIFO, a socket or a device, a model file that is one, a file it cannot read or a
configuration that is not UTF-8 is a ModelConfigError of that model, naming the file and what it is; nothing hangs
and nothing raises anything else, so the server starts and `python -m service check` reports. The poller's
fingerprint never opens anything but a regular file either.

A call that would hang on the old code (opening a FIFO blocks until a writer comes) runs on a daemon thread with a
deadline; the test then opens the FIFO for writing itself, so that the thread ends and nothing is left blocked.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.config import repository as reader
from engine.config.repository import ModelRepository, check_model_name
from engine.errors import ModelConfigError
from service.model_control import folder_fingerprint

CONFIG = 'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: 0\n'
DEADLINE = 20.0  # a call that returns at all returns in milliseconds; this only bounds a hang


def model(root: Path, name: str, backend: str = "fixture") -> Path:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG.format(name=name, backend=backend))
    return folder


def finishes(call: Callable[[], object], fifos: tuple[Path, ...] = ()) -> object:
    """`call()`'s result (or the exception it raised, returned), failing the test if it does not return within
    DEADLINE; a call blocked opening one of `fifos` is freed afterwards by opening each for writing."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # noqa: BLE001 (handed to the test to judge)
            outcome["value"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEADLINE)
    hung = thread.is_alive()
    for fifo in fifos:  # free a reader blocked in open(): a writer arrives, then leaves
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader is blocked on it
    assert not hung, f"{call} did not return within {DEADLINE} s"
    return outcome["value"]


def refusal(repository: ModelRepository, name: str, fifos: tuple[Path, ...] = ()) -> str:
    error = finishes(lambda: repository.read(name), fifos)
    assert isinstance(error, ModelConfigError), error
    return str(error)


# ---- config.pbtxt -------------------------------------------------------------------------------------------------


def test_a_config_that_is_a_folder_is_that_models_failure_and_the_others_still_read(tmp_path):
    model(tmp_path, "good")
    bad = tmp_path / "bad"
    (bad / "config.pbtxt").mkdir(parents=True)
    repository = ModelRepository(tmp_path)
    assert repository.names() == ["bad", "good"]
    # load_order (the server's startup) raised IsADirectoryError here, and the server did not start.
    assert sorted(repository.load_order(repository.names())) == ["bad", "good"]
    message = refusal(repository, "bad")
    assert message == "model 'bad': bad/config.pbtxt is a folder, not a file", message
    reading = repository.judge("bad")  # what `python -m service check` shows
    assert reading.spec is None and str(reading.error) == message
    assert repository.read("good").name == "good"


def test_a_config_that_is_a_fifo_fails_at_once_instead_of_hanging(tmp_path):
    model(tmp_path, "good")
    fifo = tmp_path / "piped" / "config.pbtxt"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    repository = ModelRepository(tmp_path)
    assert finishes(lambda: repository.load_order(repository.names()), (fifo,)) == ["good", "piped"]
    message = refusal(repository, "piped", (fifo,))
    assert message == "model 'piped': piped/config.pbtxt is a FIFO, not a regular file", message
    reading = finishes(lambda: repository.judge("piped"), (fifo,))
    assert str(reading.error) == message


def test_a_config_that_is_a_socket_or_a_device_is_named(tmp_path):
    listening = tmp_path / "sock" / "config.pbtxt"
    listening.parent.mkdir()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(listening))
    try:
        message = refusal(ModelRepository(tmp_path), "sock")
    finally:
        server.close()
    assert message == "model 'sock': sock/config.pbtxt is a socket, not a regular file", message
    # A device, linked from inside the repository (the link's target is outside, which the roots refuse first).
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "config.pbtxt").symlink_to("/dev/zero")
    assert "leads outside through a symbolic link" in refusal(ModelRepository(tmp_path), "dev")
    # Allowed there, a device is still not read: /dev/zero would never end. (Named where it is: dev/zero.)
    allowed = ModelRepository(tmp_path, allowed_roots=["/dev"])
    assert refusal(allowed, "dev") == "model 'dev': dev/zero is a character device, not a regular file"


def test_a_config_that_is_not_utf8_is_that_models_failure(tmp_path):
    folder = model(tmp_path, "latin")
    (folder / "config.pbtxt").write_bytes(b'name: "latin"\n# caf\xe9\n')
    message = refusal(ModelRepository(tmp_path), "latin")
    assert message.startswith("model 'latin': latin/config.pbtxt is not UTF-8 text"), message
    assert ModelRepository(tmp_path).load_order(["latin"]) == ["latin"]


def test_a_config_that_cannot_be_opened_is_named_with_the_reason(tmp_path, monkeypatch):
    """chmod 000 is no obstacle to root (the tests run as root in CI), so the refusal of the open is simulated."""
    model(tmp_path, "locked")
    target = str((tmp_path / "locked" / "config.pbtxt").resolve())
    real_open = os.open

    def refusing_open(path, flags, *args, **kwargs):
        if os.fspath(path) == target:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    message = refusal(ModelRepository(tmp_path), "locked")
    assert message == "model 'locked': cannot read locked/config.pbtxt: Permission denied", message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_config_is_named(tmp_path):
    folder = model(tmp_path, "locked")
    (folder / "config.pbtxt").chmod(0)
    assert "cannot read locked/config.pbtxt" in refusal(ModelRepository(tmp_path), "locked")


# ---- model files ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend, filename", [("onnxruntime", "model.onnx"), ("python", "model.py")])
def test_a_model_file_that_is_a_fifo_or_a_folder_is_named(tmp_path, backend, filename):
    fifo_model = model(tmp_path, "piped", backend)
    os.mkfifo(fifo_model / "1" / filename)
    folder_model = model(tmp_path, "foldered", backend)
    (folder_model / "1" / filename).mkdir()
    repository = ModelRepository(tmp_path)
    fifo = fifo_model / "1" / filename
    assert refusal(repository, "piped", (fifo,)) == f"model 'piped': piped/1/{filename} is a FIFO, not a regular file"
    assert refusal(repository, "foldered") == f"model 'foldered': foldered/1/{filename} is a folder, not a file"


def test_a_special_file_anywhere_in_a_version_folder_fails_the_model(tmp_path):
    """A python model imports its neighbours and ONNX Runtime reads external data beside its model: a version folder
    holds regular files and folders only."""
    folder = model(tmp_path, "m", "python")
    (folder / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (folder / "1" / "data").mkdir()
    fifo = folder / "1" / "data" / "weights.bin"
    os.mkfifo(fifo)
    message = refusal(ModelRepository(tmp_path), "m", (fifo,))
    assert message == "model 'm': m/1/data/weights.bin is a FIFO, not a regular file", message


def test_a_link_inside_the_repository_to_a_fifo_is_named_by_the_link(tmp_path):
    model(tmp_path, "m")
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "m" / "config.pbtxt").unlink()
    (tmp_path / "m" / "config.pbtxt").symlink_to(tmp_path / "pipe")
    message = refusal(ModelRepository(tmp_path), "m", (tmp_path / "pipe",))
    assert message == "model 'm': pipe is a FIFO, not a regular file", message


def test_warmup_files_that_are_not_regular_are_named(tmp_path):
    folder = model(tmp_path, "m")
    with (folder / "config.pbtxt").open("a") as config:
        config.write(
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
            'model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT0" value: '
            '{ data_type: TYPE_FP32 dims: [ 2 ] input_data_file: "in" } } } ]\n'
        )
    (folder / "warmup" / "in").mkdir(parents=True)
    message = refusal(ModelRepository(tmp_path), "m")
    assert message == "model 'm': model_warmup[0] 'w': input 'INPUT0': m/warmup/in is a folder, not a file", message


# ---- the poller's fingerprint and the reload stamp -------------------------------------------------------------------


def test_the_fingerprint_never_opens_a_fifo_and_still_sees_it(tmp_path):
    folder = model(tmp_path, "m")
    before = folder_fingerprint(folder)
    fifo = folder / "notes"
    os.mkfifo(fifo)
    after = finishes(lambda: folder_fingerprint(folder), (fifo,))
    assert after != before and any(entry[0] == "notes" for entry in after)


def test_the_files_stamp_leaves_out_pycache_and_sees_every_other_change(tmp_path):
    version = tmp_path / "1"
    version.mkdir()
    (version / "model.py").write_text("ANSWER = 1\n")
    stamp = reader.files_stamp(version, version / "model.py", origin="model 'm'")
    (version / "__pycache__").mkdir()
    (version / "__pycache__" / "model.cpython-312.pyc").write_bytes(b"compiled")
    assert reader.files_stamp(version, version / "model.py", origin="model 'm'") == stamp
    (version / "helper.py").write_text("X = 1\n")
    with_helper = reader.files_stamp(version, version / "model.py", origin="model 'm'")
    assert with_helper != stamp
    # The same size, the same modification time: the content (and the change time) still tell.
    mtime = (version / "helper.py").stat().st_mtime_ns
    (version / "helper.py").write_text("X = 2\n")
    os.utime(version / "helper.py", ns=(mtime, mtime))
    assert reader.files_stamp(version, version / "model.py", origin="model 'm'") != with_helper


def test_model_names_are_matched_whole():
    for name in ("m\n", "m\r", "a/b", "../x", "/abs", "", ".hidden", "m" * 129, "m\x00"):
        with pytest.raises(ModelConfigError):
            check_model_name(name)
    check_model_name("m" * 128)
    check_model_name("A-1.b_2")


# ---- version folders and config-less python models ----------------------------------------------------------------


@pytest.mark.parametrize(
    "name, version",
    [
        ("0", 0),
        ("1", 1),
        ("42", 42),
        (str((1 << 63) - 1), (1 << 63) - 1),
        ("01", None),  # Triton: "ignore version directory '01' which contains leading zeros"
        ("007", None),
        ("99999999999999999999999", None),  # past int64: Triton aborts
        ("1a", None),  # Triton reads 1 off the front, then never finishes loading it
        ("-1", None),
        ("+3", None),
        (" 4", None),
        ("²", None),
        ("", None),
    ],
)
def test_a_folder_is_a_version_as_triton_reads_one(name, version):
    assert reader.folder_version(name) == version


def test_folders_that_are_not_versions_are_not_served(tmp_path):
    folder = model(tmp_path, "m", "python")
    for name in ("01", "007", "1a", "99999999999999999999999", "3"):
        (folder / name).mkdir(exist_ok=True)
        (folder / name / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (folder / "1").rmdir()
    spec = ModelRepository(tmp_path).read("m")
    assert spec.version == "3" and spec.model_file.parent.name == "3"
    (folder / "3" / "model.py").unlink()
    (folder / "3").rmdir()
    assert "no numeric version directory" in refusal(ModelRepository(tmp_path), "m")


def test_a_folder_with_only_model_py_is_a_python_model(tmp_path):
    (tmp_path / "auto" / "1").mkdir(parents=True)
    (tmp_path / "auto" / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    repository = ModelRepository(tmp_path)
    assert repository.names() == ["auto"]
    spec = repository.read("auto")
    assert (spec.backend, spec.model_file.name, spec.max_batch_size) == ("python", "model.py", 0)
    assert spec.config.default_model_filename == "model.py" and spec.config.backend == "python"
    # model.py without a version folder is no model (Triton: "failed to poll from model repository").
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    assert repository.names() == ["auto"]


@pytest.mark.parametrize("backend, filename", [("onnxruntime", "model.onnx"), ("python", "model.py")])
def test_the_spec_names_its_model_file_so_the_model_config_answer_loads_back(tmp_path, backend, filename):
    folder = model(tmp_path, "m", backend)
    (folder / "1" / filename).write_bytes(b"")
    assert ModelRepository(tmp_path).read("m").config.default_model_filename == filename


def test_a_link_in_a_version_folder_that_leads_outside_is_refused_by_its_name(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "weights.bin").write_bytes(b"secret")
    repository = tmp_path / "repository"
    folder = model(repository, "m", "python")
    (folder / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (folder / "1" / "weights.bin").symlink_to(outside / "weights.bin")
    message = refusal(ModelRepository(repository), "m")
    assert "file 'm/1/weights.bin' leads outside through a symbolic link" in message, message
    assert str(outside) not in message
    # Allowed there, it is read as any file of the folder.
    assert ModelRepository(repository, allowed_roots=[outside]).read("m").name == "m"
