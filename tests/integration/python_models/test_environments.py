"""Python models in execution environments of their own (EXECUTION_ENV_PATH, issue 34 item 10), on a real server:
a model written for numpy 1 (`np.NINF`) serves beside one on the server's numpy 2; the worker's protocol (shared
memory, BYTES, BLS) runs on the environment's numpy; a packed environment is extracted once, under
--python-environments-dir, named by its content; and every environment the server cannot use is that model's
named load failure while the others serve.

The model's environment is bench/.venv-pytriton (Python 3.11, numpy 1.26): the tests that run in it skip, naming
the reason, where it is absent (tests/python_environments.py).
"""

from __future__ import annotations

import hashlib
import os
from multiprocessing import connection
from pathlib import Path

import numpy as np
import pytest

from client import ClientError
from tests.python_environments import (
    ABOUT_IO,
    BRIDGE,
    BRIDGE_IO,
    LEGACY,
    MISSING_ENVIRONMENT,
    MODERN,
    SITE_PACKAGES,
    copies_venv,
    fake_interpreter_environment,
    hostile_archive,
    model_environment,
    pack,
    write_model,
)

X = np.array([1.5, -2.0, 0.0, -0.5], np.float32)
EXPECTED_Y = np.array([1.5, -np.inf, 0.0, -np.inf], np.float32)


def _needs_environment() -> Path:
    environment = model_environment()
    if environment is None:
        pytest.skip(MISSING_ENVIRONMENT)
    return environment


def _about(running, name: str) -> tuple[np.ndarray, str, str]:
    answer = running.client.infer(name, {"X": X})
    return answer["Y"], answer["NUMPY"][0].decode(), answer["PREFIX"][0].decode()


def test_a_model_pinned_to_numpy_1_serves_beside_one_on_numpy_2(slotserve, tmp_path):
    environment = _needs_environment()
    write_model(tmp_path, "legacy", LEGACY, ABOUT_IO, environment=environment)
    write_model(tmp_path, "modern", MODERN, ABOUT_IO)
    write_model(tmp_path, "legacy_unpinned", LEGACY, ABOUT_IO)  # np.NINF on the server's numpy 2
    running = slotserve(tmp_path)

    y, numpy_version, prefix = _about(running, "legacy")
    np.testing.assert_array_equal(y, EXPECTED_Y)
    assert numpy_version.startswith("1.") and Path(prefix) == environment.resolve()
    y, numpy_version, _ = _about(running, "modern")
    np.testing.assert_array_equal(y, EXPECTED_Y)
    assert numpy_version == np.__version__ and numpy_version.startswith("2.")
    with pytest.raises(ClientError) as failed:  # the same model.py without its environment: numpy 2 has no NINF
        running.client.infer("legacy_unpinned", {"X": X})
    assert "NINF" in failed.value.message
    y, numpy_version, _ = _about(running, "legacy")  # the failure took nothing from the pinned model
    assert numpy_version.startswith("1.")


def _pickles_naming_numpy(monkeypatch) -> list[bytes]:
    """Every message this process sends or receives on a pipe (multiprocessing.connection: the workers' pipes)
    whose pickle names numpy, listed as it passes."""
    found: list[bytes] = []
    send, receive = connection.Connection._send_bytes, connection.Connection._recv_bytes  # type: ignore[attr-defined]

    def sending(self, buffer):
        if b"numpy" in bytes(buffer):
            found.append(bytes(buffer)[:300])
        return send(self, buffer)

    def receiving(self, maxsize=None):
        received = receive(self, maxsize)
        if b"numpy" in received.getvalue():
            found.append(received.getvalue()[:300])
        return received

    monkeypatch.setattr(connection.Connection, "_send_bytes", sending)
    monkeypatch.setattr(connection.Connection, "_recv_bytes", receiving)
    return found


def test_the_worker_protocol_runs_on_the_environments_numpy(slotserve, tmp_path, monkeypatch):
    """Shared-memory segments grown both ways, BYTES tensors and a BLS call, from a worker on numpy 1 to a model on
    numpy 2 and back: nothing the server and the worker exchange depends on either side's numpy (no message on
    the pipes is a pickle that names numpy: tensors travel as bytes in shared memory, the rest as builtins)."""
    environment = _needs_environment()
    numpy_pickles = _pickles_naming_numpy(monkeypatch)
    write_model(tmp_path, "bridge", BRIDGE, BRIDGE_IO, environment=environment)
    write_model(tmp_path, "modern", MODERN, ABOUT_IO)
    running = slotserve(tmp_path)
    strings = np.array([b"one", b"", "naïve".encode(), b"\x00\xff"], dtype=np.object_)
    for size in (4, 3_000_000, 7):  # 12 MB each way grows the 64 KiB segments; the small call after reuses them
        x = np.linspace(-1, 1, size, dtype=np.float32)
        answer = running.client.infer("bridge", {"X": x, "S": strings})
        np.testing.assert_array_equal(answer["Y"], np.where(x < 0, -np.inf, x).astype(np.float32))
        assert list(answer["S"]) == list(strings)
        ours, theirs = (value.decode() for value in answer["NUMPY"])
        assert ours.startswith("1.") and theirs == np.__version__
    assert numpy_pickles == []


def test_a_packed_environment_is_extracted_once_under_the_flags_folder(slotserve, tmp_path):
    environment = _needs_environment()
    packed = tmp_path / "packed"
    copies_venv(packed, site_packages=environment / SITE_PACKAGES)
    repository = tmp_path / "models"
    for name in ("first", "second"):  # one archive, two models: one extraction
        folder = write_model(repository, name, LEGACY, ABOUT_IO, environment="$$TRITON_MODEL_DIRECTORY/env.tar.gz")
        pack(packed, folder / "env.tar.gz")
    digest = hashlib.sha256((repository / "first" / "env.tar.gz").read_bytes()).hexdigest()
    cache = tmp_path / "environments"
    running = slotserve(repository, python_environments_dir=cache)

    for name in ("first", "second"):
        y, numpy_version, prefix = _about(running, name)
        np.testing.assert_array_equal(y, EXPECTED_Y)
        assert numpy_version.startswith("1.")
        assert Path(prefix).parent == cache and Path(prefix).name.endswith(digest)
    assert [entry.name for entry in cache.iterdir()] == [Path(prefix).name]  # once, and nothing half-written


def test_a_load_after_the_archive_changed_runs_the_new_environment(slotserve, tmp_path):
    """As Triton re-extracts an archive whose time changed at the model's next load: a changed archive is a changed
    model, whose workers start again on the new content; a load with the archive unchanged keeps them."""
    environment = _needs_environment()
    packed = copies_venv(tmp_path / "packed", site_packages=environment / SITE_PACKAGES)
    repository = tmp_path / "models"
    folder = write_model(repository, "m", LEGACY, ABOUT_IO, environment="$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    pack(packed, folder / "env.tar.gz")
    running = slotserve(
        repository, model_control_mode="explicit", allow_management=True, python_environments_dir=tmp_path / "cache"
    )
    running.client.load("m")
    first = Path(_about(running, "m")[2])
    running.client.load("m")
    assert Path(_about(running, "m")[2]) == first
    (packed / "added.txt").write_text("new content")
    pack(packed, folder / "env.tar.gz")
    running.client.load("m")
    second = Path(_about(running, "m")[2])
    assert second != first and (second / "added.txt").read_text() == "new content"
    assert second.name == hashlib.sha256((folder / "env.tar.gz").read_bytes()).hexdigest()


def _broken_environments(root: Path) -> dict[str, str]:
    """Models whose environments the server cannot use -> what their load failure must say."""
    outside = root / "outside"
    outside.mkdir()
    models = root / "models"
    cases: dict[str, tuple[str | Path, str]] = {
        "missing": ("$$TRITON_MODEL_DIRECTORY/env.tar.gz", "does not exist"),
        "not_a_tarball": ("$$TRITON_MODEL_DIRECTORY/env.tar.gz", "is not an archive"),
        "zip_slip": ("$$TRITON_MODEL_DIRECTORY/env.tar.gz", "Path contains '..'"),
        "absolute_member": ("$$TRITON_MODEL_DIRECTORY/env.tar.gz", "Path is absolute"),
        "link_out": ("$$TRITON_MODEL_DIRECTORY/env.tar.gz", "leads out of the environment"),
        "other_python": (root / "python310", "Python 3.10"),
        "no_numpy": (root / "bare", "has no numpy"),
        "no_interpreter": (outside, "has no bin/python3"),
    }
    for name, (value, _) in cases.items():
        write_model(models, name, MODERN, ABOUT_IO, environment=value)
    (models / "not_a_tarball" / "env.tar.gz").write_bytes(b"this is no archive\n" * 100)
    hostile_archive(models / "zip_slip" / "env.tar.gz", [("file", "../../zip-slip-marker", "written outside")])
    hostile_archive(models / "absolute_member" / "env.tar.gz", [("file", str(outside / "marker"), "outside")])
    hostile_archive(
        models / "link_out" / "env.tar.gz", [("symlink", "lib", str(outside)), ("file", "lib/marker", "outside")]
    )
    fake_interpreter_environment(root / "python310", (3, 10))
    copies_venv(root / "bare")
    write_model(models, "plain", MODERN, ABOUT_IO)
    return {name: expected for name, (_, expected) in cases.items()}


def test_an_environment_the_server_cannot_use_is_that_models_named_load_failure(slotserve, tmp_path):
    expected = _broken_environments(tmp_path)
    cache = tmp_path / "environments"
    running = slotserve(tmp_path / "models", python_environments_dir=cache)
    for name, words in expected.items():
        with pytest.raises(ClientError) as failed:
            running.client.infer(name, {"X": X})
        assert failed.value.code == "FAILED_PRECONDITION", (name, failed.value.message)
        assert "EXECUTION_ENV_PATH" in failed.value.message and words in failed.value.message, name
        np.testing.assert_array_equal(running.client.infer("plain", {"X": X})["Y"], EXPECTED_Y)
    assert not (tmp_path / "zip-slip-marker").exists() and not (tmp_path / "outside" / "marker").exists()
    assert not list(cache.glob(".*")), "a refused archive left a half-extracted folder"
    assert os.listdir(tmp_path / "outside") == []


def test_a_folder_that_cannot_hold_environments_fails_the_load_naming_the_flag(slotserve, tmp_path):
    """The default folder is under the system temporary folder, which a read-only root cannot write: a packed
    environment then fails its own load, naming the flag, and a model on a folder environment still serves."""
    environment = _needs_environment()
    packed = copies_venv(tmp_path / "packed", site_packages=environment / SITE_PACKAGES)
    repository = tmp_path / "models"
    folder = write_model(repository, "packed", LEGACY, ABOUT_IO, environment="$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    pack(packed, folder / "env.tar.gz")
    write_model(repository, "unpacked", LEGACY, ABOUT_IO, environment=environment)
    (tmp_path / "a-file").write_text("not a folder")
    running = slotserve(repository, python_environments_dir=tmp_path / "a-file" / "environments")
    with pytest.raises(ClientError) as failed:
        running.client.infer("packed", {"X": X})
    assert failed.value.code == "FAILED_PRECONDITION"
    assert "--python-environments-dir" in failed.value.message, failed.value.message
    np.testing.assert_array_equal(running.client.infer("unpacked", {"X": X})["Y"], EXPECTED_Y)
