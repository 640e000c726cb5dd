"""Contract: operations on a model M in the Unloaded state (OPS.unloaded.*).

M is Unloaded either because it was registered without loading (`load=False`) or because it was loaded,
used and explicitly unloaded. Each test checks that M is Unloaded, performs exactly one operation on it, and
asserts the cell's work/wait, response and resulting state.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.core.errors import UnsupportedSlotCount
from service.core.lifecycle import ModelState

cell = pytest.mark.cell


def expected(value: float, dtype=np.float32) -> np.ndarray:
    """What the fixture computes for the lab's request (two elements of `value`) into an output of `dtype`."""
    return np.full(2, value, np.float32).astype(dtype)


def events_of(lab, model: str) -> list[str]:
    return [event for name, event in list(lab.controls.events) if name == model]


def assert_unloaded(status, *, slots: int) -> None:
    """Unloaded, with null capacity, nothing held or queued, and the configured slot count."""
    assert status.state is ModelState.UNLOADED
    assert status.loaded is False
    assert status.max_parallel_slots is None
    assert status.memory_bytes is None
    assert status.slots == slots
    assert status.active_slots == 0
    assert status.queued_requests == 0
    assert status.manager_active is False


def unloaded_lab(lab_factory, how: str, models: dict, **options):
    """A lab whose model `m` is Unloaded: never loaded (`fresh`) or loaded, used and unloaded (`retired`)."""
    if how == "fresh":
        return lab_factory(models, load=False, **options)
    lab = lab_factory(models, **options)
    lab.infer("m").result()
    lab.unload("m").result()
    assert lab.controls.live_engines("m") == 0
    return lab


HOW = pytest.mark.parametrize("how", ["fresh", "retired"])


# ---- inference ------------------------------------------------------------------------------------------------


@cell("OPS.unloaded.infer")
@HOW
def test_inference_on_unloaded_model_is_admitted_initializes_then_executes(lab_factory, how):
    lab = unloaded_lab(lab_factory, how, {"m": {"capacity": 3}}, parallel_jobs=2)
    assert_unloaded(lab.status("m"), slots=2)
    loads_before = lab.controls.count("m", "load")
    executes_before = lab.controls.count("m", "execute")

    load = lab.gate("m", "load").hold()
    request = lab.infer("m", 2.5)
    load.wait_blocked(1)
    # Admitted (it owns a slot) and initializing; nothing executes before the pool exists.
    status = lab.status("m")
    assert status.state is ModelState.LOADING
    assert status.active_slots == 1 and status.queued_requests == 0
    assert status.loaded is False and status.max_parallel_slots is None
    assert not request.done()
    assert lab.controls.count("m", "execute") == executes_before

    load.release()
    np.testing.assert_array_equal(request.result()["OUTPUT0"], expected(2.5))
    status = lab.status("m")
    assert status.state is ModelState.READY and status.loaded
    assert status.max_parallel_slots == 3 and status.slots == 2
    assert status.active_slots == 0 and status.queued_requests == 0
    assert lab.controls.count("m", "load") == loads_before + 1
    # initialize (engine, then one context per slot), then execute
    tail = events_of(lab, "m")[-4:]
    assert tail == ["load", "clone", "clone", "execute"]


# ---- register / reconfigure -----------------------------------------------------------------------------------


@cell("OPS.unloaded.register")
@HOW
def test_register_on_unloaded_model_loads_exclusively_and_becomes_ready(lab_factory, how):
    lab = unloaded_lab(lab_factory, how, {"m": {"capacity": 4}}, parallel_jobs=2)
    assert_unloaded(lab.status("m"), slots=2)
    loads_before = lab.controls.count("m", "load")

    load = lab.gate("m", "load").hold()
    register = lab.register("m", slots=3, name="register")
    load.wait_blocked(1)
    status = lab.status("m")
    assert status.state is ModelState.LOADING
    assert status.manager_active and status.active_slots == 0
    assert status.loaded is False and status.max_parallel_slots is None  # nothing partial is published

    # Exclusive: a request that arrives now does not get a slot, although every slot is free.
    request = lab.infer("m", 4.0, name="request")
    lab.wait_queued("m", requests=1)
    status = lab.status("m")
    assert status.active_slots == 0 and status.queued_managers == 0
    assert not register.done() and not request.done()

    load.release()
    result = register.result()
    assert result.loaded is True and result.state is ModelState.READY
    assert result.slots == 3 and result.max_parallel_slots == 4
    np.testing.assert_array_equal(request.result()["OUTPUT0"], expected(4.0))
    assert lab.controls.count("m", "load") == loads_before + 1  # the validation probe became the primary
    assert lab.controls.live_contexts("m") == 3 and lab.controls.live_engines("m") == 1
    # the request ran only after the registration's complete pool (3 contexts) existed
    tail = events_of(lab, "m")
    assert tail[-5:] == ["load", "clone", "clone", "clone", "execute"]


@cell("OPS.unloaded.register")
@HOW
def test_invalid_replacement_of_unloaded_model_keeps_it_unloaded_and_usable(lab_factory, how):
    lab = unloaded_lab(lab_factory, how, {"m": {"capacity": 4}}, parallel_jobs=2)
    before = lab.status("m")
    assert_unloaded(before, slots=2)

    error = lab.register("m", slots=5).error()  # validation: the engine advertises 4
    assert isinstance(error, UnsupportedSlotCount)
    after = lab.status("m")
    assert_unloaded(after, slots=2)
    assert after.admission_timeout == before.admission_timeout and after.version == before.version
    assert lab.controls.live_engines("m") == 0 and lab.controls.live_contexts("m") == 0  # probe freed
    # the manager lease was released and the old registration still works
    np.testing.assert_array_equal(lab.infer("m", 6.0).result()["OUTPUT0"], expected(6.0))
    assert lab.status("m").slots == 2 and lab.status("m").max_parallel_slots == 4


# ---- unload ---------------------------------------------------------------------------------------------------


@cell("OPS.unloaded.unload")
@HOW
def test_unload_of_unloaded_model_is_idempotent(lab_factory, how):
    lab = unloaded_lab(lab_factory, how, {"m": {}}, parallel_jobs=2)
    assert_unloaded(lab.status("m"), slots=2)
    loads = lab.controls.count("m", "load")
    teardowns = lab.gate("m", "teardown").arrivals
    closed = lab.controls.count("m", "close_engine")

    for _ in range(3):
        result = lab.unload("m").result()
        assert result.loaded is False and result.state is ModelState.UNLOADED
        assert result.max_parallel_slots is None
        assert_unloaded(lab.status("m"), slots=2)  # the exclusive lease was released each time
    # nothing was loaded or torn down
    assert lab.controls.count("m", "load") == loads
    assert lab.gate("m", "teardown").arrivals == teardowns
    assert lab.controls.count("m", "close_engine") == closed
    stats = lab.registry.get("m").admission.statistics()
    assert stats.manager_active is False and stats.queued == 0
    # no stranded ownership: the model still serves
    np.testing.assert_array_equal(lab.infer("m", 3.0).result()["OUTPUT0"], expected(3.0))


# ---- bulk unload ----------------------------------------------------------------------------------------------


@cell("OPS.unloaded.bulk-unload")
@HOW
def test_bulk_unload_includes_unloaded_model_once(lab_factory, how):
    lab = unloaded_lab(lab_factory, how, {"m": {}, "b": {}}, parallel_jobs=2)
    assert_unloaded(lab.status("m"), slots=2)
    closed = lab.controls.count("m", "close_engine")
    loads = lab.controls.count("m", "load")

    unloaded, not_found = lab.unload_many(["m", "ghost", "m"]).result()
    assert unloaded == ["m"] and unloaded.count("m") == 1
    assert not_found == ["ghost"]
    assert_unloaded(lab.status("m"), slots=2)
    assert lab.controls.count("m", "close_engine") == closed and lab.controls.count("m", "load") == loads

    # the same through an all-models selection: M once, beside the other model
    everything = lab.start("bulk-all", lambda: lab.registry.unload_many(all_models=True)).result()
    assert everything == (["b", "m"], [])
    assert_unloaded(lab.status("m"), slots=2)
    assert lab.controls.count("m", "close_engine") == closed
    # the barriers were released: the model serves again
    np.testing.assert_array_equal(lab.infer("m", 7.0).result()["OUTPUT0"], expected(7.0))


# ---- status ---------------------------------------------------------------------------------------------------


@cell("OPS.unloaded.status")
@HOW
def test_status_of_unloaded_model_reads_null_capacity_and_loads_nothing(lab_factory, how):
    lab = unloaded_lab(lab_factory, how, {"m": {"capacity": 3}}, parallel_jobs=2)
    entry = lab.registry.get("m")
    loads = lab.controls.count("m", "load")
    admission_before = entry.admission.statistics()

    for _ in range(50):
        status = lab.status("m")
        assert_unloaded(status, slots=2)
        assert status.backend == "fixture" and status.version == "1"
        listed = {s.name: s for s in lab.registry.statuses()}
        assert listed["m"] == status
    # no load, no lease taken or queued by observing
    assert lab.controls.count("m", "load") == loads
    assert lab.controls.live_engines("m") == 0
    admission_after = entry.admission.statistics()
    assert admission_after.granted_total == admission_before.granted_total
    assert admission_after.active_slots == 0 and admission_after.queued == 0
    # metadata: unknown before the first load, the last published one after an unload
    metadata = entry.known_metadata()
    if how == "fresh":
        assert metadata is None
    else:
        assert [t.name for t in metadata.outputs] == ["OUTPUT0"]
