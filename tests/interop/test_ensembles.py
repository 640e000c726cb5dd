"""An ensemble of python steps (tests/ensemble_models.py) called by stock tritonclient from a separate process
(clients/ensemble_cases.py): outputs against numpy, and the ensemble and its steps in the index, metadata,
config and statistics."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ensemble_models import STEPS, expected, write_python_pipeline

pytestmark = pytest.mark.interop


def test_tritonclient_calls_an_ensemble_of_python_steps(slotserve, run_client, tmp_path):
    server = slotserve(write_python_pipeline(tmp_path))
    result = run_client("ensemble_cases.py", server.address, "pipeline")
    for x, answer in zip(result["inputs"], result["answers"], strict=True):
        want = expected(np.asarray(x, dtype=np.float32))
        assert sorted(answer) == ["A", "Y"]
        np.testing.assert_allclose(answer["Y"], want["Y"])
        np.testing.assert_allclose(answer["A"], want["A"])
    assert result["wrong_type"] == "INVALID_ARGUMENT"
    assert result["metadata"] == {
        "platform": "ensemble",
        "inputs": [["X", "FP32", ["-1"]]],
        "outputs": [["Y", "FP32", ["-1"]], ["A", "FP32", ["-1"]]],
    }
    assert result["config_platform"] == "ensemble" and result["config_steps"] == list(STEPS)
    assert result["index"] == sorted([name, "READY", "1"] for name in ("pipeline", *STEPS))
    stats = result["statistics"]
    assert stats["pipeline"] == {"inference_count": 2, "execution_count": 2, "success": 2, "fail": 1}
    for step in STEPS:  # each step ran once per answered ensemble call, through its own model's path
        assert stats[step] == {"inference_count": 2, "execution_count": 2, "success": 2, "fail": 0}, step
    assert run_client("ensemble_cases.py", server.address, "subset") == {"only_y": ["Y"]}
