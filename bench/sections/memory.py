"""Resident memory of a server holding a ~201 MB model with 1 and with 8 slots, against a baseline server."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import grpc
import numpy as np

from generated import grpc_service_pb2_grpc as pb_grpc
from generated import management_pb2 as mpb
from generated import management_pb2_grpc as mpb_grpc

from ..common import CACHE, DEMO_REPOSITORY, RPC_TIMEOUT, channel, infer_request, log
from ..servers import Launcher
from ..table import Table

MEMORY_SLOTS = (1, 8)
MEMORY_LAYERS, MEMORY_WIDTH, MEMORY_ROWS = 12, 2048, 64  # 12 x 2048 x 2048 FP32 = 201,326,592 bytes
MEMORY_MODEL = "weights200mb"


def memory_repository() -> tuple[Path, int]:
    """A repository holding one MatMul chain with ~201 MB of FP32 weights (built once, in bench/.cache)."""
    repository = CACHE / "memory_repository"
    directory = repository / MEMORY_MODEL
    model_file = directory / "1" / "model.onnx"
    weights = MEMORY_LAYERS * MEMORY_WIDTH * MEMORY_WIDTH * 4
    if model_file.is_file():
        return repository, weights
    from onnx import TensorProto, helper, numpy_helper

    log(f"building {model_file} ({weights / 1e6:.0f} MB of weights)")
    rng = np.random.default_rng(7)
    scale = 1.0 / np.sqrt(MEMORY_WIDTH)
    nodes, initializers, current = [], [], "INPUT0"
    for layer in range(MEMORY_LAYERS):
        weight = (rng.standard_normal((MEMORY_WIDTH, MEMORY_WIDTH), dtype=np.float32) * scale).astype(np.float32)
        initializers.append(numpy_helper.from_array(weight, f"weight{layer}"))
        result = "OUTPUT0" if layer == MEMORY_LAYERS - 1 else f"activation{layer}"
        nodes.append(helper.make_node("MatMul", [current, f"weight{layer}"], [f"product{layer}"]))
        nodes.append(helper.make_node("Tanh", [f"product{layer}"], [result]))
        current = result
    shape = [MEMORY_ROWS, MEMORY_WIDTH]
    graph = helper.make_graph(
        nodes,
        MEMORY_MODEL,
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, shape)],
        initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8, producer_name="slotserve-bench"
    )
    (directory / "1").mkdir(parents=True, exist_ok=True)
    temporary = model_file.with_suffix(".tmp")
    temporary.write_bytes(model.SerializeToString())
    dims = "".join(f"  dims: {d}\n" for d in shape)
    (directory / "config.pbtxt").write_text(
        f"# Written by bench/run.py: {MEMORY_LAYERS} MatMul+Tanh layers, {MEMORY_WIDTH}x{MEMORY_WIDTH} FP32 "
        f"weights each ({weights} bytes in all).\n"
        f'name: "{MEMORY_MODEL}"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        f'input {{\n  name: "INPUT0"\n  data_type: TYPE_FP32\n{dims}}}\n'
        f'output {{\n  name: "OUTPUT0"\n  data_type: TYPE_FP32\n{dims}}}\n'
    )
    os.replace(temporary, model_file)
    return repository, weights


def warm_up_concurrently(address: str, model: str, tensors, in_flight: int, requests_each: int) -> int:
    """`in_flight` threads, each sending `requests_each` requests back to back, started together. Returns the
    number of failures."""
    request = infer_request(model, tensors)
    failures = []
    barrier = threading.Barrier(in_flight)

    def worker() -> None:
        with channel(address) as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            barrier.wait(timeout=60)
            for _ in range(requests_each):
                try:
                    stub.ModelInfer(request, timeout=RPC_TIMEOUT)
                except grpc.RpcError as error:
                    failures.append(f"{error.code().name}: {error.details()}")

    threads = [threading.Thread(target=worker) for _ in range(in_flight)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=RPC_TIMEOUT * requests_each)
    if failures:
        log(f"warm-up failures ({len(failures)}): {failures[0]}")
    return len(failures)


def section_memory(args, launcher: Launcher, table: Table, raw: dict) -> None:
    repository, weights = memory_repository()
    # Baseline: the same server holding only `simple` (so onnxruntime is imported and initialised), warmed up.
    baseline = CACHE / "baseline_repository"
    shutil.copytree(DEMO_REPOSITORY / "simple", baseline / "simple", dirs_exist_ok=True)
    result: dict = {
        "weights_bytes": weights,
        "model_file_bytes": (repository / MEMORY_MODEL / "1" / "model.onnx").stat().st_size,
    }
    with launcher.slotserve("slotserve-baseline", baseline, ["--parallel-jobs", "1"], default_args=False) as server:
        warm_up_concurrently(
            server.address,
            "simple",
            [("INPUT0", "INT32", np.ones((1, 16), np.int32)), ("INPUT1", "INT32", np.ones((1, 16), np.int32))],
            max(MEMORY_SLOTS),
            args.memory_requests,
        )
        time.sleep(0.5)
        result["baseline_rss_kib"] = server.rss_kib()
    tensors = [
        ("INPUT0", "FP32", np.random.default_rng(1).standard_normal((MEMORY_ROWS, MEMORY_WIDTH), dtype=np.float32))
    ]
    in_flight = max(MEMORY_SLOTS)
    for slots in MEMORY_SLOTS:
        with launcher.slotserve(
            f"slotserve-memory{slots}", repository, ["--parallel-jobs", str(slots)], default_args=False
        ) as server:
            loaded = server.rss_kib()
            failures = warm_up_concurrently(server.address, MEMORY_MODEL, tensors, in_flight, args.memory_requests)
            time.sleep(0.5)
            reported = None
            try:
                with channel(server.address) as ch:
                    status = mpb_grpc.ModelManagementStub(ch).GetModel(
                        mpb.GetModelRequest(model_id=MEMORY_MODEL), timeout=30
                    )
                    reported = status.memory_bytes if status.HasField("memory_bytes") else None
                    result[f"slots_reported_{slots}"] = status.slots
            except grpc.RpcError as error:
                log(f"GetModel failed: {error.code().name}")
            result[f"slots{slots}"] = {
                "rss_after_load_kib": loaded,
                "rss_after_warmup_kib": server.rss_kib(),
                "hwm_kib": server.hwm_kib(),
                "warmup_failures": failures,
                "reported_memory_bytes": reported,
                "startup_s": server.startup_s,
            }
            log(f"memory {slots} slot(s): {result[f'slots{slots}']}")
    raw["memory"] = result
    one, many = result[f"slots{MEMORY_SLOTS[0]}"], result[f"slots{MEMORY_SLOTS[-1]}"]
    extra = MEMORY_SLOTS[-1] - MEMORY_SLOTS[0]
    per_slot = (many["rss_after_warmup_kib"] - one["rss_after_warmup_kib"]) * 1024 / extra
    share = per_slot / weights
    mb = 1024 * 1024
    table.add(
        "memory",
        "RSS MiB: baseline (only `simple`) / 200 MB model 1 slot / 8 slots",
        f"{result['baseline_rss_kib'] / 1024:.0f} / {one['rss_after_warmup_kib'] / 1024:.0f} / "
        f"{many['rss_after_warmup_kib'] / 1024:.0f} (weights {weights / mb:.0f} MiB)",
    )
    model_x = (one["rss_after_warmup_kib"] - result["baseline_rss_kib"]) * 1024 / weights
    loaded_x = (one["rss_after_load_kib"] - result["baseline_rss_kib"]) * 1024 / weights
    table.add(
        "memory",
        "RSS of the model at 1 slot (minus baseline), x weights",
        f"{model_x:.2f}x (right after load, before any request: {loaded_x:.2f}x)",
        x_weights=model_x,
    )
    table.add(
        "memory",
        "RSS per extra slot (1 -> 8 slots)",
        f"{per_slot / mb:.1f} MiB = {100 * share:.1f} % of weights"
        + (" [warm-up failures]" if one["warmup_failures"] or many["warmup_failures"] else ""),
        "<= 10 % of weights",
        share <= 0.10,
        per_slot_bytes=per_slot,
        share=share,
    )
