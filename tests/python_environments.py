"""Python models that run in execution environments of their own (EXECUTION_ENV_PATH), and the environments and
archives the tests give them: tests/unit/engine/python/test_environments.py,
tests/integration/python_models/test_environments.py, tests/differential/test_python_environments.py.

The "model's environment" is bench/.venv-pytriton (bench/setup.sh builds it: Python 3.11 with numpy 1.26, for
real Triton): a test that needs it skips, naming the reason, where it is absent (a clean clone). `LEGACY` is a
model.py written for Triton's numpy 1.x: `np.NINF` is gone from numpy 2, which the server runs.

Archives are written here with tarfile, member by member: the hostile ones (a member named `../../x`, a link out
of the folder) are shaped as NVIDIA's zip-slip regression test describes its archives, written anew.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL_ENVIRONMENT = Path(os.environ.get("SLOTSERVE_TRITON_VENV") or ROOT / "bench" / ".venv-pytriton")
SITE_PACKAGES = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"


def model_environment() -> Path | None:
    """bench/.venv-pytriton when it is there and has numpy 1.x; None otherwise."""
    python = MODEL_ENVIRONMENT / "bin" / "python3"
    if not python.exists() or not list((MODEL_ENVIRONMENT / SITE_PACKAGES).glob("numpy-1.*.dist-info")):
        return None
    return MODEL_ENVIRONMENT


MISSING_ENVIRONMENT = (
    f"{MODEL_ENVIRONMENT} (a venv with Python {sys.version_info.major}.{sys.version_info.minor} and numpy 1.x, "
    "the model's environment in these tests) is not set up: run bench/setup.sh"
)

# Y = X with its negative values replaced by -inf, written with numpy 1's np.NINF; NUMPY is the numpy version the
# model runs on, PREFIX the interpreter's sys.prefix (where its environment is).
LEGACY = """
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            y = np.where(x < 0, np.NINF, x).astype(np.float32)
            about = [pb_utils.Tensor(name, np.array([value.encode()], dtype=np.object_))
                     for name, value in (("NUMPY", np.__version__), ("PREFIX", sys.prefix))]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y), *about]))
        return responses
"""

# The same answer written for numpy 2 (-np.inf).
MODERN = LEGACY.replace("np.NINF", "-np.inf")

# On the environment's numpy: a BLS call to `modern` (the server's numpy) for Y, the BYTES input S echoed, and Y as
# large as X (a large X grows the shared-memory segments both ways).
BRIDGE = """
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            s = pb_utils.get_input_tensor_by_name(request, "S").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="modern", inputs=[pb_utils.Tensor("X", x)], requested_output_names=["Y", "NUMPY"]
            )
            answer = call.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            y = pb_utils.get_output_tensor_by_name(answer, "Y").as_numpy()
            theirs = pb_utils.get_output_tensor_by_name(answer, "NUMPY").as_numpy()
            ours = np.array([np.__version__.encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", np.ascontiguousarray(y)),
                pb_utils.Tensor("S", s.copy()),
                pb_utils.Tensor("NUMPY", np.concatenate([ours, theirs])),
            ]))
        return responses
"""

ABOUT_IO = """
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "NUMPY" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "PREFIX" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

BRIDGE_IO = """
input [
  { name: "X" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "S" data_type: TYPE_STRING dims: [ -1 ] }
]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "S" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "NUMPY" data_type: TYPE_STRING dims: [ 2 ] }
]
"""


def environment_parameter(value: str | Path) -> str:
    return f'parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{value}" }} }}\n'


def write_model(root: Path, name: str, body: str, io_config: str, environment: str | Path | None = None) -> Path:
    """root/name with config.pbtxt (python backend, `io_config`, EXECUTION_ENV_PATH when `environment` is given)
    and 1/model.py; returns the model's folder."""
    folder = root / name
    (folder / "1").mkdir(parents=True)
    config = f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n' + textwrap.dedent(io_config)
    if environment is not None:
        config += environment_parameter(environment)
    (folder / "config.pbtxt").write_text(config)
    (folder / "1" / "model.py").write_text(textwrap.dedent(body))
    return folder


# ---- environments ------------------------------------------------------------------------------------------------


def copies_venv(folder: Path, site_packages: Path | None = None) -> Path:
    """A venv made with `--copies --without-pip` (its bin/python3 a file, not a link out of the folder, so the
    folder can be packed and extracted elsewhere); with `site_packages`, a .pth file in its own site-packages adds
    that folder to sys.path (a file naming a folder: how the tests give it numpy 1 without copying numpy's 80 MB)."""
    subprocess.run([sys.executable, "-m", "venv", "--copies", "--without-pip", str(folder)], check=True, timeout=120)
    if site_packages is not None:
        (folder / SITE_PACKAGES / "numpy1.pth").write_text(f"{site_packages}\n")
    return folder


def fake_interpreter_environment(folder: Path, version: tuple[int, int]) -> Path:
    """A folder whose bin/python3 is a shell script that answers any question as a Python `version` with numpy
    1.26 would (it prints the probe's answer): an environment of another Python without building one."""
    (folder / "bin").mkdir(parents=True)
    script = folder / "bin" / "python3"
    answer = f'{{"python": [{version[0]}, {version[1]}], "numpy": "1.26.4", "problem": null}}'
    script.write_text(f"#!/bin/sh\necho '{answer}'\n")
    script.chmod(0o755)
    return folder


def pack(folder: Path, archive: Path) -> Path:
    """folder's contents at the archive's top (as conda-pack and `tar -C folder -czf archive .` lay them out)."""
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        for entry in sorted(folder.iterdir()):
            tar.add(entry, arcname=entry.name)
    return archive


def _info(
    name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, mode: int = 0o644, link: str = ""
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.linkname = kind, size, mode, link
    return info


def hostile_archive(archive: Path, members: list[tuple[str, str, str]]) -> Path:
    """A .tar.gz of `members`, each (kind, name, text): kind "file" (text: its content), "dir", "symlink" and
    "hardlink" (text: the link's target), "fifo"; bin/python3 is added first as a file, as an environment has it."""
    with tarfile.open(archive, "w:gz") as tar:
        tar.addfile(_info("bin", tarfile.DIRTYPE, mode=0o755))
        tar.addfile(_info("bin/python3", size=10, mode=0o755), io.BytesIO(b"#!/bin/sh\n"))
        for kind, name, text in members:
            if kind == "file":
                body = text.encode()
                tar.addfile(_info(name, size=len(body)), io.BytesIO(body))
            elif kind == "dir":
                tar.addfile(_info(name, tarfile.DIRTYPE, mode=0o755))
            elif kind == "symlink":
                tar.addfile(_info(name, tarfile.SYMTYPE, link=text))
            elif kind == "hardlink":
                tar.addfile(_info(name, tarfile.LNKTYPE, link=text))
            elif kind == "fifo":
                tar.addfile(_info(name, tarfile.FIFOTYPE))
            else:
                raise ValueError(kind)
    return archive
