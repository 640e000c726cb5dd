"""Several requests in flight on one ModelStreamInfer stream, asked of real Triton 2.51 and of slotserve (the same
python models, each server its own gate folder):

* A non-decoupled model's answers come in the order of the requests, even when a later request finishes first
  (two instances; the first request held at a gate until the second has run): Triton writes them in request
  order.
* A decoupled model's answers come as they are sent: the second request's answer arrives while the first is still
  held.
* Requests sent together on one stream to a model with dynamic batching reach one `execute` as one batch, and
  the model's error for some members comes back for those members alone (NVIDIA's L0_backend_python lifecycle
  case `test_batch_error`, rewritten: errors for the first and third request of the batch).

tests/integration/streams/test_stream_in_flight.py holds slotserve's side alone (gated at the fixture and with the
admission queue observed). Skips, naming the reason, where the reference is not set up (bench/setup.sh).
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path

import grpc
import numpy as np
import pytest

from generated import grpc_service_pb2_grpc as pb_grpc
from service.testing import serve
from tests.integration.streams.test_stream_in_flight import (
    DECOUPLED_GATED,
    Stream,
    decoupled_gated_config,
    output,
    request,
    write_python_model,
)

from .reference import find_installation, run_triton

pytestmark = pytest.mark.interop

INSTALLATION, MISSING_REASON = find_installation()
CALL_TIMEOUT = 60.0

# Two instances, no batching: a request whose input is 1 waits (after writing `arrived-<id>`) for the file
# `release-<id>`; every request writes `done-<id>` just before its response is returned.
ORDERED_GATED = """
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.gate = config["parameters"]["gate_dir"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if int(x[0]) == 1:
                open(os.path.join(self.gate, "arrived-" + request.request_id()), "w").close()
                while not os.path.exists(os.path.join(self.gate, "release-" + request.request_id())):
                    time.sleep(0.005)  # ordering-free: a gate the test opens
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
            open(os.path.join(self.gate, "done-" + request.request_id()), "w").close()
        return responses
"""

# Dynamic batching that waits (20 s) for a preferred batch of three: errors for the first and third request of
# each `execute`, and the batch's size (len(requests)) with the second one's input.
BATCH_ERRORS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for index, request in enumerate(requests):
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if index in (0, 2):
                error = pb_utils.TritonError("An error occurred during execution")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            size = np.full((x.shape[0], 1), len(requests), np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x), pb_utils.Tensor("BATCH", size)]))
        return responses
"""

FLOAT_IN_OUT = """
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def _ordered_config(gate: Path) -> str:
    return f"""
max_batch_size: 0
{FLOAT_IN_OUT}
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
parameters {{ key: "gate_dir" value {{ string_value: "{gate}" }} }}
"""


BATCH_ERRORS_CONFIG = """
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 20000000 }
"""


def _repository(root: Path) -> tuple[Path, Path]:
    """A repository of the three models under `root`, and the folder of the gated models' gate folders (one each,
    named after the model)."""
    gates = root / "gates"
    for model in ("ordered", "decoupled"):
        (gates / model).mkdir(parents=True)
    repository = root / "repository"
    write_python_model(repository, "ordered", ORDERED_GATED, _ordered_config(gates / "ordered"))
    write_python_model(repository, "decoupled", DECOUPLED_GATED, decoupled_gated_config(gates / "decoupled"))
    write_python_model(repository, "batch_errors", BATCH_ERRORS, BATCH_ERRORS_CONFIG)
    return repository, gates


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """{"triton": (address, gates), "slotserve": (address, gates)}, each on its own copy of the models and gates."""
    if INSTALLATION is None:
        pytest.skip(MISSING_REASON)
    root = tmp_path_factory.mktemp("stream-in-flight")
    theirs, their_gate = _repository(root / "triton")
    ours, our_gate = _repository(root / "slotserve")
    with ExitStack() as stack:
        (root / "triton-run").mkdir()
        reference = stack.enter_context(run_triton(INSTALLATION, theirs, root / "triton-run"))
        running = stack.enter_context(serve(ours, parallel_jobs=2))
        yield {"triton": (reference.address, their_gate), "slotserve": (running.address, our_gate)}


def _appears(path: Path, what: str, timeout: float = CALL_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)  # ordering-free: polls a file the model writes


def _x(value: float) -> np.ndarray:
    return np.array([value], np.float32)


def _ordered_answers(address: str, gates: Path) -> list[tuple[str, str, float]]:
    """On one stream to `ordered`: "held" (kept at its gate until "free" has run to its end), then "free". The
    answers as they arrived: (id, error, Y)."""
    gate = gates / "ordered"
    with Stream(address) as stream:
        stream.send(request("ordered", "X", _x(1), "held"))
        _appears(gate / "arrived-held", "the first request held in execute")
        stream.send(request("ordered", "X", _x(2), "free"))
        _appears(gate / "done-free", "the second request run to its end on the other instance")
        (gate / "release-held").touch()
        replies = stream.receive(2)
    return [(r.infer_response.id, r.error_message, float(output(r, "Y")[0])) for r in replies]


def test_a_non_decoupled_models_answers_keep_the_order_of_the_requests_as_on_triton(servers):
    answers = {name: _ordered_answers(*where) for name, where in servers.items()}
    assert answers["triton"] == [("held", "", 1.0), ("free", "", 2.0)]  # Triton: in the order of the requests
    assert answers["slotserve"] == answers["triton"]


def _decoupled_answers(address: str, gates: Path) -> list[tuple[str, str, float]]:
    """On one stream to `decoupled`: "held" (kept at its gate), then "free": the first answer is read while "held"
    is still held; then it is released."""
    gate = gates / "decoupled"
    with Stream(address) as stream:
        stream.send(request("decoupled", "X", _x(1), "held"))
        _appears(gate / "arrived-held", "the first request held in execute")
        stream.send(request("decoupled", "X", _x(2), "free"))
        early = stream.receive(1)
        (gate / "release-held").touch()
        replies = early + stream.receive(1)
    return [(r.infer_response.id, r.error_message, float(output(r, "Y")[0])) for r in replies]


def test_a_decoupled_models_answers_come_as_they_are_sent_as_on_triton(servers):
    answers = {name: _decoupled_answers(*where) for name, where in servers.items()}
    assert answers["triton"] == [("free", "", 2.0), ("held", "", 1.0)]
    assert answers["slotserve"] == answers["triton"]


def _batch_answers(address: str) -> list[tuple[str, bool, float | None, int | None]]:
    """Three requests sent back-to-back on one stream to `batch_errors`: (id, failed, Y, BATCH) of each answer."""
    messages = [request("batch_errors", "X", np.array([[n]], np.float32), f"e{n}") for n in range(3)]
    with grpc.insecure_channel(address) as channel:
        call = pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(messages), timeout=CALL_TIMEOUT)
        replies = list(call)
    answers: list[tuple[str, bool, float | None, int | None]] = []
    for reply in replies:
        if reply.error_message:
            answers.append((reply.infer_response.id, True, None, None))
        else:
            y, size = output(reply, "Y")[0, 0], output(reply, "BATCH", "<i4")[0, 0]
            answers.append((reply.infer_response.id, False, float(y), int(size)))
    return answers


def test_requests_sent_together_on_a_stream_reach_one_execute_and_each_error_stays_with_its_request(servers):
    answers = {name: _batch_answers(address) for name, (address, _gates) in servers.items()}
    assert answers["triton"] == [("e0", True, None, None), ("e1", False, 1.0, 3), ("e2", True, None, None)]
    assert answers["slotserve"] == answers["triton"]
