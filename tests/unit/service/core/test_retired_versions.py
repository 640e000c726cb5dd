"""Versions in the core (issue 21 part 2): a version a reload retires is never loaded again, even by a request
that found its entry before the reload; the memory budget counts each version as a model of its own."""

from __future__ import annotations

import threading
import time

import pytest

from engine.config.repository import ModelRepository
from engine.testing.fixture import FixtureBackend, FixtureControls
from service.core.errors import ModelNotFound
from service.core.lifecycle import ModelState, SharedRuntime
from service.core.registry import ModelRegistry, Registration
from service.core.residency import Residency

WAIT = 10.0

cell = pytest.mark.cell


def _write(root, policy: str, parameters: str = "") -> None:
    folder = root / "m"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(f'name: "m"\nbackend: "fixture"\n{parameters}{policy}')
    for version in ("1", "2"):
        (folder / version).mkdir(exist_ok=True)


def _until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"waited {WAIT} s for {what}"
        time.sleep(0.005)  # ordering-free: polls an observable state


@cell("VERSION.05")
def test_a_request_that_found_a_retired_version_is_refused_and_nothing_loads_it(tmp_path):
    _write(tmp_path, "version_policy { all { } }")
    controls = FixtureControls()
    registry = ModelRegistry(ModelRepository(tmp_path), SharedRuntime(backends={"fixture": FixtureBackend(controls)}))
    registry.register(Registration(name="m"))
    dropped = registry.get("m", "1")
    running = dropped.acquire_lease(None)  # earlier work the retirement waits for
    _write(tmp_path, "version_policy { specific { versions: [ 2 ] } }")
    reload = threading.Thread(target=registry.load, args=("m",))
    reload.start()
    _until(lambda: dropped.status().queued_managers == 1, "the retirement to queue")
    assert [e.spec.version for e in registry.versions("m").entries()] == ["2"]  # no new request finds it
    outcome: list[BaseException] = []

    def late_request() -> None:  # found the entry before the reload, arrives after the retirement
        try:
            dropped.acquire_lease(None).release()
        except BaseException as error:  # the test checks it
            outcome.append(error)

    late = threading.Thread(target=late_request)
    late.start()
    # queued_requests counts every queued ticket: the retirement and the late request
    _until(lambda: dropped.status().queued_requests == 2 or outcome, "the late request to queue")
    assert not outcome, outcome
    loads = controls.count("m", "load")
    running.release()
    reload.join(WAIT)
    late.join(WAIT)
    assert not reload.is_alive() and not late.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], ModelNotFound), outcome
    assert "'m' version 1 is not found" in str(outcome[0])
    assert dropped.state is ModelState.UNLOADED and dropped.retired
    assert controls.count("m", "load") == loads  # nothing loaded the retired version again
    assert registry.get("m").is_ready() and registry.get("m").spec.version == "2"


@cell("VERSION.07")
def test_the_memory_budget_counts_each_version(tmp_path):
    _write(tmp_path, "version_policy { all { } }", 'parameters { key: "memory_bytes" value { string_value: "60" } }\n')
    residency = Residency(memory_budget=100)
    controls = FixtureControls()
    runtime = SharedRuntime(backends={"fixture": FixtureBackend(controls)}, residency=residency)
    registry = ModelRegistry(ModelRepository(tmp_path), runtime)
    registry.register(Registration(name="m"), load=False)
    with registry.get("m", "2").acquire_lease(None):
        assert residency.memory_in_use() == 60
    with registry.get("m", "1").acquire_lease(None):  # both do not fit: the idle version 2 is evicted
        assert residency.memory_in_use() == 60
    assert [(e.spec.version, e.state) for e in registry.versions("m").entries()] == [
        ("1", ModelState.READY),
        ("2", ModelState.UNLOADED),
    ]
