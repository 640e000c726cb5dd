"""tritonclient[grpc] against a server of tests/python_models/repository (slotserve, or real Triton), in its own
process: the BLS models `bls` and `bls_async` and what a request's id and parameters look like to a model.

    python bls_cases.py HOST:PORT CASE

Each case asserts what a correct answer must be and prints one JSON object as the last line of stdout (the BLS
tests of tests/python_models/ and tests/differential/test_bls.py check and compare it).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def bls(client, mode: str, arg: dict | None = None, **kwargs):
    """The JSON the `bls` model answered, or [status, message] of a failure."""
    inputs = [grpcclient.InferInput("MODE", [1], "BYTES"), grpcclient.InferInput("ARG", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([mode.encode()], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([json.dumps(arg or {}).encode()], dtype=np.object_))
    try:
        result = client.infer("bls", inputs, **kwargs)
    except InferenceServerException as error:
        return [str(error.status()).replace("StatusCode.", ""), error.message()]
    return json.loads(result.as_numpy("TEXT")[0])


def case_calls(client) -> dict:
    """Every BLS call the `bls` model makes, and what comes back."""
    a, b = [5, -3, 100], [2, 2, 2]
    answers = {
        "add_sub": bls(client, "add_sub", {"a": a, "b": b}),
        "several": bls(client, "several"),
        "thread": bls(client, "thread", {"a": a, "b": b}),
        "stream": bls(client, "stream", {"n": 3}),
        "stream_none": bls(client, "stream", {"n": 0}),
        # one response (the callee's pid) sent with the final flag: how many the iterator gives (no empty one after)
        "stream_final": len(bls(client, "stream", {"n": 997})),
    }
    assert answers["add_sub"] == {"OUTPUT0": [7, -1, 102], "OUTPUT1": [3, -5, 98]}, answers
    assert answers["thread"] == answers["add_sub"], answers
    return answers


def case_errors(client) -> dict:
    """A callee's failures, as the caller's has_error()/error() show them: [code, message]."""
    answers = {
        "unknown": bls(client, "unknown"),
        "bad_input": bls(client, "bad_input"),
        "callee_error": bls(client, "callee_error", {"code": "INVALID_ARG"}),
        "callee_unavailable": bls(client, "callee_error", {"code": "UNAVAILABLE"}),
        "callee_raise": bls(client, "callee_raise"),
        "stream_error": bls(client, "stream", {"n": -1}),
    }
    for case, answer in answers.items():
        errors = answer if case == "stream_error" else [answer]
        assert all("error" in item for item in errors if isinstance(item, dict)), (case, answer)
    return answers


def case_info(client) -> dict:
    """request_id(), parameters(), correlation_id() and flags() as the model sees them, from a client's request and
    from a BLS call."""
    parameters = {"key": "value", "count": 3, "flag": True}
    return {
        "plain": bls(client, "info"),
        "client": bls(client, "info", request_id="req-7", parameters=parameters),
        "sequence": bls(client, "info", request_id="seq", sequence_id=42, sequence_start=True),
        "forward": bls(client, "forward", request_id="req-8"),
    }


def case_async(client) -> dict:
    """The `async def execute` model awaiting async_exec calls (two at once, then a decoupled one)."""
    a = np.array([4, 5, 6], dtype=np.int32)
    entry = grpcclient.InferInput("A", [3], "INT32")
    entry.set_data_from_numpy(a)
    result = client.infer("bls_async", [entry])
    answer = {name: result.as_numpy(name).tolist() for name in ("SUM", "DIFF", "STREAM")}
    assert answer == {"SUM": [8, 10, 12], "DIFF": [3, 4, 5], "STREAM": [0, 1, 2]}, answer
    return answer


def main(argv: list[str]) -> int:
    address, case, *args = argv[1:]
    with grpcclient.InferenceServerClient(address) as client:
        result = globals()[f"case_{case}"](client, *args)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
