"""L0_input_validation, rewritten with python models (the QA's own are python for the input-count cases; its
PyTorch and TensorFlow models, whose checks are Triton's core's, become python models with the same
configuration): missing required inputs and optional ones, in Triton's words; a byte size that does not match the
shape; BYTES tensors with fewer or more elements than their shape. The TensorRT shape-tensor case is left out (no
TensorRT here)."""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import numpy as np

from .harness import Model, python_model, slotserve_fails, tensor

ONE = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([1], np.float32))]) for _ in requests]
"""

ZEROS = """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.outputs = json.loads(args["model_config"])["output"]

        def execute(self, requests):
            responses = []
            for request in requests:
                rows = request.inputs()[0].as_numpy().shape[0]
                outputs = [
                    pb_utils.Tensor(o["name"], np.zeros([rows, *o["dims"]], pb_utils.triton_string_to_numpy(o["data_type"])))
                    for o in self.outputs
                ]
                responses.append(pb_utils.InferenceResponse(outputs))
            return responses
"""


def inputs(optional: tuple[bool, ...]) -> str:
    entries = [
        f'{{ name: "INPUT{index}" data_type: TYPE_FP32 dims: [ -1 ]{" optional: true" if flag else ""} }}'
        for index, flag in enumerate(optional)
    ]
    return f"""
        input [ {", ".join(entries)} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        instance_group [ {{ kind: KIND_CPU }} ]
    """


MODELS: dict[str, Model] = {
    "input_all_required": python_model(inputs((False, False, False)), ONE),
    "input_optional": python_model(inputs((False, False, False, True)), ONE),
    "input_all_optional": python_model(inputs((True, True, True)), ONE),
    "pt_identity": python_model(
        """
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 8 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 8 ] } ]
        dynamic_batching { max_queue_delay_microseconds: 1000000 }
        """,
        ZEROS,
    ),
    "graphdef_object_int32_int32": python_model(
        """
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_STRING dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
        """,
        ZEROS,
    ),
}


def test_input_validation_required_empty(server):
    answer = server.infer("input_all_required", {})
    assert answer.code == "INVALID_ARGUMENT"
    assert (
        "expected 3 inputs but got 0 inputs for model 'input_all_required'. Got input(s) [], but missing required "
        "input(s) ['INPUT0','INPUT1','INPUT2']. Please provide all required input(s)." in answer.message
    ), answer.message


def test_input_validation_optional_empty(server):
    answer = server.infer("input_optional", {})
    assert answer.code == "INVALID_ARGUMENT"
    assert (
        "expected number of inputs between 3 and 4 but got 0 inputs for model 'input_optional'. Got input(s) [], but "
        "missing required input(s) ['INPUT0','INPUT1','INPUT2']. Please provide all required input(s)."
        in answer.message
    ), answer.message


def test_input_validation_required_missing(server):
    answer = server.infer("input_all_required", {"INPUT0": np.arange(1, dtype=np.float32)})
    assert answer.code == "INVALID_ARGUMENT"
    assert (
        "expected 3 inputs but got 1 inputs for model 'input_all_required'. Got input(s) ['INPUT0'], but missing "
        "required input(s) ['INPUT1','INPUT2']. Please provide all required input(s)." in answer.message
    ), answer.message


def test_input_validation_optional(server):
    answer = server.infer("input_optional", {"INPUT0": np.arange(1, dtype=np.float32)})
    assert answer.code == "INVALID_ARGUMENT"
    assert (
        "expected number of inputs between 3 and 4 but got 1 inputs for model 'input_optional'. Got input(s) "
        "['INPUT0'], but missing required input(s) ['INPUT1','INPUT2']. Please provide all required input(s)."
        in answer.message
    ), answer.message


def test_input_validation_all_optional(server):
    answer = server.infer("input_all_optional", {})
    assert answer.ok, answer
    assert list(answer.outputs) == ["OUTPUT0"]


TENSOR_WORDS = (
    "34.8 a malformed input tensor is refused in slotserve's words, not Triton's (service/tensors.py, helper memory)"
)


@slotserve_fails(TENSOR_WORDS)
def test_input_shape_validation(server):
    """40 bytes sent for a [1, 8] FP32 input: refused, naming both sizes."""
    assert server.infer("pt_identity", {"INPUT0": np.arange(8, dtype=np.float32)[None]}).ok
    lying = tensor(np.arange(10, dtype=np.float32)[None], shape=(1, 8))
    answer = server.infer("pt_identity", {"INPUT0": lying})
    assert answer.code == "INVALID_ARGUMENT"
    assert "input byte size mismatch for input 'INPUT0' for model 'pt_identity'. Expected 32, got 40" in answer.message


def _strings(count: int) -> np.ndarray:
    return np.array([str(value) for value in np.random.randint(0, 127, size=count)], dtype=object).reshape(1, count)


@slotserve_fails(TENSOR_WORDS)
def test_input_string_shape_validation(server):
    """BYTES inputs whose element count differs from their [1, 16] shape."""
    model = "graphdef_object_int32_int32"
    fewer = {name: tensor(_strings(14), shape=(1, 16)) for name in ("INPUT0", "INPUT1")}
    answer = server.infer(model, fewer)
    assert answer.code == "INVALID_ARGUMENT"
    assert f"expected 16 string elements for inference input 'INPUT1' for model '{model}', got 14" in answer.message
    more = {name: tensor(_strings(18), shape=(1, 16)) for name in ("INPUT0", "INPUT1")}
    answer = server.infer(model, more)
    assert answer.code == "INVALID_ARGUMENT"
    assert (
        f"unexpected number of string elements 17 for inference input 'INPUT1' for model '{model}', expecting 16"
        in answer.message
    ), answer.message
