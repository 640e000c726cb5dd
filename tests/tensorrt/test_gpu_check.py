"""engine.tensorrt.gpu_check: its argument parsing, a full run over the test double on the demo models, and the
clear refusal on a machine without a GPU. (The real check needs an NVIDIA GPU: `make gpu-check`.)"""

from __future__ import annotations

import shutil

import pytest

from demo import build_repository as demo
from engine.tensorrt import gpu_check

from ..conftest import DEMO_REPOSITORY
from .test_backend import _machine_has_a_gpu


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """The demo models gpu_check uses by default: three built here, silero_vad (a download) taken from the demo
    repository `make models` built."""
    root = tmp_path_factory.mktemp("gpu-check") / "models"
    for build in (demo.build_simple, demo.build_identity_fp32, demo.build_matmul_chain):
        demo.write_model(root, build())
    silero = DEMO_REPOSITORY / "silero_vad"
    if not silero.exists():
        pytest.fail("the demo repository has no silero_vad: run `make models` (make test does it)")
    shutil.copytree(silero, root / "silero_vad")
    return root


def test_argument_parsing(tmp_path, capsys):
    args = gpu_check.parse_args(["--repository", str(tmp_path)])
    assert args.model_names == list(gpu_check.DEFAULT_MODELS) and args.slot_counts == [1, 2, 4]
    assert args.check_names == ["data_dependent", "batching"]
    assert args.double is False and args.cache_dir is None
    args = gpu_check.parse_args(
        [
            "--repository",
            str(tmp_path),
            "--models",
            "simple",
            "--slots",
            "2,8",
            "--iterations",
            "5",
            "--double",
            "--cache-dir",
            str(tmp_path),
        ]
    )
    assert args.model_names == ["simple"] and args.slot_counts == [2, 8] and args.iterations == 5 and args.double
    for bad in (["--slots", "x"], ["--slots", "0"], ["--iterations", "0"], ["--checks", "speed"], []):
        with pytest.raises(SystemExit) as caught:
            gpu_check.parse_args((["--repository", str(tmp_path)] if bad else []) + bad)
        assert caught.value.code == 2
    with pytest.raises(SystemExit) as caught:
        gpu_check.parse_args(["--help"])
    assert caught.value.code == 0 and "--repository" in capsys.readouterr().out


def test_a_full_run_over_the_double(repository, tmp_path, capsys):
    code = gpu_check.main(
        ["--repository", str(repository), "--double", "--iterations", "2", "--cache-dir", str(tmp_path / "cache")]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[1].startswith("versions: driver ? (CUDA 13.0); cuda-python runtime CUDA 13.0")
    assert "TensorRT 11.4.0.106; GPU 0 Double GPU (compute capability 9.0)" in out
    for name in gpu_check.DEFAULT_MODELS:
        assert f"{name}: engine plan built" in out
        assert f"{name}: 1 slot: " in out and "4 slots: " in out
    for name in ("simple", "identity_fp32", "matmul_chain"):
        assert f"{name}: outputs vs ONNX Runtime: OUTPUT0: ok" in out
    # silero_vad's `sr` is an INT64 scalar: it went through as a 0-d tensor, and both outputs matched.
    assert "silero_vad: outputs vs ONNX Runtime: output: ok (max |diff| 0); stateN: ok" in out
    assert "data-dependent output (nonzero, plan built): density 0.0: OUTPUT0: ok" in out
    assert "density 1.0: OUTPUT0: ok" in out
    assert "batching (simple, plan built): profile batch sizes min 1, opt 4, max 8; stacked batches 1..8: ok" in out
    assert "gpu-check: all outputs matched" in out


def test_a_model_missing_from_the_repository_is_skipped(tmp_path, capsys):
    demo.write_model(tmp_path, demo.build_simple())
    code = gpu_check.main(
        [
            "--repository",
            str(tmp_path),
            "--double",
            "--models",
            "simple,silero_vad",
            "--slots",
            "1",
            "--iterations",
            "1",
            "--checks",
            "",
            "--cache-dir",
            str(tmp_path / "cache"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and f"silero_vad: skipped: not in {tmp_path}" in out


def test_a_mismatch_fails_the_run(repository, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu_check, "compare", lambda expected, actual, rtol, atol: (False, ["OUTPUT0: MISMATCH"]))
    code = gpu_check.main(
        [
            "--repository",
            str(repository),
            "--double",
            "--models",
            "simple",
            "--slots",
            "1",
            "--iterations",
            "1",
            "--cache-dir",
            str(tmp_path / "cache"),
        ]
    )
    assert code == 1 and "gpu-check: FAILED" in capsys.readouterr().out


@pytest.mark.skipif(_machine_has_a_gpu(), reason="this machine has a CUDA device")
def test_without_a_gpu_it_says_why(repository, tmp_path, capsys):
    code = gpu_check.main(["--repository", str(repository), "--models", "simple", "--cache-dir", str(tmp_path)])
    assert code == 2
    assert "TensorRT cannot run here" in capsys.readouterr().err
