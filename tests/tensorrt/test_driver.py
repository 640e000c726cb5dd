"""engine.tensorrt.driver: which GPU extra the NVIDIA driver runs (what `make gpu-check` installs), and the message
when it runs none."""

from __future__ import annotations

import pytest

from engine.tensorrt import driver


@pytest.mark.parametrize(
    "cuda_version,capabilities,extra",
    [
        (13020, (), "tensorrt-cu13"),
        (13000, ((9, 0),), "tensorrt-cu13"),
        (12090, (), "tensorrt-cu12"),
        (12020, ((8, 6),), "tensorrt-cu12"),
        (13000, ((7, 0),), "tensorrt-cu12"),  # CUDA 13 dropped Volta: a V100 on a new driver stays on CUDA 12
    ],
)
def test_the_newest_cuda_major_the_driver_and_every_gpu_support(cuda_version, capabilities, extra):
    assert driver.choose_extra(cuda_version, "", capabilities).name == extra


def test_a_driver_too_old_is_named_with_the_one_needed():
    with pytest.raises(driver.NoUsableDriver) as caught:
        driver.choose_extra(11080, "470.82.01")
    assert str(caught.value) == (
        "the NVIDIA driver 470.82.01 (CUDA 11.8) is too old: slotserve's TensorRT extras "
        "need CUDA 12 or newer, that is driver 525 or newer"
    )
    with pytest.raises(driver.NoUsableDriver, match="no NVIDIA driver found"):
        driver.choose_extra(0)


def test_cuda_python_13_on_a_cuda_12_driver(monkeypatch):
    monkeypatch.setattr(driver, "nvidia_smi", lambda: ("550.54.15", ((9, 0),)))
    message = driver.insufficient_driver_message(12040, 13000)
    assert message.startswith(
        "the installed cuda-python is built for CUDA 13.0 and needs a driver for CUDA 13.x "
        "(580 or newer), but this machine has driver 550.54.15 (CUDA 12.4)"
    )
    assert "`pip install .[tensorrt-cu12]`" in message


@pytest.mark.parametrize(
    "found,code,stdout,stderr",
    [
        (
            (12040, "550.54.15"),
            0,
            "tensorrt-cu12\n",
            "driver 550.54.15 (CUDA 12.4) runs TensorRT 10 for CUDA 12: using the tensorrt-cu12 extra",
        ),
        ((13000, ""), 0, "tensorrt-cu13\n", "a driver for CUDA 13.0 runs TensorRT 11"),
        ((0, ""), 3, "", "no NVIDIA driver found"),
    ],
)
def test_main_prints_the_extra_on_stdout_and_why_on_stderr(monkeypatch, capsys, found, code, stdout, stderr):
    monkeypatch.setattr(driver, "driver_cuda_version", lambda: found[0])
    monkeypatch.setattr(driver, "nvidia_smi", lambda: (found[1], ()))
    assert driver.main() == code
    out, err = capsys.readouterr()
    assert out == stdout and stderr in err


def test_on_this_machine_without_a_driver():
    # No libcuda here: the query answers 0 instead of failing (on a GPU machine it is the driver's CUDA version).
    assert driver.driver_cuda_version() >= 0
