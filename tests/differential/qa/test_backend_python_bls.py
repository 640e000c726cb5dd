"""L0_backend_python/bls, rewritten (the cases without torch): request parameters carried through recursive BLS
calls, large BLS tensors checked by a unittest inside the model (`unittest.main("model")`, exec and async_exec,
plain and decoupled), and BLS refused outside execute (in initialize: the load fails; in finalize: logged)."""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import numpy as np
import pytest

from .harness import Model, json_of, python_model
from .models import identity, square

# The QA's bls_parameters: with n > 0 it adds bool_n, int_n and str_n to its request's parameters and calls itself
# with n - 1 and those parameters; with 0 it answers the parameters it got, as JSON.
BLS_PARAMETERS = """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                count = int(pb_utils.get_input_tensor_by_name(request, "NUMBER_PARAMETERS").as_numpy()[0])
                parameters = json.loads(request.parameters())
                if count == 0:
                    outputs = [pb_utils.Tensor("PARAMETERS_AGGREGATED", np.array([json.dumps(parameters)], dtype=np.object_))]
                else:
                    parameters[f"bool_{count}"] = bool(count)
                    parameters[f"int_{count}"] = count
                    parameters[f"str_{count}"] = str(count)
                    call = pb_utils.InferenceRequest(
                        model_name="bls_parameters",
                        inputs=[pb_utils.Tensor("NUMBER_PARAMETERS", np.array([count - 1], dtype=np.ubyte))],
                        requested_output_names=["PARAMETERS_AGGREGATED"],
                        parameters=parameters,
                    )
                    outputs = call.exec().output_tensors()
                responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            return responses
"""

# A unittest run inside execute by `unittest.main("model")` (which imports model.py again, as the module
# `model`); the answer is OUTPUT0 = [passed] as FP16, where the configuration says FP32 [16], as the QA's model.
BLS_MEMORY = """
    import unittest

    import numpy as np
    import triton_python_backend_utils as pb_utils

    DECOUPLED = {decoupled}
    SIZES = [16 * 1024 * 1024] + [4 * 1024 * 1024] * 4  # the QA's 256 Mi and 4 x 50 Mi elements, shrunk


    def identity(size):
        value = np.random.randn(1, size).astype(np.float32)
        call = pb_utils.InferenceRequest(
            model_name="identity_fp32", inputs=[pb_utils.Tensor("INPUT0", value)], requested_output_names=["OUTPUT0"]
        )
        if DECOUPLED:
            responses = call.exec(decoupled=True)
            response = next(responses)
            return value, response, responses
        return value, call.exec(), iter(())


    class BlsMemoryTest(unittest.TestCase):
        def test_large_tensors(self):
            for size in SIZES:
                value, response, rest = identity(size)
                self.assertFalse(response.has_error(), response.has_error() and response.error().message())
                output = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
                self.assertIsNotNone(output)
                self.assertTrue(np.allclose(output.as_numpy(), value))
                with self.assertRaises(StopIteration):
                    next(rest)


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for _ in requests:
                result = unittest.main("model", exit=False, argv=["model"])
                passed = np.array([result.result.wasSuccessful()], dtype=np.float16)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", passed)]))
            return responses
"""

BLS_MEMORY_ASYNC = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    DECOUPLED = {decoupled}
    SIZES = [16 * 1024 * 1024] + [4 * 1024 * 1024] * 4  # the QA's 256 Mi and 4 x 50 Mi elements, shrunk


    async def identity(size):
        value = np.random.randn(1, size).astype(np.float32)
        call = pb_utils.InferenceRequest(
            model_name="identity_fp32", inputs=[pb_utils.Tensor("INPUT0", value)], requested_output_names=["OUTPUT0"]
        )
        if DECOUPLED:
            return value, next(await call.async_exec(decoupled=True))
        return value, await call.async_exec()


    async def passes():
        for size in SIZES:
            value, response = await identity(size)
            if response.has_error():
                return False
            output = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
            if output is None or not np.allclose(output.as_numpy(), value):
                return False
        return True


    class TritonPythonModel:
        async def execute(self, requests):
            responses = []
            for _ in requests:
                passed = np.array([await passes()], dtype=np.float16)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", passed)]))
            return responses
"""

NO_INPUTS = """
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
    instance_group [ { kind: KIND_CPU } ]
"""


def MODELS() -> dict[str, Model]:
    models = {
        "identity_fp32": identity(),
        "square_int32": square(),
        "bls_parameters": python_model(
            """
            max_batch_size: 0
            input [ { name: "NUMBER_PARAMETERS" data_type: TYPE_UINT8 dims: [ 1 ] } ]
            output [ { name: "PARAMETERS_AGGREGATED" data_type: TYPE_STRING dims: [ 1 ] } ]
            instance_group [ { count: 4 kind: KIND_CPU } ]
            """,
            BLS_PARAMETERS,
        ),
    }
    for suffix, decoupled in (("", False), ("_decoupled", True)):
        models[f"bls_memory{suffix}"] = python_model(NO_INPUTS, BLS_MEMORY.replace("{decoupled}", str(decoupled)))
        models[f"bls_memory_async{suffix}"] = python_model(
            NO_INPUTS, BLS_MEMORY_ASYNC.replace("{decoupled}", str(decoupled))
        )
    return models


def test_bls_parameters(server):
    answer = server.infer("bls_parameters", {"NUMBER_PARAMETERS": np.array([3], np.uint8)}, ["PARAMETERS_AGGREGATED"])
    expected = {}
    for index in range(1, 4):
        expected.update({f"bool_{index}": True, f"int_{index}": index, f"str_{index}": str(index)})
    assert json_of(answer["PARAMETERS_AGGREGATED"]) == expected


@pytest.mark.parametrize("model", ["bls_memory", "bls_memory_decoupled"])
def test_bls_memory(server, model):
    answer = server.infer(model, {})
    assert answer.ok, answer
    assert answer["OUTPUT0"].tolist() == [1.0]


@pytest.mark.parametrize("model", ["bls_memory_async", "bls_memory_async_decoupled"])
def test_bls_memory_async(server, model):
    answer = server.infer(model, {})
    assert answer.ok, answer
    assert answer["OUTPUT0"].tolist() == [1.0]


BLS_IN_INITIALIZE = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            call = pb_utils.InferenceRequest(
                model_name="square_int32", inputs=[pb_utils.Tensor("IN", np.array([1], np.int32))], requested_output_names=["OUT"]
            )
            call.exec(decoupled=True)

        def execute(self, requests):
            pass
"""

BLS_IN_FINALIZE = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            pass

        def finalize(self):
            call = pb_utils.InferenceRequest(
                model_name="square_int32", inputs=[pb_utils.Tensor("IN", np.array([1], np.int32))], requested_output_names=["OUT"]
            )
            call.exec(decoupled=True)
"""

OUTSIDE_EXECUTE = "BLS is only supported during the 'execute' function."
EXPLICIT = {"triton_args": ("--model-control-mode=explicit",), "model_control_mode": "explicit"}


def test_bls_init_error(launch):
    server = launch(
        {"square_int32": square(), "bls_init_error": python_model(NO_INPUTS, BLS_IN_INITIALIZE)}, **EXPLICIT
    )
    code, message = server.load("bls_init_error")
    assert code != "OK" and OUTSIDE_EXECUTE in message, (code, message)


def test_bls_finalize_error(launch, logged):
    models = {"square_int32": square(), "bls_finalize_error": python_model(NO_INPUTS, BLS_IN_FINALIZE)}
    server = launch(models, **EXPLICIT)
    assert server.load("bls_finalize_error") == ("OK", "")
    assert server.unload("bls_finalize_error") == ("OK", "")
    logged(server, OUTSIDE_EXECUTE)
