"""grpcio's own CPU per ModelInfer: a sync grpc.server (16 threads, as a front end's) answering every call with a
canned response (no decoding, no link, no admission), driven by perf_analyzer on `simple`'s shape. Read beside
bench/frontend_cpu.py's front-end figure: the difference is what a front end adds (decode, encode, the link and
its wake-ups). The machine is shared: compare figures from the same run only.

    .venv/bin/python -m bench.grpcio_floor --clients 16 --rounds 3 --seconds 3
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
import numpy as np

from generated import grpc_service_pb2 as pb
from generated import model_config_pb2 as mc

from .frontend_cpu import PERF_ANALYZER

NAMES_IN, NAMES_OUT = ("INPUT0", "INPUT1"), ("OUTPUT0", "OUTPUT1")


def _answers() -> dict[str, bytes]:
    infer = pb.ModelInferResponse(model_name="simple", model_version="1")
    for name in NAMES_OUT:
        infer.outputs.add(name=name, datatype="INT32", shape=[1, 16])
        infer.raw_output_contents.append(np.zeros(16, np.int32).tobytes())
    tensor = pb.ModelMetadataResponse.TensorMetadata
    metadata = pb.ModelMetadataResponse(
        name="simple",
        versions=["1"],
        platform="onnxruntime_onnx",
        inputs=[tensor(name=name, datatype="INT32", shape=[-1, 16]) for name in NAMES_IN],
        outputs=[tensor(name=name, datatype="INT32", shape=[-1, 16]) for name in NAMES_OUT],
    )
    config = mc.ModelConfig(
        name="simple",
        max_batch_size=8,
        input=[mc.ModelInput(name=name, data_type=mc.TYPE_INT32, dims=[16]) for name in NAMES_IN],
        output=[mc.ModelOutput(name=name, data_type=mc.TYPE_INT32, dims=[16]) for name in NAMES_OUT],
    )
    return {
        "ServerMetadata": pb.ServerMetadataResponse(name="floor", version="2.51.0").SerializeToString(),
        "ModelMetadata": metadata.SerializeToString(),
        "ModelConfig": pb.ModelConfigResponse(config=config).SerializeToString(),
        "ModelInfer": infer.SerializeToString(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    counter = itertools.count()

    def handler(method: str, answer: bytes) -> Callable[[Any, Any], bytes]:
        if method != "ModelInfer":
            return lambda request, context: answer

        def infer(request: Any, context: Any) -> bytes:
            next(counter)
            return answer

        return infer

    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        method: grpc.unary_unary_rpc_method_handler(handler(method, answer)) for method, answer in _answers().items()
    }
    server = grpc.server(futures.ThreadPoolExecutor(16))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        for round_number in range(1, args.rounds + 1):
            started_cpu, started_calls = time.process_time(), next(counter)
            subprocess.run(
                [
                    str(PERF_ANALYZER),
                    "-i",
                    "grpc",
                    "-u",
                    f"127.0.0.1:{port}",
                    "-m",
                    "simple",
                    "--concurrency-range",
                    f"{args.clients}:{args.clients}",
                    "--measurement-interval",
                    str(int(args.seconds * 1000)),
                    "--max-trials",
                    "1",
                    "--stability-percentage",
                    "1000",
                ],
                capture_output=True,
                check=False,
            )
            cpu, calls = time.process_time() - started_cpu, next(counter) - started_calls
            print(
                f"round {round_number}: {calls} calls  grpcio server {cpu * 1e6 / max(calls, 1):6.0f} us/call  "
                f"load {os.getloadavg()[0]:.2f}"
            )
    finally:
        server.stop(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
