"""Calls that send their headers and never their request message cannot silence the probes (issue 19, item 2).

grpcio's sync server reads a unary request on a handler thread, before any of slotserve's code runs; with a
fixed pool of --max-workers threads, 64 such calls made health, ServerLive and ServerReady time out. Here a
stalled call is a grpc stream-unary call on a unary method's path whose request iterator blocks on an Event: on
the wire it is a unary call whose message has not come yet (headers sent, nothing else). Each stalling client
has connections of its own, as separate clients do; the probes come on new connections, as the kubelet's do.

What a stalled call holds on the server is observed directly: the server's threads blocked in grpcio's read of a
unary request (`grpc._server._unary_request`), counted from the stacks of this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from service.process.handler_threads import LINGER_SECONDS
from service.testing import serve
from tests.integration._support import ROOT, from_raw, write_fixture_model
from tests.thread_frames import current_frames

WAIT = 60.0  # generous bound for "eventually" on a loaded machine
PROBE_BOUND = 1.0  # the requirement: each probe answers within 1 s
STALLED = 200
INFER = "/inference.GRPCInferenceService/ModelInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"
CHECK = "/grpc.health.v1.Health/Check"
VALUES = np.arange(4, dtype="<f4")


def _infer_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[4])
    request.raw_input_contents.append(VALUES.tobytes())
    return request


# method path -> (its request, how its response is read)
REQUESTS = {
    INFER: (_infer_request, pb.ModelInferResponse.FromString),
    LIVE: (pb.ServerLiveRequest, pb.ServerLiveResponse.FromString),
    CHECK: (health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse.FromString),
}


def _new_connection(address: str) -> grpc.Channel:
    """A channel with a TCP connection of its own (grpc shares one between equal channels by default)."""
    channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
    grpc.channel_ready_future(channel).result(timeout=WAIT)
    return channel


def waiting_for_a_request() -> int:
    """Threads of this process blocked in grpcio's server-side read of a unary request message."""
    count = 0
    frame: FrameType | None
    for frame in current_frames().values():
        while frame is not None:
            code = frame.f_code
            if code.co_name == "unary_request" and code.co_filename.endswith(os.path.join("grpc", "_server.py")):
                count += 1
                break
            frame = frame.f_back
    return count


def eventually(predicate, timeout: float = WAIT) -> bool:
    """Poll an observable state until it holds or `timeout` passes; whether it held."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)  # ordering-free: re-checks a state until a deadline
    return True


class StalledCalls:
    """`count` calls, `per_connection` on each connection of their own, cycling through `methods`: each sends its
    headers and then nothing until `release()`, when it sends its one request and half-closes."""

    def __init__(
        self, address: str, count: int, *, per_connection: int = 25, methods: tuple[str, ...] = (INFER, LIVE, CHECK)
    ) -> None:
        self._release = threading.Event()
        self.channels = [_new_connection(address) for _ in range((count + per_connection - 1) // per_connection)]
        for channel in self.channels:  # one finished call first: the server's SETTINGS (its stream limit) are in
            pb_grpc.GRPCInferenceServiceStub(channel).ServerLive(pb.ServerLiveRequest(), timeout=WAIT)
        self.methods = [methods[index % len(methods)] for index in range(count)]
        self.futures = []
        for index, method in enumerate(self.methods):
            make_request, read_response = REQUESTS[method]
            call: Any = self.channels[index // per_connection].stream_unary(
                method,
                request_serializer=lambda message: message.SerializeToString(),
                response_deserializer=read_response,
            )
            self.futures.append(call.future(self._request_after_release(make_request), timeout=WAIT * 4))

    def _request_after_release(self, make_request):
        if self._release.wait(WAIT * 4):  # bounded, so a failing test never leaves this thread behind for long
            yield make_request()

    def release(self) -> None:
        self._release.set()

    def close(self) -> None:
        for future in self.futures:
            future.cancel()
        self._release.set()
        for channel in self.channels:
            channel.close()

    def __enter__(self) -> StalledCalls:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def probe_times(address: str) -> dict[str, float | str]:
    """health Check, ServerLive and ServerReady on a new connection, as a probe makes them, each with a deadline of
    PROBE_BOUND: the seconds each took (connecting included for the first), or the status code it failed with."""
    results: dict[str, float | str] = {}
    started = time.monotonic()
    channel = _new_connection(address)
    try:
        inference = pb_grpc.GRPCInferenceServiceStub(channel)
        calls = {
            "health": lambda: (
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=PROBE_BOUND).status
                == health_pb2.HealthCheckResponse.SERVING
            ),
            "live": lambda: inference.ServerLive(pb.ServerLiveRequest(), timeout=PROBE_BOUND).live,
            "ready": lambda: inference.ServerReady(pb.ServerReadyRequest(), timeout=PROBE_BOUND).ready,
        }
        for name, call in calls.items():
            try:
                answer = call()
                results[name] = time.monotonic() - started if answer else "answered not serving"
            except grpc.RpcError as error:
                results[name] = error.code().name
            started = time.monotonic()
    finally:
        channel.close()
    return results


def _answered_in_time(results: dict[str, float | str]) -> bool:
    return all(isinstance(seconds, float) and seconds < PROBE_BOUND for seconds in results.values())


@pytest.fixture
def repository(tmp_path):
    write_fixture_model(tmp_path, "m", inputs=[("INPUT0", "FP32", [4])], outputs=[("OUTPUT0", "FP32", [4])])
    return tmp_path


def _check_inference(client) -> None:
    outputs = client.infer("m", {"INPUT0": VALUES}, timeout=10)
    np.testing.assert_array_equal(outputs["OUTPUT0"], VALUES)


def test_probes_answer_within_a_second_and_inference_runs_with_200_stalled_calls_open(repository):
    with serve(repository) as running, StalledCalls(running.address, STALLED):
        # Every stalled call holds a server thread waiting for its message (on the old fixed pool only 64 could,
        # the rest queued for a thread, and so did the probes). Checked after the probes, so that a server that
        # cannot take them all fails on the probes, the symptom.
        all_reached = eventually(lambda: waiting_for_a_request() >= STALLED, timeout=30.0)
        reached = waiting_for_a_request()
        results = probe_times(running.address)
        assert _answered_in_time(results), f"with {reached} stalled calls on the server: {results}"
        _check_inference(running.client)  # another client's inference runs
        assert all_reached, f"only {reached} of the {STALLED} stalled calls reached the server"
        assert running.server.handler_threads.statistics().busy >= STALLED


def test_python_m_client_health_answers_with_stalled_calls_open(repository):
    with serve(repository) as running, StalledCalls(running.address, 100):
        all_reached = eventually(lambda: waiting_for_a_request() >= 100, timeout=30.0)  # as in the test above
        done = subprocess.run(
            [sys.executable, "-m", "client", "--address", running.address, "--timeout", "5", "health", "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"live": True, "ready": True, "health": "SERVING"}
        assert all_reached


def test_stalled_calls_that_complete_or_are_cancelled_leave_no_handler_thread_behind(repository):
    with serve(repository, max_workers=16) as running:
        threads = running.server.handler_threads
        with StalledCalls(running.address, 60, per_connection=15) as stalled:
            assert eventually(lambda: waiting_for_a_request() == 60)
            assert threads.statistics().threads >= 60  # more than the 16 kept: one for each stalled call
            cancelled, completed = stalled.futures[:30], stalled.futures[30:]
            for future in cancelled:
                future.cancel()
            stalled.release()  # the others send their request now, late
            for future, method in zip(completed, stalled.methods[30:], strict=True):
                response = future.result(timeout=WAIT)
                if method == INFER:
                    np.testing.assert_array_equal(from_raw(response.raw_output_contents[0], "FP32", [4]), VALUES)
                elif method == LIVE:
                    assert response.live
                else:
                    assert response.status == health_pb2.HealthCheckResponse.SERVING
            assert all(future.cancelled() for future in cancelled)
        # The threads beyond --max-workers end LINGER_SECONDS after their call; nothing waits for a message.
        assert eventually(
            lambda: threads.statistics().threads <= 16 and threads.statistics().busy == 0, timeout=LINGER_SECONDS + WAIT
        ), threads.statistics()
        assert waiting_for_a_request() == 0
        assert running.server.calls.active == 0
        assert threads.statistics().retired >= 60 - 16
        _check_inference(running.client)


def test_calls_beyond_max_concurrent_rpcs_are_refused_at_once_and_admitted_again_below_it(repository):
    with serve(repository, max_workers=16, max_concurrent_rpcs=24) as running:
        with StalledCalls(running.address, 24, per_connection=12) as stalled:
            assert eventually(lambda: waiting_for_a_request() == 24)
            channel = _new_connection(running.address)
            try:
                live = pb_grpc.GRPCInferenceServiceStub(channel).ServerLive
                started = time.monotonic()
                with pytest.raises(grpc.RpcError) as refused:
                    live(pb.ServerLiveRequest(), timeout=WAIT)
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
                assert time.monotonic() - started < WAIT / 2  # refused, not left to its deadline
                stalled.futures[0].cancel()
                assert eventually(lambda: running.server.handler_threads.statistics().busy == 23)
                assert live(pb.ServerLiveRequest(), timeout=WAIT).live
            finally:
                channel.close()


def test_shutdown_with_stalled_calls_open_keeps_its_bound_and_ends_them(repository):
    grace, margin = 0.5, 0.5
    with serve(repository) as running, StalledCalls(running.address, 100) as stalled:
        assert eventually(lambda: waiting_for_a_request() >= 100)
        report = running.server.shutdown(drain_seconds=0.0, grace=grace, margin=margin)
        assert report.seconds < grace + 2 * margin + 0.5, report
        assert report.abandoned_calls == 0  # they never reached slotserve's code
        for future in stalled.futures:  # grpcio cancels them once the grace and margins are over
            assert future.exception(timeout=WAIT).code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
        threads = running.server.handler_threads
        assert eventually(lambda: threads.statistics().threads == 0), threads.statistics()
        assert waiting_for_a_request() == 0


@pytest.mark.parametrize("value", ["63", "3000000000"])
def test_max_concurrent_rpcs_outside_its_range_is_refused_before_anything_loads(repository, value):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "service",
            "--model-repository",
            str(repository),
            "--port",
            "0",
            "--max-workers",
            "64",
            "--max-concurrent-rpcs",
            value,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert result.returncode == 2, result.stderr
    assert f"--max-concurrent-rpcs must be --max-workers (64)..100000, got {value}" in result.stderr
    assert "Traceback" not in result.stderr and "loaded" not in result.stderr
