"""L0_backend_python/io and /ensemble, rewritten for CPU tensors (the QA's models move tensors to the GPU with torch;
here they go through Tensor.to_dlpack / from_dlpack on the CPU): an ensemble of three DLPack identities whose
later steps also call the first by BLS (plain and decoupled), an empty output, five batched requests each given an
output of its own length, outputs filtered to the requested ones (plain and decoupled), and an ensemble of two
python add_sub models."""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import concurrent.futures
import itertools

import numpy as np

from .harness import Model, build_request, ensemble, python_model
from .models import add_sub

# OUTPUT0 = INPUT0 through DLPack, NEXT_GPU_OUTPUT = GPU_OUTPUT[1:]; a model other than the first also checks the
# first's answer to the same inputs by BLS.
DLPACK_IO_IDENTITY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.name = args["model_name"]

        def answer(self, request):
            given = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            flags = pb_utils.get_input_tensor_by_name(request, "GPU_OUTPUT")
            output = pb_utils.Tensor.from_dlpack("OUTPUT0", given.to_dlpack())
            following = pb_utils.Tensor("NEXT_GPU_OUTPUT", flags.as_numpy()[1:])
            if self.name != "dlpack_io_identity_1":
                call = pb_utils.InferenceRequest(
                    model_name="dlpack_io_identity_1", inputs=[given, flags], requested_output_names=["OUTPUT0"]
                )
                response = call.exec()
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                seen = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()
                if not np.array_equal(seen, given.as_numpy()):
                    raise pb_utils.TritonModelException("the BLS output differs from the input")
            return pb_utils.InferenceResponse([output, following])

        def execute(self, requests):
            return [self.answer(request) for request in requests]
"""

# The same, decoupled: every request is answered twice from a thread, then the final flag.
DLPACK_IO_IDENTITY_DECOUPLED = """
    import threading

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                given = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy().copy()
                flags = pb_utils.get_input_tensor_by_name(request, "GPU_OUTPUT").as_numpy().copy()
                threading.Thread(target=self.answer, args=(request.get_response_sender(), given, flags), daemon=True).start()
            return None

        def answer(self, sender, given, flags):
            for _ in range(2):
                output = pb_utils.Tensor.from_dlpack("OUTPUT0", pb_utils.Tensor("INPUT0", given).to_dlpack())
                sender.send(pb_utils.InferenceResponse([output, pb_utils.Tensor("NEXT_GPU_OUTPUT", flags[1:])]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

IO_CONFIG = """
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "GPU_OUTPUT" data_type: TYPE_BOOL dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "NEXT_GPU_OUTPUT" data_type: TYPE_BOOL dims: [ -1 ] } ]
    instance_group [ { kind: KIND_CPU } ]
"""


def ensemble_io(prefix: str) -> str:
    """Three steps, each named <prefix>_<n>: INPUT0 and GPU_OUTPUT flow through, the flags one shorter each time."""
    steps = []
    flowing = ("INPUT0", "GPU_OUTPUT")
    for index in (1, 2, 3):
        last = index == 3
        out = ("OUTPUT0", "NEXT_GPU_OUTPUT") if last else (f"output_{index}", f"next_gpu_output_{index}")
        steps.append(
            f"""{{ model_name: "{prefix}_{index}" model_version: -1
              input_map {{ key: "INPUT0" value: "{flowing[0]}" }} input_map {{ key: "GPU_OUTPUT" value: "{flowing[1]}" }}
              output_map {{ key: "OUTPUT0" value: "{out[0]}" }} output_map {{ key: "NEXT_GPU_OUTPUT" value: "{out[1]}" }} }}"""
        )
        flowing = out
    return f"""
        platform: "ensemble"
        max_batch_size: 0
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: "GPU_OUTPUT" data_type: TYPE_BOOL dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: "NEXT_GPU_OUTPUT" data_type: TYPE_BOOL dims: [ -1 ] }} ]
        ensemble_scheduling {{ step [ {", ".join(steps)} ] }}
    """


EMPTY_OUTPUT = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            empty = np.ones([0], np.float32)
            return [pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUTPUT", pb_utils.Tensor("E", empty).to_dlpack())]) for _ in requests]
"""

# Five requests batched into one execute: request i gets i + 1 values of i + 1.
VARIABLE_OUTPUT = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            if len(requests) != 5:
                raise pb_utils.TritonModelException(f"expected 5 requests in one execute, got {len(requests)}")
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.ones(index + 1, np.float32) * (index + 1))])
                for index in range(len(requests))
            ]
"""

ENSEMBLE = """
    platform: "ensemble"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    ensemble_scheduling { step [
      { model_name: "add_sub_1" model_version: -1
        input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
        output_map { key: "OUTPUT0" value: "output_0" } output_map { key: "OUTPUT1" value: "output_1" } },
      { model_name: "add_sub_2" model_version: -1
        input_map { key: "INPUT0" value: "output_0" } input_map { key: "INPUT1" value: "output_1" }
        output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" } }
    ] }
"""


def MODELS() -> dict[str, Model]:
    models = {
        "add_sub": add_sub(),
        "add_sub_1": add_sub(),
        "add_sub_2": add_sub(),
        "ensemble": ensemble(ENSEMBLE),
        "ensemble_io": ensemble(ensemble_io("dlpack_io_identity")),
        "ensemble_io_decoupled": ensemble(ensemble_io("dlpack_io_identity_decoupled")),
        "dlpack_io_identity_decoupled": python_model(
            IO_CONFIG + "model_transaction_policy { decoupled: true }", DLPACK_IO_IDENTITY_DECOUPLED
        ),
        "dlpack_empty_output": python_model(
            """
            max_batch_size: 8
            input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
            output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
            """,
            EMPTY_OUTPUT,
        ),
        "variable_gpu_output": python_model(
            """
            max_batch_size: 256
            input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
            output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
            dynamic_batching { max_queue_delay_microseconds: 2000000 }
            instance_group [ { count: 1 kind: KIND_CPU } ]
            """,
            VARIABLE_OUTPUT,
        ),
    }
    for index in (1, 2, 3):
        models[f"dlpack_io_identity_{index}"] = python_model(IO_CONFIG, DLPACK_IO_IDENTITY)
        models[f"dlpack_io_identity_decoupled_{index}"] = python_model(
            IO_CONFIG + "model_transaction_policy { decoupled: true }", DLPACK_IO_IDENTITY_DECOUPLED
        )
    return models


def test_ensemble_io(server):
    """Every combination of the three steps' flags, on one stream: the input comes back from the third step."""
    value = np.random.random([1000]).astype(np.float32)
    with server.stream() as stream:
        for flags in itertools.product((True, False), repeat=3):
            stream.send(build_request("ensemble_io", {"INPUT0": value, "GPU_OUTPUT": np.array(flags)}))
            item = stream.next()
            assert item is not None and not item.error, item
            assert np.array_equal(item.outputs["OUTPUT0"], value)


def test_ensemble_io_decoupled(server):
    """The same with decoupled steps: two responses per request reach the client."""
    value = np.random.random([1000]).astype(np.float32)
    with server.stream() as stream:
        for flags in itertools.product((True, False), repeat=3):
            stream.send(build_request("ensemble_io_decoupled", {"INPUT0": value, "GPU_OUTPUT": np.array(flags)}))
            for _ in range(2):
                item = stream.next()
                assert item is not None and not item.error, item
                assert np.array_equal(item.outputs["OUTPUT0"], value)


def test_empty_output(server):
    answer = server.infer("dlpack_empty_output", {"INPUT": np.array([[1.0]], np.float32)})
    assert answer.ok, answer
    assert answer["OUTPUT"].size == 0


def test_variable_output(server):
    """Five requests sent together are one execute; request i is answered with i + 1 values of i + 1."""
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        answers = list(
            pool.map(lambda _: server.infer("variable_gpu_output", {"INPUT": np.array([[1.0]], np.float32)}), range(5))
        )
    for answer in answers:
        assert answer.ok, answer
    sizes = sorted(answer["OUTPUT"].size for answer in answers)
    assert sizes == [1, 2, 3, 4, 5]
    for answer in answers:
        np.testing.assert_almost_equal(answer["OUTPUT"], np.ones(answer["OUTPUT"].size) * answer["OUTPUT"].size)


def test_requested_output_default(server):
    a, b = np.random.rand(16).astype(np.float32), np.random.rand(16).astype(np.float32)
    one = server.infer("add_sub", {"INPUT0": a, "INPUT1": b}, ["OUTPUT1"])
    assert list(one.outputs) == ["OUTPUT1"] and np.allclose(one["OUTPUT1"], a - b)
    both = server.infer("add_sub", {"INPUT0": a, "INPUT1": b})
    assert sorted(both.outputs) == ["OUTPUT0", "OUTPUT1"]
    assert np.allclose(both["OUTPUT0"], a + b) and np.allclose(both["OUTPUT1"], a - b)


def test_requested_output_decoupled(server):
    value = np.random.rand(4).astype(np.float32)
    flags = np.random.rand(4) > 0.5
    inputs = {"INPUT0": value, "GPU_OUTPUT": flags}
    items = server.stream_all([build_request("dlpack_io_identity_decoupled", inputs, ["OUTPUT0"])])
    assert len(items) == 2 and all(list(item.outputs) == ["OUTPUT0"] for item in items), items
    assert all(np.allclose(item.outputs["OUTPUT0"], value) for item in items)
    items = server.stream_all([build_request("dlpack_io_identity_decoupled", inputs)])
    assert len(items) == 2 and all(sorted(item.outputs) == ["NEXT_GPU_OUTPUT", "OUTPUT0"] for item in items), items
    assert all(np.array_equal(item.outputs["NEXT_GPU_OUTPUT"], flags[1:]) for item in items)


def test_ensemble(server):
    """Two add_sub steps: (a + b) + (a - b) = 2a and (a + b) - (a - b) = 2b."""
    a, b = np.random.rand(16).astype(np.float32), np.random.rand(16).astype(np.float32)
    answer = server.infer("ensemble", {"INPUT0": a, "INPUT1": b})
    # float32 sums and differences: (a + b) - (a - b) is 2b within the rounding of a + b
    assert np.allclose(answer["OUTPUT0"], 2 * a, atol=1e-6) and np.allclose(answer["OUTPUT1"], 2 * b, atol=1e-6)
