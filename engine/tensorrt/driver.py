"""Which TensorRT extra the NVIDIA driver can run, and what to say when it can run none.

slotserve offers two GPU extras (pyproject.toml):

    tensorrt-cu12   TensorRT 10 built for CUDA 12, cuda-python 12   drivers 525 or newer; Volta (compute
                                                                    capability 7.0) or newer GPUs
    tensorrt-cu13   TensorRT 11 built for CUDA 13, cuda-python 13   drivers 580 or newer; Turing (7.5) or newer
                                                                    (CUDA 13 dropped Volta and older)

cuda-bindings links the CUDA runtime statically, so the driver must support that runtime's major version (CUDA's
minor version compatibility covers the minor versions): cuda-bindings 13 on a CUDA 12 driver fails every call
with cudaErrorInsufficientDriver. The driver is asked directly (`cuDriverGetVersion` in libcuda, which needs no
cuda-python; `nvidia-smi` for the driver's own version and the GPUs' compute capability).

`python -m engine.tensorrt.driver` prints the extra to install on stdout (what `make gpu-check` installs) and
why on stderr; exit status 3 with the reason when the driver supports neither (or none is found).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache

from .cuda import cuda_version_text


@dataclass(frozen=True)
class Extra:
    name: str  # the pyproject extra
    cuda_major: int
    tensorrt: str  # the TensorRT generation it installs
    min_driver: str  # Linux driver branch that supports this CUDA major (NVIDIA's compatibility table)
    min_compute_capability: tuple[int, int]


EXTRAS = {
    12: Extra("tensorrt-cu12", 12, "TensorRT 10", "525", (7, 0)),
    13: Extra("tensorrt-cu13", 13, "TensorRT 11", "580", (7, 5)),
}


class NoUsableDriver(Exception):
    """No NVIDIA driver, or one too old for every extra."""


@lru_cache(maxsize=1)
def nvidia_smi() -> tuple[str, tuple[tuple[int, int], ...]]:
    """(driver version, compute capability of each GPU) from nvidia-smi; ("", ()) where it is missing or fails.
    Blocks for at most 10 s."""
    if shutil.which("nvidia-smi") is None:
        return "", ()
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "", ()
    version, capabilities = "", []
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) >= 2:
            version = version or fields[0]
            try:
                major, minor = fields[1].split(".")
                capabilities.append((int(major), int(minor)))
            except ValueError:  # "[N/A]" on drivers too old to report it
                pass
    return version, tuple(capabilities)


def driver_cuda_version() -> int:
    """The CUDA version the installed driver supports (12040 = 12.4), from libcuda's cuDriverGetVersion; 0 when
    no driver is installed."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    version = ctypes.c_int(0)
    if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return 0
    return version.value


def describe_driver(cuda_version: int, driver_version: str = "") -> str:
    """ "driver 550.54.15 (CUDA 12.4)", or "a driver for CUDA 12.4" when nvidia-smi gave no version."""
    cuda = f"CUDA {cuda_version_text(cuda_version)}"
    return f"driver {driver_version} ({cuda})" if driver_version else f"a driver for {cuda}"


def choose_extra(cuda_version: int, driver_version: str = "", capabilities: tuple[tuple[int, int], ...] = ()) -> Extra:
    """The extra with the newest CUDA major that the driver supports and every GPU can run. Raises NoUsableDriver
    naming the driver found and the one needed."""
    if cuda_version <= 0:
        raise NoUsableDriver(
            "no NVIDIA driver found (libcuda.so.1 is missing); TensorRT needs an NVIDIA GPU with "
            f"driver {EXTRAS[12].min_driver} or newer"
        )
    for major in sorted(EXTRAS, reverse=True):
        extra = EXTRAS[major]
        if cuda_version // 1000 >= major and all(cc >= extra.min_compute_capability for cc in capabilities):
            return extra
    oldest = EXTRAS[min(EXTRAS)]
    raise NoUsableDriver(
        f"the NVIDIA {describe_driver(cuda_version, driver_version)} is too old: slotserve's TensorRT extras need "
        f"CUDA {oldest.cuda_major} or newer, that is driver {oldest.min_driver} or newer"
    )


def insufficient_driver_message(driver_cuda: int, runtime_cuda: int) -> str:
    """Why cuda-python failed with cudaErrorInsufficientDriver, and which extra fits this driver instead."""
    driver_version, capabilities = nvidia_smi()
    found = describe_driver(driver_cuda, driver_version)
    needed = EXTRAS.get(runtime_cuda // 1000)
    need = (
        f"a driver for CUDA {runtime_cuda // 1000}.x ({needed.min_driver} or newer)"
        if needed
        else f"a driver for CUDA {cuda_version_text(runtime_cuda)}"
    )
    message = (
        f"the installed cuda-python is built for CUDA {cuda_version_text(runtime_cuda)} and needs {need}, "
        f"but this machine has {found}"
    )
    try:
        fitting = choose_extra(driver_cuda, driver_version, capabilities)
    except NoUsableDriver as error:
        return f"{message}; {error}"
    return (
        f"{message}. Install the extra this driver supports: `pip install .[{fitting.name}]` ({fitting.tensorrt}, "
        f"CUDA {fitting.cuda_major}; `make gpu-check` picks it), or upgrade the driver"
    )


def main() -> int:
    driver_version, capabilities = nvidia_smi()
    cuda_version = driver_cuda_version()
    try:
        extra = choose_extra(cuda_version, driver_version, capabilities)
    except NoUsableDriver as error:
        print(f"gpu-check: {error}", file=sys.stderr)
        return 3
    print(
        f"gpu-check: the NVIDIA {describe_driver(cuda_version, driver_version)} runs {extra.tensorrt} for "
        f"CUDA {extra.cuda_major}: using the {extra.name} extra",
        file=sys.stderr,
    )
    print(extra.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
