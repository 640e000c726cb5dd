"""A configuration without tensors: auto_complete_config declares them (Triton's auto-complete API)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "TEXT", "data_type": "TYPE_STRING", "dims": [-1]})
        auto_complete_model_config.add_output({"name": "LENGTHS", "data_type": "TYPE_INT32", "dims": [-1]})
        auto_complete_model_config.add_output({"name": "UPPER", "data_type": "TYPE_STRING", "dims": [-1]})
        return auto_complete_model_config

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            lengths = np.array([len(t) for t in texts], dtype=np.int32)
            upper = np.array([t.upper() for t in texts], dtype=np.object_)
            outputs = [pb_utils.Tensor("LENGTHS", lengths), pb_utils.Tensor("UPPER", upper)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
