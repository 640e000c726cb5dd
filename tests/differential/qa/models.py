"""Model sources several QA modules share, written for this port (the behaviour of NVIDIA's QA models and of the
python backend's examples, in our own code)."""

from __future__ import annotations

from .harness import Model, python_model

IDENTITY = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]
                )
                for r in requests
            ]
"""


def identity_config(datatype: str = "TYPE_FP32", max_batch_size: int = 64, extra: str = "") -> str:
    return f"""
        max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT0" data_type: {datatype} dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: {datatype} dims: [ -1 ] }} ]
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        {extra}
    """


def identity(datatype: str = "TYPE_FP32", max_batch_size: int = 64, extra: str = "") -> Model:
    return python_model(identity_config(datatype, max_batch_size, extra), IDENTITY)


# OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 in the configuration's output types.
ADD_SUB = """
    import json

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            config = json.loads(args["model_config"])
            self.types = [
                pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, name)["data_type"])
                for name in ("OUTPUT0", "OUTPUT1")
            ]

        def execute(self, requests):
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
                outputs = [
                    pb_utils.Tensor("OUTPUT0", (a + b).astype(self.types[0])),
                    pb_utils.Tensor("OUTPUT1", (a - b).astype(self.types[1])),
                ]
                responses.append(pb_utils.InferenceResponse(outputs))
            return responses
"""


def add_sub_config(datatype: str = "TYPE_FP32", dims: str = "[ 16 ]", max_batch_size: int = 0, extra: str = "") -> str:
    return f"""
        max_batch_size: {max_batch_size}
        input [
          {{ name: "INPUT0" data_type: {datatype} dims: {dims} }},
          {{ name: "INPUT1" data_type: {datatype} dims: {dims} }}
        ]
        output [
          {{ name: "OUTPUT0" data_type: {datatype} dims: {dims} }},
          {{ name: "OUTPUT1" data_type: {datatype} dims: {dims} }}
        ]
        instance_group [ {{ kind: KIND_CPU }} ]
        {extra}
    """


def add_sub(datatype: str = "TYPE_FP32", dims: str = "[ 16 ]", max_batch_size: int = 0, extra: str = "") -> Model:
    return python_model(add_sub_config(datatype, dims, max_batch_size, extra), ADD_SUB)


# Decoupled: for IN = [n], n responses each OUT = [n] from a thread of its own, then the final flag (the python
# backend's decoupled "square" example).
SQUARE = """
    import threading

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
                sender = request.get_response_sender()
                threading.Thread(target=self.answer, args=(sender, count), daemon=True).start()
            return None

        def answer(self, sender, count):
            for _ in range(count):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([count], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

SQUARE_CONFIG = """
    max_batch_size: 0
    model_transaction_policy { decoupled: true }
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    instance_group [ { kind: KIND_CPU } ]
"""


def square() -> Model:
    return python_model(SQUARE_CONFIG, SQUARE)


# Decoupled: IN (n values), DELAY (n milliseconds), WAIT (milliseconds): after WAIT, one response per value, each
# after its DELAY, OUT = the value and IDX = its index, then the final flag (the python backend's "repeat" example
# and the L0_decoupled repeat model).
REPEAT = """
    import threading
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
                delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy().copy()
                wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy().copy()
                sender = request.get_response_sender()
                threading.Thread(target=self.answer, args=(sender, values, delays, wait), daemon=True).start()
            return None

        def answer(self, sender, values, delays, wait):
            time.sleep(float(wait[0]) / 1000)  # ordering-free: the model's WAIT input, timing under test
            for index, (value, delay) in enumerate(zip(values, delays)):
                time.sleep(float(delay) / 1000)  # ordering-free: its DELAY input; one thread sends in order
                outputs = [
                    pb_utils.Tensor("OUT", np.array([value], np.int32)),
                    pb_utils.Tensor("IDX", np.array([index], np.uint32)),
                ]
                sender.send(pb_utils.InferenceResponse(outputs))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

REPEAT_CONFIG = """
    max_batch_size: 0
    model_transaction_policy { decoupled: true }
    input [
      { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
      { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
      { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
    ]
    output [
      { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
      { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
    ]
    instance_group [ { kind: KIND_CPU } ]
"""


def repeat() -> Model:
    return python_model(REPEAT_CONFIG, REPEAT)
