"""The rate limiter on a real server and channel (service/core/rate_limiter.py; docs/lifecycle.md, "Rate limiter"):
two models sharing a resource of count 1 never run at once, the waiting slot counts as busy, `--rate-limit off`
ignores the config, `--rate-limit-resource` raises availability, a model needing more than the flag gives fails to
load, and a wait for resources ends at the request's deadline naming the resource (Triton core#448's shape)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from engine.testing.fixture import FixtureBackend
from service.core.rate_limiter import RateLimitMode, ResourceFlag
from service.testing import serve

from ._support import write_fixture_model

WAIT = 60.0  # "eventually" on a loaded machine


def _model(root, name: str, resources: str, *, slots: int = 1, max_batch_size: int = 0, batching: bool = False):
    extra = f"instance_group [ {{ count: {slots} rate_limiter {{ resources [ {resources} ] }} }} ]\n"
    if batching:
        extra += "dynamic_batching { }\n"
    write_fixture_model(
        root,
        name,
        inputs=[("INPUT0", "FP32", [4])],
        outputs=[("OUTPUT0", "FP32", [4])],
        max_batch_size=max_batch_size,
        extra=extra,
    )


def _server(root, controls, mode: RateLimitMode = RateLimitMode.EXECUTION_COUNT, **options):
    return serve(root, backends={"fixture": FixtureBackend(controls)}, parallel_jobs=4, rate_limit=mode, **options)


def _call(
    running,
    model: str,
    errors: list[BaseException],
    timeout: float = WAIT,
    shape: tuple[int, ...] = (4,),
    parameters: dict[str, int] | None = None,
) -> threading.Thread:
    def call() -> None:
        try:
            running.client.infer(model, {"INPUT0": np.ones(shape, "f")}, parameters=parameters, timeout=timeout)
        except BaseException as error:  # noqa: BLE001 (reported to the test)
            errors.append(error)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def _eventually(condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)  # ordering-free: polls a state until a deadline
    return condition()


def _joined(*threads: threading.Thread) -> None:
    for thread in threads:
        thread.join(timeout=WAIT)
        assert not thread.is_alive()


def test_two_models_sharing_a_resource_of_one_never_run_at_once(tmp_path, controls):
    _model(tmp_path, "a", '{ name: "R" count: 1 }')
    _model(tmp_path, "b", '{ name: "R" count: 1 }')
    with _server(tmp_path, controls) as running:
        limiter = running.server.runtime.rate_limiter
        assert limiter is not None and limiter.available() == {"R": 1}
        engine_a = controls.gate("a", "execute").hold()
        engine_b = controls.gate("b", "execute").hold()
        errors: list[BaseException] = []
        first = _call(running, "a", errors)
        engine_a.wait_arrivals(1, timeout=WAIT)
        second = _call(running, "b", errors)
        assert _eventually(lambda: limiter.queued() == 1)  # b's run waits for R
        seen_waiting = time.perf_counter_ns()
        b_admission = running.server.registry.get("b").admission.statistics()
        assert b_admission.active_slots == 1 and b_admission.queued == 0  # its slot is held: busy, not queued
        assert controls.gate("b", "prepare").arrivals == 0 and engine_b.arrivals == 0  # it has not begun to run
        waited_at_least = time.perf_counter_ns() - seen_waiting  # b arrived before and runs after this stretch
        engine_a.release()
        engine_b.wait_arrivals(1, timeout=WAIT)  # R was handed over once a ended
        assert controls.gate("a", "execute").arrivals == 1
        engine_b.release()
        _joined(first, second)
        assert errors == []
        assert limiter.queued() == 0
        # The wait for resources is the request's queue time (as Triton counts an instance waiting for the rate
        # limiter), not its compute time.
        assert running.server.registry.get("b").statistics.snapshot().queue.ns >= waited_at_least


def test_the_batch_leader_takes_the_resources_for_the_whole_batch(tmp_path, controls):
    _model(tmp_path, "solo", '{ name: "R" count: 1 }')
    _model(tmp_path, "batched", '{ name: "R" count: 1 }', max_batch_size=4, batching=True)
    with _server(tmp_path, controls) as running:
        limiter = running.server.runtime.rate_limiter
        assert limiter is not None
        engine = controls.gate("solo", "execute").hold()
        errors: list[BaseException] = []
        holder = _call(running, "solo", errors)
        engine.wait_arrivals(1, timeout=WAIT)
        batch = _call(running, "batched", errors, shape=(1, 4))
        assert _eventually(lambda: limiter.queued() == 1)
        assert controls.gate("batched", "execute").arrivals == 0
        engine.release()
        _joined(holder, batch)
        assert errors == [] and controls.gate("batched", "execute").arrivals == 1


def test_rate_limit_off_ignores_the_config(tmp_path, controls):
    _model(tmp_path, "a", '{ name: "R" count: 1 }')
    _model(tmp_path, "b", '{ name: "R" count: 1 }')
    with _server(tmp_path, controls, mode=RateLimitMode.OFF) as running:
        assert running.server.runtime.rate_limiter is None
        engine_a = controls.gate("a", "execute").hold()
        engine_b = controls.gate("b", "execute").hold()
        errors: list[BaseException] = []
        calls = [_call(running, "a", errors), _call(running, "b", errors)]
        engine_a.wait_arrivals(1, timeout=WAIT)
        engine_b.wait_arrivals(1, timeout=WAIT)  # both run at once
        engine_a.release()
        engine_b.release()
        _joined(*calls)
        assert errors == []


def test_rate_limit_resource_raises_the_availability(tmp_path, controls):
    _model(tmp_path, "a", '{ name: "R" count: 1 }')
    _model(tmp_path, "b", '{ name: "R" count: 1 }')
    with _server(tmp_path, controls, rate_limit_resources=(ResourceFlag("R", 2),)) as running:
        limiter = running.server.runtime.rate_limiter
        assert limiter is not None and limiter.available() == {"R": 2}
        engine_a = controls.gate("a", "execute").hold()
        engine_b = controls.gate("b", "execute").hold()
        errors: list[BaseException] = []
        calls = [_call(running, "a", errors), _call(running, "b", errors)]
        engine_a.wait_arrivals(1, timeout=WAIT)
        engine_b.wait_arrivals(1, timeout=WAIT)  # two copies of R: both run at once
        engine_a.release()
        engine_b.release()
        _joined(*calls)
        assert errors == []


def test_a_model_needing_more_than_the_flag_gives_fails_to_load_and_the_others_serve(tmp_path, controls):
    _model(tmp_path, "greedy", '{ name: "R" count: 4 }')
    _model(tmp_path, "modest", '{ name: "R" count: 1 }')
    with _server(tmp_path, controls, rate_limit_resources=(ResourceFlag("R", 1),)) as running:
        status = running.server.registry.get("greedy").status()
        assert 'Resource count for "R" is limited to 1' in status.last_error
        assert "the minimum required count is 4" in status.last_error
        outputs = running.client.infer("modest", {"INPUT0": np.ones(4, "f")}, timeout=WAIT)
        np.testing.assert_array_equal(outputs["OUTPUT0"], np.ones(4, "f"))


def test_a_wait_for_resources_ends_at_the_deadline_naming_the_resource_and_loses_nothing(tmp_path, controls):
    _model(tmp_path, "a", '{ name: "GPU_MEM" count: 1 }')
    _model(tmp_path, "b", '{ name: "GPU_MEM" count: 1 }')
    with _server(tmp_path, controls) as running:
        limiter = running.server.runtime.rate_limiter
        assert limiter is not None
        engine = controls.gate("a", "execute").hold()
        errors: list[BaseException] = []
        holder = _call(running, "a", errors)
        engine.wait_arrivals(1, timeout=WAIT)
        refused: list[BaseException] = []
        # The server's deadline (the request's `timeout` parameter), well before the client's: a client deadline of
        # the same length raced the server's refusal on a loaded machine and won (DEADLINE_EXCEEDED, no words).
        _joined(_call(running, "b", refused, parameters={"timeout": 500_000}))
        assert len(refused) == 1
        message = str(refused[0])
        assert "GPU_MEM" in message and "model 'b'" in message, message
        assert limiter.queued() == 0
        assert running.server.registry.get("b").admission.statistics().active_slots == 0  # its slot went back
        engine.release()
        _joined(holder)
        assert errors == []
        outputs = running.client.infer("b", {"INPUT0": np.ones(4, "f")}, timeout=WAIT)  # b serves again
        np.testing.assert_array_equal(outputs["OUTPUT0"], np.ones(4, "f"))


@pytest.mark.parametrize("flag", ["--rate-limit-resource=R:x", "--rate-limit=sometimes"])
def test_bad_flags_are_refused_naming_the_value(flag, capsys):
    from service.process.flags import server_parser

    with pytest.raises(SystemExit):
        server_parser().parse_args([flag])
    assert flag.split("=", 1)[1] in capsys.readouterr().err


def test_an_ensemble_whose_parallel_steps_share_a_resource_of_one_runs_them_one_at_a_time(tmp_path, controls):
    from .ensembles.test_ensemble_cycles import ensemble, fan

    _model(tmp_path, "step", '{ name: "R" count: 1 }', slots=2)  # two slots, one copy of R
    ensemble(tmp_path, "both", [(m, i, {"OUTPUT0": o["OUTPUT0"]}) for m, i, o in fan("step", 2)])
    with _server(tmp_path, controls) as running:
        limiter = running.server.runtime.rate_limiter
        assert limiter is not None
        engine = controls.gate("step", "execute").hold()
        errors: list[BaseException] = []
        call = _call(running, "both", errors)
        engine.wait_arrivals(1, timeout=WAIT)
        assert _eventually(lambda: limiter.queued() == 1)  # the other step's slot waits for R, not for a slot
        assert running.server.registry.get("step").admission.statistics().active_slots == 2
        engine.release()
        _joined(call)
        assert errors == [] and engine.arrivals == 2


def test_check_reports_the_rate_limiter_block(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    _model(tmp_path, "limited", '{ name: "GPU_MEM" count: 2 }, { name: "R2" global: true count: 1 }')
    done = subprocess.run(
        [sys.executable, "-m", "service", "check", str(tmp_path), "--enable-test-backends", "--format", "json"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=WAIT * 2,
    )
    assert done.returncode == 0, done.stderr
    (model,) = json.loads(done.stdout)["models"]
    assert model["serves"] and model["refused"] == []
    assert model["rate_limiter"] == {
        "resources": [{"name": "GPU_MEM", "count": 2, "shared": False}, {"name": "R2", "count": 1, "shared": True}],
        "priority": 0,
    }
    text = subprocess.run(
        [sys.executable, "-m", "service", "check", str(tmp_path), "--enable-test-backends"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=WAIT * 2,
    ).stdout
    assert "rate limiter: each slot needs GPU_MEM x2, R2 x1 (global), priority 0" in text, text


def test_an_unloaded_model_no_longer_sets_the_default_availability(tmp_path, controls):
    _model(tmp_path, "big", '{ name: "R" count: 3 }')
    _model(tmp_path, "small", '{ name: "R" count: 1 }')
    with _server(tmp_path, controls, allow_management=True) as running:
        limiter = running.server.runtime.rate_limiter
        assert limiter is not None and limiter.available() == {"R": 3}
        running.management.unload("big")
        assert limiter.available() == {"R": 1}  # as Triton recomputes it when the instances go
        outputs = running.client.infer("small", {"INPUT0": np.ones(4, "f")}, timeout=WAIT)
        np.testing.assert_array_equal(outputs["OUTPUT0"], np.ones(4, "f"))
