"""An ensemble request's threads and its end, on a real server (in-process, so `threading` sees the server's
threads): a wide ensemble under concurrent requests runs its steps on each request's own thread plus the
ensemble's shared helpers (service/request_path/ensemble.py STEP_HELPERS, docs/ensembles.md), never a thread per step,
and the server stays live meanwhile; the helpers end with the ensemble; a request that ends (its deadline, the client's
cancel) starts none of the steps it had not started, and cancels the running one; a failing step inside nested
ensembles is named once per ensemble and logged once. The fixture backend's gates hold the steps in place."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from engine.errors import ExecutionError
from generated import grpc_service_pb2 as pb

from .._support import CALL_TIMEOUT, client_error, stub, write_fixture_model
from .test_ensembles import F, start_fixture_server, wait_until, write_ensemble

# docs/ensembles.md states the bound: each request's own thread plus at most 8 helpers per loaded ensemble
# (service/request_path/ensemble.py STEP_HELPERS; test_the_bound_is_the_documented_one checks the constant).
HELPERS = 8
X = np.ones(2, "f")


def fan_repository(root: Path, width: int) -> None:
    """`fan`: `width` parallel steps on the fixture model `w` (one slot), each reading X; `other` beside it."""
    for name in ("w", "other"):
        write_fixture_model(root, name, inputs=[("INPUT0", "FP32", [-1])], outputs=[("OUTPUT0", "FP32", [-1])])
    steps = [("w", {"INPUT0": "X"}, {"OUTPUT0": "Y" if index == 0 else f"t{index}"}) for index in range(width)]
    write_ensemble(root, "fan", [("X", F, [-1])], [("Y", F, [-1])], steps)


def in_flight(running, gate) -> int:
    """Step calls inside `w` now: the one at its held execute gate plus those queued for its slot."""
    return gate.blocked + running.server.registry.get("w").status().queued_requests


def counts(running, model: str) -> tuple[int, int]:
    stats = {s.name: s for s in running.client.statistics()}[model].inference_stats
    return stats.success.count, stats.fail.count


def helper_threads(model: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"ensemble-{model}-helper"]


def test_a_wide_ensemble_under_concurrent_requests_keeps_its_threads_bounded_and_the_server_live(tmp_path, controls):
    width, requests = 200, 4
    fan_repository(tmp_path, width)
    with start_fixture_server(tmp_path, controls, allow_management=True) as running:
        gate = controls.gate("w", "execute").hold()
        baseline = threading.active_count()
        answers: list = []
        calls = [
            threading.Thread(target=lambda: answers.append(running.client.infer("fan", {"X": X}, timeout=120)))
            for _ in range(requests)
        ]
        for call in calls:
            call.start()
        # Every request's own thread and every helper end up inside w (one at its gate, the others queued).
        wait_until(lambda: in_flight(running, gate) >= requests + HELPERS)
        # Then, for a while, nothing more arrives (each request had 199 more steps ready) and the server answers.
        most_threads, most_in_flight, slowest_live = 0, 0, 0.0
        window = time.monotonic() + 1.0
        while time.monotonic() < window:  # ordering-free: watches that a bound holds until a deadline
            most_threads = max(most_threads, threading.active_count())
            most_in_flight = max(most_in_flight, in_flight(running, gate))
            started = time.perf_counter()
            assert running.client.live(timeout=5)
            slowest_live = max(slowest_live, time.perf_counter() - started)
            time.sleep(0.02)  # ordering-free: samples the counts until the window ends
        assert most_in_flight == requests + HELPERS
        # the test's own callers, a handler thread per call, the helpers, and a few of gRPC's own
        assert most_threads - baseline <= 2 * requests + HELPERS + 6, (baseline, most_threads)
        assert slowest_live < 2.0
        np.testing.assert_array_equal(running.client.infer("other", {"INPUT0": X}, timeout=10)["OUTPUT0"], X)
        gate.release()
        for call in calls:
            call.join(timeout=120)
        assert len(answers) == requests and all(np.array_equal(a["Y"], X) for a in answers)
        assert counts(running, "w") == (requests * width, 0)
        assert 0 < len(helper_threads("fan")) <= HELPERS
        running.management.unload("fan")  # the helpers stop with the ensemble
        wait_until(lambda: not helper_threads("fan"))


def test_idle_helpers_end_by_themselves(tmp_path, controls, monkeypatch):
    import service.request_path.ensemble

    monkeypatch.setattr(service.request_path.ensemble, "HELPER_IDLE_SECONDS", 0.2)
    fan_repository(tmp_path, 20)
    with start_fixture_server(tmp_path, controls) as running:
        np.testing.assert_array_equal(running.client.infer("fan", {"X": X})["Y"], X)
        wait_until(lambda: not helper_threads("fan"))
        np.testing.assert_array_equal(running.client.infer("fan", {"X": X})["Y"], X)  # and start again
        assert counts(running, "w") == (40, 0)


def test_the_bound_is_the_documented_one():
    import service.request_path.ensemble

    assert service.request_path.ensemble.STEP_HELPERS == HELPERS
    page = (Path(__file__).resolve().parents[3] / "docs" / "ensembles.md").read_text()
    assert f"at most {HELPERS} helper threads" in page


def test_the_clients_deadline_starts_none_of_the_steps_not_started(tmp_path, controls):
    width = 40
    fan_repository(tmp_path, width)
    with start_fixture_server(tmp_path, controls) as running:
        gate = controls.gate("w", "execute").hold()
        started = time.monotonic()
        late = client_error(running.client.infer, "fan", {"X": X}, timeout=2.0)
        assert late.code == "DEADLINE_EXCEEDED"
        assert time.monotonic() - started < 20  # bounded by the deadline, not by the held step
        wait_until(lambda: counts(running, "fan") == (0, 1))  # the ensemble's request has ended on the server
        successes, failures = counts(running, "w")
        # Only the steps taken before the deadline reached w (its own thread's and at most the helpers'); each
        # was cancelled (the held one at its gate, the queued ones in w's queue), and none started after.
        assert successes == 0 and 1 <= failures <= 1 + HELPERS < width
        assert gate.arrivals == 1
        assert running.server.registry.get("w").status().queued_requests == 0
        gate.release()
        np.testing.assert_array_equal(running.client.infer("fan", {"X": X})["Y"], X)
        assert counts(running, "w") == (width, failures)


def infer_request(model: str, name: str, array: np.ndarray) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name=name, datatype="FP32", shape=array.shape)
    request.raw_input_contents.append(array.astype("<f4").tobytes())
    return request


def test_a_client_cancel_ends_the_running_steps_and_starts_no_other(tmp_path, controls):
    width = 40
    fan_repository(tmp_path, width)
    with start_fixture_server(tmp_path, controls) as running:
        gate = controls.gate("w", "execute").hold()
        call = stub(running).ModelInfer.future(infer_request("fan", "X", X), timeout=CALL_TIMEOUT)
        wait_until(lambda: in_flight(running, gate) == 1 + HELPERS)  # its thread and every helper inside w
        call.cancel()
        with pytest.raises(grpc.FutureCancelledError):
            call.result()
        wait_until(lambda: counts(running, "fan") == (0, 1))
        # exactly the steps that had started: cancelled; the other 31 never started
        assert counts(running, "w") == (0, 1 + HELPERS)
        assert gate.arrivals == 1 and running.server.registry.get("w").status().queued_requests == 0
        gate.release()
        np.testing.assert_array_equal(running.client.infer("fan", {"X": X})["Y"], X)


def test_the_deadline_in_a_chain_ends_it_at_the_held_step(tmp_path, controls):
    for name in ("a", "b", "c"):
        write_fixture_model(tmp_path, name, inputs=[("INPUT0", "FP32", [-1])], outputs=[("OUTPUT0", "FP32", [-1])])
    chain = [
        ("a", {"INPUT0": "X"}, {"OUTPUT0": "t1"}),
        ("b", {"INPUT0": "t1"}, {"OUTPUT0": "t2"}),
        ("c", {"INPUT0": "t2"}, {"OUTPUT0": "Y"}),
    ]
    write_ensemble(tmp_path, "chain", [("X", F, [-1])], [("Y", F, [-1])], chain)
    with start_fixture_server(tmp_path, controls) as running:
        gate = controls.gate("a", "execute").hold()
        assert client_error(running.client.infer, "chain", {"X": X}, timeout=1.0).code == "DEADLINE_EXCEEDED"
        wait_until(lambda: counts(running, "chain") == (0, 1))
        assert counts(running, "a") == (0, 1) and counts(running, "b") == counts(running, "c") == (0, 0)
        gate.release()
        np.testing.assert_array_equal(running.client.infer("chain", {"X": X})["Y"], X)


def test_a_failure_inside_nested_ensembles_is_named_once_per_ensemble_and_logged_once(tmp_path, controls, caplog):
    write_fixture_model(tmp_path, "w", inputs=[("INPUT0", "FP32", [-1])], outputs=[("OUTPUT0", "FP32", [-1])])
    write_ensemble(
        tmp_path,
        "inner",
        [("INPUT0", F, [-1])],
        [("OUTPUT0", F, [-1])],
        [("w", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"})],
    )
    write_ensemble(
        tmp_path, "outer", [("X", F, [-1])], [("Y", F, [-1])], [("inner", {"INPUT0": "X"}, {"OUTPUT0": "Y"})]
    )
    with start_fixture_server(tmp_path, controls) as running:
        controls.gate("w", "execute").fail_next(ExecutionError("w broke"))
        with caplog.at_level(logging.ERROR, logger="service.request_path.ensemble"):
            failed = client_error(running.client.infer, "outer", {"X": X}, timeout=30)
        assert failed.code == "INTERNAL"
        assert failed.message == (
            "ensemble 'outer': step 0 (model 'inner'): ensemble 'inner': step 0 (model 'w') failed to execute this "
            "request; see the server log"
        )
        logged = [r for r in caplog.records if r.name == "service.request_path.ensemble" and r.levelno >= logging.ERROR]
        assert len(logged) == 1 and logged[0].exc_info is not None and "w broke" in logged[0].getMessage()
        np.testing.assert_array_equal(running.client.infer("outer", {"X": X})["Y"], X)
