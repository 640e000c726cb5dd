"""Contract, two-model situations: another bulk operation targets A/B (TWO.other-bulk-targets-ab.*).

A and B each run a request held at their execute gate; a first bulk unload of [a, b] has published its barrier
on both and waits behind those requests.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from service.core.lifecycle import ModelState
from tests.contract.harness import admission_stats, events_since, wait_admission

cell = pytest.mark.cell


def _echo(op, value: float) -> None:
    np.testing.assert_array_equal(op.result()["OUTPUT0"], np.full(2, value, np.float32))


def _other_bulk_targets_ab(lab_factory):
    lab = lab_factory({"a": {}, "b": {}})
    gates, running = {}, {}
    for model in "ab":
        gates[model] = lab.gate(model, "execute").hold()
        running[model] = lab.infer(model, 1.0, name=f"{model}-running")
        gates[model].wait_blocked(1)
    first = lab.unload_many(["a", "b"], name="first-bulk")
    for model in "ab":
        wait_admission(lab, model, lambda s: s.queued_managers == 1, f"first bulk's barrier on {model}")
        assert lab.status(model).loaded
    return lab, gates, running, first


def _drain(gates, running) -> None:
    for model in "ab":
        gates[model].release()
        _echo(running[model], 1.0)


def _request_queues_after_the_bulk_barrier_then_reloads_and_runs(lab_factory, target: str, other: str) -> None:
    lab, gates, running, first = _other_bulk_targets_ab(lab_factory)
    loads = lab.controls.count(target, "load")
    request = lab.infer(target, 4.0, name=f"request-{target}")
    stats = wait_admission(lab, target, lambda s: s.queued_requests == 1, "request behind the barrier")
    assert stats.active_slots == 1 < stats.capacity  # a spare slot exists, yet it queues
    mark = len(lab.controls.events)
    _drain(gates, running)
    assert first.result() == (["a", "b"], [])
    _echo(request, 4.0)
    events = events_since(lab, target, mark)
    assert events.index("close_engine") < events.index("load") < events.index("execute")
    assert lab.controls.count(target, "load") == loads + 1
    assert lab.status(target).state is ModelState.READY
    assert lab.status(other).state is ModelState.UNLOADED


@cell("TWO.other-bulk-targets-ab.req-a")
def test_request_to_a_queues_after_the_bulk_barrier_then_reloads_and_runs(lab_factory):
    _request_queues_after_the_bulk_barrier_then_reloads_and_runs(lab_factory, "a", "b")


@cell("TWO.other-bulk-targets-ab.req-b")
def test_request_to_b_queues_after_the_bulk_barrier_then_reloads_and_runs(lab_factory):
    _request_queues_after_the_bulk_barrier_then_reloads_and_runs(lab_factory, "b", "a")


@cell("TWO.other-bulk-targets-ab.reconf-a")
def test_reconfigure_a_queues_on_a_after_the_bulk_then_loads_the_replacement(lab_factory):
    lab, gates, running, first = _other_bulk_targets_ab(lab_factory)
    loads, closed = lab.controls.count("a", "load"), lab.controls.count("a", "close_engine")
    reconfigure = lab.register("a", options={"tag": "v2"}, name="reconfigure")
    wait_admission(lab, "a", lambda s: s.queued_managers == 2, "reconfigure queued behind the bulk barrier")
    assert admission_stats(lab, "b").queued_managers == 1  # only A's queue
    mark = len(lab.controls.events)
    _drain(gates, running)
    assert first.result() == (["a", "b"], [])
    result = reconfigure.result()
    assert result.loaded and result.state is ModelState.READY
    events = events_since(lab, "a", mark)
    assert events.index("close_engine") < events.index("load")  # the bulk unloaded A before the reload
    assert lab.controls.count("a", "load") == loads + 1
    assert lab.controls.count("a", "close_engine") == closed + 1
    assert lab.registry.get("a").spec.parameter("tag") == "v2"
    assert lab.status("b").state is ModelState.UNLOADED


@cell("TWO.other-bulk-targets-ab.unload-a")
def test_unload_a_queues_on_a_after_the_bulk_and_is_idempotent(lab_factory):
    lab, gates, running, first = _other_bulk_targets_ab(lab_factory)
    closed = lab.controls.count("a", "close_engine")
    unload = lab.unload("a", name="unload")
    wait_admission(lab, "a", lambda s: s.queued_managers == 2, "unload queued behind the bulk barrier")
    assert not unload.done()
    _drain(gates, running)
    assert first.result() == (["a", "b"], [])
    result = unload.result()
    assert result.loaded is False and result.state is ModelState.UNLOADED
    assert lab.controls.count("a", "close_engine") == closed + 1  # torn down once, by the bulk
    for model in "ab":
        assert lab.status(model).state is ModelState.UNLOADED


@cell("TWO.other-bulk-targets-ab.unload-ab")
def test_overlapping_reversed_bulk_orders_behind_the_first_deduplicates_and_does_not_cycle(lab_factory):
    lab, gates, running, first = _other_bulk_targets_ab(lab_factory)
    closed = {model: lab.controls.count(model, "close_engine") for model in "ab"}
    calls: list[tuple[str, str, bool]] = []  # (model, bulk, whether it tore a pool down), in lease order
    for model in "ab":
        entry = lab.registry.get(model)
        original = entry.unload_leased

        def recorded(original=original, model=model):
            unloaded = original()  # runs under the bulk's exclusive lease on `model`
            calls.append((model, threading.current_thread().name.split("#")[0], unloaded))
            return unloaded

        entry.unload_leased = recorded  # observation only: wraps the entry's own method
    second = lab.unload_many(["b", "a", "b", "zz", "a"], name="second-bulk")  # reversed, duplicated, unknown
    for model in "ab":
        wait_admission(lab, model, lambda s: s.queued_managers == 2, f"second bulk's barrier on {model}")
    _drain(gates, running)  # B's older request ends first, then A's: the reverse of the first selection
    assert first.result() == (["a", "b"], [])
    assert second.result() == (["b", "a"], ["zz"])  # each id once, in its selection order
    for model in "ab":
        # on every shared model the first bulk's barrier came first; the second found nothing left to free
        assert [(bulk, unloaded) for name, bulk, unloaded in calls if name == model] == [
            ("first-bulk", True),
            ("second-bulk", False),
        ]
        assert lab.status(model).state is ModelState.UNLOADED
        assert lab.controls.count(model, "close_engine") == closed[model] + 1
        stats = admission_stats(lab, model)
        assert stats.queued == 0 and not stats.manager_active


class _WatchedLock:
    """Wraps a lock and counts callers that found it taken and had to wait (observation only)."""

    def __init__(self, lock) -> None:
        self._lock = lock
        self._count_lock = threading.Lock()
        self.contended = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking=False):
            return True
        if not blocking:
            return False
        with self._count_lock:
            self.contended += 1
        return self._lock.acquire(True, timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    __enter__ = acquire

    def __exit__(self, *exc) -> None:
        self.release()


@cell("TWO.other-bulk-targets-ab.unload-ab")
def test_bulk_arriving_mid_publication_of_another_still_orders_behind_it_on_every_shared_model(lab_factory):
    """Atomic publication: a reversed bulk that arrives while the first bulk has published its barrier on A but
    not yet on B must not get ahead of it on B."""
    lab = lab_factory({"a": {}, "b": {}})
    gates, running = {}, {}
    for model in "ab":
        gates[model] = lab.gate(model, "execute").hold()
        running[model] = lab.infer(model, 1.0, name=f"{model}-running")
        gates[model].wait_blocked(1)
    watched = _WatchedLock(lab.registry._bulk_lock)
    lab.registry._bulk_lock = watched  # the registry's publication mutex, observed
    calls: list[tuple[str, str]] = []
    for model in "ab":
        entry = lab.registry.get(model)
        original = entry.unload_leased

        def recorded(original=original, model=model):
            calls.append((model, threading.current_thread().name.split("#")[0]))
            return original()

        entry.unload_leased = recorded
    a_admission = lab.registry.get("a").admission
    arrive_locked = a_admission.arrive_locked
    second: list = []

    def arrive_then_let_the_second_bulk_in(*args, **kwargs):
        ticket = arrive_locked(*args, **kwargs)
        if threading.current_thread().name.startswith("first-bulk") and not second:
            # The first bulk has published on A only. Start the reversed bulk and hold the first one here until
            # the second either publishes on B (it got ahead) or waits for the publication mutex.
            second.append(lab.unload_many(["b", "a"], name="second-bulk"))
            lab.wait_until(
                lambda: watched.contended >= 1 or admission_stats(lab, "b").queued_managers >= 1,
                "the second bulk to publish on B or wait for the first bulk's publication",
            )
        return ticket

    a_admission.arrive_locked = arrive_then_let_the_second_bulk_in
    first = lab.unload_many(["a", "b"], name="first-bulk")
    lab.wait_until(lambda: bool(second), "the second bulk started")
    for model in "ab":
        wait_admission(lab, model, lambda s: s.queued_managers == 2, f"both barriers on {model}")
    _drain(gates, running)
    assert first.result() == (["a", "b"], [])
    assert second[0].result() == (["b", "a"], [])
    for model in "ab":
        assert [bulk for name, bulk in calls if name == model] == ["first-bulk", "second-bulk"], calls
        assert lab.status(model).state is ModelState.UNLOADED
