"""The remaining L0_backend_python subsuites, rewritten: argument_validation (pb_utils refuses bad arguments, checked
by a unittest inside the model), model_control (a python model and an ensemble over it loaded and unloaded again
and again), restart (a model's process killed between requests), request_rescheduling (iterative sequences:
`request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`), env (a model run in an environment of its
own, EXECUTION_ENV_PATH), and two models whose helper modules share a name."""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import numpy as np
import pytest

from .harness import Model, build_request, ensemble, json_of, python_model, triton_fails
from .models import identity

# The QA's checks of pb_utils' argument validation, as a unittest run inside execute.
ARGUMENT_VALIDATION = """
    import unittest

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class ArgumentValidationTest(unittest.TestCase):
        def test_infer_request_args(self):
            inputs = [pb_utils.Tensor("INPUT0", np.asarray([1, 2], dtype=np.int32))]
            model, outputs = "my_model", ["my_output"]
            with self.assertRaises(pb_utils.TritonModelException):
                pb_utils.InferenceRequest(inputs=[None], model_name=model, requested_output_names=outputs)
            with self.assertRaises(TypeError):
                pb_utils.InferenceRequest(inputs=None, model_name=model, requested_output_names=outputs)
            with self.assertRaises(TypeError):
                pb_utils.InferenceRequest(model_name=None, inputs=inputs, requested_output_names=outputs)
            with self.assertRaises(TypeError):
                pb_utils.InferenceRequest(requested_output_names=[None], inputs=inputs, model_name=model)
            with self.assertRaises(TypeError):
                pb_utils.InferenceRequest(requested_output_names=None, inputs=inputs, model_name=model)
            for name in ("correlation_id", "request_id", "model_version", "flags"):
                with self.assertRaises(TypeError, msg=name):
                    pb_utils.InferenceRequest(requested_output_names=outputs, inputs=inputs, model_name=model, **{name: None})
            request = pb_utils.InferenceRequest(requested_output_names=outputs, inputs=inputs, model_name=model, correlation_id=5)
            self.assertIsInstance(request.correlation_id(), int)
            self.assertEqual(request.correlation_id(), 5)
            request = pb_utils.InferenceRequest(
                requested_output_names=outputs, inputs=inputs, model_name=model, correlation_id="test_str_id-5"
            )
            self.assertIsInstance(request.correlation_id(), str)
            self.assertEqual(request.correlation_id(), "test_str_id-5")
            request = pb_utils.InferenceRequest(requested_output_names=outputs, inputs=inputs, model_name=model)
            self.assertEqual(request.correlation_id(), 0)
            pb_utils.InferenceRequest(requested_output_names=[], inputs=[], model_name=model)

        def test_infer_response_args(self):
            with self.assertRaises(pb_utils.TritonModelException):
                pb_utils.InferenceResponse(output_tensors=[None])
            with self.assertRaises(TypeError):
                pb_utils.InferenceResponse(output_tensors=None)
            pb_utils.InferenceResponse(output_tensors=[])
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.asarray([1, 2], dtype=np.int32))])

        def test_tensor_args(self):
            array = np.asarray([1, 2], dtype=np.int32)
            with self.assertRaises(TypeError):
                pb_utils.Tensor(None, array)
            with self.assertRaises(TypeError):
                pb_utils.Tensor("OUTPUT0", None)
            with self.assertRaises(pb_utils.TritonModelException):
                pb_utils.Tensor.from_dlpack("OUTPUT0", None)
            with self.assertRaises(pb_utils.TritonModelException):
                pb_utils.Tensor.from_dlpack("", None)
            with self.assertRaises(TypeError):
                pb_utils.Tensor("", None)

        def test_log_args(self):
            logger = pb_utils.Logger
            with self.assertRaises(TypeError):
                logger.log("Invalid Level", None)
            with self.assertRaises(TypeError):
                logger.log("Invalid Level", 1)
            for method in (logger.log_info, logger.log_warn, logger.log_error, logger.log_verbose):
                with self.assertRaises(TypeError, msg=method.__name__):
                    method(None)
            logger.log("Level unspecified")
            logger.log("Level given", logger.INFO)


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for _ in requests:
                result = unittest.main("model", exit=False, argv=["model"])
                failures = [str(test) + ": " + text.splitlines()[-1] for test, text in result.result.failures + result.result.errors]
                outputs = [
                    pb_utils.Tensor("OUTPUT0", np.array([result.result.wasSuccessful()], dtype=np.float16)),
                    pb_utils.Tensor("FAILURES", np.array(["\\n".join(failures)], dtype=np.object_)),
                ]
                responses.append(pb_utils.InferenceResponse(outputs))
            return responses
"""

RESTART = """
    import os

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                pid = pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value), pid]))
            return responses
"""

# Decoupled, iterative: IN = [n] gives n responses n-1 .. 0, one per (rescheduled) execute of the same request.
ITERATIVE = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.remaining = None

        def execute(self, requests):
            for request in requests:
                if self.remaining is None:
                    self.remaining = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
                sender = request.get_response_sender()
                self.remaining -= 1
                response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([self.remaining], np.int32))])
                if self.remaining <= 0:
                    self.remaining = None
                    sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                else:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                    sender.send(response)
            return None
"""

# Not decoupled, iterative: the first execute reschedules the request (returning None for it), the next answers.
RESCHEDULING_ADD_SUB = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.calls = 0

        def execute(self, requests):
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
                if self.calls == 0:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                    responses.append(None)
                else:
                    responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
                self.calls += 1
            return responses
"""

HELPER_USER = """
    import numpy as np
    import triton_python_backend_utils as pb_utils
    from helper import WHO


    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([WHO], dtype=np.object_))]) for _ in requests]
"""

STRING_OUT = """
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

SIMPLE_IDENTITY = """
    platform: "ensemble"
    max_batch_size: 64
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    ensemble_scheduling { step [ { model_name: "identity_fp32" model_version: -1
      input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }
"""


def MODELS() -> dict[str, Model]:
    return {
        "argument_validation": python_model(
            """
            output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "FAILURES" data_type: TYPE_STRING dims: [ 1 ] } ]
            instance_group [ { kind: KIND_CPU } ]
            """,
            ARGUMENT_VALIDATION,
        ),
        "restart": python_model(
            """
            max_batch_size: 0
            input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]
            output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] }, { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
            instance_group [ { count: 1 kind: KIND_CPU } ]
            """,
            RESTART,
        ),
        "helper_a": python_model(STRING_OUT, HELPER_USER, extra={"helper.py": 'WHO = "a"\n'}),
        "helper_b": python_model(STRING_OUT, HELPER_USER, extra={"helper.py": 'WHO = "b"\n'}),
    }


def test_argument_validation(server):
    answer = server.infer("argument_validation", {})
    assert answer.ok, answer
    assert answer["FAILURES"].tolist() == [b""]
    assert answer["OUTPUT0"].tolist() == [1.0]


def test_helper_modules_of_the_same_name_do_not_collide(server):
    """Two models import their own `helper.py` (each model's instances are processes of their own)."""
    one = np.zeros([1], np.float32)
    assert server.infer("helper_a", {"INPUT0": one})["OUTPUT0"].tolist() == [b"a"]
    assert server.infer("helper_b", {"INPUT0": one})["OUTPUT0"].tolist() == [b"b"]


def _restart_infer(server):
    value = np.random.randn(1, 16).astype(np.float32)
    answer = server.infer("restart", {"INPUT0": value})
    if answer.ok:
        assert np.array_equal(answer["OUTPUT0"], value)
    return answer


def test_restart_infer(server):
    assert _restart_infer(server).ok


@triton_fails(
    "after its stub is killed, every later request is answered \"Stub process 'restart_0_0' is not healthy.\" "
    "(2.51's test.sh leaves restart out: 'Reimplement restart on decoupled data pipeline')"
)
def test_restart(server):
    """The model's process is killed between requests: the next request fails (Triton), the one after works."""
    pid = int(_restart_infer(server)["PID"][0])
    os.kill(pid, signal.SIGKILL)
    assert not _restart_infer(server).ok
    assert _restart_infer(server).ok


def test_model_control_reload(launch):
    """explicit mode: load a python model, then an ensemble over it; infer both; unload both; again."""
    models = {"identity_fp32": identity(), "simple_identity_fp32": ensemble(SIMPLE_IDENTITY)}
    server = launch(models, ("--model-control-mode=explicit",), model_control_mode="explicit")
    value = np.arange(16, dtype=np.float32)[None]
    for _ in range(3):
        assert not server.ready("identity_fp32")
        assert server.load("identity_fp32") == ("OK", "")
        assert server.load("simple_identity_fp32") == ("OK", "")
        assert server.ready("identity_fp32") and server.ready("simple_identity_fp32")
        for model in ("identity_fp32", "simple_identity_fp32"):
            assert np.array_equal(server.infer(model, {"INPUT0": value}, ["OUTPUT0"])["OUTPUT0"], value)
        assert server.unload("simple_identity_fp32") == ("OK", "")
        assert server.unload("identity_fp32") == ("OK", "")
        assert not server.ready("identity_fp32") and not server.ready("simple_identity_fp32")


def test_grpc_decoupled_rescheduling(launch):
    models = {
        "iterative_sequence": python_model(
            """
            max_batch_size: 0
            model_transaction_policy { decoupled: true }
            input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
            output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
            sequence_batching { iterative_sequence: true }
            instance_group [ { kind: KIND_CPU } ]
            """,
            ITERATIVE,
        )
    }
    server = launch(models)
    items = server.stream_all([build_request("iterative_sequence", {"IN": np.array([3], np.int32)})])
    assert [item.error for item in items] == ["", "", ""], items
    assert [item.outputs["OUT"].tolist() for item in items] == [[2], [1], [0]]


def test_grpc_non_decoupled_rescheduling(launch):
    models = {
        "request_rescheduling_addsub": python_model(
            """
            input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
            output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
            sequence_batching { iterative_sequence: true }
            instance_group [ { kind: KIND_CPU } ]
            """,
            RESCHEDULING_ADD_SUB,
        )
    }
    server = launch(models)
    a, b = np.random.randn(16).astype(np.float32), np.random.randn(16).astype(np.float32)
    answer = server.infer("request_rescheduling_addsub", {"INPUT0": a, "INPUT1": b})
    assert answer.ok, answer
    assert np.array_equal(answer["OUTPUT0"], a + b) and np.array_equal(answer["OUTPUT1"], a - b)


# ---- env: EXECUTION_ENV_PATH ---------------------------------------------------------------------------------------

ENVIRONMENT_PROBE = """
    import json
    import sys

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            shown = json.dumps({"numpy": np.__version__, "ninf": float(np.NINF), "prefix": sys.prefix})
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([shown], dtype=np.object_))]) for _ in requests]
"""


def _numpy1_environment() -> Path:
    """A folder environment with numpy 1.x (Triton's own venv: Python 3.11, numpy 1.26)."""
    from ..conftest import INSTALLATION

    if INSTALLATION is None:
        pytest.skip("no Triton venv")
    return INSTALLATION.venv


def test_execution_env_path(launch):
    """A model pinned to numpy 1 (it uses np.NINF, gone in numpy 2) runs in the environment its config names."""
    environment = _numpy1_environment()
    config = textwrap.dedent(STRING_OUT) + textwrap.dedent(
        f"""
        parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{environment}" }} }}
        """
    )
    server = launch({"numpy_one": python_model(config, ENVIRONMENT_PROBE)})
    answer = server.infer("numpy_one", {"INPUT0": np.zeros([1], np.float32)})
    assert answer.ok, answer
    shown = json_of(answer["OUTPUT0"])
    assert shown["numpy"].startswith("1.") and shown["ninf"] == float("-inf"), shown
