"""The server every fuzz test of this package shares (started once), and a raw stub to it."""

from __future__ import annotations

import pytest

from engine.fixture import FixtureBackend, FixtureControls
from generated import grpc_service_pb2_grpc as pb_grpc
from service.testing import serve
from tests.integration._support import demo_subset, write_fixture_model

from .lab import DEMO_MODELS, MAX_BATCH, Lab


@pytest.fixture(scope="package")
def lab(tmp_path_factory):
    repository = demo_subset(tmp_path_factory.mktemp("fuzz") / "repository", *DEMO_MODELS)
    write_fixture_model(repository, "gated", inputs=[("INPUT0", "FP32", [-1])], outputs=[("OUTPUT0", "FP32", [-1])],
                        max_batch_size=MAX_BATCH)
    controls = FixtureControls()
    # One slot and a queue of one per model: concurrent examples meet waits and queue-full refusals.
    with serve(repository, backends={"fixture": FixtureBackend(controls)}, parallel_jobs=1, max_queue=1) as server:
        try:
            yield Lab(server, controls)
        finally:
            controls.release_all()


@pytest.fixture(scope="package")
def running(lab):
    return lab.running


@pytest.fixture(scope="package")
def stub(running) -> pb_grpc.GRPCInferenceServiceStub:
    return pb_grpc.GRPCInferenceServiceStub(running.client.channel)

