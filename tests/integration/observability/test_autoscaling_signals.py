"""The signals an autoscaler reads move with the load, over HTTP (issue 37, "Autoscaling signals").

A real server with a fixture-backend model of two slots and `--max-queue 3`, metrics on port 0. The test holds
both slots at the fixture's execute gate, queues three requests behind them and has a fourth refused for the full
queue, then scrapes /metrics: busy slots equal the configured slots, three requests are pending, the oldest has
waited more than zero seconds (and longer at a second scrape, the same request still at the head), and the refusal
is counted under its reason. Releasing the gate drains everything and the gauges fall back to zero; the refusal
counter keeps its count. A second test queues an unload (a manager) before a request: it is no pending request.

Order comes from the fixture's gates and the admission controller's own statistics, never from sleeps; the polls
re-check a state until a deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc
import numpy as np
import pytest

from client import ClientError
from engine.testing.fixture import FixtureBackend
from generated import grpc_service_pb2 as pb
from service.core.admission import AdmissionStatistics

from .._support import CALL_TIMEOUT, stub, write_fixture_model
from .test_metrics import WAIT, Samples, scrape, value

TENSOR = [("INPUT0", "FP32", [-1])]
OUT = [("OUTPUT0", "FP32", [-1])]
VALUES = np.arange(4, dtype=np.float32)
SLOTS = 2
QUEUE = 3
# Every reason a request is turned away for before it runs: each has a series from the start.
REFUSAL_REASONS = (
    "server_busy",
    "residency_limit",
    "memory_limit",
    "tensor_memory_limit",
    "shared_memory_limit",
    "shutting_down",
)


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "repository"
    write_fixture_model(root, "m", inputs=TENSOR, outputs=OUT)
    write_fixture_model(root, "other", inputs=TENSOR, outputs=OUT)  # idle all along: its signals stay at zero
    return root


def request(model: str = "m") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name="INPUT0", datatype="FP32", shape=VALUES.shape)
    message.raw_input_contents.append(VALUES.astype("<f4").tobytes())
    return message


def admission_until(running, predicate: Callable[[AdmissionStatistics], bool], what: str) -> AdmissionStatistics:
    """Model m's admission statistics once `predicate` holds."""
    admission = running.server.registry.get("m").admission
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        statistics = admission.statistics()
        if predicate(statistics):
            return statistics
        time.sleep(0.005)  # ordering-free: re-checks a state predicate (the controller's queue) until the deadline
    raise AssertionError(f"model m never showed {what} within {WAIT} s")


def signals(samples: Samples, model: str) -> dict[str, float]:
    """What an autoscaler reads for one model."""
    return {
        "busy": value(samples, "slotserve_model_active_slots", model=model),
        "configured": value(samples, "slotserve_model_slots", model=model),
        "pending": value(samples, "nv_inference_pending_request_count", model=model, version="1"),
        "queued": value(samples, "slotserve_model_queued_requests", model=model),
        "oldest_wait": value(samples, "slotserve_model_oldest_wait_seconds", model=model),
    }


def refusals(samples: Samples, model: str) -> dict[str, float]:
    return {
        reason: value(samples, "slotserve_model_refusals_total", model=model, reason=reason)
        for reason in REFUSAL_REASONS
    }


def timed_scrape(running) -> tuple[float, Samples, float]:
    """(monotonic time before, the scrape, monotonic time after)."""
    before = time.monotonic()
    samples = scrape(running)
    return before, samples, time.monotonic()


def test_signals_rise_with_held_slots_and_a_queue_and_fall_back_when_released(repository, controls, slotserve):
    running = slotserve(
        repository,
        backends={"fixture": FixtureBackend(controls)},
        metrics_port=0,
        parallel_jobs=SLOTS,
        max_queue=QUEUE,
    )
    running.client.infer("m", {"INPUT0": VALUES})  # loaded
    idle = scrape(running)
    for model in ("m", "other"):
        assert signals(idle, model) == {
            "busy": 0,
            "configured": SLOTS,
            "pending": 0,
            "queued": 0,
            "oldest_wait": 0,
        }
        assert refusals(idle, model) == dict.fromkeys(REFUSAL_REASONS, 0)

    gate = controls.gate("m", "execute").hold()
    holders = [stub(running).ModelInfer.future(request(), timeout=CALL_TIMEOUT) for _ in range(SLOTS)]
    gate.wait_blocked(SLOTS)  # every slot is held
    queued = [stub(running).ModelInfer.future(request(), timeout=CALL_TIMEOUT) for _ in range(QUEUE)]
    held = admission_until(running, lambda s: s.queued_requests == QUEUE, f"{QUEUE} requests queued")
    oldest = held.oldest_request_arrival
    assert oldest is not None

    with pytest.raises(ClientError) as refused:  # the queue is full: turned away at once
        running.client.infer("m", {"INPUT0": VALUES}, timeout=WAIT)
    assert refused.value.reason == "server_busy" and "full" in str(refused.value), refused.value

    first_before, first, first_after = timed_scrape(running)
    now = signals(first, "m")
    assert {name: now[name] for name in ("busy", "configured", "pending", "queued")} == {
        "busy": SLOTS,  # busy / configured = 1: saturated
        "configured": SLOTS,
        "pending": QUEUE,
        "queued": QUEUE,
    }
    # The age of the oldest queued request at the moment of the scrape, measured on the server's clock.
    assert first_before - oldest <= now["oldest_wait"] <= first_after - oldest
    assert now["oldest_wait"] > 0
    assert refusals(first, "m") == {**dict.fromkeys(REFUSAL_REASONS, 0), "server_busy": 1}
    # The same refusal is also the request's outcome.
    assert value(first, "slotserve_model_requests_total", model="m", outcome="server_busy") == 1
    assert signals(first, "other") == signals(idle, "other")

    # Nothing moved in the queue, and the same request's wait has grown by the time between the scrapes.
    second_before, second, second_after = timed_scrape(running)
    assert running.server.registry.get("m").admission.statistics().oldest_request_arrival == oldest
    later = signals(second, "m")
    assert later["pending"] == QUEUE
    assert second_before - oldest <= later["oldest_wait"] <= second_after - oldest
    assert later["oldest_wait"] > now["oldest_wait"]

    gate.release()
    for future in holders + queued:
        assert future.result(timeout=WAIT).model_name == "m"
    admission_until(running, lambda s: s.active_slots == 0 and s.queued == 0, "every slot released")
    drained = scrape(running)
    assert signals(drained, "m") == {"busy": 0, "configured": SLOTS, "pending": 0, "queued": 0, "oldest_wait": 0}
    assert refusals(drained, "m") == {**dict.fromkeys(REFUSAL_REASONS, 0), "server_busy": 1}  # a counter


def test_a_queued_unload_is_not_a_pending_request(repository, controls, slotserve):
    """An unload waits in the model's queue for the slots to drain, and requests queue behind it; the unload is no
    request, so neither the pending count nor the oldest wait counts it."""
    running = slotserve(
        repository,
        backends={"fixture": FixtureBackend(controls)},
        metrics_port=0,
        parallel_jobs=SLOTS,
        allow_management=True,
    )
    running.client.infer("m", {"INPUT0": VALUES})
    gate = controls.gate("m", "execute").hold()
    holders = [stub(running).ModelInfer.future(request(), timeout=CALL_TIMEOUT) for _ in range(SLOTS)]
    gate.wait_blocked(SLOTS)
    unload_errors: list[BaseException] = []

    def unload() -> None:
        try:
            running.management.unload("m", timeout=WAIT)
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            unload_errors.append(error)

    unloading = threading.Thread(target=unload, name="unload")
    unloading.start()
    admission_until(running, lambda s: s.queued_managers == 1, "the unload queued")
    sent = time.monotonic()  # the unload arrived before this; the request after it
    waiting = stub(running).ModelInfer.future(request(), timeout=CALL_TIMEOUT)
    admission_until(running, lambda s: s.queued_requests == 1, "a request queued behind the unload")

    _, samples, scraped = timed_scrape(running)
    now = signals(samples, "m")
    assert now["pending"] == 1, "the queued unload was counted as a pending request"
    assert now["queued"] == 1, "the queued unload was counted as a queued request"
    assert 0 < now["oldest_wait"] <= scraped - sent, "the oldest wait is the unload's, not the request's"

    gate.release()
    unloading.join(WAIT)
    assert not unloading.is_alive() and not unload_errors, unload_errors
    for future in [*holders, waiting]:
        try:
            future.result(timeout=WAIT)
        except grpc.RpcError as error:  # the request behind the unload may find the model gone
            assert error.code() in (grpc.StatusCode.UNAVAILABLE,), error
    admission_until(running, lambda s: s.active_slots == 0 and s.queued == 0, "every slot released")
    drained = signals(scrape(running), "m")
    assert (drained["busy"], drained["pending"], drained["queued"], drained["oldest_wait"]) == (0, 0, 0, 0)
