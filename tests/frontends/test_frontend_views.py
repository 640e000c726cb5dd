"""What must look the same through any front end (issue 39): metrics are one view (the admission process's
metrics port counts the calls of every front end), and bearer tokens, TLS and system shared memory work on each
front end as on today's server."""

from __future__ import annotations

import urllib.request

import grpc
import numpy as np
import pytest

from generated import grpc_service_pb2 as pb
from generated import management_pb2, management_pb2_grpc
from tests.integration._certs import make_pki
from tests.integration._shm import ShmObject, in_region, register
from tests.integration.observability.test_triton_metrics import labels, samples
from tests.shutdown.harness import WAIT, assert_ok, outcome

from ._support import stub
from .conftest import request, values

CALLS_PER_FRONT_END = 3
INFERENCE_TOKEN = "inference-token-for-frontends-0123456789"
MANAGEMENT_TOKEN = "management-token-for-frontends-0123456789"


@pytest.fixture
def no_token_environment(monkeypatch):
    for name in ("SLOTSERVE_MANAGEMENT_TOKEN", "SLOTSERVE_INFERENCE_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def test_metrics_are_one_view_of_every_front_ends_calls(served, frontends):
    server = served({"m": {}}, metrics_port=0)
    channels = server.ends.every()
    for index, channel in enumerate(channels):
        for call in range(CALLS_PER_FRONT_END):
            stub(channel).ModelInfer(request("m", float(10 * index + call)), timeout=WAIT)
    calls = CALLS_PER_FRONT_END * frontends
    with urllib.request.urlopen(f"http://127.0.0.1:{server.lab.server.metrics_port}/metrics", timeout=WAIT) as reply:
        found = samples(reply.read().decode())
    assert found[("nv_inference_request_success", labels("m"))] == calls
    assert found[("nv_inference_count", labels("m"))] == calls
    assert len(server.runs("m")) == calls


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.mark.usefixtures("no_token_environment")
def test_tokens_are_checked_by_every_front_end(served, frontends):
    server = served(
        {"m": {}},
        allow_management=True,
        inference_token=INFERENCE_TOKEN,
        management_token=MANAGEMENT_TOKEN,
        metadata=_bearer(INFERENCE_TOKEN),
    )
    channels = server.ends.every()
    assert len(channels) == frontends
    for channel in channels:
        for metadata in ((), _bearer("wrong"), _bearer(MANAGEMENT_TOKEN[:-1])):
            code, error = outcome(stub(channel).ModelInfer.future(request("m", 1.0), timeout=WAIT, metadata=metadata))
            assert (code, error.reason) == ("UNAUTHENTICATED", "unauthenticated"), error
        response = stub(channel).ModelInfer(request("m", 2.0), timeout=WAIT, metadata=_bearer(INFERENCE_TOKEN))
        assert response.model_name == "m"
        management = management_pb2_grpc.ModelManagementStub(channel)
        status_request = management_pb2.GetModelRequest(model_id="m")
        with pytest.raises(grpc.RpcError) as refused:
            management.GetModel(status_request, timeout=WAIT, metadata=_bearer(INFERENCE_TOKEN))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert management.GetModel(status_request, timeout=WAIT, metadata=_bearer(MANAGEMENT_TOKEN)).model_id == "m"
    assert server.runs("m") == [2.0] * frontends  # refused calls never reached admission


def test_tls_is_served_by_every_front_end_and_plaintext_refused(served, frontends, tmp_path):
    pki = make_pki(tmp_path / "pki")
    credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca.cert.read_bytes())
    server = served(
        {"m": {}},
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        tls_ca=pki.ca.cert,
        open_channel=lambda address, options: grpc.secure_channel(address, credentials, options=options),
    )
    channels = server.ends.every()
    assert len(channels) == frontends
    for index, channel in enumerate(channels):
        assert_ok(stub(channel).ModelInfer.future(request("m", float(index)), timeout=WAIT), values(float(index)))
    for _ in range(4 * frontends):  # plaintext is refused wherever its connection lands
        with grpc.insecure_channel(server.lab.address, options=[("grpc.use_local_subchannel_pool", 1)]) as plain:
            code, _ = outcome(stub(plain).ServerLive.future(pb.ServerLiveRequest(), timeout=5))
            assert code == "UNAVAILABLE"
    assert server.runs("m") == [float(index) for index in range(frontends)]


def test_system_shared_memory_registered_through_one_front_end_serves_calls_through_every_other(served, frontends):
    """One registry of regions for the whole server: a region registered through the first front end carries a
    call's input and output through the last one, its status reads the same through each, and once unregistered
    through the last, a call through the first that names it is refused (NOT_FOUND) and runs nothing."""
    server = served({"m": {}}, shared_memory="system")
    channels = server.ends.every()
    region = ShmObject(1024)
    try:
        register(stub(channels[0]), "r", region.key, 1024, timeout=WAIT)
        for index, channel in enumerate(channels):
            data = values(float(index + 1))
            region.write(64 * index, data)
            message = pb.ModelInferRequest(model_name="m")
            in_region(message.inputs.add(name="INPUT0", datatype="FP32", shape=[3]), "r", data.nbytes, 64 * index)
            in_region(message.outputs.add(name="OUTPUT0"), "r", data.nbytes, 512 + 64 * index)
            response = stub(channel).ModelInfer(message, timeout=WAIT)
            assert response.raw_output_contents[0] == b"", response
            np.testing.assert_array_equal(region.array(512 + 64 * index, np.float32, (3,)), data)
        for channel in channels:
            status = stub(channel).SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(), timeout=WAIT)
            assert list(status.regions) == ["r"] and status.regions["r"].byte_size == 1024
        stub(channels[-1]).SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name="r"), timeout=WAIT)
        message = pb.ModelInferRequest(model_name="m")
        in_region(message.inputs.add(name="INPUT0", datatype="FP32", shape=[3]), "r", 12)
        code, error = outcome(stub(channels[0]).ModelInfer.future(message, timeout=WAIT))
        assert (code, error.reason) == ("NOT_FOUND", "region_not_found") and "'r'" in error.message, error
        assert server.runs("m") == [float(index + 1) for index in range(frontends)]
    finally:
        region.close()
