"""A decoupled model with `async def execute` whose requests each await a BLS call to async_gate
(`async_exec(decoupled=True)`, the same KEY and gate folder) and pass its responses on, then the final flag (the same
file runs on slotserve and on Triton 2.51): one instance of it overlaps its requests, and so their BLS calls."""

import json

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            await self._answer(request)

    async def _answer(self, request):
        key = pb_utils.get_input_tensor_by_name(request, "KEY").as_numpy()
        call = pb_utils.InferenceRequest(
            model_name="async_gate",
            inputs=[pb_utils.Tensor("KEY", key)],
            requested_output_names=["OUT", "PEERS"],
            parameters={"gates": json.loads(request.parameters())["gates"]},
        )
        sender = request.get_response_sender()
        for response in await call.async_exec(decoupled=True):
            if response.has_error():
                sender.send(pb_utils.InferenceResponse(error=response.error()))
                continue
            outputs = response.output_tensors()
            if outputs:
                sender.send(pb_utils.InferenceResponse(outputs))
        sender.send(flags=FINAL)
