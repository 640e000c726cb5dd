"""The lab every fuzz test shares: the models under test, how long and how many, and the statuses allowed."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import HealthCheck, settings

from engine.testing.fixture import FixtureControls

ALLOWED = frozenset({"OK", "INVALID_ARGUMENT", "NOT_FOUND", "UNAVAILABLE"})
CALL_TIMEOUT = 20.0  # seconds: the gRPC deadline of a call; a call still running then counts as a hang
NO_DEADLINE = 400 * 24 * 3600.0  # a deadline beyond a year: the server treats the call as having none
SCALE = float(os.environ.get("SLOTSERVE_FUZZ_SCALE", "1"))
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
# gRPC's own status when a request deserializer raises (before any handler of slotserve runs).
GRPC_DESERIALIZE_FAILURE = "Exception deserializing request!"
# Messages slotserve gives for INTERNAL errors (service/transport/status_codes.py); never acceptable on a stream either.
INTERNAL_MESSAGES = ("internal error (reference", "the model failed to execute this request")


def examples(count: int) -> int:
    return max(1, int(count * SCALE))


FUZZ = settings(
    deadline=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.filter_too_much,
    ],
)


@dataclass(frozen=True)
class Model:
    inputs: tuple[tuple[str, str], ...]  # (name, datatype)
    outputs: tuple[tuple[str, str], ...]
    width: int | None  # the fixed dimension after the batch dimension; None: variable (-1)


MODELS = {
    "simple": Model((("INPUT0", "INT32"), ("INPUT1", "INT32")), (("OUTPUT0", "INT32"), ("OUTPUT1", "INT32")), 16),
    "simple_identity": Model((("INPUT0", "BYTES"),), (("OUTPUT0", "BYTES"),), None),
    "identity_fp32": Model((("INPUT0", "FP32"),), (("OUTPUT0", "FP32"),), None),
    # A fixture model (output = input) whose execute gate the concurrent test holds to fill its queue.
    "gated": Model((("INPUT0", "FP32"),), (("OUTPUT0", "FP32"),), None),
}
DEMO_MODELS = ("simple", "simple_identity", "identity_fp32")
MAX_BATCH = 8
# Widths that make a request larger than 64 KiB, so service/transport/wire.py's own parser (not protobuf's) reads it.
LARGE_WIDTH = {"simple_identity": 6_000, "identity_fp32": 20_000, "gated": 20_000}


# System shared memory: the server uses only keys under SHM_PREFIX. REGIONS are registered at startup (name ->
# size); every test may name fuzz_in for inputs (random bytes, never written) and fuzz_out for outputs; only
# test_shared_memory_fuzz writes seq_in and names seq_out. REGION_OBJECTS (filled by conftest.py) holds each
# region's object, so an answer can be checked against what the region holds.
SHM_PREFIX = "/slotserve_fuzz_"
REGIONS = {"fuzz_in": 1 << 16, "fuzz_out": 1 << 16, "seq_in": 1 << 20, "seq_out": 1 << 20}
REGION_OBJECTS: dict = {}  # region name -> tests.integration._shm.ShmObject


@dataclass
class Lab:
    running: object  # service.testing.RunningServer
    controls: FixtureControls
