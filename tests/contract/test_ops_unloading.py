"""Contract: operations on a model M in the Unloading state (OPS.unloading.*).

M is Ready (2 slots over a fixture engine advertising 4), then an unload takes its exclusive lease, retires the
pool (logical residency cleared, contexts closed) and is held at the engine's `teardown` gate.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from service.core.errors import UnsupportedSlotCount
from service.core.lifecycle import ModelState

cell = pytest.mark.cell


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


def assert_logically_unloaded(status) -> None:
    assert status.state is ModelState.UNLOADING
    assert status.loaded is False and status.max_parallel_slots is None and status.memory_bytes is None


class Unloading:
    def __init__(self, lab_factory, models: dict | None = None) -> None:
        self.lab = lab = lab_factory(models or {"m": {"capacity": 4}, "b": {}}, parallel_jobs=2)
        assert lab.status("m").state is ModelState.READY
        self.teardown = lab.gate("m", "teardown").hold()
        self.unload = lab.unload("m", name="unload")
        self.teardown.wait_blocked(1)
        status = lab.status("m")
        assert_logically_unloaded(status)
        assert status.manager_active and not self.unload.done()
        assert lab.controls.live_engines("m") == 1  # the physical teardown is still under way


@pytest.fixture
def unloading(lab_factory):
    return Unloading(lab_factory)


# ---- inference ------------------------------------------------------------------------------------------------


@cell("OPS.unloading.infer")
def test_request_queues_then_reloads_after_teardown_and_runs(unloading):
    lab = unloading.lab
    request = lab.infer("m", 2.0, name="request")
    lab.wait_queued("m", requests=1)
    status = lab.status("m")
    assert status.active_slots == 0 and status.queued_managers == 0
    assert not request.done()
    assert lab.controls.count("m", "load") == 1  # no reload while the old engine is being torn down

    unloading.teardown.release()
    np.testing.assert_array_equal(request.result()["OUTPUT0"], expected(2.0))
    assert unloading.unload.error() is None
    status = lab.status("m")
    assert status.state is ModelState.READY and status.loaded and status.max_parallel_slots == 4
    assert lab.controls.count("m", "load") == 2 and lab.controls.live_engines("m") == 1
    events = events_of(lab, "m")
    # teardown finished (engine closed) before the reload, which came before the run
    assert events[events.index("close_engine") :] == ["close_engine", "load", "clone", "clone", "execute"]


# ---- register / reconfigure -----------------------------------------------------------------------------------


@cell("OPS.unloading.register")
def test_registration_queues_then_loads_the_replacement_after_teardown(unloading):
    lab = unloading.lab
    register = lab.register("m", config_json=config_json(3, "TYPE_INT32"), slots=3, name="register")
    lab.wait_status("m", lambda s: s.queued_managers == 1, "registration queued")
    assert not register.done()
    assert lab.gate("m", "load").arrivals == 1  # not validated or loaded while the teardown runs
    status = lab.status("m")
    assert_logically_unloaded(status)
    assert status.slots == 2  # the committed configuration is still the old one

    unloading.teardown.release()
    result = register.result()
    assert result.loaded and result.state is ModelState.READY
    assert result.slots == 3 and result.max_parallel_slots == 3
    assert unloading.unload.error() is None
    np.testing.assert_array_equal(lab.infer("m", 4.0).result()["OUTPUT0"], expected(4.0, np.int32))
    events = events_of(lab, "m")
    assert events.index("close_engine") < events.index("load", 1)  # teardown, then the replacement's load
    assert lab.controls.live_engines("m") == 1 and lab.controls.live_contexts("m") == 3


@cell("OPS.unloading.register")
def test_invalid_registration_after_teardown_leaves_the_model_unloaded(unloading):
    lab = unloading.lab
    register = lab.register("m", slots=5, name="register")  # the engine advertises 4
    lab.wait_status("m", lambda s: s.queued_managers == 1, "registration queued")
    unloading.teardown.release()
    assert isinstance(register.error(), UnsupportedSlotCount)
    status = lab.status("m")
    assert status.state is ModelState.UNLOADED and status.loaded is False and status.max_parallel_slots is None
    assert status.slots == 2 and not status.manager_active
    assert lab.controls.live_engines("m") == 0 and lab.controls.live_contexts("m") == 0  # probe freed
    np.testing.assert_array_equal(lab.infer("m", 1.0).result()["OUTPUT0"], expected(1.0))


# ---- unload ---------------------------------------------------------------------------------------------------


@cell("OPS.unloading.unload")
def test_second_unload_queues_and_is_idempotent(unloading):
    lab = unloading.lab
    second = lab.unload("m", name="second-unload")
    lab.wait_status("m", lambda s: s.queued_managers == 1, "second unload queued")
    assert not second.done()

    unloading.teardown.release()
    result = second.result()
    assert result.loaded is False and result.state is ModelState.UNLOADED and result.max_parallel_slots is None
    assert unloading.unload.error() is None
    status = lab.status("m")
    assert status.state is ModelState.UNLOADED and not status.manager_active and status.queued_requests == 0
    # one teardown only: the second unload found nothing to free
    assert unloading.teardown.arrivals == 1
    assert lab.controls.count("m", "close_engine") == 1 and lab.controls.live_engines("m") == 0


@cell("OPS.unloading.unload")
def test_second_unload_answers_unloaded_even_when_a_later_request_reloads_at_once(unloading, monkeypatch):
    """The response of an operation describes its own outcome. Here a request queued behind the second unload
    is allowed to run (it reloads M) between the unload's release of its lease and the building of its
    response: an interleaving the scheduler may produce at any time. The unload must still answer
    loaded=false."""
    lab = unloading.lab
    entry = lab.registry.get("m")
    original = entry._release_exclusive

    def release_then_let_the_next_one_run(ticket):
        original(ticket)
        if threading.current_thread().name.startswith("second-unload"):
            lab.wait_state("m", ModelState.READY)  # the later request reloaded M

    monkeypatch.setattr(entry, "_release_exclusive", release_then_let_the_next_one_run)
    second = lab.unload("m", name="second-unload")
    lab.wait_status("m", lambda s: s.queued_managers == 1, "second unload queued")
    request = lab.infer("m", 3.0, name="request")
    lab.wait_queued("m", requests=1, managers=1)

    unloading.teardown.release()
    np.testing.assert_array_equal(request.result()["OUTPUT0"], expected(3.0))
    result = second.result()
    assert result.loaded is False and result.state is ModelState.UNLOADED, (
        f"unload answered {result.state.value}/loaded={result.loaded}"
    )


# ---- bulk unload ----------------------------------------------------------------------------------------------


@cell("OPS.unloading.bulk-unload")
def test_bulk_barrier_queues_while_ready_model_is_freed_first(unloading):
    lab = unloading.lab
    assert lab.status("b").state is ModelState.READY
    bulk = lab.unload_many(["m", "b"], name="bulk")
    lab.wait_status("m", lambda s: s.queued_managers == 1, "bulk barrier on M")
    lab.wait_state("b", ModelState.UNLOADED)  # B is freed before the bulk waits for M
    assert lab.controls.live_engines("b") == 0
    assert lab.status("m").state is ModelState.UNLOADING and not bulk.done()

    unloading.teardown.release()
    assert bulk.result() == (["m", "b"], [])
    assert unloading.unload.error() is None
    for model in ("m", "b"):
        status = lab.status(model)
        assert status.state is ModelState.UNLOADED and status.loaded is False and not status.manager_active
    assert unloading.teardown.arrivals == 1 and lab.controls.count("m", "close_engine") == 1
    closes = [name for name, event in list(lab.controls.events) if event == "close_engine"]
    assert closes == ["b", "m"]


# ---- status ---------------------------------------------------------------------------------------------------


@cell("OPS.unloading.status")
def test_status_reports_logical_unloaded_while_physical_teardown_continues(unloading):
    lab = unloading.lab
    entry = lab.registry.get("m")
    granted = entry.admission.statistics().granted_total
    for _ in range(100):
        status = lab.status("m")
        assert_logically_unloaded(status)
        assert status.slots == 2 and status.active_slots == 0 and status.queued_requests == 0
        listed = {s.name: s for s in lab.registry.statuses()}
        assert listed["m"] == status
    # sessions are gone, the engine (weights) is still being destroyed
    assert lab.controls.live_contexts("m") == 0 and lab.controls.live_engines("m") == 1
    assert unloading.teardown.blocked == 1 and not unloading.unload.done()
    assert entry.admission.statistics().granted_total == granted  # observing took no lease

    unloading.teardown.release()
    result = unloading.unload.result()
    assert result.loaded is False and result.state is ModelState.UNLOADED
    status = lab.status("m")
    assert status.state is ModelState.UNLOADED and status.max_parallel_slots is None
    assert lab.controls.live_engines("m") == 0
    events = events_of(lab, "m")
    assert events[-3:] == ["close_context", "close_context", "close_engine"]
