"""A laboratory for contract tests: fixture models in a real registry (no gRPC), operations started on their
own threads, and waits on the models' own statistics instead of sleeps.

    lab = Lab(tmp_path, models={"a": {"capacity": 2}, "b": {}})
    grants = lab.record_grants("a")           # operation names in the order A granted their leases
    gate = lab.gate("a", "execute").hold()
    first = lab.infer("a")
    gate.wait_blocked(1)                      # the request is now executing on a slot
    manager = lab.unload("a")
    lab.wait_queued("a", managers=1)          # exactly one manager and no request wait on A
    ...
    gate.release()
    assert first.result()["OUTPUT0"] ...

Every operation returns an `Op`; `Op.result()` returns its value or raises its exception (bounded by a
timeout so a broken test fails instead of hanging).

Order is read where it is decided, never from completion: an operation finishes after its lease is released, so
the next waiter (granted at that release) can finish first. `record_grants` logs each lease while it is held.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.config.repository import ModelRepository
from engine.interface import CancelToken
from engine.testing.fixture import FixtureBackend, FixtureControls, Gate
from service.core.lifecycle import ModelState, ModelStatus, SharedRuntime
from service.core.registry import ModelRegistry, Registration, RegistryPolicy
from service.core.residency import ColdLoadGuard, Residency

WAIT = 10.0  # seconds any wait may take before the test fails


class FakeClock:
    """A monotonic clock the test moves by hand (`clock.now += 5`), for timeouts without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Op:
    """An operation running on its own thread."""

    def __init__(self, name: str, target: Callable[[], object], lab: Lab) -> None:
        self.name = name
        self._lab = lab
        self._value = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(target,), name=name, daemon=True)
        self.thread.start()

    def _run(self, target) -> None:
        try:
            self._value = target()
        except BaseException as error:  # reported to the test through result()
            self._error = error
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float = WAIT) -> Op:
        if not self._done.wait(timeout):
            raise AssertionError(f"operation {self.name} did not finish within {timeout} s")
        return self

    def result(self, timeout: float = WAIT):
        self.wait(timeout)
        if self._error is not None:
            raise self._error
        return self._value

    def error(self, timeout: float = WAIT) -> BaseException | None:
        self.wait(timeout)
        return self._error


def write_fixture_model(root: Path, name: str, parameters: dict | None = None, max_batch_size: int = 0) -> None:
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f'name: "{name}"', 'backend: "fixture"', f"max_batch_size: {max_batch_size}"]
    for key, value in (parameters or {}).items():
        lines.append(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}')
    (directory / "config.pbtxt").write_text("\n".join(lines) + "\n")


class Lab:
    def __init__(
        self,
        root: Path,
        models: dict[str, dict] | None = None,
        *,
        parallel_jobs: int | None = 2,
        admission_timeout: float = 0.0,
        max_queue: int = 0,
        max_concurrent_loads: int = 1,
        load: bool = True,
        clock: Callable[[], float] = time.monotonic,
        max_resident_models: int = 0,
        memory_budget: int = 0,
        idle_unload: float = 0.0,
        memory_check_seconds: float = 0.0,  # 0: no memory watch thread (a test calls check_memory itself)
    ) -> None:
        self.root = Path(root)
        for name, parameters in (models or {"a": {}, "b": {}}).items():
            write_fixture_model(self.root, name, parameters)
        self.controls = FixtureControls()
        self.clock = clock
        self.residency = Residency(
            max_resident_models=max_resident_models,
            memory_budget=memory_budget,
            idle_unload=idle_unload,
            clock=clock,
            memory_check_seconds=memory_check_seconds,
        )
        self.runtime = SharedRuntime(
            backends={"fixture": FixtureBackend(self.controls)},
            max_queue=max_queue,
            cold_loads=ColdLoadGuard(max_concurrent_loads),
            clock=clock,
            residency=self.residency,
        )
        self.registry = ModelRegistry(
            ModelRepository(self.root),
            self.runtime,
            RegistryPolicy(parallel_jobs=parallel_jobs, admission_timeout=admission_timeout),
        )
        self.residency.start()
        self.registry.register_repository(load=load)
        self._lock = threading.Lock()  # guards: _ops, _counter
        self._ops: list[Op] = []
        self._counter = 0

    # ---- operations -----------------------------------------------------------------------------------------

    def start(self, name: str, target: Callable[..., object]) -> Op:
        with self._lock:
            self._counter += 1
            op = Op(f"{name}#{self._counter}", target, self)
            self._ops.append(op)
        return op

    def infer(
        self,
        model: str,
        value: float = 1.0,
        *,
        timeout: float | None = None,
        cancel: CancelToken | None = None,
        name: str | None = None,
    ) -> Op:
        """A request: admission (with the model's timeout, or `timeout` seconds), load if needed, execute."""

        def run():
            entry = self.registry.get(model)
            deadline = None
            if timeout is not None:
                deadline = self.clock() + timeout
            elif entry.settings.admission_timeout > 0:
                deadline = self.clock() + entry.settings.admission_timeout
            token = cancel or CancelToken()
            with entry.acquire_lease(deadline, token) as lease:
                return lease.execute({"INPUT0": np.full(2, value, np.float32)}, [], token)

        return self.start(name or f"infer:{model}", run)

    def register(self, model: str, name: str | None = None, **registration) -> Op:
        return self.start(
            name or f"register:{model}", lambda: self.registry.register(Registration(name=model, **registration))
        )

    def unload(self, model: str, name: str | None = None) -> Op:
        return self.start(name or f"unload:{model}", lambda: self.registry.unload(model))

    def unload_many(self, models: list[str], name: str | None = None, cancel: CancelToken | None = None) -> Op:
        return self.start(name or "bulk:" + ",".join(models), lambda: self.registry.unload_many(models, cancel=cancel))

    # ---- observation ----------------------------------------------------------------------------------------

    def gate(self, model: str, point: str) -> Gate:
        return self.controls.gate(model, point)

    def status(self, model: str) -> ModelStatus:
        return self.registry.get(model).status()

    def wait_until(self, predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
        """Poll a state predicate until it holds. The order of events comes from the predicate (the models'
        statistics), never from the delay."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.0005)  # ordering-free: re-checks a state predicate

    def wait_status(self, model: str, predicate: Callable[[ModelStatus], bool], what: str = "") -> ModelStatus:
        self.wait_until(lambda: predicate(self.status(model)), what or f"status of {model}")
        return self.status(model)

    def queue(self, model: str) -> tuple[int, int]:
        """(queued requests, queued managers) of `model`'s admission queue. Managers are registrations,
        unloads and bulk barriers; ModelStatus.queued_requests counts both kinds together."""
        stats = self.registry.get(model).admission.statistics()
        return stats.queued_requests, stats.queued_managers

    def wait_queued(self, model: str, *, requests: int = 0, managers: int = 0) -> None:
        """Wait until exactly `requests` inference requests and `managers` management tickets wait in `model`'s
        admission queue (both counts must match: a test states the whole queue it expects)."""
        self.wait_until(
            lambda: self.queue(model) == (requests, managers),
            f"{requests} requests and {managers} managers queued on {model}",
        )

    def wait_active(self, model: str, count: int) -> None:
        self.wait_status(model, lambda s: s.active_slots == count, f"{count} active slots on {model}")

    def wait_state(self, model: str, state: ModelState) -> None:
        self.wait_status(model, lambda s: s.state is state, f"{model} {state.value}")

    def record_grants(self, model: str) -> list[str]:
        """Start logging `model`'s lease grants: returns a list that receives each operation's name (without
        its "#n") when its lease is granted, appended by the granted thread while it holds the lease.

        Exact grant order for exclusive leases (managers) and for a model with one slot: the next lease cannot
        be granted before the holder has appended. Covers leases taken through the model's admission
        `acquire` (requests, registrations, unloads), not bulk barriers. Observation only: wraps the entry's
        controller instance, whose own behaviour is unchanged."""
        admission = self.registry.get(model).admission
        log: list[str] = []
        acquire = admission.acquire

        def logged_acquire(*args, **kwargs):
            ticket = acquire(*args, **kwargs)
            log.append(threading.current_thread().name.split("#")[0])
            return ticket

        admission.acquire = logged_acquire  # type: ignore[method-assign]  # the test's log around the real one
        return log

    def close(self) -> None:
        """Release every gate and wait for every operation (a test that leaves work behind fails here)."""
        self.controls.release_all()
        with self._lock:
            ops = list(self._ops)
        for op in ops:
            op.wait()
        self.residency.stop()


# ---- helpers for the two-model matrix (tests/contract/test_two_*.py); additive, used by those files ----------


def admission_stats(lab: Lab, model: str):
    """The admission statistics of `model` (queued requests and queued managers counted apart)."""
    return lab.registry.get(model).admission.statistics()


def wait_admission(lab: Lab, model: str, predicate: Callable[..., bool], what: str = ""):
    """Poll `model`'s admission statistics until `predicate` holds; returns them."""
    lab.wait_until(lambda: predicate(admission_stats(lab, model)), what or f"admission of {model}")
    return admission_stats(lab, model)


def infer_logged(lab: Lab, model: str, log: list, label: str, value: float = 1.0) -> Op:
    """A request like `Lab.infer` (no admission deadline) that appends `label` to `log` at the moment its lease
    is granted, while it holds the lease: with one slot, `log` is the grant order."""

    def run():
        entry = lab.registry.get(model)
        token = CancelToken()
        with entry.acquire_lease(None, token) as lease:
            log.append(label)
            return lease.execute({"INPUT0": np.full(2, value, np.float32)}, [], token)

    return lab.start(label, run)


def events_since(lab: Lab, model: str, mark: int) -> list[str]:
    """The fixture events of `model` recorded after the first `mark` events (all models), in order."""
    return [event for name, event in list(lab.controls.events)[mark:] if name == model]
