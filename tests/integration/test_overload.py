"""The overload contract (docs/errors.md, "Overload") through a real server and a real gRPC channel: every refusal for
overload keeps its status code and carries `grpc-retry-pushback-ms` in its trailers (the model's predicted wait, a
reason's default, or -1: do not retry); `--refuse-predicted-wait` refuses a request whose deadline comes before its
predicted turn and admits one with time enough; a client whose retry policy honours the pushback retries after it,
or not at all when told not to (counted by the server, not timed).

Each test holds fixture models at their gates (engine/testing/fixture.py) to make the overload, and waits on the
server's own state (blocked callers, queued tickets), never on time.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from engine.testing.fixture import FixtureBackend
from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from service.core import service_rate
from service.testing import RunningServer, serve

from ._support import write_fixture_model

TENSOR = [("INPUT0", "FP32", [-1])]
BATCHING = "mb"  # a dynamically batching model: its requests queue as batch items (service/core/batching.py)
WAIT = 30.0  # bounds every wait on the server's state: a broken server fails the test instead of hanging it
PUSHBACK = "grpc-retry-pushback-ms"


def memory_parameter(size: int) -> str:
    return f'parameters {{ key: "memory_bytes" value {{ string_value: "{size}" }} }}\n'


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "repository"
    write_fixture_model(root, "m", inputs=TENSOR, outputs=TENSOR)
    write_fixture_model(root, BATCHING, inputs=TENSOR, outputs=TENSOR, max_batch_size=1, extra="dynamic_batching { }\n")
    write_fixture_model(root, "a", inputs=TENSOR, outputs=TENSOR, extra=memory_parameter(1000))
    write_fixture_model(root, "b", inputs=TENSOR, outputs=TENSOR, extra=memory_parameter(1000))
    write_fixture_model(root, "huge", inputs=TENSOR, outputs=TENSOR, extra=memory_parameter(5000))
    return root


def request(model: str, count: int = 4, timeout_us: int | None = None) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, count] if model == BATCHING else [count])
    message.raw_input_contents.append(np.arange(count, dtype=np.float32).tobytes())
    if timeout_us is not None:
        message.parameters["timeout"].int64_param = timeout_us
    return message


@dataclass
class Refusal:
    code: grpc.StatusCode
    reason: str  # the ErrorInfo's
    pushback: str | None  # grpc-retry-pushback-ms, as sent
    details: str


def refusal_of(error: Any) -> Refusal:
    """What a failed call's client sees: code, ErrorInfo reason, pushback trailer."""
    trailers = dict(error.trailing_metadata() or ())
    status = rpc_status.from_call(error)
    reasons = []
    for detail in status.details if status is not None else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            reasons.append(info.reason)
    return Refusal(error.code(), "".join(reasons), trailers.get(PUSHBACK), error.details())


def refused(stub: pb_grpc.GRPCInferenceServiceStub, message: pb.ModelInferRequest, **call: Any) -> Refusal:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(message, timeout=call.pop("timeout", WAIT), **call)
    return refusal_of(caught.value)


@contextmanager
def channel(address: str, retry_policy: dict | None = None) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    """A stub on a channel of its own; with `retry_policy`, gRPC retries ModelInfer by it (gRFC A6)."""
    options = []
    if retry_policy is not None:
        config = {
            "methodConfig": [
                {
                    "name": [{"service": "inference.GRPCInferenceService", "method": "ModelInfer"}],
                    "retryPolicy": retry_policy,
                }
            ]
        }
        options = [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(config))]
    with grpc.insecure_channel(address, options=options) as open_channel:
        yield pb_grpc.GRPCInferenceServiceStub(open_channel)


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)  # ordering-free: polls the server's state until a deadline


def queued(running: RunningServer, model: str) -> int:
    return running.server.registry.get(model).admission.statistics().queued_requests


class Held:
    """Requests sent in the background (futures on the test's stub), each left to finish at the end."""

    def __init__(self, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
        self.stub = stub
        self.calls: list[Any] = []

    def send(self, message: pb.ModelInferRequest) -> Any:
        call = self.stub.ModelInfer.future(message, timeout=WAIT)
        self.calls.append(call)
        return call

    def outcomes(self) -> list[str]:
        """Each call's end: "OK" or its code's name."""
        ends = []
        for call in self.calls:
            try:
                call.result(timeout=WAIT)
                ends.append("OK")
            except grpc.RpcError as error:
                ends.append(error.code().name)
        return ends


def busy_model(running, controls, stub, model: str = "m", queue: int = 0) -> Held:
    """`model`'s one slot held at its execute gate by a request, `queue` more queued behind it."""
    gate = controls.gate(model, "execute").hold()
    held = Held(stub)
    held.send(request(model))
    gate.wait_blocked(1, timeout=WAIT)
    for count in range(1, queue + 1):
        held.send(request(model))
        wait_until(functools.partial(_queued_is, running, model, count), f"{count} request(s) queued on {model}")
    return held


def _queued_is(running: RunningServer, model: str, count: int) -> bool:
    return queued(running, model) == count


def scrape(running: RunningServer) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{running.server.metrics_port}/metrics", timeout=WAIT) as response:
        return response.read().decode()


def sample(text: str, name: str, labels: str = "") -> float:
    """The value of `name{labels}` in a scrape (labels as written, in the page's order)."""
    match = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.M)
    assert match, f"{name}{labels} is not on the metrics page"
    return float(match.group(1))


def expected_hint_ms(running, model: str) -> str:
    """The hint the server's own estimator gives now (the model's state unchanged since the refusal: its gate held)."""
    return str(round(service_rate.retry_after(running.server.registry.get(model)) * 1000))


# ---- each refusal carries its hint ------------------------------------------------------------------------------


def test_a_full_queue_is_unavailable_with_the_models_predicted_wait(repository, controls):
    with serve(repository, backends={"fixture": FixtureBackend(controls)}, max_queue=1) as running:
        with channel(running.address) as stub:
            held = busy_model(running, controls, stub, queue=1)
            first = refused(stub, request("m"))
            assert (first.code, first.reason) == (grpc.StatusCode.UNAVAILABLE, "server_busy")
            assert "queue of model 'm' is full" in first.details
            # Nothing completed yet: no rate, the documented default.
            assert first.pushback == str(round(service_rate.UNKNOWN_RETRY_AFTER * 1000))
            controls.gate("m", "execute").release()
            assert held.outcomes() == ["OK", "OK"]

            held = busy_model(running, controls, stub, queue=1)  # two completions measured now
            second = refused(stub, request("m"))
            assert service_rate.rate_of(running.server.registry.get("m")).per_slot() is not None
            assert second.reason == "server_busy" and second.pushback == expected_hint_ms(running, "m")
            controls.gate("m", "execute").release()
            assert held.outcomes() == ["OK", "OK"]
            failures = running.server.registry.get("m").statistics.snapshot().failures
            assert failures == {"server_busy": 2}


def test_a_queue_timeout_is_unavailable_with_the_models_predicted_wait(repository, controls):
    with serve(repository, backends={"fixture": FixtureBackend(controls)}) as running:
        with channel(running.address) as stub:
            held = busy_model(running, controls, stub)
            late = refused(stub, request("m", timeout_us=1000))  # its own admission deadline: 1 ms
            assert (late.code, late.reason) == (grpc.StatusCode.UNAVAILABLE, "server_busy")
            assert "before the admission deadline" in late.details
            assert late.pushback == expected_hint_ms(running, "m") and int(late.pushback) > 0
            controls.gate("m", "execute").release()
            assert held.outcomes() == ["OK"]


def test_the_handler_budget_is_unavailable_with_its_default_hint_and_counted(repository, controls):
    with serve(
        repository, backends={"fixture": FixtureBackend(controls)}, max_workers=9, control_threads=8, metrics_port=0
    ) as running:  # one inference handler thread
        with channel(running.address) as stub:
            held = busy_model(running, controls, stub)
            busy = refused(stub, request("b"))
            assert (busy.code, busy.reason, busy.pushback) == (grpc.StatusCode.UNAVAILABLE, "server_busy", "100")
            assert sample(scrape(running), "slotserve_busy_calls_total") == 1
            controls.gate("m", "execute").release()
            assert held.outcomes() == ["OK"]


def test_residency_and_memory_refusals_carry_their_hints_and_a_model_too_large_is_told_not_to_retry(
    repository, controls
):
    backends = {"fixture": FixtureBackend(controls)}
    with serve(repository, backends=backends, load_at_startup=False, max_resident_models=1) as running:
        with channel(running.address) as stub:
            held = busy_model(running, controls, stub, model="a")
            no_room = refused(stub, request("b"))
            assert (no_room.code, no_room.reason, no_room.pushback) == (
                grpc.StatusCode.UNAVAILABLE,
                "residency_limit",
                "1000",
            )
            controls.gate("a", "execute").release()
            assert held.outcomes() == ["OK"]
    with serve(repository, backends=backends, load_at_startup=False, memory_budget=1500) as running:
        with channel(running.address) as stub:
            held = busy_model(running, controls, stub, model="a")
            over = refused(stub, request("b"))
            assert (over.code, over.reason, over.pushback) == (grpc.StatusCode.UNAVAILABLE, "memory_limit", "1000")
            never = refused(stub, request("huge"))  # 5000 bytes under a 1500-byte budget: no retry can fit it
            assert (never.code, never.reason, never.pushback) == (grpc.StatusCode.UNAVAILABLE, "memory_limit", "-1")
            controls.gate("a", "execute").release()
            assert held.outcomes() == ["OK"]
            assert running.server.registry.get("b").statistics.snapshot().failures == {"memory_limit": 1}


def test_tensor_memory_refusals_carry_their_hints(repository, controls):
    # A request of 1000 FP32 takes 4000 bytes: one fits in flight, two do not; 2000 never fit one request.
    with serve(
        repository,
        backends={"fixture": FixtureBackend(controls)},
        max_request_tensor_bytes=6000,
        max_inflight_tensor_bytes=6000,
    ) as running:
        with channel(running.address) as stub:
            gate = controls.gate("m", "execute").hold()
            held = Held(stub)
            held.send(request("m", count=1000))
            gate.wait_blocked(1, timeout=WAIT)
            wait = refused(stub, request("b", count=1000))
            assert (wait.code, wait.reason, wait.pushback) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "tensor_memory_limit",
                "100",
            )
            never = refused(stub, request("b", count=2000))
            assert (never.reason, never.pushback) == ("tensor_memory_limit", "-1")
            gate.release()
            assert held.outcomes() == ["OK"]
            assert running.server.registry.get("b").statistics.snapshot().failures == {"tensor_memory_limit": 2}


def test_requests_cut_short_by_a_shutdown_carry_its_hint(repository, controls):
    with serve(repository, backends={"fixture": FixtureBackend(controls)}) as running:
        with channel(running.address) as stub:
            held = busy_model(running, controls, stub, queue=1)
            stopping = threading.Thread(target=running.server.stop, kwargs={"grace": 0.2})
            stopping.start()  # the grace passes with the gate held: both calls are cut short
            errors = []
            for call in held.calls:
                with pytest.raises(grpc.RpcError) as caught:
                    call.result(timeout=WAIT)
                errors.append(refusal_of(caught.value))
            stopping.join(WAIT)
            assert [(e.code, e.reason, e.pushback) for e in errors] == [
                (grpc.StatusCode.UNAVAILABLE, "shutting_down", "1000")
            ] * 2


# ---- --refuse-predicted-wait --------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["m", BATCHING])
def test_the_predicted_wait_option_refuses_a_too_short_deadline_and_admits_one_with_enough(repository, controls, model):
    with serve(
        repository, backends={"fixture": FixtureBackend(controls)}, refuse_predicted_wait=True, metrics_port=0
    ) as running:
        entry = running.server.registry.get(model)
        with channel(running.address) as stub:
            assert stub.ModelInfer(request(model, timeout_us=1000), timeout=WAIT)  # a free slot: at once, however short
            # One run that takes at least half a second makes the rate at most 2 requests per second (the wait below
            # sets how long the run lasts, it orders nothing).
            held = busy_model(running, controls, stub, model)
            threading.Event().wait(0.5)
            controls.gate(model, "execute").release()
            assert held.outcomes() == ["OK"]

            held = busy_model(running, controls, stub, model, queue=1)  # predicted: (1 + 1) / (1 x rate) >= 1 s
            too_short = refused(stub, request(model, timeout_us=100_000))
            assert (too_short.code, too_short.reason, too_short.pushback) == (
                grpc.StatusCode.UNAVAILABLE,
                "wait_exceeds_deadline",
                "-1",
            )
            assert f"model '{model}' would take about" in too_short.details
            admitted = held.send(request(model, timeout_us=60_000_000))
            wait_until(lambda: queued(running, model) == 2, "the request with time enough to queue")
            controls.gate(model, "execute").release()
            assert held.outcomes() == ["OK", "OK", "OK"] and admitted.result(timeout=WAIT)
            assert entry.statistics.snapshot().failures == {"wait_exceeds_deadline": 1}
            page = scrape(running)  # counted under its own reason, and as Triton's REJECTED
            assert (
                sample(page, "slotserve_model_requests_total", f'{{model="{model}",outcome="wait_exceeds_deadline"}}')
                == 1
            )
            assert (
                sample(page, "nv_inference_request_failure", f'{{model="{model}",reason="REJECTED",version="1"}}') == 1
            )


def test_without_the_option_a_short_deadline_queues_and_ends_at_its_deadline(repository, controls):
    with serve(repository, backends={"fixture": FixtureBackend(controls)}) as running:
        with channel(running.address) as stub:
            held = busy_model(running, controls, stub)
            threading.Event().wait(0.5)  # (as above: a run of half a second at least)
            controls.gate("m", "execute").release()
            assert held.outcomes() == ["OK"]
            held = busy_model(running, controls, stub, queue=1)
            late = refused(stub, request("m", timeout_us=100_000))
            assert late.reason == "server_busy"  # it waited its 100 ms in the queue
            controls.gate("m", "execute").release()
            assert held.outcomes() == ["OK", "OK"]


# ---- a client whose retry policy honours the pushback -----------------------------------------------------------

# Retries only after a backoff of an hour (gRPC draws the first between 0 and `initialBackoff`; C-core jitters it by
# 20 %): within the call's deadline a retry can only come from the server's pushback.
PATIENT = {
    "maxAttempts": 3,
    "initialBackoff": "3600s",
    "maxBackoff": "3600s",
    "backoffMultiplier": 1,
    "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"],
}
# Retries at once (within 10 ms): without a pushback saying not to, every attempt would be made.
EAGER = {**PATIENT, "initialBackoff": "0.01s", "maxBackoff": "0.01s"}


def test_a_retry_policy_retries_after_the_pushback_and_not_at_all_when_told_not_to(repository, controls):
    with serve(
        repository,
        backends={"fixture": FixtureBackend(controls)},
        max_request_tensor_bytes=6000,
        max_inflight_tensor_bytes=6000,
    ) as running:
        tensor_memory = running.server.dataplane.tensor_memory
        with (
            channel(running.address) as plain,
            channel(running.address, PATIENT) as patient,
            channel(running.address, EAGER) as eager,
        ):
            gate = controls.gate("m", "execute").hold()
            held = Held(plain)
            held.send(request("m", count=1000))
            gate.wait_blocked(1, timeout=WAIT)

            # The in-flight limit: pushback 100 ms, so every attempt the policy allows is made, well within 10 s.
            last = refused(patient, request("b", count=1000), timeout=10.0)
            assert (last.reason, last.pushback) == ("tensor_memory_limit", "100")
            assert tensor_memory.statistics().refused_in_flight == PATIENT["maxAttempts"]

            # A request no retry can fit: pushback -1, so a policy that would retry at once makes no retry at all.
            never = refused(eager, request("b", count=2000), timeout=10.0)
            assert (never.reason, never.pushback) == ("tensor_memory_limit", "-1")
            assert tensor_memory.statistics().refused_request == 1

            gate.release()
            assert held.outcomes() == ["OK"]
