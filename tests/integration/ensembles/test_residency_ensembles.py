"""Residency with ensembles (issue 35, item 5): an ensemble holds no engine (its steps are models of their own),
so it is never counted under --max-resident-models or --memory-budget, never evicts its own steps, and is never
a victim. `--max-resident-models 2` with a two-step ensemble once made 3 requests cause 6 evictions and reloads
(the ensemble, busy during its own request, counted as the third resident model, so its two steps evicted each
other at every call), and a step was evicted at startup to make room for the ensemble itself."""

from __future__ import annotations

import numpy as np

from engine.testing.fixture import FixtureBackend
from service.testing import serve

from .test_ensembles import F, fixture_repository, write_ensemble

TWO_STEPS = [("first", {"INPUT0": "X"}, {"OUTPUT0": "t"}), ("second", {"INPUT0": "t"}, {"OUTPUT0": "Y"})]


def _events(running, event: str) -> int:
    return sum(count for (name, _model), count in running.server.runtime.events.counts().items() if name == event)


def test_a_two_step_ensemble_under_a_limit_of_two_evicts_nothing(tmp_path, controls):
    fixture_repository(tmp_path, "first", "second")
    write_ensemble(tmp_path, "pipeline", [("X", F, [-1])], [("Y", F, [-1])], TWO_STEPS)
    with serve(tmp_path, backends={"fixture": FixtureBackend(controls)}, max_resident_models=2) as running:
        assert running.server.residency.evictions == 0  # the startup loads: no step made room for the ensemble
        for value in (1.0, 2.0, 3.0):
            outputs = running.client.infer("pipeline", {"X": np.full(2, value, np.float32)})
            np.testing.assert_array_equal(outputs["Y"], [value, value])
        assert running.server.residency.evictions == 0
        assert _events(running, "evicted") == 0
        assert controls.count("first", "load") == 1 and controls.count("second", "load") == 1
        assert running.server.residency.resident_names() == ["first", "second"]  # the ensemble is not counted


def test_the_steps_of_an_ensemble_are_still_evicted_for_another_model(tmp_path, controls):
    """Not counting the ensemble changes nothing for the others: a third model evicts the least recently used
    step (the ensemble stays ready, and the step's next call loads it again)."""
    fixture_repository(tmp_path, "first", "second", "other")
    write_ensemble(tmp_path, "pipeline", [("X", F, [-1])], [("Y", F, [-1])], TWO_STEPS)
    with serve(
        tmp_path, backends={"fixture": FixtureBackend(controls)}, max_resident_models=2, load_at_startup=False
    ) as running:
        running.client.infer("pipeline", {"X": np.ones(1, np.float32)})
        running.client.infer("other", {"INPUT0": np.ones(1, np.float32)})
        assert running.server.runtime.events.counts().get(("evicted", "first")) == 1
        assert running.server.residency.resident_names() == ["other", "second"]
        assert running.client.model_ready("pipeline")
        np.testing.assert_array_equal(running.client.infer("pipeline", {"X": np.full(1, 5, np.float32)})["Y"], [5])
