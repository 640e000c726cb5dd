"""Iterative sequences (`sequence_batching { iterative_sequence: true }`, issue 34 item 5) on slotserve and on real
Triton 2.51: python models that hand a request back unfinished with
`request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)` (tests/sequence_models.py: the
LOG models answer what they saw on the execution that answered: LOG_FIELDS). The same calls go to both servers
through the generated stub (conftest.py says why not tritonclient); Triton's answers are asserted too, so that a
change on either side shows.

The facts asked of Triton here (the behaviour of NVIDIA's own QA cases, qa/L0_backend_python/request_rescheduling
and qa/L0_iterative_sequence, written again with models of our own):

* A request without a sequence id gets one from the model's own counter (1, 2, ...) and the START flag; every
  execution after its first has flags 0 (START and END controls false), the same correlation id.
* A non-decoupled model answers a rescheduled request on a later execution; a decoupled one streams responses
  over its executions, the final flag on the last.
* With one sequence slot (max_batch_size 0, one instance) a second request waits for the first one's last
  execution: the model never sees them interleaved.
* The request that started an iterative sequence ends it when it finishes: the next request of that id must START.
* Misuse: a response returned for a rescheduled request fails it (Triton's words); rescheduling on a model without
  iterative_sequence is refused in Triton's log words, where Triton never answers the client (a deliberate
  difference: slotserve answers, docs/sequences.md).

Skips, naming the reason, without the reference (tests/differential/README.md).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from demo import build_repository as builders
from generated import grpc_service_pb2 as pb
from tests import sequence_models as models
from tests.sequence_models import (
    COUNTDOWN_MODEL_PY,
    COUNTDOWN_STREAM_MODEL_PY,
    ITERATIVE_CONTROLS,
    LOG_FIELDS,
    RESCHEDULE_AND_ANSWER_MODEL_PY,
    IterativeOptions,
)

from .calls import CALL_TIMEOUT
from .conftest import INSTALLATION, MISSING_REASON, Endpoint, _start_slotserve, _start_triton

pytestmark = pytest.mark.interop

ITERATIVE = "  iterative_sequence: true\n" + ITERATIVE_CONTROLS
NEVER_ANSWERED_SECONDS = 6.0  # how long a client waits for an answer Triton never sends
# Triton's words, in its log (python_be.cc "Failed to release request: ..."), for a reschedule it cannot honour.
NOT_CONFIGURED = (
    "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured to handle "
    "such a flag."
)
# Triton's words (pb_stub.cc, with its spelling) for a response returned for a rescheduled request.
WRONG_RETURN = "Expected a None object in the execute function return list for reschduled request"

# name -> (model.py source, options); every model has one instance.
LOG_MODELS = {
    "it_count": (COUNTDOWN_MODEL_PY, IterativeOptions()),
    "it_count_ids": (COUNTDOWN_MODEL_PY, IterativeOptions()),
    "it_count_named": (COUNTDOWN_MODEL_PY, IterativeOptions()),
    "it_count_batched": (COUNTDOWN_MODEL_PY, IterativeOptions(max_batch_size=4)),
    "it_count_oldest": (
        COUNTDOWN_MODEL_PY,
        IterativeOptions(
            "  iterative_sequence: true\n  oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 0 }\n"
            + ITERATIVE_CONTROLS,
            max_batch_size=4,
        ),
    ),
    "it_start_end": (COUNTDOWN_MODEL_PY, IterativeOptions()),
    "it_count_none": (models.COUNTDOWN_RETURNING_NONE_MODEL_PY, IterativeOptions()),
    "it_stream": (COUNTDOWN_STREAM_MODEL_PY, IterativeOptions(decoupled=True)),
    "it_stream_serial": (COUNTDOWN_STREAM_MODEL_PY, IterativeOptions(decoupled=True)),
    "it_wrong": (RESCHEDULE_AND_ANSWER_MODEL_PY, IterativeOptions()),
    "rs_direct": (COUNTDOWN_MODEL_PY, IterativeOptions("  direct { }\n" + ITERATIVE_CONTROLS)),
    "rs_plain": (COUNTDOWN_MODEL_PY, IterativeOptions(None)),
    "rs_plain_stream": (COUNTDOWN_STREAM_MODEL_PY, IterativeOptions(None, decoupled=True)),
}

# A BLS caller (as NVIDIA's bls_request_rescheduling): IN -> exec() of it_count with IN, and exec(decoupled=True) of
# it_stream with IN; OUT = [the execution it_count answered on, then each streamed response's execution].
BLS_CONFIG = """name: "bls_iterative"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT64 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

BLS_MODEL_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils


def _executions(response):
    log = pb_utils.get_output_tensor_by_name(response, "LOG")
    return [] if log is None else [int(log.as_numpy().reshape(-1)[0])]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            wanted = pb_utils.get_input_tensor_by_name(request, "IN")
            seen = []
            for model, decoupled in (("it_bls_count", False), ("it_bls_stream", True)):
                call = pb_utils.InferenceRequest(
                    model_name=model, inputs=[pb_utils.Tensor("IN", wanted.as_numpy())], requested_output_names=["LOG"]
                )
                answers = call.exec(decoupled=decoupled)
                for answer in answers if decoupled else [answers]:
                    if answer.has_error():
                        raise pb_utils.TritonModelException(answer.error().message())
                    seen.extend(_executions(answer))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array(seen, dtype=np.int64))]))
        return responses
"""


@dataclass
class Servers:
    triton: Endpoint
    slotserve: Endpoint
    triton_log: Path

    def each(self) -> tuple[Endpoint, Endpoint]:
        return self.triton, self.slotserve


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[Servers]:
    """Triton and slotserve on one repository of the models above, started once for the module. Each test uses
    models of its own where a model's counters (its executions, the ids it hands out) are compared."""
    if INSTALLATION is None:
        pytest.skip(MISSING_REASON)
    root = tmp_path_factory.mktemp("iterative")
    repository = root / "models"
    for name, (source, options) in LOG_MODELS.items():
        models.write_python_log_model(repository, name, source, options)
    models.write_python_log_model(repository, "it_bls_count", COUNTDOWN_MODEL_PY)
    models.write_python_log_model(
        repository, "it_bls_stream", COUNTDOWN_STREAM_MODEL_PY, IterativeOptions(decoupled=True)
    )
    builders.write_python_model(repository, "bls_iterative", BLS_CONFIG, BLS_MODEL_PY)
    with ExitStack() as stack:
        reference = _start_triton(stack, root / "triton-run", repository)
        ours = _start_slotserve(stack, repository)
        (log,) = (root / "triton-run").glob("tritonserver-*.log")
        yield Servers(reference, ours, log)


# ------------------------------------------------------------------------------------------------------ requests


def log_request(
    model: str,
    executions: int,
    sequence_id: int | str | None = None,
    *,
    start: bool | None = None,
    end: bool | None = None,
    request_id: str = "",
    batched: bool = False,
) -> pb.ModelInferRequest:
    """IN = how many executions the request is to take; the sequence parameters where given."""
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    shape = [1, 1] if batched else [1]
    request.inputs.add(name="IN", datatype="INT32", shape=shape)
    request.raw_input_contents.append(np.full(shape, executions, np.int32).tobytes())
    if isinstance(sequence_id, str):
        request.parameters["sequence_id"].string_param = sequence_id
    elif sequence_id is not None:
        request.parameters["sequence_id"].int64_param = sequence_id
    if start is not None:
        request.parameters["sequence_start"].bool_param = start
    if end is not None:
        request.parameters["sequence_end"].bool_param = end
    return request


def log_of(reply: pb.ModelInferResponse) -> dict[str, int]:
    """The LOG output of a reply, by field."""
    (raw,) = reply.raw_output_contents
    return dict(zip(LOG_FIELDS, np.frombuffer(raw, np.int64).tolist(), strict=True))


def infer(endpoint: Endpoint, request: pb.ModelInferRequest, timeout: float = CALL_TIMEOUT) -> tuple[str, Any]:
    """("OK", log) or (code name, details)."""
    try:
        return "OK", log_of(endpoint.stub.ModelInfer(request, timeout=timeout))
    except grpc.RpcError as error:
        return error.code().name, error.details()


def stream(
    endpoint: Endpoint, requests: Iterable[pb.ModelInferRequest], timeout: float = CALL_TIMEOUT
) -> tuple[list[tuple[str, Any, bool]], str]:
    """Send `requests` on one stream and read it to its end: the answers as received, ("OK", log, final flag) or
    ("ERROR", error_message, True), and how the stream ended (OK, or the status code's name)."""
    answers: list[tuple[str, Any, bool]] = []
    try:
        for response in endpoint.stub.ModelStreamInfer(iter(list(requests)), timeout=timeout):
            if response.error_message:
                answers.append(("ERROR", response.error_message, True))
                continue
            final = response.infer_response.parameters["triton_final_response"].bool_param
            log = log_of(response.infer_response) if response.infer_response.outputs else None
            answers.append(("OK", log, final))
    except grpc.RpcError as error:
        return answers, error.code().name
    return answers, "OK"


def picked(log: dict[str, int], *fields: str) -> tuple[int, ...]:
    return tuple(log[field] for field in fields)


# ------------------------------------------------------------------------------------------------ the behaviour


def test_a_request_without_an_id_runs_again_until_the_model_answers_it_as_on_triton(servers):
    # Triton facts: no sequence id -> the model's counter hands out 1, then 2; START on the first execution only
    # (flags 1, START 1), flags 0 on the later ones; the answer comes from the execution the model chose (the 3rd).
    answers = {}
    for endpoint in servers.each():
        answers[endpoint.name] = [
            infer(endpoint, log_request("it_count", 3)),
            infer(endpoint, log_request("it_count", 1)),
        ]
    reference = answers["triton"]
    assert reference == [
        ("OK", dict(zip(LOG_FIELDS, (3, 0, 1, 1, 3, 0, 0, 1), strict=True))),
        ("OK", dict(zip(LOG_FIELDS, (1, 1, 2, 1, 4, 1, 0, 2), strict=True))),
    ]
    assert answers["slotserve"] == reference


def test_execute_may_return_none_for_a_call_whose_requests_it_all_rescheduled_as_on_triton(servers):
    # Triton fact: the stub takes None (not a list) from a call whose every request was rescheduled; the request
    # runs again and is answered on its third execution.
    for endpoint in servers.each():
        code, answer = infer(endpoint, log_request("it_count_none", 3))
        assert code == "OK" and picked(answer, "execution", "flags", "correlation_id") == (3, 0, 1), (
            endpoint.name,
            answer,
        )


def test_ids_zero_and_empty_and_an_end_alone_start_a_sequence_of_their_own_as_on_triton(servers):
    # Triton facts: sequence_id 0 or "" (with or without START) is "no id": the counter's next one; an END without
    # an id is replaced by START (flags 1, END control 0).
    requests = [
        log_request("it_count_ids", 2, 0, start=True),
        log_request("it_count_ids", 2, "", start=True),
        log_request("it_count_ids", 1, end=True),
    ]
    answers = {endpoint.name: [infer(endpoint, request) for request in requests] for endpoint in servers.each()}
    fields = ("execution", "flags", "correlation_id", "START", "END", "CORRID")
    reference = [picked(answer, *fields) for code, answer in answers["triton"]]
    assert reference == [(2, 0, 1, 0, 0, 1), (2, 0, 2, 0, 0, 2), (1, 1, 3, 1, 0, 3)]
    assert [code for code, _ in answers["slotserve"]] == ["OK"] * 3, answers["slotserve"]
    assert [picked(answer, *fields) for _, answer in answers["slotserve"]] == reference


def test_a_decoupled_iterative_model_streams_one_response_per_execution_as_on_triton(servers):
    # Triton facts (NVIDIA's iterative_sequence case): IN=3 gives three responses over three executions, the final
    # flag on the third; START on the first execution only; a request with its own id (and START) keeps that id.
    answers = {}
    for endpoint in servers.each():
        requests = [log_request("it_stream", 3, request_id="a"), log_request("it_stream", 2, 77, start=True)]
        answers[endpoint.name] = stream(endpoint, requests)
    fields = ("execution", "flags", "correlation_id", "START", "END", "CORRID")
    reference, ended = answers["triton"]
    assert ended == "OK"
    assert [(code, picked(log, *fields), final) for code, log, final in reference] == [
        ("OK", (1, 1, 1, 1, 0, 1), False),
        ("OK", (2, 0, 1, 0, 0, 1), False),
        ("OK", (3, 0, 1, 0, 0, 1), True),
        ("OK", (1, 1, 77, 1, 0, 77), False),
        ("OK", (2, 0, 77, 0, 0, 77), True),
    ]
    ours, ours_ended = answers["slotserve"]
    assert ours_ended == "OK" and [a[0] for a in ours] == ["OK"] * 5, ours
    assert [(code, picked(log, *fields), final) for code, log, final in ours] == [
        (code, picked(log, *fields), final) for code, log, final in reference
    ]


def test_with_one_sequence_slot_a_second_request_waits_for_the_first_ones_last_execution_as_on_triton(servers):
    # Triton fact: max_batch_size 0 and one instance is one sequence slot: a second request (IN=3), sent once the
    # first one's first response has come, waits for the first one's last execution: the model's execute calls
    # 1-3 are the first request's, 4-6 the second's.
    calls = {}
    for endpoint in servers.each():
        with OpenStream(endpoint) as first, OpenStream(endpoint) as second:
            first.send(log_request("it_stream_serial", 3))
            answers = {"A": first.take(1)}
            second.send(log_request("it_stream_serial", 3))
            answers["A"] += first.take(2)
            answers["B"] = second.take(3)
        calls[endpoint.name] = {key: [log["calls"] for _, log, _ in taken] for key, taken in answers.items()}
    assert calls["triton"] == {"A": [1, 2, 3], "B": [4, 5, 6]}
    assert calls["slotserve"] == calls["triton"]


class OpenStream:
    """A ModelStreamInfer call the test feeds one request at a time (`send`) and reads as answers come (`take`);
    bounded by CALL_TIMEOUT."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._call = endpoint.stub.ModelStreamInfer(iter(self._requests.get, None), timeout=CALL_TIMEOUT)

    def send(self, request: pb.ModelInferRequest) -> None:
        self._requests.put(request)

    def take(self, count: int) -> list[tuple[str, Any, bool]]:
        taken = []
        for _ in range(count):
            response = next(self._call)
            if response.error_message:
                taken.append(("ERROR", response.error_message, True))
            else:
                final = response.infer_response.parameters["triton_final_response"].bool_param
                taken.append(("OK", log_of(response.infer_response), final))
        return taken

    def __enter__(self) -> OpenStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._requests.put(None)
        self._call.cancel()


def test_the_request_that_started_an_iterative_sequence_ends_it_as_on_triton(servers):
    # Triton facts: a request with its own id and START runs (its executions carry that id); when it finishes the
    # sequence is over: the id's next request without START is refused in the usual words; a new START works.
    for offset, endpoint in enumerate(servers.each()):
        sequence_id = 55 + offset
        code, answer = infer(endpoint, log_request("it_count_named", 3, sequence_id, start=True))
        assert code == "OK" and picked(answer, "execution", "correlation_id", "CORRID") == (3, sequence_id, sequence_id)
        code, text = infer(endpoint, log_request("it_count_named", 2, sequence_id))
        assert code == "INVALID_ARGUMENT" and str(sequence_id) in text, (endpoint.name, text)
        if endpoint.name == "triton":  # slotserve says why the sequence ended (docs/sequences.md)
            assert text == (
                f"inference request for sequence {sequence_id} to model 'it_count_named' must specify the START flag "
                "on the first request of the sequence"
            )
        assert infer(endpoint, log_request("it_count_named", 1, sequence_id, start=True))[0] == "OK", endpoint.name


@pytest.mark.parametrize("model,batched", [("it_count_batched", True), ("it_count_oldest", True)])
def test_iterations_of_concurrent_requests_all_answer_as_on_triton(servers, model, batched):
    # Triton facts: with max_batch_size 4 (direct: four sequence slots; oldest: four candidates) two requests at
    # once are both answered on their third execution, each with its own id. (Triton batches their executions
    # together; slotserve's direct runs each alone: docs/sequences.md. `requests` and `calls` are not compared.)
    for endpoint in servers.each():
        results = _concurrently(endpoint, {key: log_request(model, 3, batched=batched) for key in ("x", "y")})
        assert [results[key][0] for key in ("x", "y")] == ["OK", "OK"], (endpoint.name, results)
        ids = sorted(results[key][1]["correlation_id"] for key in ("x", "y"))
        assert ids == [1, 2], (endpoint.name, results)
        assert all(results[key][1]["execution"] == 3 and results[key][1]["flags"] == 0 for key in ("x", "y"))


def _concurrently(endpoint: Endpoint, requests: dict[str, pb.ModelInferRequest]) -> dict[str, tuple[str, Any]]:
    """Send each request from a thread of its own; their outcomes by key."""
    results: dict[str, tuple[str, Any]] = {}

    def send(key: str) -> None:
        results[key] = infer(endpoint, requests[key])

    threads = [threading.Thread(target=send, args=(key,)) for key in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(CALL_TIMEOUT)
    return results


def test_bls_calls_to_iterative_models_are_answered_as_on_triton(servers):
    # Triton facts (NVIDIA's bls_request_rescheduling): exec() of a non-decoupled iterative model returns its one
    # answer (from its 3rd execution); exec(decoupled=True) of a decoupled one yields a response per execution.
    answers = {}
    for endpoint in servers.each():
        request = pb.ModelInferRequest(model_name="bls_iterative")
        request.inputs.add(name="IN", datatype="INT32", shape=[1])
        request.raw_input_contents.append(np.array([3], np.int32).tobytes())
        try:
            reply = endpoint.stub.ModelInfer(request, timeout=CALL_TIMEOUT)
            answers[endpoint.name] = np.frombuffer(reply.raw_output_contents[0], np.int64).tolist()
        except grpc.RpcError as error:
            answers[endpoint.name] = [error.code().name, error.details()]
    assert answers["triton"] == [3, 1, 2, 3]
    assert answers["slotserve"] == answers["triton"]


def test_a_decoupled_iterative_model_is_refused_on_model_infer_as_on_triton(servers):
    for endpoint in servers.each():
        assert infer(endpoint, log_request("it_stream", 2)) == (
            "UNIMPLEMENTED",
            "ModelInfer RPC doesn't support models with decoupled transaction policy",
        ), endpoint.name


# ---------------------------------------------------------------------------------------------------- misuse


def test_a_response_returned_for_a_rescheduled_request_fails_it_in_tritons_words(servers):
    # Triton fact: INTERNAL "Failed to process the request(s) for model 'it_wrong_0_0', message: Expected a None
    # object in the execute function return list for reschduled request, found type '<class
    # 'c_python_backend_utils.InferenceResponse'>'." slotserve: INTERNAL with the same words (its own type name).
    for endpoint in servers.each():
        code, text = infer(endpoint, log_request("it_wrong", 1))
        assert code == "INTERNAL" and WRONG_RETURN in text, (endpoint.name, text)
        assert "it_wrong" in text, (endpoint.name, text)
    assert infer(servers.slotserve, log_request("it_wrong", 1))[0] == "INTERNAL"  # the model serves on


@pytest.mark.parametrize("model", ["rs_direct", "rs_plain"])
def test_rescheduling_without_iterative_sequence_is_refused_in_tritons_words_where_triton_never_answers(servers, model):
    # A DELIBERATE DIFFERENCE (docs/sequences.md). Triton fact: a request rescheduled by a model without
    # iterative_sequence (a direct sequence model, or no sequence batching) is never answered: the client waits
    # until its deadline, and Triton's log says "Failed to release request: Request is released with
    # TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured to handle such a flag.".
    # slotserve answers INTERNAL with those words at once, and the model serves on.
    sequence = dict(sequence_id=901, start=True, end=True) if model == "rs_direct" else {}
    code, _ = infer(servers.triton, log_request(model, 2, **sequence), timeout=NEVER_ANSWERED_SECONDS)
    assert code == "DEADLINE_EXCEEDED"
    assert NOT_CONFIGURED in servers.triton_log.read_text(errors="replace")
    code, text = infer(servers.slotserve, log_request(model, 2, **sequence))
    assert code == "INTERNAL" and NOT_CONFIGURED in text and model in text, text
    assert infer(servers.slotserve, log_request(model, 1, **sequence))[0] == "OK"


def test_a_decoupled_model_without_iterative_sequence_that_reschedules_gets_an_error_where_triton_hangs(servers):
    # A DELIBERATE DIFFERENCE. Triton fact: the response sent before the reschedule arrives, then nothing (no final
    # flag, no error) until the client's deadline. slotserve: that response, then an error message in Triton's
    # log words, ending the request; the stream ends normally.
    reference, ended = stream(servers.triton, [log_request("rs_plain_stream", 2)], timeout=NEVER_ANSWERED_SECONDS)
    assert [(code, log["execution"], final) for code, log, final in reference] == [("OK", 1, False)]
    assert ended == "DEADLINE_EXCEEDED"
    ours, ours_ended = stream(servers.slotserve, [log_request("rs_plain_stream", 2)])
    assert ours_ended == "OK" and [answer[0] for answer in ours] == ["OK", "ERROR"], ours
    assert ours[0][1]["execution"] == 1 and NOT_CONFIGURED in ours[1][1], ours


def test_a_start_and_end_request_rescheduled_finishes_where_triton_never_answers(servers):
    # A DELIBERATE DIFFERENCE. Triton fact: an iterative request with its own id and both START and END is refused
    # when it is rescheduled (its END ended the sequence: the log says "Failed to release request: inference request
    # for sequence 56 ... must specify the START flag"), and the client is never answered. slotserve ends the
    # sequence when the request finishes: the request is answered (its END control true on its first execution
    # only), and the id's next request must START.
    code, _ = infer(
        servers.triton, log_request("it_start_end", 2, 56, start=True, end=True), timeout=NEVER_ANSWERED_SECONDS
    )
    assert code == "DEADLINE_EXCEEDED"
    code, answer = infer(servers.slotserve, log_request("it_start_end", 2, 56, start=True, end=True))
    assert code == "OK" and picked(answer, "execution", "flags", "START", "END") == (2, 0, 0, 0), answer
    code, text = infer(servers.slotserve, log_request("it_start_end", 1, 56))
    assert code == "INVALID_ARGUMENT" and "56" in text, text
