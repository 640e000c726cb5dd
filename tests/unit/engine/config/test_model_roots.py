"""engine.config.files.ModelRoots: the one rule for where a model's files may be, and how paths are shown to
clients (issue 19, item 11). Real folders and symbolic links in tmp_path; the server-level tests are in
tests/integration/model_control/test_model_paths.py."""

from __future__ import annotations

import pytest

from engine.config.files import ModelRoots, hide_paths
from engine.errors import ModelConfigError

RULE = "must be inside the model repository or a root allowed with --allow-model-root"


@pytest.fixture
def tree(tmp_path):
    """<tmp>/repo/m/1/model.onnx, <tmp>/outside/deep/x, <tmp>/shared/s/1/model.onnx."""
    for path in ("repo/m/1/model.onnx", "outside/deep/x", "shared/s/1/model.onnx"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(b"")
    return tmp_path


def refusal(roots: ModelRoots, path, **kwargs) -> str:
    with pytest.raises(ModelConfigError) as info:
        roots.resolve(path, "source", origin="model 'm'", **kwargs)
    message = str(info.value)
    assert message.startswith("model 'm': source ") and RULE in message, message
    return message


def test_paths_inside_the_repository_resolve_to_their_real_place(tree):
    roots = ModelRoots.of(tree / "repo")
    real = (tree / "repo" / "m" / "1" / "model.onnx").resolve()
    assert roots.resolve("m/1/model.onnx", "f", origin="o") == real
    assert roots.resolve("m/1/../1/model.onnx", "f", origin="o") == real  # `..` that stays inside is fine
    assert roots.resolve("model.onnx", "f", origin="o", base=tree / "repo" / "m" / "1") == real
    assert roots.resolve(str(real), "f", origin="o") == real  # an absolute path inside too


def test_absolute_and_dot_dot_paths_outside_are_refused_whether_or_not_they_exist(tree):
    roots = ModelRoots.of(tree / "repo")
    existing, missing = tree / "outside" / "deep" / "x", tree / "outside" / "nothing"
    assert refusal(roots, existing) == refusal(roots, missing).replace("nothing", "deep/x")
    assert f"'{existing}'" in refusal(roots, existing)  # the caller's own words, for a path it gave
    assert "'../outside/deep/x'" in refusal(roots, "../outside/deep/x")
    assert "'../../../outside'" in refusal(roots, "../../../outside", base=tree / "repo" / "m" / "1")
    refusal(roots, "/etc/hostname")


def test_a_link_that_leads_outside_is_refused_by_its_own_name_without_its_target(tree):
    repo = tree / "repo"
    (repo / "linked").symlink_to(tree / "outside" / "deep", target_is_directory=True)
    (repo / "dangling").symlink_to(tree / "outside" / "not-there")
    roots = ModelRoots.of(repo)
    for name in ("linked", "linked/x", "dangling"):
        message = refusal(roots, name)
        assert f"source '{name}' leads outside through a symbolic link" in message, message
        assert str(tree) not in message
    # `..` after a link climbs from the link's target, as the OS does: <tmp>/outside here, not the repository.
    refusal(roots, "linked/../deep/x")


def test_allowed_roots_admit_their_insides_and_only_those(tree):
    repo = tree / "repo"
    (repo / "linked").symlink_to(tree / "shared" / "s", target_is_directory=True)
    roots = ModelRoots.of(repo, [tree / "shared"])
    assert roots.resolve("linked/1/model.onnx", "f", origin="o") == (tree / "shared" / "s" / "1" / "model.onnx")
    assert roots.resolve(tree / "shared" / "s", "f", origin="o") == tree / "shared" / "s"
    refusal(roots, tree / "outside")
    refusal(roots, tree)


def test_shown_paths_are_relative_to_the_repository_or_named_by_their_allowed_root(tree):
    roots = ModelRoots.of(tree / "repo", [tree / "shared"])
    assert roots.shown(tree / "repo" / "m" / "1" / "model.onnx") == "m/1/model.onnx"
    assert roots.shown(tree / "shared" / "s" / "1" / "model.onnx") == "shared/s/1/model.onnx"
    assert roots.shown(tree / "shared") == "shared"
    assert roots.shown(tree / "outside" / "deep" / "x") == "x"


def test_library_text_loses_the_server_folders_and_keeps_everything_else(tree):
    roots = ModelRoots.of(tree / "repo", [tree / "shared"])
    text = (
        f'Load model from {tree}/repo/m/1/model.onnx failed; data "{tree}/shared/s/w.bin"; '
        f"see /etc/ssl/certs/ca.pem; dims 1/model.onnx INT32/FP32 a / b"
    )
    assert roots.hide(text) == (
        'Load model from m/1/model.onnx failed; data "shared/s/w.bin"; see ca.pem; dims 1/model.onnx INT32/FP32 a / b'
    )
    assert hide_paths(f"cannot open {tree}/repo/m/1/model.onnx") == "cannot open model.onnx"
