"""Instance-count updates while the model serves (issue 34, item 7), in the style of Triton's
qa/L0_model_update/instance_update_test.py (test_infer_while_updating, test_update_while_inferencing and the
add/remove cases): a RepositoryModelLoad whose only change is `instance_group.count` neither holds inference while
the new instances initialize nor waits for inference in flight; removed instances leave without blocking the rest.

Triton's QA bounds each wait by 5 s (TRITON_BOUND, its `assertLess(..., 5.0)`); here the slow parts are held at
gates (tests/lifecycle_models.py: the new instance's `initialize`, a request's `execute`) until the test has seen
the other side go through, so no timing decides the order."""

from __future__ import annotations

import threading
import time

import numpy as np

from client import ClientError
from tests.lifecycle_models import WAIT, Gates, is_alive, set_instance_count, wait_until, worker_pids, write_gated_model

TRITON_BOUND = 5.0  # qa/L0_model_update: "Infer blocked by update", "Update blocked by infer"
X = {"X": np.arange(4, dtype=np.float32)}


class InThread:
    """`call()` on a thread of its own; `result()` returns what it returned or raises what it raised."""

    def __init__(self, call, name: str) -> None:
        self._outcome: list = []
        self.thread = threading.Thread(target=self._run, args=(call,), name=name, daemon=True)
        self.thread.start()

    def _run(self, call) -> None:
        try:
            self._outcome.append((call(), None))
        except BaseException as error:  # the test inspects it
            self._outcome.append((None, error))

    def running(self) -> bool:
        return self.thread.is_alive()

    def result(self, timeout: float = WAIT):
        self.thread.join(timeout)
        assert self._outcome, f"{self.thread.name} did not end within {timeout} s"
        value, error = self._outcome[0]
        if error is not None:
            raise error
        return value


def serve_gated(slotserve, tmp_path, count: int):
    """The gated model `m` with `count` instances, loaded (explicit mode, as Triton's QA runs it)."""
    root, gates = tmp_path / "models", Gates(tmp_path / "gates" / "m")
    write_gated_model(root, "m", gates.folder, count=count)
    running = slotserve(root, model_control_mode="explicit", load_models=["m"], parallel_jobs=4, allow_management=True)
    assert running.management.get("m").slots == count
    return running, gates, root


def infer(running, timeout: float = WAIT) -> list[float]:
    return running.client.infer("m", X, timeout=timeout)["Y"].tolist()


def test_inference_is_served_while_an_added_instance_initializes(slotserve, tmp_path):
    running, gates, root = serve_gated(slotserve, tmp_path, count=1)
    try:
        gates.hold("initialize")
        set_instance_count(root, "m", gates.folder, 2)
        update = InThread(lambda: running.client.load("m", timeout=WAIT), "update")
        gates.wait_arrivals("initialize", 1)  # the added instance's worker is in its initialize, held
        started = time.monotonic()
        assert infer(running, timeout=TRITON_BOUND) == [0.0, 1.0, 2.0, 3.0]  # served by the first instance
        print(f"\ninference during an instance update: {time.monotonic() - started:.3f} s")
        assert update.running() and running.client.model_ready("m")
        gates.release("initialize")
        update.result()
        status = running.management.get("m")
        assert (status.state, status.slots, status.loaded) == ("READY", 2, True)
        # Both instances serve: two requests held in execute at once, in two workers.
        gates.hold("execute")
        calls = [InThread(lambda: infer(running), f"infer-{n}") for n in range(2)]
        assert len(set(gates.wait_arrivals("execute", 2))) == 2
        gates.release("execute")
        assert [call.result() for call in calls] == [[0.0, 1.0, 2.0, 3.0]] * 2
    finally:
        gates.release_all()


def test_an_added_instance_does_not_wait_for_inference_in_flight(slotserve, tmp_path):
    running, gates, root = serve_gated(slotserve, tmp_path, count=1)
    try:
        gates.hold("execute")
        earlier = InThread(lambda: infer(running), "earlier")
        gates.wait_arrivals("execute", 1)
        set_instance_count(root, "m", gates.folder, 2)
        started = time.monotonic()
        running.client.load("m", timeout=TRITON_BOUND)  # not queued behind the request in flight
        print(f"\ninstance update beside a request in flight: {time.monotonic() - started:.3f} s")
        assert earlier.running()
        assert running.management.get("m").slots == 2
        gates.release("execute")
        assert earlier.result() == [0.0, 1.0, 2.0, 3.0]
        assert infer(running) == [0.0, 1.0, 2.0, 3.0]
    finally:
        gates.release_all()


def test_a_removed_idle_instance_leaves_at_once_and_the_busy_ones_serve_on(slotserve, tmp_path):
    running, gates, root = serve_gated(slotserve, tmp_path, count=3)
    try:
        wait_until(lambda: len(worker_pids()) == 3, "three workers (and no other test's left)")
        gates.hold("execute")
        busy = [InThread(lambda: infer(running), f"busy-{n}") for n in range(2)]
        serving = gates.wait_arrivals("execute", 2)
        set_instance_count(root, "m", gates.folder, 2)
        running.client.load("m", timeout=TRITON_BOUND)  # the third, idle instance is the one removed
        assert running.management.get("m").slots == 2 and running.client.model_ready("m")
        wait_until(lambda: len(worker_pids()) == 2, "the removed instance's worker ended")
        assert all(is_alive(pid) for pid in serving) and all(call.running() for call in busy)
        gates.release("execute")
        assert [call.result() for call in busy] == [[0.0, 1.0, 2.0, 3.0]] * 2
        assert infer(running) == [0.0, 1.0, 2.0, 3.0]
    finally:
        gates.release_all()


def test_a_removed_busy_instance_finishes_its_request_then_closes(slotserve, tmp_path):
    running, gates, root = serve_gated(slotserve, tmp_path, count=2)
    try:
        gates.hold("execute")
        busy = [InThread(lambda: infer(running), f"busy-{n}") for n in range(2)]
        gates.wait_arrivals("execute", 2)
        set_instance_count(root, "m", gates.folder, 1)
        update = InThread(lambda: running.client.load("m", timeout=WAIT), "update")
        # The pool has one slot from now on: the removed one is lent, and the update waits for it to come back.
        wait_until(lambda: running.management.get("m").slots == 1, "the count went down")
        assert running.client.model_ready("m") and update.running()
        gates.release("execute")
        assert [call.result() for call in busy] == [[0.0, 1.0, 2.0, 3.0]] * 2  # both requests finished
        update.result()
        wait_until(lambda: len(worker_pids()) == 1, "the removed instance's worker ended")
        assert infer(running) == [0.0, 1.0, 2.0, 3.0]
    finally:
        gates.release_all()


def test_unloading_a_model_whose_added_instance_hangs_stops_the_update(slotserve, tmp_path):
    running, gates, root = serve_gated(slotserve, tmp_path, count=1)
    try:
        gates.hold("initialize")
        set_instance_count(root, "m", gates.folder, 2)
        update = InThread(lambda: running.client.load("m", timeout=WAIT), "update")
        (added,) = gates.wait_arrivals("initialize", 1)
        running.client.unload("m", timeout=WAIT)  # not held by the hung initialize
        try:
            update.result()
        except ClientError as error:
            assert "unloaded while it loaded" in error.message, error
        else:
            raise AssertionError("the update succeeded though its instance was stopped")
        assert not is_alive(added) and not running.client.model_ready("m")
    finally:
        gates.release_all()


def test_a_count_the_model_cannot_have_is_refused_and_the_model_serves_on(slotserve, tmp_path):
    running, gates, root = serve_gated(slotserve, tmp_path, count=2)
    try:
        set_instance_count(root, "m", gates.folder, 17)
        try:
            running.client.load("m", timeout=WAIT)
        except ClientError as error:
            assert error.code == "INVALID_ARGUMENT" and "1..16" in error.message, error
        else:
            raise AssertionError("a count of 17 was accepted")
        status = running.management.get("m")
        assert (status.state, status.slots) == ("READY", 2)
        assert infer(running) == [0.0, 1.0, 2.0, 3.0]
    finally:
        gates.release_all()
