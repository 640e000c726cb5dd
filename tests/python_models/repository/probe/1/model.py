"""A model that misbehaves on request, for fault tests. MODE selects what execute does with ARG:

pid            answer PID (this worker's process id) and TEXT = the instance name
exit           os._exit(int(ARG))
raise          raise ValueError(ARG)
error          answer with TritonError(ARG's text, code given as "CODE:text")
overlap        create ARG/<pid>.started, then spin (holding the GIL, pure Python) until another worker's
               file is there or 60 s passed; TEXT = "peer" or "alone"
cancel         wait (up to 60 s) until is_cancelled(), then create file ARG; TEXT = "cancelled"
hang           spin forever, ignoring cancellation
echo           TEXT = ARG (BYTES round trip)
"""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        return [self.answer(request) for request in requests]

    def answer(self, request):
        mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
        arg = pb_utils.get_input_tensor_by_name(request, "ARG").as_numpy()[0]
        text = arg
        if mode == "exit":
            os._exit(int(arg))
        elif mode == "raise":
            raise ValueError(arg.decode())
        elif mode == "error":
            code, message = arg.decode().split(":", 1)
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, getattr(pb_utils.TritonError, code)))
        elif mode == "overlap":
            text = self.overlap(arg.decode())
        elif mode == "cancel":
            deadline = time.monotonic() + 60
            while not request.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.01)  # ordering-free: polls the request's cancellation until a deadline
            if request.is_cancelled():
                open(arg.decode(), "w").close()
            text = b"cancelled"
        elif mode == "hang":
            open(arg.decode(), "w").close()
            while True:
                pass
        elif mode == "pid":
            text = self.instance.encode()
        outputs = [
            pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
            pb_utils.Tensor("TEXT", np.array([text], dtype=np.object_)),
        ]
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def overlap(self, folder):
        mine = os.path.join(folder, f"{os.getpid()}.started")
        open(mine, "w").close()
        deadline = time.monotonic() + 60
        spins = 0
        while time.monotonic() < deadline:
            spins += 1  # pure Python: this loop holds the GIL between checks
            if spins % 1000 == 0 and any(name != os.path.basename(mine) for name in os.listdir(folder)):
                return b"peer"
        return b"alone"
