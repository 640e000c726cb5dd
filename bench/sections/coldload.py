"""Cold loads: each demo model unloaded, then the time RepositoryModelLoad takes; and server start to ready."""

from __future__ import annotations

import time

import grpc

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc

from ..common import DEMO_REPOSITORY, RPC_TIMEOUT, channel, log
from ..servers import Launcher
from ..table import Table, fmt_ms, median


def section_coldload(args, launcher: Launcher, table: Table, raw: dict) -> None:
    models = sorted(p.name for p in DEMO_REPOSITORY.iterdir() if (p / "config.pbtxt").is_file())
    result: dict = {}
    with launcher.slotserve("slotserve-coldload", DEMO_REPOSITORY, ["--allow-management"]) as server:
        result["server_start_to_ready_s"] = server.startup_s
        with channel(server.address) as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            for model in models:
                times = []
                error = None
                for _ in range(args.coldload_repeats):
                    try:
                        stub.RepositoryModelUnload(
                            pb.RepositoryModelUnloadRequest(model_name=model), timeout=RPC_TIMEOUT
                        )
                        started = time.perf_counter()
                        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=model), timeout=RPC_TIMEOUT)
                        elapsed = time.perf_counter() - started
                        if not stub.ModelReady(pb.ModelReadyRequest(name=model), timeout=30).ready:
                            error = "not ready after RepositoryModelLoad"
                        times.append(elapsed * 1000)
                    except grpc.RpcError as rpc_error:
                        error = f"{rpc_error.code().name}: {rpc_error.details()}"
                        break
                result[model] = {"ms": times, "error": error}
                log(f"cold load {model}: {times} {error or ''}")
    raw["coldload"] = result
    for model in models:
        entry = result[model]
        table.add(
            "coldload",
            f"cold load {model} (unload, then RepositoryModelLoad) ms",
            fmt_ms(median(entry["ms"])) + (f" [{entry['error'][:80]}]" if entry["error"] else ""),
            ms=median(entry["ms"]),
        )
    table.add(
        "coldload",
        "server start to ready, all demo models loaded (s)",
        f"{result['server_start_to_ready_s']:.2f}",
        s=result["server_start_to_ready_s"],
    )
