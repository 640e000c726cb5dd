"""A repository with an ensemble of python steps, servable by slotserve and by real Triton alike (Triton's wheel
in bench/.venv-pytriton ships only the python backend): tests/interop/test_ensembles.py and
tests/differential/test_ensembles.py use it.

    X --add3--> A --\\
      \\               combine (A * S) --> Y        outputs: Y, and A
       --square--> S /

add3 and square read the same input and run at the same time; combine starts once both have answered.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

ENSEMBLE = "pipeline"
STEPS = ("add3", "square", "combine")

_UNARY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", ({expression}).astype(np.float32))]))
        return out
"""

_COMBINE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            s = pb_utils.get_input_tensor_by_name(request, "S").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", (a * s).astype(np.float32))]))
        return out
"""


def _tensor(kind: str, name: str) -> str:
    return f'{kind} [ {{ name: "{name}" data_type: TYPE_FP32 dims: [ -1 ] }} ]\n'


def _python_model(root: Path, name: str, code: str, inputs: tuple[str, ...]) -> None:
    (root / name / "1").mkdir(parents=True)
    config = f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
    config += "".join(_tensor("input", i) for i in inputs) + _tensor("output", "Y")
    (root / name / "config.pbtxt").write_text(config)
    (root / name / "1" / "model.py").write_text(textwrap.dedent(code))


PIPELINE_CONFIG = f"""name: "{ENSEMBLE}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: "A" data_type: TYPE_FP32 dims: [ -1 ] }} ]
ensemble_scheduling {{
  step [
    {{ model_name: "add3" model_version: -1
      input_map {{ key: "X" value: "X" }} output_map {{ key: "Y" value: "A" }} }},
    {{ model_name: "square" model_version: -1
      input_map {{ key: "X" value: "X" }} output_map {{ key: "Y" value: "S" }} }},
    {{ model_name: "combine" model_version: -1
      input_map {{ key: "A" value: "A" }} input_map {{ key: "S" value: "S" }} output_map {{ key: "Y" value: "Y" }} }}
  ]
}}
"""


# A step whose model fails to load (its initialize raises): the repository of the "step failed" cases.
BROKEN_STEP = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("square is broken")

    def execute(self, requests):
        return []
"""

SQUARE = _UNARY.replace("{expression}", "x * x")
SQUARE_CONFIG_JSON = (
    '{"name": "square", "backend": "python", "max_batch_size": 0, '
    '"input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1]}], '
    '"output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}]}'
)


def write_python_pipeline(root: Path, *, broken_square: bool = False) -> Path:
    """Write the ensemble and its three python steps into `root` (with `broken_square`, the step 'square' fails
    to load: BROKEN_STEP); return `root`."""
    _python_model(root, "add3", _UNARY.replace("{expression}", "x + 3"), ("X",))
    _python_model(root, "square", BROKEN_STEP if broken_square else SQUARE, ("X",))
    _python_model(root, "combine", _COMBINE, ("A", "S"))
    (root / ENSEMBLE / "1").mkdir(parents=True)
    (root / ENSEMBLE / "config.pbtxt").write_text(PIPELINE_CONFIG)
    return root


def expected(x: np.ndarray) -> dict[str, np.ndarray]:
    """What the ensemble must answer for input `x`."""
    return {"Y": (x + 3) * (x * x), "A": x + 3}
