"""Peak resident memory of slotserve for one large BYTES request: `simple_identity` (ONNX Identity on strings),
elements of 2 bytes (6 on the wire with their 4-byte lengths), as issue 19 measured them.

Each point runs on a fresh server holding only `simple_identity` (its VmHWM, the peak RSS, only grows): one small
request warms it up, then VmHWM is read from /proc/PID/status, one large request is sent, and VmHWM is read again.
The figure is the rise, and the rise per byte on the wire. The last point is past --max-request-tensor-bytes'
default (1 GiB decoded): it must be refused with RESOURCE_EXHAUSTED before it is decoded, so its rise stays near the
received message itself.
"""

from __future__ import annotations

import shutil
import struct
import time

import grpc

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc

from ..common import CACHE, DEMO_REPOSITORY, RPC_TIMEOUT, channel, log
from ..servers import Launcher
from ..table import Table

MODEL = "simple_identity"
ELEMENT = b"ab"
# Element counts: about 11 MiB and 23 MiB on the wire, then one past the default per-request limit. The estimate
# reserves each element BYTES_COPIES (4) times its decoded cost (56 bytes plus its 2 bytes of contents: the decoded
# element and the engine's copies, service/transport/tensors.py), 232 bytes an element: 1 GiB admits about 4.6 million,
# so 5.9 million (the second request, 34 MiB on the wire) is refused before it is decoded.
POINTS = (1_900_000, 4_000_000, 5_900_000)
MIB = 1024 * 1024


def bytes_request(elements: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, elements])
    request.raw_input_contents.append((struct.pack("<I", len(ELEMENT)) + ELEMENT) * elements)
    return request


def measure_point(launcher: Launcher, repository, elements: int) -> dict:
    """One fresh server, one large request: the VmHWM rise and what the request got."""
    request = bytes_request(elements)
    wire = request.ByteSize()
    with launcher.slotserve(f"slotserve-bytes-{elements}", repository, default_args=False) as server:
        with channel(server.address) as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            stub.ModelInfer(bytes_request(16), timeout=RPC_TIMEOUT)  # warm: the first run allocates ORT's arena
            before = server.hwm_kib()
            started = time.perf_counter()
            try:
                response = stub.ModelInfer(request, timeout=RPC_TIMEOUT)
                outcome = (
                    "OK"
                    if len(response.raw_output_contents[0]) == len(request.raw_input_contents[0])
                    else "OK but wrong size"
                )
            except grpc.RpcError as error:
                outcome = f"{error.code().name}: {(error.details() or '')[:160]}"
            seconds = time.perf_counter() - started
            after = server.hwm_kib()
    rise = (after - before) * 1024
    point = {
        "elements": elements,
        "wire_bytes": wire,
        "hwm_before_kib": before,
        "hwm_after_kib": after,
        "rise_bytes": rise,
        "rise_per_wire_byte": rise / wire,
        "seconds": seconds,
        "outcome": outcome,
    }
    log(f"bytes_memory {elements} elements: {point}")
    return point


def bytes_repository():
    """A repository holding a copy of the demo's simple_identity (a copy: model files must lie inside the
    repository the server serves)."""
    repository = CACHE / "bytes_memory_repository"
    shutil.copytree(DEMO_REPOSITORY / MODEL, repository / MODEL, dirs_exist_ok=True)
    return repository


def section_bytes_memory(args, launcher: Launcher, table: Table, raw: dict) -> None:
    repository = bytes_repository()
    points = [measure_point(launcher, repository, elements) for elements in POINTS]
    raw["bytes_memory"] = points
    for point in points:
        table.add(
            "bytes_memory",
            f"BYTES request of {point['elements'] / 1e6:.1f} M 2-byte elements ({point['wire_bytes'] / MIB:.0f} "
            "MiB on the wire): server peak RSS rise",
            f"{point['rise_bytes'] / MIB:.0f} MiB = {point['rise_per_wire_byte']:.0f}x the wire size, "
            f"{point['seconds']:.1f} s, {point['outcome'][:60]}",
            **point,
        )
