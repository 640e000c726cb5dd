"""A context that takes several requests at once (`LoadedModel.requests_per_context`: a python model whose decoupled
`async def execute` overlaps its calls): the pool lends it that many times, round robin over its contexts, and
admission grants that many requests per slot; a context taken out while lent is closed by the last of its leases."""

from __future__ import annotations

import threading
import time

import pytest

from engine.config.repository import ModelRepository
from engine.config.specs import ModelSpec
from engine.testing.fixture import FixtureBackend, FixtureControls
from service.core.errors import AdmissionTimeout
from service.core.lifecycle import SharedRuntime
from service.core.pool import SlotPool
from service.core.registry import ModelRegistry, Registration


class Overlapping(FixtureBackend):
    """The fixture backend, its models taking three requests per context."""

    def load(self, spec: ModelSpec):
        model = super().load(spec)
        model.requests_per_context = 3
        return model


def _pool(contexts: int) -> tuple[SlotPool, FixtureControls]:
    controls = FixtureControls()
    spec = ModelSpec(name="m", backend="fixture")
    primary = Overlapping(controls).load(spec)
    return SlotPool(spec, primary, [primary.create_context() for _ in range(contexts)]), controls


def test_each_context_is_lent_as_many_times_as_it_takes_requests_round_robin():
    pool, _ = _pool(2)
    assert (pool.capacity, pool.request_slots) == (2, 6)
    first, second = pool.contexts()
    assert [pool.take() for _ in range(6)] == [first, second, first, second, first, second]


def test_a_context_removed_while_lent_is_closed_by_its_last_lease_only():
    pool, _ = _pool(2)
    _first, second = pool.contexts()
    assert pool.request_slots == 6
    lent = [pool.take() for _ in range(4)]  # the second context twice
    assert lent.count(second) == 2
    assert pool.remove(1) == []  # lent: not closed now
    closed: list[object] = []
    second.close = lambda: closed.append(second)  # type: ignore[method-assign]
    pool.give_back(second)
    assert closed == [] and not pool.wait_removed(time.monotonic(), None)
    pool.give_back(second)
    assert closed == [second] and pool.wait_removed(time.monotonic(), None)
    assert (pool.capacity, pool.request_slots) == (1, 3)


def test_an_idle_context_removed_is_handed_back_to_close_at_once():
    pool, _ = _pool(2)
    _first, second = pool.contexts()
    assert pool.remove(1) == [second]
    assert pool.request_slots == 3


def test_admission_grants_as_many_requests_per_slot_as_the_context_takes(tmp_path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text('name: "m"\nbackend: "fixture"\n')
    registry = ModelRegistry(ModelRepository(tmp_path), SharedRuntime(backends={"fixture": Overlapping()}))
    registry.register(Registration(name="m"))
    entry = registry.get("m")
    leases = [entry.acquire_lease(time.monotonic() + 30) for _ in range(3)]
    assert len({id(lease.context) for lease in leases}) == 1  # one slot, three requests on it
    status = entry.status()
    assert (status.slots, status.active_slots) == (1, 3)
    with pytest.raises(AdmissionTimeout):  # a fourth waits for a place: here until its deadline
        entry.acquire_lease(time.monotonic() + 0.05)
    leases.pop().release()
    leases.append(entry.acquire_lease(time.monotonic() + 30))  # a place is free again
    for lease in leases:
        lease.release()
    assert entry.status().active_slots == 0


def test_a_take_waiting_for_a_context_is_woken_by_the_give_back():
    # give_back notifies only while a `take` waits (the common give_back has nobody to wake): the waiter must still
    # get the context given back, and one that came without waiters is simply free for the next take.
    pool, _ = _pool(1)
    lent = [pool.take() for _ in range(3)]  # every lending of the one context is out
    taken: list[object] = []
    waiter = threading.Thread(target=lambda: taken.append(pool.take()), daemon=True)
    waiter.start()
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:  # ordering-free: polls until the waiter is parked in take()
        with pool._freed:
            if pool._waiting == 1:
                break
        time.sleep(0.001)  # ordering-free: re-checks that the waiter is parked
    assert pool._waiting == 1
    pool.give_back(lent[0])
    waiter.join(timeout=10.0)
    assert not waiter.is_alive() and taken == [lent[0]] and pool._waiting == 0
    pool.give_back(lent[1])  # nobody waits now: the context is free for the next take, without a wake-up
    assert pool.take() is lent[1]
