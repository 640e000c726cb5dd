"""A decoupled model (the same file runs on slotserve and on Triton): IN = [n] answers with n responses OUT = [0],
[1], ..., [n-1], then the final flag on its own. n = 0: no response at all. n < 0: one error response
(INVALID_ARGUMENT) carrying the final flag. n >= 1000: the responses come from a thread of the model after execute
returned (n - 1000 of them). n == 999: one response, then it waits until the request is cancelled and sends the
final flag."""

import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _response(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])


class TritonPythonModel:
    def initialize(self, args):
        if not pb_utils.using_decoupled_model_transaction_policy(__import__("json").loads(args["model_config"])):
            raise pb_utils.TritonModelException("repeat must be decoupled")
        self.threads = []

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            if n < 0:
                error = pb_utils.TritonError(f"n must be >= 0, got {n}", pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
            elif n == 997:
                sender.send(_response(os.getpid()), flags=FINAL)
            elif n == 999:
                sender.send(_response(0))
                while not request.is_cancelled():
                    time.sleep(0.01)  # ordering-free: polls the request's cancellation
                sender.send(flags=FINAL)
            elif n >= 1000:
                thread = threading.Thread(target=self._answer, args=(sender, n - 1000))
                thread.start()
                self.threads.append(thread)
            else:
                for value in range(n):
                    sender.send(_response(value))
                sender.send(flags=FINAL)
        return None

    def _answer(self, sender, n):
        for value in range(n):
            sender.send(_response(value))
        sender.send(flags=FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
