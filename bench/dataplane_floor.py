"""The admission floor: what one `simple` request costs the server's own Python, without gRPC, threads or links.

    .venv/bin/python -m bench.dataplane_floor                 µs per request (wall and thread CPU), median of rounds
    .venv/bin/python -m bench.dataplane_floor --profile       plus a cProfile breakdown of one round (cumulative)

A server core is built in-process over demo/model_repository (service.process.server.Server, never started: no port,
no gRPC server), `simple` is loaded, and one thread does what ModelInfer does with a request's wire bytes, in a hot
loop: parse the bytes (service/transport/wire.py), make the dataplane's request (service/transport/tensors.py),
`Dataplane.infer` (find the model and version, reserve tensor memory, decode, cache check, trace check, the path's
admission, the ONNX Runtime run, statistics, service rate) and encode the answer to its wire bytes (`as_bytes`).
What is left out is grpcio's own work and the hand-offs between threads: the part no front end removes (issue 39).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.interface import CancelToken
from generated import grpc_service_pb2 as pb
from service.process.options import ServerOptions
from service.process.server import Server
from service.transport.tensors import as_bytes, inference_request
from service.transport.wire import parse_infer_request

MODEL = "simple"


def request_bytes() -> bytes:
    """A `simple` request as a client sends it: two INT32 [1, 16] inputs as raw contents, both outputs."""
    message = pb.ModelInferRequest(model_name=MODEL, id="floor")
    for name in ("INPUT0", "INPUT1"):
        message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        message.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    return message.SerializeToString()


def one_request(server: Server, data: bytes) -> Callable[[], bytes]:
    """ModelInfer's work for `data` without grpc: parse, the dataplane's request, infer, encode."""
    dataplane = server.dataplane
    shared_memory = server.shared_memory

    def call() -> bytes:
        parsed = parse_infer_request(data)
        request = inference_request(parsed.message, as_bytes, parsed.raw_contents, shared_memory, None)
        return dataplane.infer(request, cancel=CancelToken())

    return call


def rounds(call: Callable[[], bytes], count: int, repeats: int) -> tuple[list[float], list[float]]:
    """µs per call, wall and this thread's CPU, one figure per round."""
    wall: list[float] = []
    cpu: list[float] = []
    for _ in range(repeats):
        began, began_cpu = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(count):
            call()
        wall.append((time.perf_counter_ns() - began) / count / 1e3)
        cpu.append((time.thread_time_ns() - began_cpu) / count / 1e3)
    return wall, cpu


def _summary(values: list[float]) -> str:
    return f"median {statistics.median(values):7.1f}  min {min(values):7.1f}  max {max(values):7.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=Path("demo/model_repository"))
    parser.add_argument("--count", type=int, default=2000, help="calls per round")
    parser.add_argument("--repeats", type=int, default=7, help="rounds")
    parser.add_argument("--profile", action="store_true", help="print a cProfile breakdown of one more round")
    parser.add_argument("--lines", type=int, default=40, help="profile lines shown")
    args = parser.parse_args(argv)
    server = Server(ServerOptions(model_repository=args.repository, port=0, load_at_startup=False))
    server.registry.load(MODEL)
    try:
        call = one_request(server, request_bytes())
        for _ in range(200):  # warm: ONNX Runtime's first runs, the caches of the path
            call()
        wall, cpu = rounds(call, args.count, args.repeats)
        print(f"{MODEL}: {args.repeats} rounds of {args.count} calls, µs per call")
        print(f"  wall        {_summary(wall)}")
        print(f"  thread CPU  {_summary(cpu)}")
        if args.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(args.count):
                call()
            profiler.disable()
            stats = pstats.Stats(profiler)
            stats.sort_stats("cumulative").print_stats(args.lines)
            stats.sort_stats("tottime").print_stats(args.lines)
    finally:
        server.registry.unload(MODEL)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
