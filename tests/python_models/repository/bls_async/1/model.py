"""An `async def execute` that awaits BLS calls made with async_exec, several at once (asyncio.gather), as Triton's
async BLS example does: SUM = A + A and DIFF = A - 1 from two add_sub calls in flight together; STREAM = every OUT
of repeat(len(A)) through async_exec(decoupled=True)."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


def add_sub(a, b):
    inputs = [pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", b)]
    return pb_utils.InferenceRequest(model_name="add_sub", inputs=inputs, requested_output_names=["OUTPUT0", "OUTPUT1"])


def checked(response):
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return response


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            first, second = await asyncio.gather(add_sub(a, a).async_exec(), add_sub(a, np.ones_like(a)).async_exec())
            total = pb_utils.get_output_tensor_by_name(checked(first), "OUTPUT0").as_numpy()
            diff = pb_utils.get_output_tensor_by_name(checked(second), "OUTPUT1").as_numpy()
            repeat = pb_utils.InferenceRequest(
                model_name="repeat",
                inputs=[pb_utils.Tensor("IN", np.array([a.size], dtype=np.int32))],
                requested_output_names=["OUT"],
            )
            values = []
            for response in await repeat.async_exec(decoupled=True):
                tensor = pb_utils.get_output_tensor_by_name(checked(response), "OUT")
                if tensor is not None:
                    values.append(int(tensor.as_numpy()[0]))
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("SUM", total),
                        pb_utils.Tensor("DIFF", diff),
                        pb_utils.Tensor("STREAM", np.array(values, dtype=np.int32)),
                    ]
                )
            )
        return responses
