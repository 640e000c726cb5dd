"""Test repositories written twice, one per server, with the same model names, tensors and batching: for
slotserve the project's ONNX models (demo/build_repository.py), for Triton (which ships only its python backend
here) a python model.py that computes the same thing from a config that differs only in `backend`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from demo import build_repository as builders

# Triton's python backend: the same add/sub as the ONNX graph (numpy's int8 wraps as ONNX Runtime's does).
ADD_SUB_MODEL_PY = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""

ADD_SUB_MODELS = {"simple": builders.build_simple, "simple_int8": builders.build_simple_int8}


@dataclass(frozen=True)
class Repositories:
    slotserve: Path
    triton: Path


def write_add_sub_repositories(root: Path, names: tuple[str, ...] = ("simple", "simple_int8")) -> Repositories:
    """Write `names` (keys of ADD_SUB_MODELS) under root/slotserve (ONNX) and root/triton (python backend), each
    as version 1 with the demo's config.pbtxt."""
    repositories = Repositories(root / "slotserve", root / "triton")
    for name in names:
        model = ADD_SUB_MODELS[name]()
        builders.write_model(repositories.slotserve, model)
        folder = repositories.triton / name
        (folder / "1").mkdir(parents=True)
        (folder / "1" / "model.py").write_text(ADD_SUB_MODEL_PY)
        config = builders.config_text(model)
        assert 'backend: "onnxruntime"' in config, config
        (folder / "config.pbtxt").write_text(config.replace('backend: "onnxruntime"', 'backend: "python"'))
    return repositories
