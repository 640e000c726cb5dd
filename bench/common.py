"""What every part of the benchmark uses: where things are, the log line, and a gRPC channel to a server."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
CACHE = BENCH / ".cache"
RESULTS = BENCH / "results"
LOGS = RESULTS / "logs"
DEMO_REPOSITORY = ROOT / "demo" / "model_repository"
RPC_TIMEOUT = 300.0  # every request this script sends itself carries a deadline

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import numpy as np  # noqa: E402

from generated import grpc_service_pb2 as pb  # noqa: E402


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def infer_request(model: str, tensors: list[tuple[str, str, np.ndarray]]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    for name, datatype, array in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=array.shape)
        request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    return request


def channel(address: str) -> grpc.Channel:
    limit = 1 << 30
    return grpc.insecure_channel(
        address, options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]
    )
