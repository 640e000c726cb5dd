"""L0_backend_python/examples: the python backend's examples (add_sub, bls sync and async, decoupled repeat and
square, auto_complete, bls_decoupled sync and async) as their clients check them, the models rewritten in our
words with what the examples do that matters here kept: the BLS example takes its callee's name from a BYTES
input (`model_name=tensor.as_numpy()[0]`, a bytes), the bls_decoupled examples answer an int64 sum where the
configuration says INT32, and the auto_complete examples have no config.pbtxt. The torch, jax and custom metrics
examples are left out (no torch nor jax here)."""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import numpy as np

from .harness import Model, build_request, python_model
from .models import add_sub, repeat, square

BLS_SYNC = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]  # bytes
                call = pb_utils.InferenceRequest(
                    model_name=name,
                    requested_output_names=["OUTPUT0", "OUTPUT1"],
                    inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0"), pb_utils.get_input_tensor_by_name(request, "INPUT1")],
                )
                response = call.exec()
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                responses.append(pb_utils.InferenceResponse(output_tensors=response.output_tensors()))
            return responses
"""

BLS_ASYNC = """
    import asyncio

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        async def execute(self, requests):
            responses = []
            for request in requests:
                inputs = [pb_utils.get_input_tensor_by_name(request, "INPUT0"), pb_utils.get_input_tensor_by_name(request, "INPUT1")]
                calls = [
                    pb_utils.InferenceRequest(model_name=name, requested_output_names=["OUTPUT0", "OUTPUT1"], inputs=inputs).async_exec()
                    for name in ("add_sub_copy", "add_sub")
                ]
                answers = await asyncio.gather(*calls)
                for answer in answers:
                    if answer.has_error():
                        raise pb_utils.TritonModelException(answer.error().message())
                outputs = [
                    pb_utils.get_output_tensor_by_name(answers[0], "OUTPUT0"),
                    pb_utils.get_output_tensor_by_name(answers[1], "OUTPUT1"),
                ]
                responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            return responses
"""

# Sums the OUT of every response of square_int32 (one call, or two awaited together); the sum is numpy's default
# integer (int64) where the configuration says INT32, as in the examples.
BLS_DECOUPLED_SYNC = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            count = pb_utils.get_input_tensor_by_name(requests[0], "IN")
            call = pb_utils.InferenceRequest(model_name="square_int32", inputs=[count], requested_output_names=["OUT"])
            total = np.array([0])
            for response in call.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                if response.output_tensors():
                    total += pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()
            return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)])]
"""

BLS_DECOUPLED_ASYNC = """
    import asyncio

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        async def execute(self, requests):
            count = pb_utils.get_input_tensor_by_name(requests[0], "IN")
            calls = [
                pb_utils.InferenceRequest(model_name="square_int32", inputs=[count], requested_output_names=["OUT"]).async_exec(decoupled=True)
                for _ in range(2)
            ]
            total = np.array([0])
            for responses in await asyncio.gather(*calls):
                for response in responses:
                    if response.has_error():
                        raise pb_utils.TritonModelException(response.error().message())
                    if response.output_tensors():
                        total += pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()
            return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)])]
"""

AUTO_COMPLETE = """
    import json

    import triton_python_backend_utils as pb_utils

    BATCH = {batch}


    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            present = config.as_dict()
            inputs = {{entry["name"] for entry in present["input"]}}
            outputs = {{entry["name"] for entry in present["output"]}}
            for name in ("INPUT0", "INPUT1"):
                if name not in inputs:
                    config.add_input({{"name": name, "data_type": "TYPE_FP32", "dims": [4]}})
            for name in ("OUTPUT0", "OUTPUT1"):
                if name not in outputs:
                    config.add_output({{"name": name, "data_type": "TYPE_FP32", "dims": [4]}})
            config.set_max_batch_size(BATCH)
            if BATCH:
                config.set_dynamic_batching()
            return config

        def execute(self, requests):
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
            return responses
"""

FOUR = """
    input [
      { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
      { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
    ]
    output [
      { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
      { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
    ]
    instance_group [ { kind: KIND_CPU } ]
"""
SUM = """
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] } ]
    instance_group [ { kind: KIND_CPU } ]
"""


def MODELS() -> dict[str, Model]:
    return {
        "add_sub": add_sub(dims="[ 4 ]"),
        "add_sub_copy": add_sub(dims="[ 4 ]"),
        "square_int32": square(),
        "repeat_int32": repeat(),
        "bls_sync": python_model(
            FOUR.replace("input [", 'input [ { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] },', 1), BLS_SYNC
        ),
        "bls_async": python_model(FOUR, BLS_ASYNC),
        "bls_decoupled_sync": python_model(SUM, BLS_DECOUPLED_SYNC),
        "bls_decoupled_async": python_model(SUM, BLS_DECOUPLED_ASYNC),
        "nobatch_auto_complete": Model(None, {"1/model.py": _dedented(AUTO_COMPLETE.format(batch=0))}),
        "batch_auto_complete": Model(None, {"1/model.py": _dedented(AUTO_COMPLETE.format(batch=4))}),
    }


def _dedented(source: str) -> str:
    import textwrap

    return textwrap.dedent(source)


def _pair():
    return np.random.rand(4).astype(np.float32), np.random.rand(4).astype(np.float32)


def test_add_sub(server):
    a, b = _pair()
    answer = server.infer("add_sub", {"INPUT0": a, "INPUT1": b})
    assert np.allclose(answer["OUTPUT0"], a + b) and np.allclose(answer["OUTPUT1"], a - b)


def test_bls_sync(server):
    a, b = _pair()
    inputs = {"INPUT0": a, "INPUT1": b, "MODEL_NAME": np.array(["add_sub"], dtype=np.object_)}
    answer = server.infer("bls_sync", inputs, ["OUTPUT0", "OUTPUT1"], id="1")
    assert np.allclose(answer["OUTPUT0"], a + b) and np.allclose(answer["OUTPUT1"], a - b)
    inputs["MODEL_NAME"] = np.array(["undefined_model"], dtype=np.object_)
    refused = server.infer("bls_sync", inputs, ["OUTPUT0", "OUTPUT1"], id="1")
    assert not refused.ok and "undefined_model" in refused.message, refused


def test_bls_async(server):
    a, b = _pair()
    answer = server.infer("bls_async", {"INPUT0": a, "INPUT1": b})
    assert np.allclose(answer["OUTPUT0"], a + b) and np.allclose(answer["OUTPUT1"], a - b)


def test_decoupled_repeat(server):
    """One request, four values: four responses in order, OUT the value and IDX its index."""
    values = [4, 2, 0, 1]
    request = build_request(
        "repeat_int32",
        {
            "IN": np.array(values, np.int32),
            "DELAY": np.array([1, 2, 3, 4], np.uint32),
            "WAIT": np.array([5], np.uint32),
        },
        ["OUT", "IDX"],
        id="0",
    )
    items = server.stream_all([request])
    assert [item.error for item in items] == [""] * 4, items
    assert [item.outputs["OUT"].tolist() for item in items] == [[value] for value in values]
    assert [item.outputs["IDX"].tolist() for item in items] == [[index] for index in range(4)]
    assert {item.id for item in items} == {"0"}


def test_decoupled_square(server):
    counts = [4, 2, 0, 1]
    requests = [
        build_request("square_int32", {"IN": np.array([count], np.int32)}, ["OUT"], id=str(index))
        for index, count in enumerate(counts)
    ]
    items = server.stream_all(requests)
    for index, count in enumerate(counts):
        mine = [item for item in items if item.id == str(index)]
        assert len(mine) == count and all(item.outputs["OUT"].tolist() == [count] for item in mine), (index, items)


def _config_ios(server, model: str) -> tuple[int, list, list]:
    config = server.config(model)
    ios = lambda entries: sorted((e.name, e.data_type, list(e.dims)) for e in entries)  # noqa: E731
    return config.max_batch_size, ios(config.input), ios(config.output)


def test_auto_complete(server):
    four = [("INPUT0", 11, [4]), ("INPUT1", 11, [4])]  # 11: TYPE_FP32
    outputs = [("OUTPUT0", 11, [4]), ("OUTPUT1", 11, [4])]
    assert _config_ios(server, "nobatch_auto_complete") == (0, four, outputs)
    assert _config_ios(server, "batch_auto_complete") == (4, four, outputs)


def test_bls_decoupled_sync(server):
    for count in [4, 2, 0, 1]:
        answer = server.infer("bls_decoupled_sync", {"IN": np.array([count], np.int32)}, ["SUM"], id="1")
        assert answer.ok, answer
        assert answer["SUM"].tolist() == [count * count]


def test_bls_decoupled_async(server):
    for count in [4, 2, 0, 1]:
        answer = server.infer("bls_decoupled_async", {"IN": np.array([count], np.int32)}, ["SUM"], id="1")
        assert answer.ok, answer
        assert answer["SUM"].tolist() == [2 * count * count]
