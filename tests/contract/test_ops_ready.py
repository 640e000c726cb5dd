"""Contract: operations on a model M in the Ready state (OPS.ready.*).

M is loaded at lab creation (a complete pool is published). Where the cell speaks of earlier work draining,
an earlier request is held executing at the fixture's `execute` gate.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from service.core.errors import UnsupportedSlotCount
from service.core.lifecycle import ModelState

cell = pytest.mark.cell


def expected(value: float, dtype=np.float32) -> np.ndarray:
    return np.full(2, value, np.float32).astype(dtype)


def events_of(lab, model: str) -> list[str]:
    return [event for name, event in list(lab.controls.events) if name == model]


def config_json(capacity: int, output_type: str = "TYPE_INT32") -> str:
    """A replacement configuration that changes the engine: another advertised capacity and output type."""
    return json.dumps(
        {
            "backend": "fixture",
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
            "output": [{"name": "OUTPUT0", "data_type": output_type, "dims": [-1]}],
            "parameters": {"capacity": {"string_value": str(capacity)}},
        }
    )


def ready_lab(lab_factory, models=None, **options):
    lab = lab_factory(models or {"m": {"capacity": 4}}, **options)
    status = lab.status("m")
    assert status.state is ModelState.READY and status.loaded
    return lab


# ---- inference ------------------------------------------------------------------------------------------------


@cell("OPS.ready.infer")
def test_inference_on_ready_model_uses_spare_slots_then_queues(lab_factory):
    lab = ready_lab(lab_factory, {"m": {"capacity": 2}}, parallel_jobs=2)
    execute = lab.gate("m", "execute").hold()
    first = lab.infer("m", 1.0, name="first")
    execute.wait_blocked(1)
    second = lab.infer("m", 2.0, name="second")
    execute.wait_blocked(2)  # admitted into the spare slot at once
    status = lab.status("m")
    assert status.active_slots == 2 and status.queued_requests == 0
    third = lab.infer("m", 3.0, name="third")
    lab.wait_queued("m", requests=1)  # no spare slot left: it queues
    status = lab.status("m")
    assert status.active_slots == 2 and status.state is ModelState.READY
    assert not third.done()

    execute.release()
    for op, value in ((first, 1.0), (second, 2.0), (third, 3.0)):
        np.testing.assert_array_equal(op.result()["OUTPUT0"], expected(value))
    status = lab.status("m")
    assert status.state is ModelState.READY and status.loaded and status.max_parallel_slots == 2
    assert status.active_slots == 0 and status.queued_requests == 0
    assert lab.controls.count("m", "load") == 1  # no reload: the published pool served all three
    assert lab.controls.count("m", "execute") == 3


# ---- register / reconfigure -----------------------------------------------------------------------------------


@cell("OPS.ready.register")
def test_reconfigure_waits_for_earlier_work_and_probes_privately_before_teardown(lab_factory):
    lab = ready_lab(lab_factory, parallel_jobs=2)
    execute = lab.gate("m", "execute").hold()
    earlier = lab.infer("m", 1.0, name="earlier")
    execute.wait_blocked(1)

    load = lab.gate("m", "load").hold()
    register = lab.register("m", config_json=config_json(3), slots=3, name="register")
    lab.wait_status("m", lambda s: s.queued_managers == 1, "registration queued")
    assert load.arrivals == 1 and not register.done()  # nothing validated before earlier work drained

    execute.release()
    np.testing.assert_array_equal(earlier.result()["OUTPUT0"], expected(1.0))
    load.wait_blocked(1)  # the private capacity probe of the changed engine
    status = lab.status("m")
    # the old pool is untouched and still published while the replacement is validated
    assert status.state is ModelState.RECONFIGURING and status.loaded
    assert status.slots == 2 and status.max_parallel_slots == 4
    assert lab.controls.count("m", "close_engine") == 0 and lab.controls.live_contexts("m") == 2

    load.release()
    result = register.result()
    assert result.loaded and result.state is ModelState.READY
    assert result.slots == 3 and result.max_parallel_slots == 3
    np.testing.assert_array_equal(lab.infer("m", 2.0).result()["OUTPUT0"], expected(2.0, np.int32))
    events = events_of(lab, "m")
    # probe (load) before the old pool's teardown; the probe became the new primary (no third load)
    probe = events.index("load", 1)
    assert probe < events.index("close_engine")
    assert lab.controls.count("m", "load") == 2
    assert lab.controls.live_engines("m") == 1 and lab.controls.live_contexts("m") == 3


@cell("OPS.ready.register")
def test_reconfigure_failing_private_validation_keeps_the_ready_pool(lab_factory):
    lab = ready_lab(lab_factory, parallel_jobs=2)
    before = lab.status("m")
    # the changed engine advertises 2 slots; 3 are asked for: the probe refuses before any teardown
    error = lab.register("m", config_json=config_json(2), slots=3).error()
    assert isinstance(error, UnsupportedSlotCount)
    after = lab.status("m")
    assert after == before  # same state, count, capacity, metadata and residency
    assert lab.controls.count("m", "close_context") == 0
    assert lab.controls.live_engines("m") == 1 and lab.controls.live_contexts("m") == 2  # probe freed
    np.testing.assert_array_equal(lab.infer("m", 4.0).result()["OUTPUT0"], expected(4.0))  # old config


@cell("OPS.ready.register")
def test_resize_with_unchanged_engine_reuses_live_capacity_after_earlier_work(lab_factory):
    lab = ready_lab(lab_factory, parallel_jobs=2)
    execute = lab.gate("m", "execute").hold()
    earlier = lab.infer("m", 1.0, name="earlier")
    execute.wait_blocked(1)
    register = lab.register("m", slots=4, name="register")
    lab.wait_status("m", lambda s: s.queued_managers == 1, "registration queued")
    assert not register.done() and lab.status("m").slots == 2
    execute.release()
    np.testing.assert_array_equal(earlier.result()["OUTPUT0"], expected(1.0))
    result = register.result()
    assert result.loaded and result.state is ModelState.READY
    assert result.slots == 4 and result.max_parallel_slots == 4
    assert lab.controls.count("m", "load") == 1  # no probe, no reload
    assert lab.controls.live_contexts("m") == 4


# ---- unload ---------------------------------------------------------------------------------------------------


@cell("OPS.ready.unload")
def test_unload_waits_for_earlier_work_then_unloads(lab_factory):
    lab = ready_lab(lab_factory, {"m": {"capacity": 2}}, parallel_jobs=2)
    execute = lab.gate("m", "execute").hold()
    earlier = lab.infer("m", 1.0, name="earlier")
    execute.wait_blocked(1)
    unload = lab.unload("m", name="unload")
    lab.wait_status("m", lambda s: s.queued_managers == 1, "unload queued")
    status = lab.status("m")
    assert status.loaded and status.state is ModelState.READY and not unload.done()
    assert lab.controls.count("m", "close_context") == 0

    execute.release()
    np.testing.assert_array_equal(earlier.result()["OUTPUT0"], expected(1.0))
    result = unload.result()
    assert result.loaded is False and result.state is ModelState.UNLOADED
    assert result.max_parallel_slots is None
    assert lab.controls.live_engines("m") == 0 and lab.controls.live_contexts("m") == 0
    events = events_of(lab, "m")
    # the earlier request ran before teardown, and contexts were closed before the engine
    assert events == ["load", "clone", "clone", "execute", "close_context", "close_context", "close_engine"]


# ---- bulk unload ----------------------------------------------------------------------------------------------


@cell("OPS.ready.bulk-unload")
def test_bulk_unload_frees_ready_idle_model_first(lab_factory):
    lab = ready_lab(lab_factory, {"m": {}, "b": {}}, parallel_jobs=2)
    execute = lab.gate("b", "execute").hold()
    busy = lab.infer("b", 1.0, name="busy-b")
    execute.wait_blocked(1)

    bulk = lab.unload_many(["b", "m", "m"], name="bulk")
    lab.wait_state("m", ModelState.UNLOADED)  # idle M is freed first, though listed after B
    lab.wait_status("b", lambda s: s.queued_managers == 1, "barrier on B")
    status = lab.status("b")
    assert status.loaded and status.active_slots == 1 and not bulk.done()
    assert lab.controls.live_engines("m") == 0

    execute.release()
    np.testing.assert_array_equal(busy.result()["OUTPUT0"], expected(1.0))
    unloaded, not_found = bulk.result()
    assert unloaded == ["b", "m"] and not_found == []  # M once
    for model in ("m", "b"):
        status = lab.status(model)
        assert status.state is ModelState.UNLOADED and status.loaded is False
        assert status.max_parallel_slots is None and not status.manager_active and status.queued_requests == 0
    closes = [name for name, event in list(lab.controls.events) if event == "close_engine"]
    assert closes == ["m", "b"]


# ---- status ---------------------------------------------------------------------------------------------------


@cell("OPS.ready.status")
def test_status_of_ready_model_reports_counters_and_reserves_nothing(lab_factory):
    lab = ready_lab(lab_factory, {"m": {"capacity": 2}}, parallel_jobs=2)
    entry = lab.registry.get("m")
    execute = lab.gate("m", "execute").hold()
    first = lab.infer("m", 1.0, name="first")
    execute.wait_blocked(1)
    granted = entry.admission.statistics().granted_total

    for _ in range(100):
        status = lab.status("m")
        assert status.state is ModelState.READY and status.loaded
        assert status.slots == 2 and status.max_parallel_slots == 2
        assert status.active_slots == 1 and status.queued_requests == 0 and not status.manager_active
    assert entry.admission.statistics().granted_total == granted
    assert [t.name for t in entry.known_metadata().outputs] == ["OUTPUT0"]

    # The spare slot is still free after all that observing: the next request takes it without queueing.
    second = lab.infer("m", 2.0, name="second")
    execute.wait_blocked(2)
    status = lab.status("m")
    assert status.active_slots == 2 and status.queued_requests == 0
    third = lab.infer("m", 3.0, name="third")
    lab.wait_queued("m", requests=1)
    assert lab.status("m").active_slots == 2

    execute.release()
    for op, value in ((first, 1.0), (second, 2.0), (third, 3.0)):
        np.testing.assert_array_equal(op.result()["OUTPUT0"], expected(value))
    status = lab.status("m")
    assert status.state is ModelState.READY and status.active_slots == 0 and status.queued_requests == 0
    assert entry.admission.statistics().granted_total == granted + 2
