"""Contract: operations on a model M in the Loading state (OPS.loading.*).

M is put into Loading in one of two ways the contract names ("an admitted request or exclusive registration
lease"): the first request's initializer held at the fixture's `load` gate (`request`), or an explicit load
(a registration of the unloaded entry) held at the same gate (`register`).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from service.core.lifecycle import ModelState

cell = pytest.mark.cell

HOW = pytest.mark.parametrize("how", ["request", "register"])


def expected(value: float, dtype=np.float32) -> np.ndarray:
    return np.full(2, value, np.float32).astype(dtype)


def events_of(lab, model: str) -> list[str]:
    return [event for name, event in list(lab.controls.events) if name == model]


def start_loading(lab, how: str, model: str = "m", value: float = 1.0):
    """Put `model` into Loading (its `load` gate held) and return (gate, the operation that loads)."""
    load = lab.gate(model, "load").hold()
    if how == "request":
        loader = lab.infer(model, value, name="loader")
    else:
        loader = lab.register(model, name="loader")
    load.wait_blocked(1)
    status = lab.status(model)
    assert status.state is ModelState.LOADING
    assert status.loaded is False and status.max_parallel_slots is None
    if how == "request":
        assert status.active_slots == 1 and not status.manager_active
    else:
        assert status.active_slots == 0 and status.manager_active
    assert not loader.done()
    return load, loader


def check_loader(loader, how: str, value: float = 1.0) -> None:
    if how == "request":
        np.testing.assert_array_equal(loader.result()["OUTPUT0"], expected(value))
    else:
        assert loader.error() is None


# ---- inference ------------------------------------------------------------------------------------------------


@cell("OPS.loading.infer")
def test_requests_during_initialization_fill_spare_slots_then_queue_and_run_after_complete_publication(lab_factory):
    lab = lab_factory({"m": {"capacity": 2}}, parallel_jobs=2, load=False)
    clone = lab.gate("m", "clone").hold()
    load, first = start_loading(lab, "request", value=1.0)

    second = lab.infer("m", 2.0, name="second")
    lab.wait_active("m", 2)  # a spare slot admits it; it waits on the one initializer
    third = lab.infer("m", 3.0, name="third")
    lab.wait_queued("m", requests=1)  # the pool is full: it queues
    status = lab.status("m")
    assert status.state is ModelState.LOADING and status.active_slots == 2 and status.queued_requests == 1
    assert load.arrivals == 1  # the admitted second request did not start a load of its own
    assert not any(op.done() for op in (first, second, third))

    # The engine is loaded but the pool is incomplete (its contexts are being built): nothing is published.
    load.release()
    clone.wait_blocked(1)
    status = lab.status("m")
    assert status.state is ModelState.LOADING
    assert status.loaded is False and status.max_parallel_slots is None and status.memory_bytes is None
    assert lab.gate("m", "prepare").arrivals == 0
    assert not any(op.done() for op in (first, second, third))

    clone.release()
    for op, value in ((first, 1.0), (second, 2.0), (third, 3.0)):
        np.testing.assert_array_equal(op.result()["OUTPUT0"], expected(value))
    status = lab.status("m")
    assert status.state is ModelState.READY and status.loaded and status.max_parallel_slots == 2
    assert lab.controls.count("m", "load") == 1 and lab.controls.count("m", "clone") == 2
    events = events_of(lab, "m")
    # every result came after complete publication: both contexts were built before any execution
    assert events == ["load", "clone", "clone", "execute", "execute", "execute"]


@cell("OPS.loading.infer")
def test_request_during_registration_load_queues_and_runs_after_publication(lab_factory):
    # Loading under an exclusive registration lease leaves no spare slot: the request queues.
    lab = lab_factory({"m": {"capacity": 2}}, parallel_jobs=2, load=False)
    load, loader = start_loading(lab, "register")
    request = lab.infer("m", 5.0, name="request")
    lab.wait_queued("m", requests=1)
    status = lab.status("m")
    assert status.active_slots == 0 and status.state is ModelState.LOADING
    assert not request.done()
    load.release()
    np.testing.assert_array_equal(request.result()["OUTPUT0"], expected(5.0))
    check_loader(loader, "register")
    assert lab.status("m").state is ModelState.READY
    assert lab.controls.count("m", "load") == 1
    assert events_of(lab, "m") == ["load", "clone", "clone", "execute"]


# ---- register / reconfigure -----------------------------------------------------------------------------------


@cell("OPS.loading.register")
def test_register_during_first_load_waits_for_the_load_and_earlier_requests(lab_factory):
    lab = lab_factory({"m": {"capacity": 4}}, parallel_jobs=2, load=False)
    execute = lab.gate("m", "execute").hold()
    load, first = start_loading(lab, "request", value=1.0)

    register = lab.register("m", slots=3, name="register")
    lab.wait_status("m", lambda s: s.queued_managers == 1, "registration queued")
    later = lab.infer("m", 2.0, name="later")
    lab.wait_queued("m", requests=1, managers=1)
    status = lab.status("m")
    # a slot is spare (1 of 2 active), yet the later request queues behind the registration barrier
    assert status.active_slots == 1 and status.slots == 2
    assert not register.done() and not later.done()

    load.release()
    execute.wait_blocked(1)  # the first load is done; the earlier request runs
    status = lab.status("m")
    assert status.state is ModelState.READY and status.slots == 2  # the registration still waits
    assert status.queued_managers == 1 and not register.done()
    assert lab.gate("m", "execute").arrivals == 1  # the later request did not overtake the barrier

    execute.release()
    np.testing.assert_array_equal(first.result()["OUTPUT0"], expected(1.0))
    np.testing.assert_array_equal(later.result()["OUTPUT0"], expected(2.0))
    result = register.result()
    assert result.loaded and result.state is ModelState.READY and result.slots == 3
    final = lab.status("m")
    assert final.state is ModelState.READY and final.loaded
    assert final.slots == 3 and final.max_parallel_slots == 4
    assert lab.controls.live_contexts("m") == 3 and lab.controls.live_engines("m") == 1
    events = events_of(lab, "m")
    # first load, first request, resize by the registration (third context), then the later request
    assert events == ["load", "clone", "clone", "execute", "clone", "execute"]


@cell("OPS.loading.register")
def test_second_registration_queues_behind_the_loading_registration(lab_factory):
    lab = lab_factory({"m": {"capacity": 4}}, parallel_jobs=2, load=False)
    load, loader = start_loading(lab, "register")

    second = lab.register("m", slots=3, name="second")
    lab.wait_status("m", lambda s: s.queued_managers == 1, "second registration queued")
    assert not second.done()
    assert load.arrivals == 1  # the queued registration has not started loading or probing
    status = lab.status("m")
    assert status.state is ModelState.LOADING and status.slots == 2

    load.release()
    result = second.result()
    assert result.loaded and result.state is ModelState.READY
    assert result.slots == 3 and result.max_parallel_slots == 4
    check_loader(loader, "register")
    assert lab.controls.live_contexts("m") == 3 and lab.controls.live_engines("m") == 1
    np.testing.assert_array_equal(lab.infer("m", 8.0).result()["OUTPUT0"], expected(8.0))


# ---- unload ---------------------------------------------------------------------------------------------------


@cell("OPS.loading.unload")
@HOW
def test_unload_during_load_waits_for_the_first_load_and_earlier_work(lab_factory, how):
    lab = lab_factory({"m": {"capacity": 2}}, parallel_jobs=2, load=False)
    execute = lab.gate("m", "execute").hold()
    load, loader = start_loading(lab, how)
    earlier = loader
    if how == "register":
        # earlier work behind the loading registration: a request queued before the unload
        earlier = lab.infer("m", 1.0, name="earlier")
        lab.wait_queued("m", requests=1)

    unload = lab.unload("m", name="unload")
    lab.wait_status("m", lambda s: s.queued_managers == 1, "unload barrier queued")
    assert not unload.done()

    load.release()
    execute.wait_blocked(1)  # the first load finished; the earlier request executes
    status = lab.status("m")
    assert status.state is ModelState.READY and status.loaded  # the unload still waits
    assert status.queued_managers == 1 and not unload.done()
    assert lab.controls.count("m", "close_engine") == 0

    execute.release()
    np.testing.assert_array_equal(earlier.result()["OUTPUT0"], expected(1.0))
    check_loader(loader, how)
    result = unload.result()
    assert result.loaded is False and result.state is ModelState.UNLOADED
    assert result.max_parallel_slots is None
    assert lab.status("m").state is ModelState.UNLOADED
    assert lab.controls.count("m", "load") == 1
    assert lab.controls.live_contexts("m") == 0 and lab.controls.live_engines("m") == 0
    events = events_of(lab, "m")
    # the request ran on the first load's pool; then the pool was freed, contexts before the engine
    assert events == ["load", "clone", "clone", "execute", "close_context", "close_context", "close_engine"]


# ---- bulk unload ----------------------------------------------------------------------------------------------


@cell("OPS.loading.bulk-unload")
@HOW
def test_bulk_unload_publishes_barrier_before_pool_exists_and_frees_ready_model_first(lab_factory, how):
    lab = lab_factory({"m": {"capacity": 2}, "b": {}}, parallel_jobs=2, load=False)
    lab.infer("b").result()
    assert lab.status("b").state is ModelState.READY
    load, loader = start_loading(lab, how)

    bulk = lab.unload_many(["m", "b"], name="bulk")
    # the barrier on M is published although M has no pool yet
    lab.wait_status("m", lambda s: s.queued_managers == 1, "bulk barrier on M")
    # the ready-idle B is freed while M is still loading
    lab.wait_state("b", ModelState.UNLOADED)
    assert lab.status("b").loaded is False and lab.controls.live_engines("b") == 0
    status = lab.status("m")
    assert status.state is ModelState.LOADING and not bulk.done()

    load.release()
    assert bulk.result() == (["m", "b"], [])
    check_loader(loader, how)
    status = lab.status("m")
    assert status.state is ModelState.UNLOADED and status.loaded is False and status.max_parallel_slots is None
    assert lab.controls.count("m", "load") == 1
    assert lab.controls.live_engines("m") == 0 and lab.controls.live_contexts("m") == 0
    closes = [(name, event) for name, event in list(lab.controls.events) if event == "close_engine"]
    assert closes == [("b", "close_engine"), ("m", "close_engine")]  # B first, then M


# ---- status ---------------------------------------------------------------------------------------------------


@cell("OPS.loading.status")
@HOW
def test_status_during_load_never_exposes_a_partial_pool_and_changes_nothing(lab_factory, how):
    lab = lab_factory({"m": {"capacity": 3}}, parallel_jobs=3, load=False)
    clone = lab.gate("m", "clone").hold()
    load, loader = start_loading(lab, how)
    entry = lab.registry.get("m")
    before = lab.status("m")
    granted = entry.admission.statistics().granted_total

    for phase_gate in (load, clone):
        for _ in range(50):
            status = lab.status("m")
            assert status.state is ModelState.LOADING
            assert status.loaded is False and status.max_parallel_slots is None and status.memory_bytes is None
            assert status.slots == 3
            assert (status.active_slots, status.queued_requests, status.manager_active) == (
                before.active_slots,
                before.queued_requests,
                before.manager_active,
            )
        assert entry.known_metadata() is None
        if phase_gate is load:
            load.release()
            clone.wait_blocked(1)  # primary built, no context yet: still nothing published
    assert entry.admission.statistics().granted_total == granted  # status took no lease
    assert load.arrivals == 1 and not loader.done()

    # Watch status through the rest of the build: loaded only with the whole pool and its capacity.
    observations = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            status = lab.status("m")
            observations.append(
                (status.loaded, status.max_parallel_slots, status.state, lab.controls.live_contexts("m"))
            )
            time.sleep(0.0002)  # ordering-free: sampling only; no event is ordered by it

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        clone.release()
        check_loader(loader, how)
    finally:
        stop.set()
        watcher.join()
    for loaded, capacity, state, contexts in observations:
        if loaded:
            assert capacity == 3 and state is ModelState.READY and contexts == 3
        else:
            assert capacity is None and state is ModelState.LOADING
    final = lab.status("m")
    assert final.state is ModelState.READY and final.loaded and final.max_parallel_slots == 3
    assert lab.controls.count("m", "load") == 1  # observing started no load of its own
