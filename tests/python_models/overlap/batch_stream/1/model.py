"""A decoupled model with dynamic batching (the same file runs on slotserve and on Triton 2.51). A request with
KEY = k (a batch of one row) gets k responses OUT = [100 * k + i] (i = 0 .. k-1), each with REQUESTS = how many
requests its execute call got, then the final flag alone; k = 0 gets the final flag alone, a negative k one error
response carrying the final flag. A request with the parameter "hold" (and "gates", a folder) creates
`entered-KEY` there and waits in execute, holding the instance, until the test creates `open-KEY`: the requests
sent meanwhile queue and reach the next execute together."""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _key(request):
    return int(pb_utils.get_input_tensor_by_name(request, "KEY").as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            parameters = json.loads(request.parameters())
            if parameters.get("hold"):
                gates, key = parameters["gates"], _key(request)
                open(os.path.join(gates, f"entered-{key}"), "w").close()
                while not os.path.exists(os.path.join(gates, f"open-{key}")):
                    time.sleep(0.005)  # ordering-free: polls the test's gate
        for request in requests:
            key = _key(request)
            sender = request.get_response_sender()
            if key < 0:
                error = pb_utils.TritonError(f"key {key} is refused", pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                continue
            for index in range(key):
                outputs = [
                    pb_utils.Tensor("OUT", np.array([[100 * key + index]], np.int32)),
                    pb_utils.Tensor("REQUESTS", np.array([[len(requests)]], np.int32)),
                ]
                sender.send(pb_utils.InferenceResponse(outputs))
            sender.send(flags=FINAL)
        return None
