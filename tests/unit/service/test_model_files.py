"""service.model_files.ModelFiles, the private folders of loads with files, against names and endings that went
wrong (issue 33, item 5): the model's name is checked before anything is made, every folder lies inside the root,
and whatever ends a stage (an error of any kind, a shutdown while it writes) leaves nothing behind."""

from __future__ import annotations

import pytest

from engine.errors import ModelConfigError
from service import model_files
from service.core.errors import ShuttingDown
from service.model_files import ModelFiles

CONFIG = '{"backend": "fixture"}'


def everything(folder) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


@pytest.fixture
def area(tmp_path):
    """<tmp>/files is the --model-files-dir; anything written in <tmp> beside it is an escape."""
    (tmp_path / "files").mkdir()
    return tmp_path


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/abs", "a/b", "m" * 300, "m\n", "", ".."])
def test_a_bad_model_name_is_refused_before_anything_is_made(area, name):
    files = ModelFiles(area / "files", 1 << 20)
    with pytest.raises(ModelConfigError, match="invalid model name"):
        files.stage(name, {"1/model.onnx": b"x"}, CONFIG)
    assert everything(area) == ["files"]


def test_a_shutdown_while_a_stage_writes_leaves_nothing(area, monkeypatch):
    files = ModelFiles(area / "files", 1 << 20)
    written = []
    real_write = model_files._write_new

    def write_then_shut_down(folder, name, content):
        real_write(folder, name, content)
        written.append(name)
        if len(written) == 1:
            files.remove_all()  # the server's shutdown, between two files of the load

    monkeypatch.setattr(model_files, "_write_new", write_then_shut_down)
    with pytest.raises(ShuttingDown):
        files.stage("m", {"1/a": b"a" * 1000, "1/sub/b": b"b" * 1000, "1/c": b"c"}, CONFIG)
    assert everything(area) == ["files"]
    with pytest.raises(ShuttingDown):  # and nothing new is staged after it
        files.stage("m", {"1/a": b"a"}, CONFIG)
    assert everything(area) == ["files"]


def test_a_stage_ended_by_any_error_removes_what_it_wrote(area, monkeypatch):
    files = ModelFiles(area / "files", 1 << 20)
    real_write = model_files._write_new

    def fail_on_the_second(folder, name, content):
        if name == "1/b":
            raise MemoryError("no memory for the copy")
        real_write(folder, name, content)

    monkeypatch.setattr(model_files, "_write_new", fail_on_the_second)
    with pytest.raises(MemoryError):
        files.stage("m", {"1/a": b"a", "1/b": b"b"}, CONFIG)
    assert everything(area / "files") in ([], [files.root.name])


def test_staged_folders_lie_directly_in_the_root(area):
    files = ModelFiles(area / "files", 1 << 20)
    folder = files.stage("m.v-1_x", {"1/model.onnx": b"x", "./1/./extra": b"y"}, CONFIG)
    assert folder.parent == files.root and folder.name.startswith("m.v-1_x-")
    assert everything(folder) == ["1", "1/extra", "1/model.onnx"]
    files.done(folder)
    files.remove_all()
    assert everything(area) == ["files"]
