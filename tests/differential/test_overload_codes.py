"""The status codes of overload refusals, asked of real Triton 2.51 and of slotserve (issue 38, "Overload contract"):
the same python models on both, a full queue and a queue timeout, and the trailers each server sends with them.

Triton's answers, kept here so that a change shows:

| the request | Triton 2.51 | slotserve |
|---|---|---|
| its queue is full (`max_queue_size`) | UNAVAILABLE, "[request id: ...] Exceeds maximum queue size" | UNAVAILABLE |
| its queue policy's timeout passes | UNAVAILABLE, "[request id: ...] Request timeout expired" | UNAVAILABLE |
| the retry hint `grpc-retry-pushback-ms` | never sent | sent with both (docs/errors.md, "Overload") |

slotserve keeps Triton's codes; the hint is an addition a Triton client ignores.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc
import pytest

from .calls import CALL_TIMEOUT
from .conftest import INSTALLATION, MISSING_REASON, _start_slotserve, _start_triton
from .test_failure_reasons import BODIES, CONFIG, HEAD, INIT, pending, request

WAIT = 60.0  # a loaded machine; the gates open within milliseconds otherwise
MODELS = {  # model -> dynamic batching's queue policy
    "full": "dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
    "timed": "dynamic_batching { default_queue_policy { default_timeout_microseconds: 300000 } }",
}
PUSHBACK = "grpc-retry-pushback-ms"


def write_repository(root: Path, gates: Path) -> Path:
    """Gated python models (tests/differential/test_failure_reasons.py's): each tells the test it runs, then waits
    for the release file."""
    repository = root / "models"
    for name, extra in MODELS.items():
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(CONFIG.format(name=name, max_batch_size=1, extra=extra))
        code = HEAD.format(gates=str(gates)).replace("class TritonPythonModel:\n", "class TritonPythonModel:\n" + INIT)
        (repository / name / "1" / "model.py").write_text(code + BODIES["gated"])
    return repository


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(triton, slotserve, gates folder) on the same python repository, started once for the module."""
    if INSTALLATION is None:
        pytest.skip(MISSING_REASON)
    root = tmp_path_factory.mktemp("overload-codes")
    gates = root / "gates"
    gates.mkdir()
    repository = write_repository(root, gates)
    with ExitStack() as stack:
        triton = _start_triton(stack, root / "triton-run", repository)
        ours = _start_slotserve(stack, repository)
        yield (triton, ours), gates


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # ordering-free: polls an observable state until a deadline


def refusal(stub, model: str) -> tuple[str, str, dict[str, str]]:
    """(code name, details, trailing metadata) of a call that must fail."""
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request(model, batched=True), timeout=CALL_TIMEOUT)
    error: Any = caught.value  # a grpc.Call too (its stubs type RpcError alone)
    trailers = {key: value for key, value in error.trailing_metadata() or () if isinstance(value, str)}
    return error.code().name, error.details(), trailers


def run_behind_a_running_request(servers, model: str, queued_before_refusal: int):
    """For each server: a first request runs (held at its gate), `queued_before_refusal` more wait in the queue,
    then one more is refused; returns {server: (code, details, trailers)} of that one."""
    (triton, ours), gates = servers
    answers = {}
    for endpoint in (triton, ours):
        (gates / "release").unlink(missing_ok=True)
        (gates / model).unlink(missing_ok=True)
        running = [endpoint.stub.ModelInfer.future(request(model, batched=True), timeout=CALL_TIMEOUT)]
        wait_for((gates / model).exists, f"{endpoint.name}'s first request to run")
        for count in range(1, queued_before_refusal + 1):
            running.append(endpoint.stub.ModelInfer.future(request(model, batched=True), timeout=CALL_TIMEOUT))
            wait_for(lambda endpoint=endpoint, count=count: pending(endpoint, model) == count, "the queued request")
        try:
            answers[endpoint.name] = refusal(endpoint.stub, model)
        finally:
            (gates / "release").touch()
            for call in running:
                call.result(timeout=CALL_TIMEOUT)
    return answers


def test_a_full_queue_is_unavailable_on_both_and_only_slotserve_sends_a_retry_hint(servers):
    answers = run_behind_a_running_request(servers, "full", queued_before_refusal=1)
    their_code, their_details, their_trailers = answers["triton"]
    assert their_code == "UNAVAILABLE" and their_details.endswith("Exceeds maximum queue size")  # Triton's answer
    assert PUSHBACK not in their_trailers
    our_code, our_details, our_trailers = answers["slotserve"]
    assert our_code == "UNAVAILABLE" and "queue of model 'full' is full" in our_details
    assert int(our_trailers[PUSHBACK]) > 0


def test_a_queue_timeout_is_unavailable_on_both_and_only_slotserve_sends_a_retry_hint(servers):
    answers = run_behind_a_running_request(servers, "timed", queued_before_refusal=0)
    their_code, their_details, their_trailers = answers["triton"]
    assert their_code == "UNAVAILABLE" and their_details.endswith("Request timeout expired")  # Triton's answer
    assert PUSHBACK not in their_trailers
    our_code, our_details, our_trailers = answers["slotserve"]
    assert our_code == "UNAVAILABLE" and "before the admission deadline" in our_details
    assert int(our_trailers[PUSHBACK]) > 0
