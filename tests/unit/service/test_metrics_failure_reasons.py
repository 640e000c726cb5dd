"""Every outcome has Triton's failure reason (service/metrics.py TRITON_REASON_OF): a new error reason must say which
of BACKEND, REJECTED, CANCELED or OTHER Triton's dashboards show it as (issue 35, item 3: python models' failures
fell through to OTHER)."""

from __future__ import annotations

from collections import Counter

import pytest

from service.core.outcomes import FAILED
from service.core.statistics import StatisticsSnapshot
from service.metrics import TRITON_FAILURE_REASONS, TRITON_REASON_OF, triton_failures
from service.status_codes import TABLE


def test_every_reason_a_request_can_end_with_has_a_triton_reason():
    assert set(TABLE) | {FAILED} <= set(TRITON_REASON_OF), sorted(set(TABLE) | {FAILED} - set(TRITON_REASON_OF))
    assert set(TRITON_REASON_OF.values()) <= set(TRITON_FAILURE_REASONS)


@pytest.mark.parametrize(
    "outcome, reason",
    [
        ("model_error", "BACKEND"),
        ("model_error_invalid_argument", "BACKEND"),
        ("device_failed", "BACKEND"),
        (FAILED, "BACKEND"),
        ("cancelled", "CANCELED"),
        ("server_busy", "REJECTED"),
        ("tensor_memory_limit", "REJECTED"),
        ("invalid_request_error", "OTHER"),
        ("a_reason_nobody_mapped", "OTHER"),
    ],
)
def test_an_outcome_counts_under_its_triton_reason(outcome, reason):
    snapshot = _snapshot(Counter({outcome: 3}))
    assert triton_failures(snapshot) == {**dict.fromkeys(TRITON_FAILURE_REASONS, 0), reason: 3}


def test_an_ensembles_backend_failure_is_other_as_tritons_ensemble_scheduler_says():
    snapshot = _snapshot(Counter({"model_error": 2, "cancelled": 1, "server_busy": 1}))
    assert triton_failures(snapshot, "ensemble") == {"BACKEND": 0, "OTHER": 2, "CANCELED": 1, "REJECTED": 1}


def _snapshot(failures: Counter) -> StatisticsSnapshot:
    class Snapshot:  # triton_failures reads only `failures`
        pass

    snapshot = Snapshot()
    snapshot.failures = dict(failures)  # type: ignore[attr-defined]
    return snapshot  # type: ignore[return-value]
