"""OUTPUT0 = 2 * INPUT0; REQUESTS = how many requests the execute call that answered this one got."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            count = np.full((rows.shape[0], 1), len(requests), dtype=np.int32)
            outputs = [pb_utils.Tensor("OUTPUT0", rows * 2), pb_utils.Tensor("REQUESTS", count)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
