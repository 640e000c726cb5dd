"""nv_inference_request_failure's reason for each way a request fails, on slotserve alone (issue 35, item 3; the
same cases are asked of real Triton in tests/differential/test_failure_reasons.py, which skips without it).

A python model's failures used to be counted as OTHER (Triton's dashboards then showed backend errors as client
errors); they are BACKEND, as Triton reports a backend's failed execution. An ensemble whose step fails is OTHER
on the ensemble (Triton's ensemble scheduler) and BACKEND on the step; a queue timeout is REJECTED; a request
cancelled in the queue CANCELED; a request refused by validation OTHER.
"""

from __future__ import annotations

import time

import grpc
import pytest

from generated import grpc_service_pb2_grpc as pb_grpc
from service.testing import serve
from tests.differential.test_failure_reasons import failures, pending, request, successes, write_repository

CALL_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    root = tmp_path_factory.mktemp("failure-reasons")
    gates = root / "gates"
    gates.mkdir()
    with serve(write_repository(root, gates), metrics_port=0, allow_management=True) as server:
        channel = grpc.insecure_channel(server.address)
        endpoint = type("Endpoint", (), {})()
        endpoint.name = "slotserve"
        endpoint.stub = pb_grpc.GRPCInferenceServiceStub(channel)
        endpoint.metrics_url = f"http://127.0.0.1:{server.server.metrics_port}/metrics"
        yield endpoint, gates
        channel.close()


def code_of(call) -> str:
    try:
        call()
    except grpc.RpcError as error:
        return error.code().name
    return "OK"


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + CALL_TIMEOUT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # ordering-free: polls an observable state until a deadline


@pytest.mark.parametrize("model", ["raises", "dies", "wrong_dtype", "error_response"])
def test_a_python_models_failure_is_backend(running, model):
    endpoint, _ = running
    assert code_of(lambda: endpoint.stub.ModelInfer(request(model), timeout=CALL_TIMEOUT)) == "INTERNAL"
    assert failures(endpoint, model) == {"BACKEND": 1} and successes(endpoint, model) == 0


def test_an_ensemble_whose_step_fails_is_other_and_its_step_backend(running):
    endpoint, _ = running
    before = failures(endpoint, "raises").get("BACKEND", 0)
    assert code_of(lambda: endpoint.stub.ModelInfer(request("ensemble"), timeout=CALL_TIMEOUT)) == "INTERNAL"
    assert failures(endpoint, "ensemble") == {"OTHER": 1}
    assert failures(endpoint, "raises")["BACKEND"] == before + 1


def test_a_request_refused_by_validation_is_other(running):
    endpoint, _ = running
    bad = request("wrong_dtype", datatype="INT32")
    before = failures(endpoint, "wrong_dtype")
    assert code_of(lambda: endpoint.stub.ModelInfer(bad, timeout=CALL_TIMEOUT)) == "INVALID_ARGUMENT"
    assert failures(endpoint, "wrong_dtype") == {**before, "OTHER": 1}


def test_a_queue_timeout_is_rejected(running):
    endpoint, gates = running
    (gates / "release").unlink(missing_ok=True)
    first = endpoint.stub.ModelInfer.future(request("timed", batched=True), timeout=CALL_TIMEOUT)
    wait_for((gates / "timed").exists, "the first request to run")
    code = code_of(lambda: endpoint.stub.ModelInfer(request("timed", batched=True), timeout=CALL_TIMEOUT))
    (gates / "release").touch()
    first.result(timeout=CALL_TIMEOUT)
    assert code == "UNAVAILABLE" and failures(endpoint, "timed") == {"REJECTED": 1}


def test_a_request_cancelled_in_the_queue_is_canceled(running):
    endpoint, gates = running
    (gates / "release").unlink(missing_ok=True)
    first = endpoint.stub.ModelInfer.future(request("queued", batched=True), timeout=CALL_TIMEOUT)
    wait_for((gates / "queued").exists, "the first request to run")
    waiting = endpoint.stub.ModelInfer.future(request("queued", batched=True), timeout=CALL_TIMEOUT)
    wait_for(lambda: pending(endpoint, "queued") == 1, "the second request to queue")
    waiting.cancel()
    wait_for(lambda: failures(endpoint, "queued"), "the cancel to be counted")
    (gates / "release").touch()
    first.result(timeout=CALL_TIMEOUT)
    assert failures(endpoint, "queued") == {"CANCELED": 1}
