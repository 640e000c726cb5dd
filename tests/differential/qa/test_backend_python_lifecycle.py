"""L0_backend_python/lifecycle, rewritten: a TritonError's code and message reach the client as they are, a
cancelled request is seen cancelled by the model, one request's error in a batch fails that request alone, a model
that raises is a counted BACKEND failure, `triton_grpc_error` ends a stream with the model's error, and errors in
initialize, finalize and auto_complete_config are reported with the model's own words."""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import re
import textwrap
import threading

import numpy as np

from .harness import Model, build_request, python_model, wait_for

ERROR_CODE = """
    import triton_python_backend_utils as pb_utils

    NAMES = ("UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED", "ALREADY_EXISTS", "CANCELLED")


    class TritonPythonModel:
        def execute(self, requests):
            # Triton's stub adds TritonError to the module after importing model.py: read it here, not at import.
            CODES = {name: getattr(pb_utils.TritonError, name) for name in NAMES}
            responses = []
            for request in requests:
                name = pb_utils.get_input_tensor_by_name(request, "ERROR_CODE").as_numpy()[0][0].decode()
                if name in CODES:
                    error = pb_utils.TritonError(message="error code: " + name, code=CODES[name])
                else:
                    error = pb_utils.TritonError("unrecognized error code: " + name)
                responses.append(pb_utils.InferenceResponse(error=error))
            return responses
"""

# Writes "started" into its folder, then looks at is_cancelled() until the request is cancelled (or 60 s):
# "cancelled" or "not cancelled" is written beside it, and the answer says the same.
EXECUTE_CANCEL = """
    import os
    import time

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.folder = args["model_repository"]

        def execute(self, requests):
            with open(os.path.join(self.folder, "started.part"), "w") as marker:
                marker.write("started")
            os.replace(os.path.join(self.folder, "started.part"), os.path.join(self.folder, "started"))  # whole, at once
            responses = []
            for request in requests:
                error = pb_utils.TritonError("not cancelled")
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    if request.is_cancelled():
                        error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                        break
                    time.sleep(0.05)  # ordering-free: polls the request's cancellation until a deadline
                with open(os.path.join(self.folder, "outcome.part"), "w") as marker:
                    marker.write(error.message())
                os.replace(os.path.join(self.folder, "outcome.part"), os.path.join(self.folder, "outcome"))  # whole, at once
                responses.append(pb_utils.InferenceResponse(error=error))
            return responses
"""

# The first and third request of a call fail (the first with outputs beside its error), the second succeeds.
EXECUTE_ERROR = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for index, request in enumerate(requests):
                out = pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())
                if index == 0:
                    responses.append(pb_utils.InferenceResponse([out], pb_utils.TritonError("An error occurred during execution")))
                elif index == 1:
                    responses.append(pb_utils.InferenceResponse([out]))
                else:
                    responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("An error occurred during execution")))
            return responses
"""

# Every second request (counted by the instance) fails.
EXECUTE_GRPC_ERROR = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.count = 1

        def execute(self, requests):
            responses = []
            for request in requests:
                out = pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())
                if self.count % 2:
                    responses.append(pb_utils.InferenceResponse([out]))
                else:
                    responses.append(pb_utils.InferenceResponse([out], pb_utils.TritonError("An error occurred during execution")))
                self.count += 1
            return responses
"""

WRONG_MODEL = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                out = pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())
                lorem_ipsum  # noqa: the NameError this model is about
                responses.append(pb_utils.InferenceResponse([out]))
            return responses
"""

IN_OUT = """
    max_batch_size: 64
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
    instance_group [ { count: 1 kind: KIND_CPU } ]
"""
BATCH_DELAY_US = 3_000_000  # the QA's 12 s, shortened: the three requests of a stream arrive well inside it


def MODELS() -> dict[str, Model]:
    return {
        "error_code": python_model(
            """
            max_batch_size: 4
            input [ { name: "ERROR_CODE" data_type: TYPE_STRING dims: [ 1 ] } ]
            output [ { name: "DUMMY_OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
            """,
            ERROR_CODE,
        ),
        "execute_cancel": python_model(
            """
            max_batch_size: 1
            input [ { name: "EXECUTE_DELAY" data_type: TYPE_FP32 dims: [ 1 ] } ]
            output [ { name: "DUMMY_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
            parameters { key: "cancel_kill_seconds" value: { string_value: "0" } }
            """,
            EXECUTE_CANCEL,
        ),
        "execute_error": python_model(
            IN_OUT + f"dynamic_batching {{ preferred_batch_size: [8] max_queue_delay_microseconds: {BATCH_DELAY_US} }}",
            EXECUTE_ERROR,
        ),
        "execute_grpc_error": python_model(
            IN_OUT + "dynamic_batching { preferred_batch_size: [8] max_queue_delay_microseconds: 1200000 }",
            EXECUTE_GRPC_ERROR,
        ),
        "wrong_model": python_model(IN_OUT.replace("TYPE_FP32", "TYPE_UINT32"), WRONG_MODEL),
    }


ERROR_CODES = {
    "UNKNOWN": "UNKNOWN",
    "INTERNAL": "INTERNAL",
    "NOT_FOUND": "NOT_FOUND",
    "INVALID_ARG": "INVALID_ARGUMENT",
    "UNAVAILABLE": "UNAVAILABLE",
    "UNSUPPORTED": "UNIMPLEMENTED",
    "ALREADY_EXISTS": "ALREADY_EXISTS",
    "CANCELLED": "CANCELLED",
}


def test_error_code(server):
    """Each TritonError code is its gRPC status, and the message is the model's, nothing added."""
    for name, status in [*ERROR_CODES.items(), ("(default)", "INTERNAL")]:
        answer = server.infer("error_code", {"ERROR_CODE": np.array([[name]], dtype=np.object_)})
        expected = f"unrecognized error code: {name}" if name == "(default)" else f"error code: {name}"
        assert (answer.code, answer.message) == (status, expected), name


def test_execute_cancel(server):
    """A request cancelled by its client while the model runs: the client sees CANCELLED, the model sees
    is_cancelled() turn true."""
    folder = server.repository / "execute_cancel"
    for marker in ("started", "outcome"):
        (folder / marker).unlink(missing_ok=True)
    request = build_request("execute_cancel", {"EXECUTE_DELAY": np.array([[4.0]], np.float32)})
    call = server.stub.ModelInfer.future(request, timeout=120)
    wait_for((folder / "started").exists, "the model started the request")
    assert not call.done()
    call.cancel()
    wait_for((folder / "outcome").exists, "the model ended the request")
    assert call.code().name == "CANCELLED"
    assert (folder / "outcome").read_text() == "cancelled"


def test_batch_error(server):
    """Three requests batched into one execute: the first and third fail, the second succeeds."""
    values = [np.random.randn(2, 2).astype(np.float32) for _ in range(3)]
    with server.stream() as stream:
        for value in values:
            stream.send(build_request("execute_error", {"IN": value}))
        items = stream.take(3)
    assert [bool(item.error) for item in items] == [True, False, True], items
    assert np.array_equal(items[1].outputs["OUT"], values[1])


def _failures(server, model: str, reason: str) -> float:
    found = re.search(
        rf'^nv_inference_request_failure\{{model="{model}",reason="{reason}",version="1"\}} (\S+)$',
        server.metrics(),
        re.MULTILINE,
    )
    assert found, f"no {reason} failure counter for {model}"
    return float(found.group(1))


def test_infer_pymodel_error(server):
    """execute raises NameError: the message starts as Triton's, and the failure counts as reason BACKEND."""
    before = _failures(server, "wrong_model", "BACKEND")
    answer = server.infer("wrong_model", {"IN": np.ones([2, 2], np.uint32)})
    assert not answer.ok
    assert answer.message.startswith("Failed to process the request(s) for model "), answer.message
    assert "name 'lorem_ipsum' is not defined" in answer.message
    assert _failures(server, "wrong_model", "BACKEND") == before + 1


def _grpc_error_stream(server, requests: int) -> list:
    """Send `requests` one at a time on a stream opened with `triton_grpc_error: true`, each after the previous
    answer; returns what came back: ("OK", outputs) or ("ERROR", status)."""
    seen = []
    with server.stream(metadata=(("triton_grpc_error", "true"),)) as stream:
        for _ in range(requests):
            stream.send(build_request("execute_grpc_error", {"IN": np.random.randn(2, 2).astype(np.float32)}))
            item = stream.next()
            if item is None:
                seen.append(("ERROR", stream.status))
                break
            seen.append(("OK", item.error))
    return seen


def test_triton_grpc_error_error_on(server):
    """With `triton_grpc_error: true` the first error ends the stream with status INTERNAL."""
    seen = _grpc_error_stream(server, 2)
    assert seen[0] == ("OK", "") and seen[1][0] == "ERROR" and seen[1][1][0] == "INTERNAL", seen


def test_triton_grpc_error_multithreaded(server):
    """Two such streams at once: each ends with INTERNAL at its model error (the error falls on either)."""
    results: list = []

    def one() -> None:
        results.append(_grpc_error_stream(server, 4))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)
    assert len(results) == 2
    for seen in results:
        assert seen[-1][0] == "ERROR" and seen[-1][1][0] == "INTERNAL", results
        assert all(entry == ("OK", "") for entry in seen[:-1]), results


def test_triton_grpc_error_cancel(server):
    """Such a stream cancelled by its client after an answer ends without trouble, and the server serves on."""
    with server.stream(metadata=(("triton_grpc_error", "true"),)) as stream:
        stream.send(build_request("execute_grpc_error", {"IN": np.ones([2, 2], np.float32)}))
        assert stream.next() is not None
        stream.cancel()
    assert server.ready("execute_grpc_error")


def test_triton_grpc_error_error_off(server):
    """Without the metadata every request is answered on the stream, errors included; the stream stays open."""
    with server.stream() as stream:
        for _ in range(4):
            stream.send(build_request("execute_grpc_error", {"IN": np.ones([2, 2], np.float32)}))
            assert stream.next(), "the stream ended"
        assert stream.status is None


# ---- errors in initialize, finalize and auto_complete_config (servers of their own) -------------------------------

INIT_ERROR = """
    class TritonPythonModel:
        def initialize(self, args):
            lorem_ipsum  # noqa: the NameError this model is about

        def execute(self, requests):
            pass
"""

FINI_ERROR = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]

        def finalize(self):
            undefined_variable  # noqa: the NameError this model is about
"""

AUTO_COMPLETE_ERROR = """
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            config.set_max_batch_size(0)
            config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
            config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
            undefined_variable  # noqa: the NameError this model is about
            return config

        def execute(self, requests):
            pass
"""

EXPLICIT = {"triton_args": ("--model-control-mode=explicit",), "model_control_mode": "explicit"}


def test_init_error(launch):
    server = launch({"init_error": python_model(IN_OUT, INIT_ERROR)}, **EXPLICIT)
    code, message = server.load("init_error")
    assert code != "OK" and "name 'lorem_ipsum' is not defined" in message, (code, message)
    assert not server.ready("init_error")


def test_fini_error(launch, logged):
    """finalize raises: the unload still succeeds, and the server's log has the model's error."""
    server = launch({"fini_error": python_model(IN_OUT, FINI_ERROR)}, **EXPLICIT)
    assert server.load("fini_error") == ("OK", "")
    assert server.infer("fini_error", {"IN": np.ones([1, 2], np.float32)}).ok
    assert server.unload("fini_error") == ("OK", "")
    wait_for(lambda: not server.ready("fini_error"), "the model is unloaded")
    logged(server, "name 'undefined_variable' is not defined")


def test_auto_complete_error(launch):
    models = {"auto_complete_error": Model(None, {"1/model.py": textwrap.dedent(AUTO_COMPLETE_ERROR)})}
    server = launch(models, **EXPLICIT)
    code, message = server.load("auto_complete_error")
    assert code != "OK" and "name 'undefined_variable' is not defined" in message, (code, message)
