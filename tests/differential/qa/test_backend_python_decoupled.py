"""L0_backend_python/decoupled, rewritten: decoupled python models answering from threads, with BLS calls (plain and
decoupled) inside, an error for one request of a batch, a decoupled execute that returns responses, a send after
the final flag, a cancelled stream seen by the model, and repeated exceptions."""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import numpy as np

from .harness import Model, build_request, python_model, wait_for
from .models import identity, square

# Requests of one batched call: the first gets an error response, the others their input back.
EXECUTE_ERROR = """
    import threading

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for index, request in enumerate(requests):
                value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
                threading.Thread(target=self.answer, args=(request.get_response_sender(), index, value), daemon=True).start()
            return None

        def answer(self, sender, index, value):
            out = pb_utils.Tensor("OUT", value)
            if index == 0:
                response = pb_utils.InferenceResponse([out], pb_utils.TritonError("An error occurred during execution"))
            else:
                response = pb_utils.InferenceResponse([out])
            sender.send(response)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# execute checks a BLS call to identity_fp32, then a thread makes another and sends its output (the QA's
# decoupled_bls without its GPU part).
BLS = """
    import threading

    import numpy as np
    import triton_python_backend_utils as pb_utils


    def identity(value):
        call = pb_utils.InferenceRequest(
            model_name="identity_fp32", requested_output_names=["OUTPUT0"], inputs=[pb_utils.Tensor("INPUT0", value)]
        )
        response = call.exec()
        if response.has_error():
            raise pb_utils.TritonModelException("BLS response has an error: " + response.error().message())
        return pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
                if not np.array_equal(identity(value), value):
                    raise pb_utils.TritonModelException("BLS input and output differ")
                threading.Thread(target=self.answer, args=(request.get_response_sender(), value), daemon=True).start()
            return None

        def answer(self, sender, value):
            output = identity(value)
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", output)])
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# A thread calls the decoupled square_int32 with exec(decoupled=True) and forwards each response with outputs.
BLS_STREAM = """
    import threading

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
                threading.Thread(target=self.answer, args=(request.get_response_sender(), value), daemon=True).start()
            return None

        def answer(self, sender, value):
            call = pb_utils.InferenceRequest(
                model_name="square_int32", requested_output_names=["OUT"], inputs=[pb_utils.Tensor("IN", value)]
            )
            seen = 0
            for response in call.exec(decoupled=True):
                seen += 1
                if response.output_tensors():
                    out = pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
            if seen - 1 != int(value[0]):
                error = pb_utils.TritonError(f"expected {int(value[0])} responses, got {seen - 1}")
                sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

RETURN_RESPONSE = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
            return responses
"""

SEND_AFTER_CLOSE = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            sender = requests[0].get_response_sender()
            a = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(requests[0], "INPUT1").as_numpy()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)])
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            sender.send(response)
"""

# A thread writes "started", then watches its sender's is_cancelled() (60 s at most), writes the outcome and
# answers with it.
EXECUTE_CANCEL = """
    import os
    import threading
    import time

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.folder = args["model_repository"]

        def execute(self, requests):
            for request in requests:
                threading.Thread(target=self.answer, args=(request.get_response_sender(),), daemon=True).start()
            return None

        def answer(self, sender):
            with open(os.path.join(self.folder, "started.part"), "w") as marker:
                marker.write("started")
            os.replace(os.path.join(self.folder, "started.part"), os.path.join(self.folder, "started"))  # whole, at once
            error = pb_utils.TritonError("not cancelled")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if sender.is_cancelled():
                    error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                    break
                time.sleep(0.05)  # ordering-free: polls the cancellation until a deadline
            with open(os.path.join(self.folder, "outcome.part"), "w") as marker:
                marker.write(error.message())
            os.replace(os.path.join(self.folder, "outcome.part"), os.path.join(self.folder, "outcome"))  # whole, at once
            try:
                sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception:
                pass
"""

RAISE = """
    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                raise Exception("Intentional Error")
            return None
"""

DECOUPLED = "model_transaction_policy { decoupled: true }"
IN_OUT = """
    max_batch_size: 64
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
    instance_group [ { count: 1 kind: KIND_CPU } ]
"""
TWO_BY_SIXTEEN = """
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    instance_group [ { kind: KIND_CPU } ]
"""
BATCH_DELAY_US = 8_000_000  # the QA's 12 s, shortened: both requests of the stream arrive inside it on a loaded machine (3 s was not, once)


def MODELS() -> dict[str, Model]:
    return {
        "identity_fp32": identity(),
        "square_int32": square(),
        "decoupled_execute_error": python_model(
            IN_OUT
            + DECOUPLED
            + f"\ndynamic_batching {{ preferred_batch_size: [8] max_queue_delay_microseconds: {BATCH_DELAY_US} }}",
            EXECUTE_ERROR,
        ),
        "decoupled_bls": python_model(IN_OUT + DECOUPLED, BLS),
        "decoupled_bls_stream": python_model(
            """
            model_transaction_policy { decoupled: true }
            input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
            output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
            instance_group [ { count: 1 kind: KIND_CPU } ]
            """,
            BLS_STREAM,
        ),
        "decoupled_return_response_error": python_model(TWO_BY_SIXTEEN + DECOUPLED, RETURN_RESPONSE),
        "decoupled_send_after_close_error": python_model(TWO_BY_SIXTEEN + DECOUPLED, SEND_AFTER_CLOSE),
        "execute_cancel": python_model(
            """
            max_batch_size: 1
            model_transaction_policy { decoupled: true }
            input [ { name: "EXECUTE_DELAY" data_type: TYPE_FP32 dims: [ 1 ] } ]
            output [ { name: "DUMMY_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
            parameters { key: "cancel_kill_seconds" value: { string_value: "0" } }
            """,
            EXECUTE_CANCEL,
        ),
        "decoupled_raise_exception": python_model(IN_OUT + DECOUPLED, RAISE),
    }


def test_decoupled_execute_error(server):
    """Two requests batched into one execute of a decoupled model: the first is answered with an error, the
    second with its input."""
    values = [np.random.randn(2, 2).astype(np.float32) for _ in range(2)]
    with server.stream() as stream:
        for value in values:
            stream.send(build_request("decoupled_execute_error", {"IN": value}))
        items = stream.take(2)
    assert len(items) == 2 and items[0].error and not items[1].error, items
    assert np.array_equal(items[1].outputs["OUT"], values[1])


def test_decoupled_bls(server):
    value = np.random.randn(1, 2).astype(np.float32)
    (item,) = server.stream_all([build_request("decoupled_bls", {"IN": value})])
    assert not item.error, item.error
    assert np.array_equal(item.outputs["OUT"], value)


def test_decoupled_bls_stream(server):
    """Requests asking for 4, 2, 0 and 1 responses: each gets that many, carrying its value; 0 gets none."""
    counts = [4, 2, 0, 1]
    requests = [
        build_request("decoupled_bls_stream", {"IN": np.array([count], np.int32)}, id=str(index))
        for index, count in enumerate(counts)
    ]
    items = server.stream_all(requests)
    assert not [item.error for item in items if item.error]
    for index, count in enumerate(counts):
        mine = [item for item in items if item.id == str(index)]
        assert len(mine) == count, (index, items)
        assert all(item.outputs["OUT"].tolist() == [count] for item in mine)


RETURN_NONE_MESSAGE = (
    "Python model 'decoupled_return_response_error_0_0' is using the decoupled mode and the execute function must "
    "return None."
)


def test_decoupled_return_response_error(server):
    request = build_request(
        "decoupled_return_response_error",
        {"INPUT0": np.random.rand(16).astype(np.float32), "INPUT1": np.random.rand(16).astype(np.float32)},
    )
    items = server.stream_all([request])
    assert len(items) == 1 and RETURN_NONE_MESSAGE in items[0].error, items


def test_decoupled_send_after_close_error(server):
    """A response sent after the final flag cannot reach the client: the request ends with no answer at all."""
    request = build_request(
        "decoupled_send_after_close_error",
        {"INPUT0": np.random.rand(16).astype(np.float32), "INPUT1": np.random.rand(16).astype(np.float32)},
    )
    assert server.stream_all([request]) == []
    assert server.ready("decoupled_send_after_close_error")


def test_decoupled_execute_cancel(server):
    """The client cancels its stream while the model's thread runs: the model sees its sender cancelled."""
    folder = server.repository / "execute_cancel"
    for marker in ("started", "outcome"):
        (folder / marker).unlink(missing_ok=True)
    with server.stream() as stream:
        stream.send(build_request("execute_cancel", {"EXECUTE_DELAY": np.array([[4.0]], np.float32)}))
        wait_for((folder / "started").exists, "the model's thread started")
        stream.cancel()
        wait_for((folder / "outcome").exists, "the model's thread ended")
        assert stream.status is None or stream.status[0] == "CANCELLED"
    assert (folder / "outcome").read_text() == "cancelled"


def test_decoupled_raise_exception(server):
    """Ten requests whose execute raises: ten errors with the exception's text, and the model stays ready."""
    requests = [
        build_request("decoupled_raise_exception", {"IN": np.random.randn(2, 2).astype(np.float32)}) for _ in range(10)
    ]
    items = server.stream_all(requests)
    assert len(items) == 10 and all("Intentional Error" in item.error for item in items), items
    assert server.ready("decoupled_raise_exception")
