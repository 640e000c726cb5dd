"""How long a server waits for a python model's `initialize`, asked of real Triton 2.51 (issue 33, item 6).

Triton's python backend has one timeout setting for its stubs, `--backend-config=python,stub-timeout-seconds=N`
(30 by default; its README: "the timeout used for connecting Triton main process to the Python backend stubs").
It does not bound `initialize`: the parent waits for the stub's answer as long as the stub's health thread says
it is alive (python_backend r24.10, StubLauncher::ReceiveMessageFromStub). Recorded on 2026-12-05: a model whose
initialize never returns stayed LOADING for 49 s with the default and for 19 s with stub-timeout-seconds=2; a
RepositoryModelUnload of it waited until its client's deadline and the model stayed LOADING; once initialize
returned, Triton loaded the model and then unloaded it. Another model loaded beside it at once.

slotserve bounds initialize (initialize_timeout_seconds, 600 s by default, 0 for Triton's no limit: see
docs/python-models.md), and an unload stops the load (its worker is killed): docs/lifecycle.md. The test below
keeps both answers: Triton's, and slotserve's deliberate difference.
"""

from __future__ import annotations

import time

import grpc
import pytest

from generated import grpc_service_pb2 as pb
from tests.lifecycle_models import Gates, write_gated_model

pytestmark = pytest.mark.interop

STUB_TIMEOUT = 1  # seconds: Triton's stub-timeout-seconds, set low to show it does not bound initialize
WATCHED = 6.0  # seconds the hung load is watched: several stub timeouts
CALL = 10.0


def _index(stub) -> dict[str, str]:
    return {m.name: m.state for m in stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=CALL).models}


def _load_gives_up(stub, name: str) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as failed:
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=name), timeout=3.0)
    return failed.value.code()


def test_a_hung_initialize_is_not_bounded_by_triton_and_is_by_slotserve(triton, slotserve_endpoint, tmp_path):
    gates = Gates(tmp_path / "gates")
    write_gated_model(tmp_path / "triton", "hung", gates.folder)
    write_gated_model(
        tmp_path / "slotserve",
        "hung",
        gates.folder,
        extra='parameters { key: "initialize_timeout_seconds" value: { string_value: "2" } }\n',
    )
    gates.hold("initialize")
    try:
        reference = triton(
            tmp_path / "triton",
            "--model-control-mode=explicit",
            f"--backend-config=python,stub-timeout-seconds={STUB_TIMEOUT}",
        )
        assert _load_gives_up(reference.stub, "hung") == grpc.StatusCode.DEADLINE_EXCEEDED
        gates.wait_arrivals("initialize", 1)
        watched_until = time.monotonic() + WATCHED
        while time.monotonic() < watched_until:  # Triton keeps waiting, far past its stub timeout
            assert _index(reference.stub) == {"hung": "LOADING"}
            time.sleep(0.5)  # ordering-free: samples an observable state over a stretch of time
        with pytest.raises(grpc.RpcError) as unload:  # Triton's unload waits for the load it cannot stop
            reference.stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="hung"), timeout=2.0)
        assert unload.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert _index(reference.stub) == {"hung": "LOADING"}

        ours = slotserve_endpoint(tmp_path / "slotserve", model_control_mode="explicit")
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:  # initialize_timeout_seconds 2: the load fails at its bound
            ours.stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="hung"), timeout=CALL * 3)
        assert time.monotonic() - started < CALL * 3
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # a load's failure, as any (errors.md)
        assert "initialize did not finish within 2 s" in refused.value.details()
        assert _index(ours.stub) == {"hung": "UNAVAILABLE"}
    finally:
        gates.release_all()
