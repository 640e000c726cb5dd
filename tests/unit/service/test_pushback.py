"""service/transport/status_codes.py's retry hint: which errors carry `grpc-retry-pushback-ms`, with what value, and
that the status a call ends with keeps its details beside it."""

from __future__ import annotations

import grpc
import pytest

from service.core import errors
from service.transport import status_codes
from service.transport.tensor_memory import TensorMemoryLimit


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (errors.QueueFull("full"), "100"),  # server_busy's default (the dataplane sets a model's own when it knows it)
        (errors.ServerBusy("handlers"), "100"),
        (errors.ResidencyLimit("no room"), "1000"),
        (errors.MemoryLimit("budget"), "1000"),
        (TensorMemoryLimit("in flight"), "100"),
        (errors.ShuttingDown("stopping"), "1000"),
        (errors.WaitExceedsDeadline("too late"), "-1"),
        (errors.never_retried(errors.MemoryLimit("larger than the budget")), "-1"),
    ],
)
def test_every_overload_refusal_has_a_hint(error, expected):
    assert str(status_codes.pushback_ms(error)) == expected


@pytest.mark.parametrize(
    "error",
    [errors.InvalidRequest("bad"), errors.ModelNotFound("m"), errors.RequestCancelled("gone"), RuntimeError("bug")],
)
def test_other_errors_have_none(error):
    assert status_codes.pushback_ms(error) is None


def test_a_computed_hint_wins_and_is_a_signed_32_bit_count_of_milliseconds():
    error = errors.AdmissionTimeout("late")
    error.retry_after = 0.2504
    assert status_codes.pushback_ms(error) == 250
    error.retry_after = 1e12
    assert status_codes.pushback_ms(error) == 2**31 - 1


def test_the_status_keeps_its_details_beside_the_hint():
    status = status_codes.rich_status(grpc.StatusCode.UNAVAILABLE, "busy", "server_busy", 250)
    keys = [key for key, _ in status.trailing_metadata]
    assert (status.code, status.details) == (grpc.StatusCode.UNAVAILABLE, "busy")
    assert keys == ["grpc-status-details-bin", "grpc-retry-pushback-ms"]
    assert dict(status.trailing_metadata)["grpc-retry-pushback-ms"] == "250"
    plain = status_codes.rich_status(grpc.StatusCode.INVALID_ARGUMENT, "bad", "invalid_request_error")
    assert [key for key, _ in plain.trailing_metadata] == ["grpc-status-details-bin"]
