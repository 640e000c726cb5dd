"""Ensemble cells (ENSEMBLE.nn, tests/contract/cells.tsv): what a manager's barrier on the ensemble or on a step
model, eviction, idle retirement and a draining shutdown do to ensemble requests that are running. A real
in-process server (tests/shutdown/harness.py InProcess) over fixture steps whose gates hold an ensemble request
inside a step; orders come from the gates and from observable states (queues, statuses, counters), never from
sleeps.

The ensemble `chain` runs X -> first -> a -> second -> Y (output = input at each step); a request held at
`first`'s execute is a running ensemble request that has not reached `second` yet.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.integration.ensembles.test_ensembles import F, write_ensemble
from tests.shutdown.harness import VALUES, InProcess, outcome, output_of, wait_until

cell = pytest.mark.cell

CHAIN = [("first", {"INPUT0": "X"}, {"OUTPUT0": "a"}), ("second", {"INPUT0": "a"}, {"OUTPUT0": "Y"})]


@pytest.fixture
def chain(tmp_path, frontends):
    """`chain(extra_models=(), **server options) -> InProcess` serving `chain` and its steps, through one front
    end and through two (`frontends`, tests/conftest.py)."""
    labs: list[InProcess] = []

    def start(extra_models=(), **options) -> InProcess:
        root = tmp_path / f"repository{len(labs)}"
        write_ensemble(root, "chain", [("X", F, [-1])], [("Y", F, [-1])], CHAIN)
        lab = InProcess(root, dict.fromkeys(("first", "second", *extra_models), {}), frontends=frontends, **options)
        labs.append(lab)
        return lab

    yield start
    for lab in labs:
        lab.close()


def ensemble_request(lab: InProcess):
    from tests.shutdown.harness import infer_request

    return lab.stub.ModelInfer.future(infer_request("chain", VALUES, name="X"), timeout=60)


def held_in_first_step(lab: InProcess):
    """An ensemble request inside step 0's run (held at its execute gate): (gate, the call's future)."""
    gate = lab.gate("first", "execute").hold()
    call = ensemble_request(lab)
    gate.wait_blocked(1, timeout=30)
    return gate, call


def answered(call) -> None:
    code, value = outcome(call)
    assert code == "OK", value
    np.testing.assert_array_equal(output_of(value), VALUES)


def registry_status(lab: InProcess, model: str):
    return lab.server.registry.get(model).status()


@cell("ENSEMBLE.01")
def test_a_reconfigure_of_the_ensemble_waits_for_its_running_requests_and_later_ones_queue_behind_it(chain):
    lab = chain(allow_management=True)
    gate, running = held_in_first_step(lab)
    reload = lab.call(lab.management.register, "chain", timeout=60)  # reconfigure: same files
    wait_until(lambda: registry_status(lab, "chain").queued_managers == 1, "the reconfigure queued on the ensemble")
    later = ensemble_request(lab)
    # queued_requests counts the manager and the request behind it
    wait_until(lambda: registry_status(lab, "chain").queued_requests == 2, "the later request queued behind it")
    assert not reload.done() and not later.done()
    gate.release()
    answered(running)
    reload.result(timeout=60)
    answered(later)
    assert registry_status(lab, "chain").state.value == "ready"


@cell("ENSEMBLE.02")
def test_an_unload_of_the_ensemble_waits_for_its_running_requests_and_leaves_its_steps_loaded(chain):
    lab = chain(allow_management=True, model_control_mode="explicit", load_models=("*",))
    gate, running = held_in_first_step(lab)
    unload = lab.call(lab.client.unload, "chain", timeout=60)
    wait_until(lambda: registry_status(lab, "chain").queued_managers == 1, "the unload queued on the ensemble")
    assert not unload.done() and registry_status(lab, "chain").loaded
    gate.release()
    answered(running)  # the request runs to its end, its second step included
    unload.result(timeout=60)
    assert not registry_status(lab, "chain").loaded
    assert registry_status(lab, "first").loaded and registry_status(lab, "second").loaded


@cell("ENSEMBLE.03")
def test_a_reconfigure_of_a_step_model_waits_for_the_step_running_on_it_and_the_ensemble_request_answers(chain):
    lab = chain(allow_management=True)
    gate, running = held_in_first_step(lab)
    reload = lab.call(lab.management.register, "first", timeout=60)
    wait_until(lambda: registry_status(lab, "first").queued_managers == 1, "the reconfigure queued on the step")
    assert not reload.done()
    gate.release()
    answered(running)
    reload.result(timeout=60)
    answered(ensemble_request(lab))  # the ensemble serves on the reconfigured step
    assert registry_status(lab, "chain").loaded


@cell("ENSEMBLE.04")
def test_an_unload_of_a_later_step_model_fails_the_running_request_there_and_unloads_the_ensemble_after_it(chain):
    # explicit mode: nothing loads the step again, so the running request's step on it is refused, by name.
    lab = chain(allow_management=True, model_control_mode="explicit", load_models=("*",))
    gate, running = held_in_first_step(lab)
    unload = lab.call(lab.client.unload, "second", timeout=60)
    wait_until(lambda: not registry_status(lab, "second").loaded, "the idle step model unloaded at once")
    # the ensemble's own unload (Triton's rule) waits for its running request
    wait_until(lambda: registry_status(lab, "chain").queued_managers == 1, "the ensemble's unload queued")
    assert not unload.done()
    gate.release()
    code, error = outcome(running)
    assert code == "UNAVAILABLE" and "ensemble 'chain': step 1 (model 'second')" in error.message
    unload.result(timeout=60)
    assert not registry_status(lab, "chain").loaded and registry_status(lab, "first").loaded
    assert not lab.client.model_ready("chain")


@cell("ENSEMBLE.05")
def test_eviction_skips_a_running_ensemble_and_its_running_step(chain):
    lab = chain(extra_models=("other",), max_resident_models=2, load_at_startup=False)
    answered(ensemble_request(lab))  # first and second resident: the limit (the ensemble holds no engine)
    assert lab.server.residency.resident_names() == ["first", "second"]
    gate, running = held_in_first_step(lab)
    code, error = outcome(lab.infer("other"))  # needs room; second is idle: it goes
    assert code == "OK", error
    assert not registry_status(lab, "second").loaded and registry_status(lab, "first").loaded
    assert registry_status(lab, "chain").loaded
    code, error = outcome(lab.infer("second"))  # needs room: other is idle and goes; chain and first are busy
    assert code == "OK", error
    counts = lab.server.runtime.events.counts()
    assert ("evicted", "chain") not in counts and ("evicted", "first") not in counts
    gate.release()
    answered(running)


@cell("ENSEMBLE.06")
def test_idle_retirement_skips_a_running_ensemble_and_retires_it_once_idle(chain):
    lab = chain(idle_unload=1.0)
    reaper = lab.server.residency.reaper
    gate, running = held_in_first_step(lab)
    checks = reaper.checks
    # the step model 'second' is idle (the request has not reached it) and may go; the ensemble and 'first' stay
    wait_until(lambda: reaper.checks >= checks + 2, "the reaper examined the models", timeout=30)
    wait_until(lambda: not registry_status(lab, "second").loaded, "the idle step retired", timeout=30)
    assert registry_status(lab, "chain").loaded and registry_status(lab, "first").loaded
    gate.release()
    answered(running)  # its next step loaded 'second' again
    assert lab.server.runtime.events.counts()[("loaded", "second")] == 2
    wait_until(lambda: not registry_status(lab, "chain").loaded, "the ensemble retired once idle", timeout=30)


@cell("ENSEMBLE.07")
def test_a_draining_shutdown_lets_a_running_ensemble_request_finish_its_steps_within_the_grace(chain):
    lab = chain()
    gate, running = held_in_first_step(lab)
    shutdown = lab.shutdown(grace=30.0)
    wait_until(lambda: not lab.server.state.ready, "the shutdown under way")
    gate.release()
    answered(running)  # its later step ran during the shutdown
    shutdown.result()


@cell("ENSEMBLE.07")
def test_at_the_end_of_the_grace_the_running_step_is_cancelled_and_the_request_gets_shutting_down(chain):
    lab = chain()
    gate, running = held_in_first_step(lab)
    shutdown = lab.shutdown(grace=1.0)
    code, error = outcome(running)
    assert code == "UNAVAILABLE" and error.reason == "shutting_down", (code, error)
    shutdown.result()
    assert gate.blocked == 0  # the held step stopped waiting: its run was cancelled
