"""A model that is not decoupled, with `async def execute` (the same file runs on slotserve and on Triton 2.51): as
async_gate, but it returns its responses (OUT = [KEY], PEERS = how many other requests of this instance were inside
execute when it entered) instead of sending them."""

import asyncio
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def _path(request, name):
    return os.path.join(json.loads(request.parameters())["gates"], name)


class TritonPythonModel:
    def initialize(self, args):
        self.inside = set()

    async def execute(self, requests):
        return list(await asyncio.gather(*(self._answer(request) for request in requests)))

    async def _answer(self, request):
        key = int(pb_utils.get_input_tensor_by_name(request, "KEY").as_numpy().reshape(-1)[0])
        peers = len(self.inside)
        self.inside.add(key)
        try:
            open(_path(request, f"entered-{key}"), "w").close()
            while not os.path.exists(_path(request, f"open-{key}")):
                await asyncio.sleep(0.005)  # ordering-free: polls the test's gate
            outputs = [
                pb_utils.Tensor("OUT", np.array([key], np.int32)),
                pb_utils.Tensor("PEERS", np.array([peers], np.int32)),
            ]
            return pb_utils.InferenceResponse(outputs)
        finally:
            self.inside.discard(key)
