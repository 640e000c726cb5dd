"""BLS flows (python models calling other models) driven by stock tritonclient from a separate process
(clients/bls_cases.py), on a real server of tests/python_models/repository."""

from __future__ import annotations

import pytest

from tests.python_models import REPOSITORY

pytestmark = pytest.mark.interop

SCRIPT = "bls_cases.py"


@pytest.fixture(scope="module")
def server():
    from service.testing import serve

    with serve(REPOSITORY, parallel_jobs=2) as running:
        yield running


def test_bls_calls_answer_through_exec_threads_and_a_decoupled_callee(server, run_client):
    result = run_client(SCRIPT, server.address, "calls")  # the client asserts add_sub's values
    assert result["several"] == [{"OUTPUT0": [k + 1, k + 2], "OUTPUT1": [k - 1, k - 2]} for k in range(3)]
    assert result["stream"] == [[0], [1], [2], {}] and result["stream_none"] == [{}]


def test_callee_failures_reach_the_caller_as_error_responses_with_codes(server, run_client):
    result = run_client(SCRIPT, server.address, "errors")
    codes = {case: (answer[0] if case == "stream_error" else answer)["error"][0] for case, answer in result.items()}
    assert codes == {
        "unknown": 2,
        "bad_input": 3,
        "callee_error": 3,
        "callee_unavailable": 4,
        "callee_raise": 1,
        "stream_error": 3,
    }


def test_request_id_and_parameters_reach_the_model(server, run_client):
    result = run_client(SCRIPT, server.address, "info")
    assert result["client"] == {
        "request_id": "req-7",
        "parameters": {"key": "value", "count": 3, "flag": True},
        "correlation_id": 0,
        "flags": 0,
    }
    assert result["sequence"] == {"request_id": "seq", "parameters": {}, "correlation_id": 42, "flags": 1}
    assert result["forward"]["request_id"] == "inner-req-8" and result["forward"]["correlation_id"] == 77


def test_async_execute_awaits_async_exec_calls(server, run_client):
    assert run_client(SCRIPT, server.address, "async") == {"SUM": [8, 10, 12], "DIFF": [3, 4, 5], "STREAM": [0, 1, 2]}
