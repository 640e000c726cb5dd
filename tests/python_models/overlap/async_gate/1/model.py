"""A decoupled model with `async def execute` (the same file runs on slotserve and on Triton 2.51). Each request
names a gate folder (its request parameter "gates") and a KEY: on entering execute it creates `entered-KEY` there,
then awaits (without blocking the event loop) until the test creates `open-KEY`, and answers OUT = [KEY] and
PEERS = how many other requests of this instance were inside execute when it entered, with the final flag. A negative
KEY raises ValueError once its gate opens, sending nothing (its request never gets a final flag from the model). A
request cancelled while it waits sends the final flag alone, unless its KEY is 1000 or more: that one ignores its
cancellation (and creates `cancelled-KEY` all the same once it sees it)."""

import asyncio
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _path(request, name):
    return os.path.join(json.loads(request.parameters())["gates"], name)


class TritonPythonModel:
    def initialize(self, args):
        self.inside = set()

    async def execute(self, requests):
        await asyncio.gather(*(self._answer(request) for request in requests))

    async def _answer(self, request):
        key = int(pb_utils.get_input_tensor_by_name(request, "KEY").as_numpy().reshape(-1)[0])
        sender = request.get_response_sender()
        peers = len(self.inside)
        self.inside.add(key)
        try:
            open(_path(request, f"entered-{key}"), "w").close()
            while not os.path.exists(_path(request, f"open-{key}")):
                if request.is_cancelled() and not os.path.exists(_path(request, f"cancelled-{key}")):
                    open(_path(request, f"cancelled-{key}"), "w").close()
                    if key < 1000:
                        sender.send(flags=FINAL)
                        return
                await asyncio.sleep(0.005)  # ordering-free: polls the test's gate
            if key < 0:
                raise ValueError(f"key {key} is refused")
            outputs = [
                pb_utils.Tensor("OUT", np.array([key], np.int32)),
                pb_utils.Tensor("PEERS", np.array([peers], np.int32)),
            ]
            sender.send(pb_utils.InferenceResponse(outputs), flags=FINAL)
        finally:
            self.inside.discard(key)
