"""--model-control-mode and its companion flags are checked at startup; the file-name rules of loads with files
and the poller's folder fingerprint, on their own."""

from __future__ import annotations

import pytest

from service.cli import build_parser, option_fields
from service.model_control import folder_fingerprint
from service.model_files import ModelFiles, file_name_problem
from service.options import ServerOptions


def options(tmp_path, *argv: str) -> ServerOptions:
    return ServerOptions(**option_fields(build_parser().parse_args(["--model-repository", str(tmp_path), *argv])))


def test_defaults_are_slotserves_lazy_mode(tmp_path):
    parsed = options(tmp_path)
    assert parsed.model_control_mode == "lazy" and parsed.load_models == () and parsed.repository_poll_seconds == 15


def test_load_model_is_repeatable_in_explicit_mode(tmp_path):
    parsed = options(tmp_path, "--model-control-mode", "explicit", "--load-model", "a", "--load-model", "*")
    assert parsed.load_models == ("a", "*")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--load-model", "a"], "--load-model needs --model-control-mode explicit (the mode is lazy)"),
        (["--model-control-mode", "poll", "--load-model", "a"], "the mode is poll"),
        (["--model-control-mode", "explicit", "--no-load-at-startup"], "--no-load-at-startup belongs to"),
        (["--model-control-mode", "none", "--idle-unload", "5"], "--idle-unload needs --model-control-mode lazy"),
        (["--repository-poll-seconds", "0"], "--repository-poll-seconds must be more than 0"),
        (["--repository-poll-seconds", "nan"], "--repository-poll-seconds must be"),
        (["--max-load-file-bytes", "-1"], "--max-load-file-bytes must be >= 0"),
    ],
)
def test_flags_that_do_not_fit_the_mode_are_refused_by_name(tmp_path, argv, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        options(tmp_path, *argv)


def test_an_unknown_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--model-control-mode must be one of lazy, none, explicit, poll"):
        ServerOptions(model_repository=tmp_path, model_control_mode="auto")


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("..", "'..'"),
        ("1/../x", "'..'"),
        ("1//x", "empty components"),
        ("1/x/", "empty components"),
        (".", "only '.' steps"),
        ("a\x00b", "NUL"),
        ("1/" + "x" * 256, "256 bytes, more than NAME_MAX (255)"),
        ("1/" + "é" * 128, "256 bytes"),
    ],
)
def test_bad_file_names(name, problem):
    found = file_name_problem(name)
    assert found is not None and problem in found, found


@pytest.mark.parametrize("name", ["1/model.onnx", "./1/model.onnx", "1/" + "x" * 255, "a/b/c/d", "..x", "x.."])
def test_good_file_names(name):
    assert file_name_problem(name) is None


def test_the_byte_limit_is_inclusive_and_checked_before_writing(tmp_path):
    from service.model_files import LoadFilesTooLarge

    files = ModelFiles(tmp_path, max_bytes=10)
    with pytest.raises(LoadFilesTooLarge, match=r"11 bytes, more than --max-load-file-bytes \(10\)"):
        files.stage("m", {"1/a": b"x" * 6, "1/b": b"x" * 5}, "{}")
    assert not files.root.exists()  # nothing written, not even the private folder
    folder = files.stage("m", {"1/a": b"x" * 10}, "{}")
    assert (folder / "1" / "a").read_bytes() == b"x" * 10
    files.remove_all()
    assert not files.root.exists()


def test_a_same_size_rewrite_changes_the_fingerprint(tmp_path):
    config = tmp_path / "config.pbtxt"
    config.write_text("max_batch_size: 1\n")
    before = folder_fingerprint(tmp_path)
    config.write_text("max_batch_size: 2\n")  # same size, perhaps the same mtime on a coarse clock
    assert folder_fingerprint(tmp_path) != before
