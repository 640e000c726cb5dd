"""A PyTriton server for the batching benchmark: the demo `mlp` behind Triton's dynamic batcher.

    bench/.venv-pytriton/bin/python bench/pytriton/serve.py --model demo/model_repository/mlp/1/model.onnx \
        --grpc-port P [--instances 2] [--max-batch-size 16]

Runs in its own virtual environment (bench/setup.sh makes it: PyTriton 0.7 bundles Triton 2.51 and wants numpy
1.x). The model is the same ONNX file slotserve serves, on one shared onnxruntime session with the settings
slotserve uses (one intra-op and one inter-op thread, sequential execution, every graph optimization), run by
`instances` model instances: Triton's dynamic batcher hands each instance a batch of queued requests. Prints
"listening on 127.0.0.1:P" once the model is ready, then serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig


def session(model: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--max-batch-size", type=int, default=16)
    args = parser.parse_args()
    shared = session(args.model)

    @batch
    def infer(INPUT0: np.ndarray) -> dict[str, np.ndarray]:  # noqa: N803 - the tensor's name
        return {"OUTPUT0": shared.run(["OUTPUT0"], {"INPUT0": INPUT0})[0]}

    config = TritonConfig(grpc_address="127.0.0.1", grpc_port=args.grpc_port, allow_http=False, allow_metrics=False)
    # perf_analyzer reads ModelStatistics, which PyTriton restricts to a token by default.
    security = TritonSecurityConfig(restricted_endpoints=[])
    with Triton(config=config, security_config=security) as triton:
        triton.bind(
            model_name="mlp",
            infer_func=[infer] * args.instances,
            inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(1024,))],
            outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(1024,))],
            config=ModelConfig(max_batch_size=args.max_batch_size, batcher=DynamicBatcher()),
        )
        print(f"listening on 127.0.0.1:{args.grpc_port}", flush=True)
        triton.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
