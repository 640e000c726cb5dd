"""`nv_inference_request_failure{reason=...}` asked of real Triton 2.51 and of slotserve (issue 35, item 3): the same
python models on both, one way of failing per model, then both metrics pages compared.

Triton's answers, kept here so that a change shows (its core reports a backend's failed execution as BACKEND, an
ensemble's as OTHER, a queue timeout as REJECTED, a request cancelled in the queue as CANCELED):

| the request | Triton 2.51 | slotserve |
|---|---|---|
| execute raises | BACKEND | BACKEND |
| the worker (Triton's stub) dies | BACKEND | BACKEND |
| an ensemble whose step raises | OTHER on the ensemble (counted twice), BACKEND on the step | OTHER once, BACKEND |
| its queue policy's timeout passes | REJECTED | REJECTED |
| cancelled by its client while queued | CANCELED | CANCELED |
| a string output where the config says a number | a success (not checked) | BACKEND (INTERNAL naming it) |
| a response carrying a TritonError | a success | BACKEND (the client got an error) |
| refused by input validation | not counted | OTHER (counted in ModelStatistics too) |

The last three are slotserve's deliberate differences (docs/operations.md, "Metrics"): a client that got an error is
never counted as a success, and a failure the model caused is the backend's.
"""

from __future__ import annotations

import re
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest

from generated import grpc_service_pb2 as pb

from .calls import CALL_TIMEOUT, outcome
from .conftest import INSTALLATION, MISSING_REASON, _start_slotserve, _start_triton

WAIT = 60.0  # a loaded machine; the gates below open within milliseconds otherwise
CONFIG = """name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
{extra}
"""
HEAD = """import os
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

GATES = Path({gates!r})


def echo(request):
    values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", values)])


def responses(requests, make):
    return [make() for _ in requests]


class TritonPythonModel:
    def execute(self, requests):
"""
BODIES = {
    "raises": "        raise RuntimeError('execute failed on purpose')\n",
    "dies": "        os._exit(3)\n",
    "wrong_dtype": (
        "        wrong = pb_utils.Tensor('OUTPUT0', np.array([b'a', b'b', b'c'], dtype=np.object_))\n"
        "        return responses(requests, lambda: pb_utils.InferenceResponse([wrong]))\n"
    ),
    "error_response": (
        "        error = pb_utils.TritonError('refused on purpose')\n"
        "        return responses(requests, lambda: pb_utils.InferenceResponse(error=error))\n"
    ),
    # Gated: tells the test it runs (a file named after the model), then waits until the test releases it.
    "gated": (
        "        (GATES / self.name).touch()\n"
        "        deadline = time.monotonic() + 120\n"
        "        while not (GATES / 'release').exists() and time.monotonic() < deadline:\n"
        "            time.sleep(0.01)  # ordering-free: polls the release file until a deadline\n"
        "        return [echo(r) for r in requests]\n"
    ),
}
MODELS = {  # model -> (body, max_batch_size, extra config)
    "raises": ("raises", 0, ""),
    "dies": ("dies", 0, ""),
    "wrong_dtype": ("wrong_dtype", 0, ""),
    "error_response": ("error_response", 0, ""),
    "timed": ("gated", 1, "dynamic_batching { default_queue_policy { default_timeout_microseconds: 500000 } }"),
    # A queue policy: Triton counts a request cancelled in the queue (CANCELED) only when its queue applies one; with
    # a bare `dynamic_batching { }` the cancelled request leaves no count at all (asked of Triton 2.51).
    "queued": ("gated", 1, "dynamic_batching { default_queue_policy { max_queue_size: 4 } }"),
}
INIT = "    def initialize(self, args):\n        self.name = args['model_name']\n\n"
ENSEMBLE = """name: "ensemble"
platform: "ensemble"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [ { model_name: "raises" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }
"""


def write_repository(root: Path, gates: Path) -> Path:
    repository = root / "models"
    for name, (body, max_batch_size, extra) in MODELS.items():
        (repository / name / "1").mkdir(parents=True)
        config = CONFIG.format(name=name, max_batch_size=max_batch_size, extra=extra)
        (repository / name / "config.pbtxt").write_text(config)
        code = HEAD.format(gates=str(gates)).replace("class TritonPythonModel:\n", "class TritonPythonModel:\n" + INIT)
        (repository / name / "1" / "model.py").write_text(code + BODIES[body])
    (repository / "ensemble" / "1").mkdir(parents=True)
    (repository / "ensemble" / "config.pbtxt").write_text(ENSEMBLE)
    return repository


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(triton, slotserve, gates folder) on the same python repository, started once for the module."""
    if INSTALLATION is None:
        pytest.skip(MISSING_REASON)
    root = tmp_path_factory.mktemp("failure-reasons")
    gates = root / "gates"
    gates.mkdir()
    repository = write_repository(root, gates)
    with ExitStack() as stack:
        # --log-verbose=1: Triton logs "Issuing cancellation" once its core has the cancel (see the cancel test)
        triton = _start_triton(stack, root / "triton-run", repository, "--log-verbose=1")
        ours = _start_slotserve(stack, repository)
        yield (triton, ours), gates


def triton_log(gates: Path) -> str:
    return "".join(
        path.read_text(errors="replace") for path in (gates.parent / "triton-run").glob("tritonserver-*.log")
    )


def request(model: str, batched: bool = False, datatype: str = "FP32") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name="INPUT0", datatype=datatype, shape=[1, 3] if batched else [3])
    dtype = np.float32 if datatype == "FP32" else np.int32
    message.raw_input_contents.append(np.arange(3, dtype=dtype).tobytes())
    return message


def scrape(endpoint) -> str:
    with urllib.request.urlopen(endpoint.metrics_url, timeout=WAIT) as response:
        return response.read().decode()


def failures(endpoint, model: str) -> dict[str, float]:
    """{reason: count} of nv_inference_request_failure for `model`, the reasons counted at least once."""
    found = {}
    for reason, value in re.findall(
        rf'^nv_inference_request_failure\{{model="{model}",reason="(\w+)",version="1"\}} (\S+)$', scrape(endpoint), re.M
    ):
        if float(value):
            found[reason] = float(value)
    return found


def successes(endpoint, model: str) -> float:
    match = re.search(rf'^nv_inference_request_success\{{model="{model}",version="1"\}} (\S+)$', scrape(endpoint), re.M)
    return float(match.group(1)) if match else 0.0


def pending(endpoint, model: str) -> float:
    match = re.search(
        rf'^nv_inference_pending_request_count\{{model="{model}",version="1"\}} (\S+)$', scrape(endpoint), re.M
    )
    return float(match.group(1)) if match else 0.0


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # ordering-free: polls an observable state until a deadline


def reasons_after(servers, model: str, message: pb.ModelInferRequest) -> tuple[dict, dict, tuple, tuple]:
    """Send `message` to both; (triton's failures, ours, triton's call outcome, ours)."""
    (triton, ours), _ = servers
    calls = [outcome(endpoint.stub.ModelInfer, message) for endpoint in (triton, ours)]
    return failures(triton, model), failures(ours, model), calls[0], calls[1]


@pytest.mark.parametrize("model", ["raises", "dies"])
def test_a_failed_execution_is_backend_on_both(servers, model):
    theirs, ours, (their_code, _), (our_code, _) = reasons_after(servers, model, request(model))
    assert their_code == our_code == "INTERNAL"
    assert theirs == ours == {"BACKEND": 1}


def test_an_ensemble_whose_step_fails_is_other_on_the_ensemble_and_backend_on_the_step(servers):
    (triton, ours), _ = servers
    before = {endpoint.name: failures(endpoint, "raises").get("BACKEND", 0) for endpoint in (triton, ours)}
    theirs, mine, (their_code, _), (our_code, _) = reasons_after(servers, "ensemble", request("ensemble"))
    assert their_code == our_code == "INTERNAL"
    assert theirs == {"OTHER": 2}  # Triton's answer: its ensemble scheduler counts the one request twice
    assert mine == {"OTHER": 1}
    for endpoint in (triton, ours):  # the step counts its own failure
        assert failures(endpoint, "raises")["BACKEND"] == before[endpoint.name] + 1, endpoint.name


def test_a_request_whose_queue_timeout_passes_is_rejected_on_both(servers):
    (triton, ours), gates = servers
    for endpoint in (triton, ours):
        (gates / "release").unlink(missing_ok=True)
        (gates / "timed").unlink(missing_ok=True)
        running = endpoint.stub.ModelInfer.future(request("timed", batched=True), timeout=CALL_TIMEOUT)
        wait_for((gates / "timed").exists, f"{endpoint.name}'s first request to run")
        code, _ = outcome(endpoint.stub.ModelInfer, request("timed", batched=True))  # queued behind it: 0.5 s
        (gates / "release").touch()
        running.result(timeout=CALL_TIMEOUT)
        assert code == "UNAVAILABLE", endpoint.name
        assert failures(endpoint, "timed") == {"REJECTED": 1}, endpoint.name


def test_a_request_cancelled_in_the_queue_is_canceled_on_both(servers):
    (triton, ours), gates = servers
    for endpoint in (triton, ours):
        (gates / "release").unlink(missing_ok=True)
        (gates / "queued").unlink(missing_ok=True)
        running = endpoint.stub.ModelInfer.future(request("queued", batched=True), timeout=CALL_TIMEOUT)
        wait_for((gates / "queued").exists, f"{endpoint.name}'s first request to run")
        waiting = endpoint.stub.ModelInfer.future(request("queued", batched=True), timeout=CALL_TIMEOUT)
        wait_for(lambda endpoint=endpoint: pending(endpoint, "queued") == 1, f"{endpoint.name}'s queued request")
        waiting.cancel()
        if endpoint is triton:  # its frontend passes the cancel to its core on a thread of its own: wait for it
            wait_for(lambda: "Issuing cancellation for" in triton_log(gates), "triton to issue the cancellation")
        else:  # gRPC tells the server of the cancel on a thread of its own too: wait until the queue let it go
            # (released before that, the slot went to the queued request, which ran and succeeded: no cancel)
            wait_for(lambda endpoint=endpoint: pending(endpoint, "queued") == 0, f"{endpoint.name} to drop it")
        (gates / "release").touch()  # Triton's dynamic batcher drops the cancelled request at its next turn
        running.result(timeout=CALL_TIMEOUT)
        wait_for(lambda endpoint=endpoint: failures(endpoint, "queued"), f"{endpoint.name} to count the cancel")
        assert failures(endpoint, "queued") == {"CANCELED": 1}, endpoint.name


@pytest.mark.parametrize("model", ["wrong_dtype", "error_response"])
def test_a_failed_response_triton_counts_as_a_success_is_backend_here(servers, model):
    (triton, ours), _ = servers
    theirs, mine, (their_code, _), (our_code, _) = reasons_after(servers, model, request(model))
    assert theirs == {} and successes(triton, model) == 1  # Triton's answer
    assert our_code != "OK" and mine == {"BACKEND": 1} and successes(ours, model) == 0
    if model == "error_response":
        assert their_code == our_code == "INTERNAL"  # both answer the model's error


def test_a_request_refused_by_validation_is_other_here_and_not_counted_by_triton(servers):
    theirs, mine, (their_code, _), (our_code, _) = reasons_after(servers, "raises", request("raises", datatype="INT32"))
    assert their_code == our_code == "INVALID_ARGUMENT"
    assert theirs.get("OTHER", 0) == 0  # Triton's answer: nothing counted for the refused request
    assert mine.get("OTHER") == 1
