"""Not NVIDIA's cases: the worker behaviours of issue 34 (and 33's smaller items) asked of Triton 2.51 directly, kept
as differential questions: an exception whose `__str__` raises, two outputs of the same name in one response, a
model importing itself by name, and a model whose helper module shadows nothing of the server's."""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import numpy as np

from .harness import Model, build_request, python_model

BAD_STR = """
    import os

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no words for this")


    class TritonPythonModel:
        def execute(self, requests):
            if int(pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy()[0]) == 1:
                raise Unprintable()
            return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))]) for _ in requests]
"""

TWICE = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            outputs = [pb_utils.Tensor("OUT", np.array([1.5], np.float32)), pb_utils.Tensor("OUT", np.array([2.5], np.float32))]
            return [pb_utils.InferenceResponse(outputs) for _ in requests]
"""

# `import model` (the version folder is on sys.path) gives the file again under the name `model`.
SELF_IMPORT = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            import model

            text = f"{__name__} {model.__name__} {model.TritonPythonModel is not TritonPythonModel}"
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text], dtype=np.object_))]) for _ in requests]
"""

MODE = """
    max_batch_size: 0
    input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""
ONE_OUT = """
    max_batch_size: 0
    input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
TEXT_OUT = """
    max_batch_size: 0
    input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

MODELS: dict[str, Model] = {
    "bad_str": python_model(MODE, BAD_STR),
    "twice": python_model(ONE_OUT, TWICE),
    "self_import": python_model(TEXT_OUT, SELF_IMPORT),
}


def _mode(value: int) -> dict:
    return {"MODE": np.array([value], np.int32)}


def test_an_exception_whose_str_raises_is_an_error_response_and_the_instance_serves_on(server):
    """issue 33: on slotserve such an exception ended the worker (a death toward the model's limit of 3)."""
    before = server.infer("bad_str", _mode(0))["PID"].tolist()
    failed = server.infer("bad_str", _mode(1))
    assert failed.code == "INTERNAL", failed
    if server.kind == "slotserve":
        assert "Unprintable" in failed.message, failed.message
    assert server.infer("bad_str", _mode(0))["PID"].tolist() == before  # the same process answers


def test_two_outputs_of_one_name_are_refused_by_name(server):
    """Triton 2.51 answers a malformed response (the first output carries both shapes, the second has no datatype
    nor shape), which clients cannot read; slotserve refuses the response, naming the output (a deliberate
    difference, docs/migrating-from-triton.md). Before, it dropped one of them silently."""
    if server.kind == "triton":
        reply = server.stub.ModelInfer(build_request("twice", _mode(0)))
        assert [(o.name, o.datatype, list(o.shape)) for o in reply.outputs] == [
            ("OUT", "FP32", [1, 1]),
            ("OUT", "", []),
        ]
        return
    answer = server.infer("twice", _mode(0))
    assert answer.code == "INTERNAL" and "more than one output named ['OUT']" in answer.message, answer


def test_a_model_imports_itself_by_name(server):
    """model.py is the module `1.model`; `import model` finds the same file again (unittest.main("model") does
    this), a module of its own."""
    assert server.infer("self_import", _mode(0))["OUT"].tolist() == [b"1.model model True"]
