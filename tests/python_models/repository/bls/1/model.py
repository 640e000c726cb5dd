"""A model that calls other models of its server (BLS). MODE selects the call, ARG (JSON) its arguments; TEXT is
the JSON of what came back (outputs as lists, or {"error": [code, message]}), so the same file answers alike on
slotserve and on Triton.

add_sub       add_sub(a, b) through exec()
several       three add_sub calls from one execute
thread        add_sub from a thread the model starts inside execute
unknown       a model that does not exist
bad_input     add_sub with an FP32 input
callee_error  probe answering TritonError(CODE, text) (ARG: {"code": "INVALID_ARG"})
callee_raise  probe raising ValueError
stream        repeat(n) with exec(decoupled=True): every response's OUT, [] for one without tensors
info          this request's request_id, parameters, correlation_id and flags
forward       a call to this model's `info` mode carrying a request_id, parameters and a correlation_id of its own
stream_unary  repeat(1) with exec() (not decoupled=True)
wait_cancel   probe's `cancel` mode (it waits until its request is cancelled, then creates ARG's "marker" file)
"""

import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


def outcome(response):
    if response.has_error():
        return {"error": [int(response.error().code()), response.error().message()]}  # an enum on Triton
    return {tensor.name(): _plain(tensor.as_numpy()) for tensor in response.output_tensors()}


def _plain(array):
    if array.dtype == np.object_:
        return [element.decode("utf-8", "replace") for element in array.reshape(-1)]
    return array.tolist()


def add_sub(a, b, dtype=np.int32):
    inputs = [pb_utils.Tensor("INPUT0", np.array(a, dtype=dtype)), pb_utils.Tensor("INPUT1", np.array(b, dtype=dtype))]
    return pb_utils.InferenceRequest(model_name="add_sub", inputs=inputs, requested_output_names=["OUTPUT0", "OUTPUT1"])


def probe(mode, arg):
    inputs = [
        pb_utils.Tensor("MODE", np.array([mode.encode()], dtype=np.object_)),
        pb_utils.Tensor("ARG", np.array([arg.encode()], dtype=np.object_)),
    ]
    return pb_utils.InferenceRequest(model_name="probe", inputs=inputs, requested_output_names=["TEXT"])


class TritonPythonModel:
    def execute(self, requests):
        return [self.answer(request) for request in requests]

    def answer(self, request):
        mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
        arg = json.loads(pb_utils.get_input_tensor_by_name(request, "ARG").as_numpy()[0].decode() or "{}")
        result = getattr(self, f"mode_{mode}")(request, arg)
        text = np.array([json.dumps(result, sort_keys=True).encode()], dtype=np.object_)
        return pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", text)])

    def mode_add_sub(self, request, arg):
        return outcome(add_sub(arg["a"], arg["b"]).exec())

    def mode_several(self, request, arg):
        return [outcome(add_sub([k, k], [1, 2]).exec()) for k in range(3)]

    def mode_thread(self, request, arg):
        results = []
        thread = threading.Thread(target=lambda: results.append(outcome(add_sub(arg["a"], arg["b"]).exec())))
        thread.start()
        thread.join()
        return results[0]

    def mode_unknown(self, request, arg):
        inputs = [pb_utils.Tensor("INPUT0", np.array([1], dtype=np.int32))]
        return outcome(
            pb_utils.InferenceRequest(
                model_name="no_such_model", inputs=inputs, requested_output_names=["OUTPUT0"]
            ).exec()
        )

    def mode_bad_input(self, request, arg):
        return outcome(add_sub([1.5], [2.5], dtype=np.float32).exec())

    def mode_callee_error(self, request, arg):
        return outcome(probe("error", f"{arg['code']}:refused by the callee").exec())

    def mode_callee_raise(self, request, arg):
        return outcome(probe("raise", "the callee is broken").exec())

    def mode_stream(self, request, arg):
        inputs = [pb_utils.Tensor("IN", np.array([arg["n"]], dtype=np.int32))]
        call = pb_utils.InferenceRequest(model_name="repeat", inputs=inputs, requested_output_names=["OUT"])
        return [outcome(response).get("OUT", outcome(response)) for response in call.exec(decoupled=True)]

    def mode_wait_cancel(self, request, arg):
        return outcome(probe("cancel", arg["marker"]).exec())

    def mode_stream_unary(self, request, arg):
        inputs = [pb_utils.Tensor("IN", np.array([1], dtype=np.int32))]
        return outcome(
            pb_utils.InferenceRequest(model_name="repeat", inputs=inputs, requested_output_names=["OUT"]).exec()
        )

    def mode_info(self, request, arg):
        return {
            "request_id": request.request_id(),
            "parameters": json.loads(request.parameters()),
            "correlation_id": request.correlation_id(),
            "flags": request.flags(),
        }

    def mode_forward(self, request, arg):
        inputs = [
            pb_utils.Tensor("MODE", np.array([b"info"], dtype=np.object_)),
            pb_utils.Tensor("ARG", np.array([b"{}"], dtype=np.object_)),
        ]
        call = pb_utils.InferenceRequest(
            model_name="bls",
            inputs=inputs,
            requested_output_names=["TEXT"],
            request_id="inner-" + request.request_id(),
            correlation_id=77,
            parameters={"hop": 2, "from": "outer"},
        )
        response = call.exec()
        if response.has_error():
            return outcome(response)
        return json.loads(pb_utils.get_output_tensor_by_name(response, "TEXT").as_numpy()[0])
