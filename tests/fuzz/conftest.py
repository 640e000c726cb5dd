"""The server every fuzz test of this package shares (started once), and a raw stub to it."""

from __future__ import annotations

import os

import numpy as np
import pytest

from engine.testing.fixture import FixtureBackend, FixtureControls
from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from service.testing import serve
from tests.integration._shm import ShmObject
from tests.integration._support import demo_subset, write_fixture_model

from .lab import DEMO_MODELS, MAX_BATCH, REGION_OBJECTS, REGIONS, SHM_PREFIX, Lab


@pytest.fixture(scope="package")
def lab(tmp_path_factory):
    repository = demo_subset(tmp_path_factory.mktemp("fuzz") / "repository", *DEMO_MODELS)
    write_fixture_model(
        repository,
        "gated",
        inputs=[("INPUT0", "FP32", [-1])],
        outputs=[("OUTPUT0", "FP32", [-1])],
        max_batch_size=MAX_BATCH,
    )
    controls = FixtureControls()
    # One slot and a queue of one per model: concurrent examples meet waits and queue-full refusals. System shared
    # memory is on, with the regions of lab.REGIONS registered.
    with serve(
        repository,
        backends={"fixture": FixtureBackend(controls)},
        parallel_jobs=1,
        max_queue=1,
        shared_memory="system",
        shared_memory_prefix=SHM_PREFIX,
    ) as server:
        stub = pb_grpc.GRPCInferenceServiceStub(server.client.channel)
        try:
            for name, size in REGIONS.items():
                REGION_OBJECTS[name] = ShmObject(size, f"{SHM_PREFIX}{name}_{os.getpid()}")
                REGION_OBJECTS[name].write(0, np.random.default_rng(size).bytes(size))
                stub.SystemSharedMemoryRegister(
                    pb.SystemSharedMemoryRegisterRequest(name=name, key=REGION_OBJECTS[name].key, byte_size=size),
                    timeout=30,
                )
            yield Lab(server, controls)
        finally:
            controls.release_all()
            for item in REGION_OBJECTS.values():
                item.close()
            REGION_OBJECTS.clear()


@pytest.fixture(scope="package")
def running(lab):
    return lab.running


@pytest.fixture(scope="package")
def stub(running) -> pb_grpc.GRPCInferenceServiceStub:
    return pb_grpc.GRPCInferenceServiceStub(running.client.channel)
