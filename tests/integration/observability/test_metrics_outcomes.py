"""`slotserve_model_requests_total{outcome=...}` over HTTP for the ways a request ends without success: a queued
request its client cancels (`cancelled`), requests cut short by the server's shutdown (`shutting_down`), and a
run that fails inside the engine (`failed`); and the admission-wait histogram, which counts successful requests
only.

As in test_metrics.py: a real server (fixture-backend model driven by the test's gates, one slot) with metrics on
port 0, scraped with urllib before and after; every counter that moved must be one the test expected to move, by
exactly the expected amount. Order comes from the fixture's gates and the server's own gauges, never from sleeps.
"""

from __future__ import annotations

import threading

import grpc
import numpy as np
import pytest

from client import ClientError
from engine.testing.fixture import FixtureBackend
from generated import grpc_service_pb2 as pb

from .._support import CALL_TIMEOUT, stub, write_fixture_model
from .test_metrics import WAIT, counter_moves, key, poll, scrape, successes, value

TENSOR = [("INPUT0", "FP32", [-1])]
OUT = [("OUTPUT0", "FP32", [-1])]
VALUES = np.arange(4, dtype=np.float32)


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "repository"
    write_fixture_model(root, "m", inputs=TENSOR, outputs=OUT)
    return root


def request(model: str = "m") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name="INPUT0", datatype="FP32", shape=VALUES.shape)
    message.raw_input_contents.append(VALUES.astype("<f4").tobytes())
    return message


def call_error(future) -> ClientError:
    """The ClientError of a ModelInfer future that must fail."""
    error = future.exception(timeout=WAIT)
    assert isinstance(error, grpc.RpcError), f"expected a failure, got {error!r}"
    return ClientError.from_rpc_error(error)


def queued_on(model: str, count: int):
    return lambda samples: value(samples, "slotserve_model_queued_requests", model=model) == count


def outcome(model: str, name: str, count: int):
    return lambda samples: value(samples, "slotserve_model_requests_total", model=model, outcome=name) == count


def test_a_queued_request_the_client_cancels_counts_as_cancelled(repository, controls, slotserve):
    running = slotserve(repository, backends={"fixture": FixtureBackend(controls)}, metrics_port=0)
    running.client.infer("m", {"INPUT0": VALUES})  # loaded and warm
    gate = controls.gate("m", "execute").hold()
    holder = stub(running).ModelInfer.future(request(), timeout=CALL_TIMEOUT)
    gate.wait_blocked(1)  # the one slot is taken
    queued = stub(running).ModelInfer.future(request(), timeout=CALL_TIMEOUT)
    before = poll(running, queued_on("m", 1), "one request queued on m")
    assert value(before, "slotserve_model_active_slots", model="m") == 1

    assert queued.cancel()
    # ordering-free: re-checks a state predicate (the server's count of cancelled requests).
    cancelled = poll(running, outcome("m", "cancelled", 1), "the queued request counted as cancelled")
    assert value(cancelled, "slotserve_model_queued_requests", model="m") == 0
    assert counter_moves(before, cancelled) == {
        key("slotserve_model_requests_total", model="m", outcome="cancelled"): 1
    }
    assert controls.count("m", "execute") == 2  # the warm-up and the holder: the cancelled request never ran

    gate.release()
    assert holder.result(timeout=WAIT).model_name == "m"
    done = scrape(running)
    # The holder's success moves the success count and both histograms; the cancelled request moved neither
    # histogram (they count successful requests only).
    assert counter_moves(cancelled, done) == successes("m", 1)
    assert value(done, "slotserve_model_admission_wait_seconds_count", model="m") == 2


def test_a_run_that_fails_in_the_engine_counts_as_failed(repository, controls, slotserve):
    running = slotserve(repository, backends={"fixture": FixtureBackend(controls)}, metrics_port=0)
    running.client.infer("m", {"INPUT0": VALUES})
    before = scrape(running)
    controls.gate("m", "execute").fail_next()
    with pytest.raises(ClientError) as failed:
        running.client.infer("m", {"INPUT0": VALUES}, timeout=WAIT)
    assert failed.value.code == "INTERNAL"
    after = scrape(running)
    assert counter_moves(before, after) == {key("slotserve_model_requests_total", model="m", outcome="failed"): 1}

    # The next request succeeds and moves the admission-wait histogram by one.
    running.client.infer("m", {"INPUT0": VALUES})
    assert counter_moves(after, scrape(running)) == successes("m", 1)


def test_work_cut_short_by_the_shutdown_counts_as_shutting_down(repository, controls, slotserve):
    """A running request and one queued behind it when the grace (0 s) runs out: the queued one is refused and
    the running one cancelled, both UNAVAILABLE shutting_down. The shutdown is then held at the model's
    teardown gate (it closes idle engines after the calls ended and stops /metrics last), so the endpoint can
    still be scraped over HTTP."""
    running = slotserve(repository, backends={"fixture": FixtureBackend(controls)}, metrics_port=0)
    running.client.infer("m", {"INPUT0": VALUES})
    execute = controls.gate("m", "execute").hold()
    teardown = controls.gate("m", "teardown").hold()
    holder = stub(running).ModelInfer.future(request(), timeout=CALL_TIMEOUT)
    execute.wait_blocked(1)
    queued = stub(running).ModelInfer.future(request(), timeout=CALL_TIMEOUT)
    before = poll(running, queued_on("m", 1), "one request queued on m")

    report: list = []
    shutdown = threading.Thread(target=lambda: report.append(running.server.stop(grace=0.0)), name="shutdown")
    shutdown.start()
    try:
        for future in (queued, holder):
            error = call_error(future)
            assert (error.code, error.reason) == ("UNAVAILABLE", "shutting_down"), error
        teardown.wait_blocked(1)  # the shutdown is closing the idle engine: every call has ended
        during = scrape(running)
        assert counter_moves(before, during) == {
            key("slotserve_model_requests_total", model="m", outcome="shutting_down"): 2,
            key("slotserve_model_refusals_total", model="m", reason="shutting_down"): 2,
        }
        assert value(during, "slotserve_model_queued_requests", model="m") == 0
    finally:
        teardown.release()
        execute.release()
        shutdown.join(WAIT)
    assert not shutdown.is_alive()
    assert report[0].closed_models == ["m"] and report[0].abandoned_calls == 0
