"""The same ensemble of python steps (tests/ensemble_models.py) on slotserve and on real Triton 2.51: the same
tritonclient calls (tests/interop/clients/ensemble_cases.py) get the same outputs, status codes, metadata, index
entries and success counts. Skips, naming the reason, without the reference (tests/differential/README.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.ensemble_models import STEPS, expected, write_python_pipeline
from tests.interop.support import last_json_line, run_process

CLIENT = Path(__file__).resolve().parents[1] / "interop" / "clients" / "ensemble_cases.py"

pytestmark = pytest.mark.interop


def run_case(address: str, case: str = "pipeline") -> dict:
    completed = run_process([sys.executable, str(CLIENT), address, case], timeout=300)
    assert completed.returncode == 0, completed.stderr
    return last_json_line(completed)


def test_an_ensemble_of_python_steps_answers_as_triton_does(triton, slotserve_endpoint, tmp_path):
    repository = write_python_pipeline(tmp_path / "models")
    triton_address, our_address = triton(repository).address, slotserve_endpoint(repository).address
    reference, ours = run_case(triton_address), run_case(our_address)
    for x, answer in zip(reference["inputs"], reference["answers"], strict=True):  # Triton is the reference
        np.testing.assert_allclose(answer["Y"], expected(np.asarray(x, dtype=np.float32))["Y"])
    for key in ("answers", "wrong_type", "metadata", "config_platform", "config_steps", "index"):
        assert ours[key] == reference[key], key
    # The counts of the ensemble and of each step agree: inference and execution counts, successes, failures;
    # except that the request refused for its datatype is a failure of the ensemble on slotserve and none on
    # Triton: the difference test_statistics.py's test_failed_request_counted_as_triton_counts_it keeps (xfail)
    # for every model. Neither counts it against a step.
    assert ours["statistics"]["pipeline"] == {"inference_count": 2, "execution_count": 2, "success": 2, "fail": 1}
    assert reference["statistics"]["pipeline"] == {**ours["statistics"]["pipeline"], "fail": 0}
    for step in STEPS:
        assert ours["statistics"][step] == reference["statistics"][step], step


def test_a_request_for_some_of_the_outputs_is_answered_where_triton_reports_a_deadlock(
    triton, slotserve_endpoint, tmp_path
):
    repository = write_python_pipeline(tmp_path / "models")
    reference = run_case(triton(repository).address, "subset")
    ours = run_case(slotserve_endpoint(repository).address, "subset")
    # Triton 2.51 refuses a request for a subset of this ensemble's outputs ("unexpected deadlock, at least one
    # output is not set"); slotserve runs every step and answers the outputs asked for.
    assert reference["only_y"][0] == "INVALID_ARGUMENT" and "unexpected deadlock" in reference["only_y"][1]
    assert ours["only_y"] == ["Y"]


def test_a_step_model_unloaded_unloads_the_ensemble_and_its_reload_loads_it_as_on_triton(
    triton, slotserve_endpoint, tmp_path
):
    repository = write_python_pipeline(tmp_path / "models")
    explicit = ("--model-control-mode=explicit", "--load-model=*")
    reference = run_case(triton(repository, *explicit).address, "step_unloaded")
    ours = run_case(
        slotserve_endpoint(repository, model_control_mode="explicit", load_models=("*",)).address, "step_unloaded"
    )

    def pipeline(seen: dict) -> list:
        return next(entry for entry in seen["index"] if entry[0] == "pipeline")

    assert pipeline(reference["unloaded"]) == ["pipeline", "UNAVAILABLE", "unloaded"]
    assert pipeline(ours["unloaded"]) == pipeline(reference["unloaded"])
    assert ours["unloaded"]["ready"] is reference["unloaded"]["ready"] is False
    # The call to the unloaded ensemble: Triton answers NOT_FOUND, slotserve UNAVAILABLE (model_not_loaded), as for
    # any model unloaded in explicit mode.
    assert reference["unloaded"]["call"][0] == "NOT_FOUND" and ours["unloaded"]["call"][0] == "UNAVAILABLE"
    assert ours["reloaded"] == reference["reloaded"]
    assert ours["reloaded"]["call"] == ["A", "Y"] and ours["reloaded"]["ready"] is True


def test_a_step_model_that_failed_to_load_leaves_the_ensemble_unavailable_until_it_loads_as_on_triton(
    triton, slotserve_endpoint, tmp_path
):
    repository = write_python_pipeline(tmp_path / "models", broken_square=True)
    flags = ("--model-control-mode=explicit", "--load-model=*", "--exit-on-error=false", "--strict-readiness=false")
    reference = run_case(triton(repository, *flags).address, "step_failed")
    ours = run_case(
        slotserve_endpoint(repository, model_control_mode="explicit", load_models=("*",)).address, "step_failed"
    )

    def entry(seen: dict, name: str) -> list:
        return next(found for found in seen["index"] if found[0] == name)

    # Both: the step UNAVAILABLE with its error, the ensemble not ready, a call refused; the step loaded again
    # (a load with a working model.py) loads the ensemble again.
    for seen in (reference["failed"], ours["failed"]):
        state, reason = entry(seen, "square")[1:]
        assert state == "UNAVAILABLE" and "square is broken" in reason
        assert seen["ready"] is False
    assert ours["reloaded"] == reference["reloaded"]
    assert ours["reloaded"]["call"] == ["A", "Y"] and ours["reloaded"]["ready"] is True
    # The differences: Triton never tries the ensemble (listed with no state and no reason; a call is NOT_FOUND);
    # slotserve lists it UNAVAILABLE naming the failed step, and a call is UNAVAILABLE (not loaded, explicit mode).
    assert entry(reference["failed"], "pipeline") == ["pipeline", "", ""]
    state, reason = entry(ours["failed"], "pipeline")[1:]
    assert state == "UNAVAILABLE" and reason.startswith("ensemble 'pipeline': step 1 (model 'square') failed: ")
    assert reference["failed"]["call"][0] == "NOT_FOUND" and ours["failed"]["call"][0] == "UNAVAILABLE"


def test_loading_an_ensemble_in_explicit_mode_loads_its_steps_and_unloading_it_leaves_them_as_on_triton(
    triton, slotserve_endpoint, tmp_path
):
    repository = write_python_pipeline(tmp_path / "models")
    reference = run_case(triton(repository, "--model-control-mode=explicit").address, "explicit_load")
    ours = run_case(slotserve_endpoint(repository, model_control_mode="explicit").address, "explicit_load")
    assert reference["loaded"]["index"] == [[name, "READY"] for name in ("add3", "combine", "pipeline", "square")]
    assert reference["unloaded"] == [
        ["add3", "READY"],
        ["combine", "READY"],
        ["pipeline", "UNAVAILABLE"],
        ["square", "READY"],
    ]
    assert ours["loaded"] == reference["loaded"] and ours["unloaded"] == reference["unloaded"]
    # Before any load Triton lists the models with no state, slotserve UNAVAILABLE (registered, not loaded).
    assert {state for _, state in reference["before"]} == {""}
    assert {state for _, state in ours["before"]} == {"UNAVAILABLE"}
