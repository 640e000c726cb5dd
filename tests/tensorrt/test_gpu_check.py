"""engine.tensorrt.gpu_check: its argument parsing, a full run over the test double on the demo models, and the
clear refusal on a machine without a GPU. (The real check needs an NVIDIA GPU: `make gpu-check`.)"""

from __future__ import annotations

import pytest

from demo import build_repository as demo
from engine.tensorrt import gpu_check

from .test_backend import _machine_has_a_gpu


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """The three demo models gpu_check uses by default (built without the download the full demo needs)."""
    root = tmp_path_factory.mktemp("gpu-check") / "models"
    for build in (demo.build_simple, demo.build_identity_fp32, demo.build_matmul_chain):
        demo.write_model(root, build())
    return root


def test_argument_parsing(tmp_path, capsys):
    args = gpu_check.parse_args(["--repository", str(tmp_path)])
    assert args.model_names == list(gpu_check.DEFAULT_MODELS) and args.slot_counts == [1, 2, 4]
    assert args.double is False and args.cache_dir is None
    args = gpu_check.parse_args(["--repository", str(tmp_path), "--models", "simple", "--slots", "2,8",
                                 "--iterations", "5", "--double", "--cache-dir", str(tmp_path)])
    assert args.model_names == ["simple"] and args.slot_counts == [2, 8] and args.iterations == 5 and args.double
    for bad in (["--slots", "x"], ["--slots", "0"], ["--iterations", "0"], []):
        with pytest.raises(SystemExit) as caught:
            gpu_check.parse_args((["--repository", str(tmp_path)] if bad else []) + bad)
        assert caught.value.code == 2
    with pytest.raises(SystemExit) as caught:
        gpu_check.parse_args(["--help"])
    assert caught.value.code == 0 and "--repository" in capsys.readouterr().out


def test_a_full_run_over_the_double(repository, tmp_path, capsys):
    code = gpu_check.main(["--repository", str(repository), "--double", "--iterations", "2",
                           "--cache-dir", str(tmp_path / "cache")])
    out = capsys.readouterr().out
    assert code == 0, out
    for name in gpu_check.DEFAULT_MODELS:
        assert f"{name}: engine plan built" in out
        assert f"{name}: outputs vs ONNX Runtime: OUTPUT0: ok" in out
        assert f"{name}: 1 slot: " in out and "4 slots: " in out
    assert "gpu-check: all outputs matched" in out


def test_a_mismatch_fails_the_run(repository, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu_check, "compare", lambda expected, actual, rtol, atol: (False, ["OUTPUT0: MISMATCH"]))
    code = gpu_check.main(["--repository", str(repository), "--double", "--models", "simple", "--slots", "1",
                           "--iterations", "1", "--cache-dir", str(tmp_path / "cache")])
    assert code == 1 and "gpu-check: FAILED" in capsys.readouterr().out


@pytest.mark.skipif(_machine_has_a_gpu(), reason="this machine has a CUDA device")
def test_without_a_gpu_it_says_why(repository, tmp_path, capsys):
    code = gpu_check.main(["--repository", str(repository), "--models", "simple", "--cache-dir", str(tmp_path)])
    assert code == 2
    assert "TensorRT cannot run here" in capsys.readouterr().err
