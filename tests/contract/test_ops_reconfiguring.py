"""Contract: operations on a model M in the Reconfiguring state (OPS.reconfiguring.*).

M starts Ready with 2 slots over a fixture engine advertising 4 and producing FP32. A registration replaces it
with a changed engine and 3 slots (the engine advertises 3 and produces INT32, so results show which
configuration a request bound), and holds its exclusive lease at one of three points:

    probe        before the commit: the replacement's private primary load (validation) is held at `load`
    teardown     after the commit: the old pool's teardown is held at `teardown`
    replacement  after the commit: the replacement's first context is held at `clone`
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from engine.errors import ModelLoadError
from service.core.lifecycle import ModelState

cell = pytest.mark.cell

PHASES = ("probe", "teardown", "replacement")
OLD = {"slots": 2, "capacity": 4, "dtype": np.float32, "output": "FP32"}
NEW = {"slots": 3, "capacity": 3, "dtype": np.int32, "output": "INT32"}


def expected(value: float, dtype=np.float32) -> np.ndarray:
    return np.full(2, value, np.float32).astype(dtype)


def events_of(lab, model: str) -> list[str]:
    return [event for name, event in list(lab.controls.events) if name == model]


def config_json(capacity: int, output_type: str) -> str:
    return json.dumps(
        {
            "backend": "fixture",
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
            "output": [{"name": "OUTPUT0", "data_type": output_type, "dims": [-1]}],
            "parameters": {"capacity": {"string_value": str(capacity)}},
        }
    )


NEW_CONFIG = config_json(NEW["capacity"], "TYPE_INT32")


class Reconfiguring:
    """A lab whose model `m` is Reconfiguring, frozen at `phase` by `gate`."""

    def __init__(self, lab_factory, phase: str, models: dict | None = None, **registration) -> None:
        self.phase = phase
        self.lab = lab = lab_factory(models or {"m": {"capacity": OLD["capacity"]}, "b": {}}, parallel_jobs=2)
        status = lab.status("m")
        assert status.state is ModelState.READY and status.slots == OLD["slots"]
        self.gate = lab.gate("m", {"probe": "load", "teardown": "teardown", "replacement": "clone"}[phase]).hold()
        self.register = lab.register(
            "m", config_json=NEW_CONFIG, slots=NEW["slots"], name="reconfigure", **registration
        )
        self.slots = NEW["slots"]
        self.gate.wait_blocked(1)
        status = lab.status("m")
        assert status.state is ModelState.RECONFIGURING and status.manager_active
        assert not self.register.done()

    def finish(self) -> None:
        self.gate.release()
        assert self.register.error() is None


@pytest.fixture(params=PHASES)
def reconfiguring(lab_factory, request):
    return Reconfiguring(lab_factory, request.param)


# ---- inference ------------------------------------------------------------------------------------------------


@cell("OPS.reconfiguring.infer")
def test_request_queues_behind_the_manager_and_binds_the_new_configuration(reconfiguring):
    lab = reconfiguring.lab
    executes = lab.controls.count("m", "execute")
    request = lab.infer("m", 2.0, name="request")
    lab.wait_queued("m", requests=1)
    status = lab.status("m")
    assert status.active_slots == 0 and status.queued_managers == 0  # a queued request, no slot
    assert not request.done() and lab.controls.count("m", "execute") == executes

    reconfiguring.finish()
    output = request.result()["OUTPUT0"]
    np.testing.assert_array_equal(output, expected(2.0, NEW["dtype"]))
    assert output.dtype == NEW["dtype"]  # the new configuration, not the old FP32 one
    status = lab.status("m")
    assert status.state is ModelState.READY and status.loaded
    assert status.slots == reconfiguring.slots and status.max_parallel_slots == NEW["capacity"]


@cell("OPS.reconfiguring.infer")
def test_request_queued_behind_a_failed_replacement_retries_the_load(lab_factory):
    rec = Reconfiguring(lab_factory, "replacement")  # after the commit: the old pool is gone
    lab = rec.lab
    clone = rec.gate
    clone.fail_next(ModelLoadError("replacement context failed"))  # the held first context will fail
    load = lab.gate("m", "load").hold()  # to catch the retry
    request = lab.infer("m", 3.0, name="request")
    lab.wait_queued("m", requests=1)
    assert lab.status("m").active_slots == 0 and not request.done()

    clone.release()
    assert isinstance(rec.register.error(), ModelLoadError)
    # The queued request became the one initializer of the new configuration: it retries the load.
    load.wait_blocked(1)
    status = lab.status("m")
    assert status.state is ModelState.LOADING and status.loaded is False and status.active_slots == 1
    assert status.slots == NEW["slots"] and status.max_parallel_slots is None  # new metadata, no pool
    assert "replacement context failed" in status.last_error
    assert lab.controls.live_engines("m") == 0 and lab.controls.live_contexts("m") == 0  # nothing partial
    load.release()
    output = request.result()["OUTPUT0"]
    np.testing.assert_array_equal(output, expected(3.0, NEW["dtype"]))
    status = lab.status("m")
    assert status.state is ModelState.READY and status.max_parallel_slots == NEW["capacity"]
    assert status.slots == NEW["slots"]
    assert load.arrivals == 3  # initial load, the replacement's validated primary, the retry
    assert lab.controls.live_engines("m") == 1 and lab.controls.live_contexts("m") == NEW["slots"]


# ---- register / reconfigure -----------------------------------------------------------------------------------


@cell("OPS.reconfiguring.register")
def test_later_registration_queues_and_runs_exclusively_in_scheduler_order(reconfiguring):
    lab = reconfiguring.lab
    load_arrivals = lab.gate("m", "load").arrivals
    # The later manager goes back to config.pbtxt (FP32, capacity 4) with 4 slots.
    later = lab.register("m", slots=4, name="later-register")
    lab.wait_status("m", lambda s: s.queued_managers == 1, "later registration queued")
    request = lab.infer("m", 5.0, name="request")
    lab.wait_queued("m", requests=1, managers=1)
    assert not later.done() and not request.done()
    assert lab.gate("m", "load").arrivals == load_arrivals  # the later one has not started: exclusive

    reconfiguring.finish()
    result = later.result()
    # final ready configuration is the later registration's: it ran after the first one committed
    assert result.loaded and result.state is ModelState.READY
    assert result.slots == 4 and result.max_parallel_slots == OLD["capacity"]
    output = request.result()["OUTPUT0"]
    np.testing.assert_array_equal(output, expected(5.0, OLD["dtype"]))
    final = lab.status("m")
    assert (final.state, final.slots, final.max_parallel_slots, final.loaded) == (ModelState.READY, 4, 4, True)
    assert lab.controls.live_engines("m") == 1 and lab.controls.live_contexts("m") == 4
    metadata = lab.registry.get("m").known_metadata()
    assert metadata.outputs[0].datatype == OLD["output"]


@cell("OPS.reconfiguring.register")
def test_later_registration_answers_its_own_ready_config_even_when_a_queued_unload_runs_at_once(
    lab_factory, monkeypatch
):
    """The response of a registration describes its own outcome ("200 final ready config"). Here an unload
    queued behind the later registration is allowed to run between the registration's release of its lease and
    the building of its response: an interleaving the scheduler may produce at any time."""
    rec = Reconfiguring(lab_factory, "teardown")
    lab = rec.lab
    entry = lab.registry.get("m")
    original = entry._release_exclusive

    def release_then_let_the_next_one_run(ticket):
        original(ticket)
        if threading.current_thread().name.startswith("later-register"):
            lab.wait_state("m", ModelState.UNLOADED)  # the queued unload retired the registration's pool

    monkeypatch.setattr(entry, "_release_exclusive", release_then_let_the_next_one_run)
    later = lab.register("m", slots=4, name="later-register")
    lab.wait_status("m", lambda s: s.queued_managers == 1, "later registration queued")
    unload = lab.unload("m", name="unload")
    lab.wait_status("m", lambda s: s.queued_managers == 2, "unload queued")

    rec.finish()
    assert unload.result().loaded is False
    result = later.result()
    assert (result.state, result.loaded, result.slots, result.max_parallel_slots) == (
        ModelState.READY,
        True,
        4,
        OLD["capacity"],
    ), f"registration answered {result}"


# ---- unload ---------------------------------------------------------------------------------------------------


@cell("OPS.reconfiguring.unload")
def test_unload_queues_and_retires_the_replacement_after_it_drains(reconfiguring):
    lab = reconfiguring.lab
    execute = lab.gate("m", "execute").hold()
    request = lab.infer("m", 6.0, name="request")
    lab.wait_queued("m", requests=1)
    unload = lab.unload("m", name="unload")
    lab.wait_queued("m", requests=1, managers=1)
    assert lab.status("m").queued_managers == 1 and not unload.done()

    reconfiguring.gate.release()
    execute.wait_blocked(1)  # the replacement is published and the request runs on it
    status = lab.status("m")
    assert status.state is ModelState.READY and status.loaded
    assert status.max_parallel_slots == NEW["capacity"]
    assert status.queued_managers == 1 and not unload.done()  # the unload waits for the replacement's work
    assert reconfiguring.register.error() is None

    execute.release()
    np.testing.assert_array_equal(request.result()["OUTPUT0"], expected(6.0, NEW["dtype"]))
    result = unload.result()
    assert result.loaded is False and result.state is ModelState.UNLOADED and result.max_parallel_slots is None
    assert lab.controls.live_engines("m") == 0 and lab.controls.live_contexts("m") == 0
    events = events_of(lab, "m")
    last_execute = len(events) - 1 - events[::-1].index("execute")
    # the replacement (its contexts, then its engine) was torn down after the request it served
    assert events[last_execute + 1 :] == ["close_context"] * reconfiguring.slots + ["close_engine"]


# ---- bulk unload ----------------------------------------------------------------------------------------------


@cell("OPS.reconfiguring.bulk-unload")
def test_bulk_barrier_queues_behind_the_manager_while_unrelated_ready_model_retires(reconfiguring):
    lab = reconfiguring.lab
    assert lab.status("b").state is ModelState.READY
    bulk = lab.unload_many(["m", "b"], name="bulk")
    lab.wait_status("m", lambda s: s.queued_managers == 1, "bulk barrier on M")
    lab.wait_state("b", ModelState.UNLOADED)  # B retires while M's manager still holds it
    assert lab.status("m").state is ModelState.RECONFIGURING
    assert lab.controls.live_engines("b") == 0 and not bulk.done()

    reconfiguring.finish()
    assert bulk.result() == (["m", "b"], [])
    for model in ("m", "b"):
        status = lab.status(model)
        assert status.state is ModelState.UNLOADED and status.loaded is False
        assert status.max_parallel_slots is None and not status.manager_active
    assert lab.controls.live_engines("m") == 0 and lab.controls.live_contexts("m") == 0
    # the barrier came after the reconfiguration: the replacement was built, then freed
    assert lab.controls.count("m", "clone") == OLD["slots"] + reconfiguring.slots
    closes = [name for name, event in list(lab.controls.events) if event == "close_engine"]
    assert closes.count("m") == 2 and closes.count("b") == 1
    # B was freed before M's barrier was granted (M's last close is the bulk's unload of the replacement)
    assert closes.index("b") < len(closes) - 1 - closes[::-1].index("m")


# ---- status ---------------------------------------------------------------------------------------------------


def old_or_new(status) -> str:
    """Which complete configuration a status shows; fails on a mix."""
    old = (
        status.slots == OLD["slots"]
        and status.admission_timeout == 0.0
        and status.loaded
        and status.max_parallel_slots == OLD["capacity"]
    )
    new = (
        status.slots == NEW["slots"]
        and status.admission_timeout == 7.0
        and status.max_parallel_slots == (NEW["capacity"] if status.loaded else None)
    )
    assert old != new, f"status mixes old and new configuration: {status}"
    return "old" if old else "new"


@cell("OPS.reconfiguring.status")
def test_status_while_reconfiguring_shows_old_or_new_complete_metadata_never_a_mix(lab_factory):
    lab = lab_factory({"m": {"capacity": OLD["capacity"]}}, parallel_jobs=2)
    entry = lab.registry.get("m")
    load = lab.gate("m", "load").hold()
    teardown = lab.gate("m", "teardown").hold()
    clone = lab.gate("m", "clone").hold()

    observations: list = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            observations.append(lab.status("m"))
            time.sleep(0.0002)  # ordering-free: sampling only; no event is ordered by it

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        register = lab.register(
            "m", config_json=NEW_CONFIG, slots=NEW["slots"], admission_timeout=7.0, name="reconfigure"
        )
        # before the commit: the private probe runs; status shows the old configuration, complete
        load.wait_blocked(1)
        for _ in range(20):
            status = lab.status("m")
            assert status.state is ModelState.RECONFIGURING and old_or_new(status) == "old"
        assert entry.known_metadata().outputs[0].datatype == OLD["output"]

        # after the commit: the old pool is being torn down; status shows the new configuration, unloaded
        load.release()
        teardown.wait_blocked(1)
        for _ in range(20):
            status = lab.status("m")
            assert status.state is ModelState.RECONFIGURING and old_or_new(status) == "new"
            assert status.loaded is False and status.memory_bytes is None
        assert entry.known_metadata() is None  # new metadata is known only once the replacement loads

        # the replacement's contexts are being built: still new and unloaded, never a partial pool
        teardown.release()
        clone.wait_blocked(1)
        for _ in range(20):
            status = lab.status("m")
            assert status.state is ModelState.RECONFIGURING and old_or_new(status) == "new"
            assert status.loaded is False

        clone.release()
        result = register.result()
    finally:
        stop.set()
        watcher.join()
    assert result.loaded and old_or_new(result) == "new" and result.state is ModelState.READY
    assert entry.known_metadata().outputs[0].datatype == NEW["output"]
    # every sampled observation (however many the scheduler allowed) was one complete configuration, and the
    # old one never came back after the new one had shown
    kinds = [old_or_new(status) for status in observations]
    assert kinds == sorted(kinds, key=lambda kind: kind == "new")
    # observing reserved nothing
    assert all(status.active_slots == 0 and status.queued_requests == 0 for status in observations)
