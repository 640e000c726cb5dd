"""Through a real server: control calls never starve behind inference, and a streaming response holds its
lease until its last message is written."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client import ClientError
from engine.testing.fixture import FixtureBackend, FixtureControls
from service.testing import serve
from tests.contract.harness import write_fixture_model
from tests.integration._support import in_background, wait_for

INPUT = {"INPUT0": np.ones(4, np.float32)}


def _wait(predicate, what: str, timeout: float = 10.0) -> None:
    wait_for(predicate, what, timeout, poll=0.001)


def _control_calls_complete_within_a_second(running) -> None:
    started = time.monotonic()
    assert [s.model_id for s in running.management.list()] == ["busy", "other"]
    channel = grpc.insecure_channel(running.address)
    try:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0).status
    finally:
        channel.close()
    assert status == health_pb2.HealthCheckResponse.SERVING
    assert running.management.unload("other", timeout=1.0).loaded is False
    assert time.monotonic() - started < 1.0


@pytest.fixture
def fixture_repository(tmp_path):
    write_fixture_model(tmp_path, "busy", {"capacity": 1})
    write_fixture_model(tmp_path, "other")
    return tmp_path


def test_control_calls_complete_while_a_model_is_busy_and_its_queue_full(fixture_repository):
    controls = FixtureControls()
    execute = controls.gate("busy", "execute").hold()
    with serve(
        fixture_repository,
        backends={"fixture": FixtureBackend(controls)},
        parallel_jobs=1,
        max_queue=2,
        allow_management=True,
    ) as running:
        client = running.client
        threads = [in_background(lambda: client.infer("busy", INPUT, timeout=30)) for _ in range(3)]
        execute.wait_blocked(1)
        _wait(lambda: running.management.get("busy").queued_requests == 2, "a full queue")
        with pytest.raises(ClientError) as refused:
            client.infer("busy", INPUT, timeout=5)
        assert refused.value.code == "UNAVAILABLE" and refused.value.reason == "server_busy"
        _control_calls_complete_within_a_second(running)
        execute.release()
        for thread, box in threads:
            thread.join(10)
            assert isinstance(box[0], dict)


def test_control_calls_complete_when_every_inference_handler_thread_is_taken(fixture_repository):
    controls = FixtureControls()
    execute = controls.gate("busy", "execute").hold()
    with serve(
        fixture_repository,
        backends={"fixture": FixtureBackend(controls)},
        parallel_jobs=1,
        max_workers=12,
        control_threads=8,
        allow_management=True,
    ) as running:
        client = running.client
        limit = running.server.calls.inference_limit
        assert limit == 4
        threads = [in_background(lambda: client.infer("busy", INPUT, timeout=30)) for _ in range(limit)]
        execute.wait_blocked(1)
        _wait(lambda: running.server.calls.inference_active == limit, "every inference handler in use")
        with pytest.raises(ClientError) as refused:
            client.infer("other", INPUT, timeout=5)
        assert refused.value.code == "UNAVAILABLE" and "handler threads" in refused.value.message
        _control_calls_complete_within_a_second(running)
        execute.release()
        for thread, box in threads:
            thread.join(10)
            assert isinstance(box[0], dict)


@pytest.mark.cell("ORDER.02")
def test_streaming_response_holds_its_lease_until_its_last_message_and_a_later_manager_waits(tmp_path):
    write_fixture_model(tmp_path, "streamer", {"capacity": 2, "stream_responses": 3})
    controls = FixtureControls()
    stream_gate = controls.gate("streamer", "stream").hold_from(2)  # the first message goes out, then it holds
    with serve(
        tmp_path, backends={"fixture": FixtureBackend(controls)}, parallel_jobs=2, allow_management=True
    ) as running:
        received = []
        first_written = threading.Event()

        def consume():
            for item in running.client.stream_infer("streamer", [INPUT], timeout=30):
                received.append(item)
                first_written.set()
            return len(received)

        stream_thread, stream_box = in_background(consume)
        assert first_written.wait(10)  # the first message reached the client
        stream_gate.wait_blocked(1)  # the second is being produced
        status = running.management.get("streamer")
        assert status.active_slots == 1  # the lease is still held between messages
        unload_thread, unload_box = in_background(lambda: running.management.unload("streamer", timeout=30))
        _wait(lambda: running.management.get("streamer").queued_requests == 1, "the unload queued")
        assert unload_box == []  # it waits for the stream
        stream_gate.release()
        stream_thread.join(10)
        unload_thread.join(10)
        assert stream_box == [3]
        assert all(isinstance(item, dict) for item in received)
        assert unload_box[0].loaded is False


def test_health_is_answered_with_inference_saturated_and_more_management_calls_waiting_than_control_threads(tmp_path):
    """Every inference handler thread holds a running request, and ten management calls that wait without
    limit (unloads of the busy model, each behind its running requests) arrive: at most half the control threads
    take them, the others are refused at once with server_busy, and health, readiness and status are still
    answered at once."""
    write_fixture_model(tmp_path, "busy", {"capacity": 8})
    controls = FixtureControls()
    execute = controls.gate("busy", "execute").hold()
    with serve(
        tmp_path,
        backends={"fixture": FixtureBackend(controls)},
        parallel_jobs=8,
        max_workers=16,
        control_threads=8,
        allow_management=True,
    ) as running:
        calls = running.server.calls
        assert (calls.inference_limit, calls.management_limit) == (8, 4)
        requests = [in_background(lambda: running.client.infer("busy", INPUT, timeout=30)) for _ in range(8)]
        execute.wait_blocked(8)
        unloads = [in_background(lambda: running.management.unload("busy", timeout=30)) for _ in range(10)]
        _wait(
            lambda: calls.management_active == 4 and sum(bool(box) for _, box in unloads) == 6,
            "four unloads waiting and six refused",
        )
        refused = [box[0] for _, box in unloads if box]
        assert all(
            isinstance(error, ClientError)
            and (error.code, error.reason) == ("UNAVAILABLE", "server_busy")
            and "4 management handler threads" in error.message
            for error in refused
        ), refused
        channel = grpc.insecure_channel(running.address)
        try:
            for _ in range(3):
                status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5.0).status
                assert status == health_pb2.HealthCheckResponse.SERVING
        finally:
            channel.close()
        assert running.client.ready() and running.management.get("busy", timeout=5.0).active_slots == 8
        execute.release()
        for thread, _box in requests + unloads:
            thread.join(20)
        assert all(isinstance(box[0], dict) for _, box in requests)
        assert sum(getattr(box[0], "loaded", None) is False for _, box in unloads) == 4
