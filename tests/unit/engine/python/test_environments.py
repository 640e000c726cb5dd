"""engine/python/environments.py without a server: EXECUTION_ENV_PATH read as Triton reads it, the safe extraction
of packed environments (zip slip, links out of the folder, in every shape the module's docstring lists), the cache
named by content, and the interpreter's answers (another Python, no numpy)."""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from engine.config.specs import ModelSpec
from engine.errors import ModelConfigError, ModelLoadError
from engine.python.environments import (
    PARAMETER,
    DeclaredEnvironment,
    EnvironmentKind,
    Environments,
    UnsafeArchive,
    declared_environment,
    default_folder,
    extract_archive,
)
from tests.python_environments import (
    MISSING_ENVIRONMENT,
    copies_venv,
    fake_interpreter_environment,
    hostile_archive,
    model_environment,
    pack,
)


def _spec(directory: Path, value: str | None) -> ModelSpec:
    parameters = {} if value is None else {PARAMETER: value}
    return ModelSpec("m", "python", directory=directory, model_file=directory / "1" / "model.py", parameters=parameters)


def _interpreter_folder(folder: Path) -> Path:
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python3").write_text("#!/bin/sh\n")
    (folder / "bin" / "python3").chmod(0o755)
    return folder


# ---- EXECUTION_ENV_PATH as written --------------------------------------------------------------------------------


def test_no_parameter_or_an_empty_one_names_no_environment(tmp_path):
    assert declared_environment(_spec(tmp_path, None)) is None
    assert declared_environment(_spec(tmp_path, "")) is None  # Triton: an empty value is no environment


def test_the_model_directory_keyword_is_the_models_folder(tmp_path):
    model = tmp_path / "m"
    _interpreter_folder(model / "env")
    (model / "env.tar.gz").write_bytes(b"")
    folder = declared_environment(_spec(model, "$$TRITON_MODEL_DIRECTORY/env"))
    packed = declared_environment(_spec(model, "$$TRITON_MODEL_DIRECTORY/env.tar.gz"))
    assert folder == DeclaredEnvironment("m", "$$TRITON_MODEL_DIRECTORY/env", model / "env", EnvironmentKind.FOLDER)
    assert packed is not None and packed.path == model / "env.tar.gz" and packed.kind is EnvironmentKind.PACKED


def test_a_relative_path_is_taken_from_the_working_directory_and_links_are_followed(tmp_path, monkeypatch):
    real = _interpreter_folder(tmp_path / "envs" / "py")
    (tmp_path / "link").symlink_to(real)
    monkeypatch.chdir(tmp_path)
    declared = declared_environment(_spec(tmp_path / "m", "link"))
    assert declared is not None and declared.path == real and declared.written == "link"


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda folder: None, "does not exist"),
        (lambda folder: (folder / "x").mkdir(), "is a folder that has no bin/python3"),
        (lambda folder: os.mkfifo(folder / "x"), "is neither a folder (an environment) nor a file"),
    ],
)
def test_a_path_that_is_no_environment_is_refused_by_name(tmp_path, make, words):
    make(tmp_path)
    with pytest.raises(ModelConfigError) as refused:
        declared_environment(_spec(tmp_path, "$$TRITON_MODEL_DIRECTORY/x"))
    assert str(refused.value).startswith(f"model 'm': {PARAMETER} '$$TRITON_MODEL_DIRECTORY/x' {words}")


def test_the_default_folder_is_found_without_writing(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", None)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "not-made"))
    assert default_folder() == tmp_path / "not-made" / "slotserve-python-environments"
    assert not (tmp_path / "not-made").exists()


# ---- safe extraction --------------------------------------------------------------------------------------------

ESCAPES = {
    "dot_dot": ([("file", "../../escaped", "x")], "Path contains '..'"),
    "dot_dot_inside_the_name": ([("file", "lib/../../escaped", "x")], "Path contains '..'"),
    "absolute": ([("file", "{outside}/escaped", "x")], "Path is absolute"),
    "absolute_link": ([("symlink", "lib", "{outside}")], "leads out of the environment"),
    "relative_link": ([("symlink", "lib", "../outside")], "leads out of the environment"),
    # Each link alone stays inside; followed as the kernel does, `up/back` leaves: `up` is the top, `..` above it.
    "link_chain": ([("dir", "a", ""), ("symlink", "a/up", ".."), ("symlink", "a/back", "up/../outside")], "leads out"),
    "link_loop": ([("symlink", "x", "y"), ("symlink", "y", "x")], "leads out of the environment"),
    "write_through_a_link": ([("symlink", "lib", "bin"), ("file", "lib/python3", "x")], "lies beneath 'lib'"),
    "link_then_file_over_it": ([("symlink", "lib", "bin"), ("file", "lib", "x")], "is in the archive twice"),
    "hard_link_out": ([("hardlink", "lib", "../../etc/passwd")], "Path contains '..'"),
    "hard_link_to_a_link": ([("symlink", "lib", "bin"), ("hardlink", "lib2", "lib")], "names no file extracted"),
    "fifo": ([("fifo", "pipe", "")], "is a FIFO"),
}


@pytest.mark.parametrize("case", sorted(ESCAPES))
def test_an_archive_that_writes_or_points_outside_is_refused_naming_the_member(tmp_path, case):
    outside = tmp_path / "outside"
    outside.mkdir()
    members, words = ESCAPES[case]
    members = [(kind, name.format(outside=outside), text.format(outside=outside)) for kind, name, text in members]
    archive = hostile_archive(tmp_path / "env.tar.gz", members)
    destination = tmp_path / "deep" / "er" / "destination"
    destination.mkdir(parents=True)
    with pytest.raises(UnsafeArchive, match=words.replace("(", r"\(").replace(")", r"\)")):
        extract_archive(archive, destination)
    assert os.listdir(outside) == [] and not (tmp_path / "deep" / "escaped").exists()
    assert sorted(os.listdir(tmp_path)) == ["deep", "env.tar.gz", "outside"]


def test_a_good_archive_keeps_its_files_links_times_and_executable_bits_and_nothing_else(tmp_path):
    source = tmp_path / "source"
    (source / "bin").mkdir(parents=True)
    (source / "lib" / "pkg").mkdir(parents=True)
    (source / "bin" / "python3.11").write_bytes(b"\x7fELF...")
    os.chmod(source / "bin" / "python3.11", 0o4777)  # setuid, writable by all: neither survives
    (source / "bin" / "python3").symlink_to("python3.11")
    (source / "lib" / "pkg" / "module.py").write_text("VALUE = 1\n")
    os.utime(source / "lib" / "pkg" / "module.py", (1_600_000_000, 1_600_000_000))
    (source / "lib" / "pkg" / "twin.py").hardlink_to(source / "lib" / "pkg" / "module.py")
    (source / "lib64").symlink_to("lib")
    archive = pack(source, tmp_path / "env.tar.gz")
    destination = tmp_path / "destination"
    destination.mkdir()

    extract_archive(archive, destination)
    python = destination / "bin" / "python3.11"
    assert python.read_bytes() == b"\x7fELF..." and (python.stat().st_mode & 0o7777) == 0o755
    assert os.readlink(destination / "bin" / "python3") == "python3.11"
    module = destination / "lib" / "pkg" / "module.py"
    assert module.stat().st_mtime == 1_600_000_000 and (module.stat().st_mode & 0o7777) == 0o644
    twin = destination / "lib" / "pkg" / "twin.py"
    assert twin.read_text() == "VALUE = 1\n" and not twin.is_symlink()
    assert (destination / "lib64" / "pkg" / "module.py").read_text() == "VALUE = 1\n"


def test_a_file_that_is_no_archive_or_is_cut_short_does_not_extract(tmp_path):
    source = tmp_path / "source"
    (source / "bin").mkdir(parents=True)
    (source / "bin" / "python3").write_bytes(os.urandom(200_000))
    whole = pack(source, tmp_path / "whole.tar.gz").read_bytes()
    (tmp_path / "cut.tar.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "text.tar.gz").write_text("not an archive\n")
    for name in ("cut.tar.gz", "text.tar.gz"):
        destination = tmp_path / f"into-{name}"
        destination.mkdir()
        with pytest.raises((tarfile.TarError, EOFError, OSError)):
            extract_archive(tmp_path / name, destination)


# ---- the cache, named by content ---------------------------------------------------------------------------------


def _packed(tmp_path: Path, content: str) -> DeclaredEnvironment:
    source = _interpreter_folder(tmp_path / f"source-{content}")
    (source / "marker").write_text(content)
    archive = pack(source, tmp_path / f"{content}.tar.gz")
    return DeclaredEnvironment("m", archive.name, archive, EnvironmentKind.PACKED)


def test_an_archive_is_extracted_once_into_a_folder_named_by_its_content(tmp_path, monkeypatch):
    environments = Environments(tmp_path / "cache")
    first, second = _packed(tmp_path, "first"), _packed(tmp_path, "second")
    extractions = []
    original = extract_archive

    def counting(archive, destination):
        extractions.append(hashlib.sha256(archive.read()).hexdigest())
        archive.seek(0)
        original(archive, destination)

    monkeypatch.setattr("engine.python.environments.extract_archive", counting)
    folders = {environments._extracted(first) for _ in range(3)}  # the same archive, three loads
    folders |= {environments._extracted(second)}
    digests = [hashlib.sha256(d.path.read_bytes()).hexdigest() for d in (first, second)]
    assert extractions == digests  # each once, the content hashed being the content extracted
    assert {folder.name for folder in folders} == set(digests)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(digests)  # no partial left

    again = Environments(tmp_path / "cache")  # a restart: the folder is there already, nothing is extracted
    assert again._extracted(first) in folders and extractions == digests


def test_loads_of_one_archive_at_once_end_with_one_complete_folder(tmp_path):
    environments = Environments(tmp_path / "cache")
    declared = _packed(tmp_path, "shared")
    start = threading.Barrier(4)
    results: list[Path] = []

    def load() -> None:
        start.wait(timeout=30)
        results.append(Environments(environments.folder)._extracted(declared))  # a server each: no shared memo

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 4 and len(set(results)) == 1
    assert (results[0] / "marker").read_text() == "shared"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [results[0].name]


def test_what_a_killed_extraction_left_is_removed_and_a_live_ones_is_kept(tmp_path):
    cache = tmp_path / "cache"
    gone = cache / ".partial-999999999-abc"  # no such process
    live = cache / f".partial-{os.getpid()}-def"
    for folder in (gone, live):
        (folder / "lib").mkdir(parents=True)
    Environments(cache)._extracted(_packed(tmp_path, "next"))
    assert not gone.exists() and live.exists()


def test_a_refused_archive_leaves_no_folder_behind(tmp_path):
    environments = Environments(tmp_path / "cache")
    archive = hostile_archive(tmp_path / "bad.tar.gz", [("file", "ok", "x"), ("file", "../escaped", "x")])
    with pytest.raises(ModelLoadError, match=r"is refused: member '../escaped'"):
        environments._extracted(DeclaredEnvironment("m", "bad.tar.gz", archive, EnvironmentKind.PACKED))
    assert os.listdir(tmp_path / "cache") == []


def test_an_archive_replaced_by_a_fifo_after_the_check_is_refused_without_blocking(tmp_path):
    declared = _packed(tmp_path, "swapped")
    declared.path.unlink()
    os.mkfifo(declared.path)  # opening it for reading would wait for a writer that never comes
    with pytest.raises(ModelLoadError, match="cannot be read: not a regular file"):
        Environments(tmp_path / "cache")._extracted(declared)


def test_a_cache_folder_that_cannot_be_made_is_named_with_its_flag(tmp_path):
    (tmp_path / "a-file").write_text("")
    environments = Environments(tmp_path / "a-file" / "cache")
    with pytest.raises(ModelLoadError, match=r"cannot be extracted under --python-environments-dir .*a-file/cache"):
        environments._extracted(_packed(tmp_path, "any"))


# ---- the interpreter's answers ------------------------------------------------------------------------------------


def _folder(folder: Path) -> DeclaredEnvironment:
    return DeclaredEnvironment("m", str(folder), folder, EnvironmentKind.FOLDER)


def test_an_environment_of_numpy_1_on_the_servers_python_is_prepared(tmp_path):
    environment = model_environment()
    if environment is None:
        pytest.skip(MISSING_ENVIRONMENT)
    launch = Environments(tmp_path).prepare(_folder(environment.resolve()))
    assert launch.executable == str(environment.resolve() / "bin" / "python3")
    assert launch.variables["PYTHONPATH"] == str(Path(__file__).resolve().parents[4])
    assert launch.variables["PATH"].startswith(f"{environment.resolve()}/bin:")
    assert launch.variables["PYTHONNOUSERSITE"] == "1" and "PYTHONHOME" not in launch.variables


def test_another_python_minor_version_is_refused(tmp_path):
    folder = fake_interpreter_environment(tmp_path / "py310", (3, 10))
    with pytest.raises(ModelLoadError) as refused:
        Environments(tmp_path).prepare(_folder(folder))
    assert "is an environment of Python 3.10; the server runs Python " in str(refused.value)
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in str(refused.value)


def test_an_environment_without_numpy_is_refused(tmp_path):
    folder = copies_venv(tmp_path / "bare")
    with pytest.raises(ModelLoadError, match=r"has no numpy \(ModuleNotFoundError: No module named 'numpy'\)"):
        Environments(tmp_path).prepare(_folder(folder))


def test_an_interpreter_that_does_not_answer_is_refused_with_what_it_said(tmp_path):
    folder = tmp_path / "broken"
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python3").write_text("#!/bin/sh\necho 'no python here' >&2\nexit 3\n")
    (folder / "bin" / "python3").chmod(0o755)
    with pytest.raises(ModelLoadError, match="did not answer as a Python does .*no python here"):
        Environments(tmp_path).prepare(_folder(folder))


def test_an_old_numpy_is_refused(tmp_path):
    folder = fake_interpreter_environment(tmp_path / "old", sys.version_info[:2])
    script = folder / "bin" / "python3"
    script.write_text(script.read_text().replace("1.26.4", "1.22.4"))
    with pytest.raises(ModelLoadError, match=r"has numpy 1\.22\.4: a worker needs numpy 1\.23 or newer"):
        Environments(tmp_path).prepare(_folder(folder))


def test_a_hostile_member_is_refused_before_anything_is_written_through_it(tmp_path):
    """The classic: a link to a folder outside, then a file beneath the link. Refused at the link (an absolute
    target), and were the link relative, at the file (it lies beneath a link): nothing lands outside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        link = tarfile.TarInfo("escape")
        link.type, link.linkname = tarfile.SYMTYPE, "../outside"
        tar.addfile(link)
        body = tarfile.TarInfo("escape/payload")
        body.size = 4
        tar.addfile(body, io.BytesIO(b"evil"))
    (tmp_path / "plain.tar").write_bytes(buffer.getvalue())
    (tmp_path / "destination").mkdir()
    with pytest.raises(UnsafeArchive, match="lies beneath 'escape'"):
        extract_archive(tmp_path / "plain.tar", tmp_path / "destination")
    assert os.listdir(outside) == []
