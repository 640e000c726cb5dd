"""The memory budget is a reservation, not a check (issue 12, item 3): two cold loads that pass the budget
one after the other cannot both publish a pool that only one fits. The window between a pool passing the budget
and its publication is held open with the lifecycle's own `loaded` event (a hook, no sleeps)."""

from __future__ import annotations

import threading

import pytest

from engine.config.specs import ModelSpec
from engine.testing.fixture import FixtureBackend, FixtureControls
from service.core.errors import MemoryLimit
from service.core.events import Events
from service.core.lifecycle import ModelEntry, ModelSettings, SharedRuntime
from service.core.residency import ColdLoadGuard, Residency

WAIT = 10.0


class _BEnded(Events):
    """Sets `b_ended` when model b's load has ended, loaded or failed."""

    def __init__(self) -> None:
        super().__init__()
        self.b_ended = threading.Event()

    def emit(self, logger, event, model=None, **fields):
        if model == "b" and event in ("loaded", "load_failed"):
            self.b_ended.set()
        return super().emit(logger, event, model, **fields)


class _HoldAfterRelease(ColdLoadGuard):
    """Holds the thread named "a" right after it releases the cold-load guard: its pool is built and passed
    the budget, and is not published yet. The latest point before publication, with either guard limit."""

    def __init__(self, limit: int, until: threading.Event) -> None:
        super().__init__(limit)
        self._until = until

    def release(self, turn=None) -> None:
        super().release(turn)
        if threading.current_thread().name == "a":
            assert self._until.wait(WAIT), "b's load never ended"


@pytest.mark.parametrize("concurrent_loads", [1, 2])
def test_two_loads_never_exceed_the_budget_together(concurrent_loads):
    """Budget 100, two 60-byte models loaded at once: one loads, the other is refused with memory_limit
    (the first is loading, so it is no eviction victim), and the bytes in use stay within the budget."""
    controls = FixtureControls()
    events = _BEnded()
    residency = Residency(memory_budget=100)
    runtime = SharedRuntime(
        backends={"fixture": FixtureBackend(controls)},
        cold_loads=_HoldAfterRelease(concurrent_loads, events.b_ended),
        residency=residency,
        events=events,
    )
    entries = {
        name: ModelEntry(
            ModelSpec(name, "fixture", parameters={"memory_bytes": "60", "capacity": "1"}),
            ModelSettings(1, False, 0.0),
            runtime,
        )
        for name in "ab"
    }
    outcomes: dict[str, object] = {}

    def first_request(name: str) -> None:
        try:
            with entries[name].acquire_lease(None):
                outcomes[name] = "ok"
        except Exception as error:  # the outcome is the test's to check
            outcomes[name] = error

    a = threading.Thread(target=first_request, args=("a",), name="a")
    a.start()
    controls.gate("a", "load").wait_arrivals(1)
    b = threading.Thread(target=first_request, args=("b",), name="b")
    b.start()
    a.join(WAIT)
    b.join(WAIT)
    assert outcomes["a"] == "ok"
    assert isinstance(outcomes["b"], MemoryLimit), outcomes
    assert "needs 60 bytes; 60 of the 100-byte budget" in str(outcomes["b"])
    assert residency.resident_names() == ["a"] and residency.memory_in_use() == 60
    # b's refusal left nothing reserved: after a is unloaded, b fits.
    with entries["a"].exclusive(None):
        entries["a"].unload_leased()
    with entries["b"].acquire_lease(None):
        assert residency.resident_names() == ["b"] and residency.memory_in_use() == 60
