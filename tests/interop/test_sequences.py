"""Stock tritonclient's sequence API from a separate process (clients/sequence_cases.py) against slotserve serving
the accumulator with implicit state (tests/sequence_builders.py): three interleaved sequences (two number ids, one
string id) over ModelInfer and over ModelStreamInfer (sync and aio clients), each getting its own running sums;
the refusals in Triton's words."""

from __future__ import annotations

import pytest

from tests.sequence_builders import expected_sums, write_accumulate

pytestmark = pytest.mark.interop

VALUES = {"1001": [1, 2, 3, 4], "1002": [10, 20, 30, 40], "seq-a": [100, 200, 300, 400]}


def test_tritonclient_drives_interleaved_sequences_unary_and_streamed(slotserve, run_client, tmp_path):
    write_accumulate(tmp_path / "models", "accumulate", slots=3)
    server = slotserve(tmp_path / "models", parallel_jobs=3)
    result = run_client("sequence_cases.py", server.address, "accumulate")
    want = {sequence_id: expected_sums(values) for sequence_id, values in VALUES.items()}
    assert result["unary"] == want
    assert result["stream"]["sums"] == want
    assert result["aio_stream"] == want
    # One stream answers in request order: round-robin over the three sequences.
    assert result["stream"]["ids"] == [f"{s}-{i}" for i in range(4) for s in VALUES]
    assert result["no_id"][0] == "StatusCode.INVALID_ARGUMENT"
    assert "must specify a non-zero or non-empty correlation ID" in result["no_id"][1]
    assert result["not_started"][0] == "StatusCode.INVALID_ARGUMENT"
    assert "sequence 555 to model 'accumulate' must specify the START flag" in result["not_started"][1]
