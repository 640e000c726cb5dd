"""Iterative sequences and sequence ids on a real server, real port, raw stubs (issue 34 items 5 and 6, issue 33):
slotserve's own half of tests/differential/test_sequences_iterative.py, which asks real Triton the same questions
where it is set up (these run without it). Python LOG models (tests/sequence_models.py) that reschedule a request
with `set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`; misuse answered by name in Triton's words, the
model serving on; a request whose model reschedules it for ever stops at its client's deadline and leaves nothing
held; int64 -1 and uint64 2**64-1 are one sequence; a string id with control characters reaches the log only
through logging."""

from __future__ import annotations

import logging
import time

import grpc
import numpy as np
import pytest

from generated import grpc_service_pb2 as pb
from service.testing import serve
from tests import sequence_models as models
from tests.sequence_models import (
    COUNTDOWN_MODEL_PY,
    COUNTDOWN_STREAM_MODEL_PY,
    ITERATIVE_CONTROLS,
    LOG_FIELDS,
    RESCHEDULE_AND_ANSWER_MODEL_PY,
    IterativeOptions,
)

from .._support import CALL_TIMEOUT, stub

NOT_CONFIGURED = (
    "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured to handle "
    "such a flag."
)


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    root = tmp_path_factory.mktemp("iterative") / "models"
    for name, source, options in [
        ("count", COUNTDOWN_MODEL_PY, IterativeOptions()),
        ("count_batched", COUNTDOWN_MODEL_PY, IterativeOptions(max_batch_size=4)),
        ("count_stream", COUNTDOWN_STREAM_MODEL_PY, IterativeOptions(decoupled=True)),
        ("count_none", models.COUNTDOWN_RETURNING_NONE_MODEL_PY, IterativeOptions()),
        ("wrong", RESCHEDULE_AND_ANSWER_MODEL_PY, IterativeOptions()),
        ("plain", COUNTDOWN_MODEL_PY, IterativeOptions(None)),
        ("plain_stream", COUNTDOWN_STREAM_MODEL_PY, IterativeOptions(None, decoupled=True)),
        ("direct", COUNTDOWN_MODEL_PY, IterativeOptions("  direct { }\n" + ITERATIVE_CONTROLS)),
        ("forever", COUNTDOWN_MODEL_PY, IterativeOptions()),
    ]:
        models.write_python_log_model(root, name, source, options)
    models.write_python_echo(root, "echo", models.SequenceOptions(max_sequence_idle_microseconds=60_000_000))
    models.write_python_echo(
        root, "echo_oldest", models.SequenceOptions(strategy=models.OLDEST, max_candidate_sequences=2, max_batch_size=0)
    )
    with serve(root) as server:
        yield server


def log_request(model: str, executions: int, *, batched: bool = False, request_id: str = "") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    shape = [1, 1] if batched else [1]
    request.inputs.add(name="IN", datatype="INT32", shape=shape)
    request.raw_input_contents.append(np.full(shape, executions, np.int32).tobytes())
    return request


def log_of(reply: pb.ModelInferResponse) -> dict[str, int]:
    (raw,) = reply.raw_output_contents
    return dict(zip(LOG_FIELDS, np.frombuffer(raw, np.int64).tolist(), strict=True))


def call(running, request, timeout: float = CALL_TIMEOUT):
    """("OK", log) or (code name, details)."""
    try:
        return "OK", log_of(stub(running).ModelInfer(request, timeout=timeout))
    except grpc.RpcError as error:
        return error.code().name, error.details()


def streamed(running, requests) -> list[tuple[str, object, bool]]:
    """The answers of `requests` sent on one stream: ("OK", log, final) or ("ERROR", message, True)."""
    answers = []
    for response in stub(running).ModelStreamInfer(iter(list(requests)), timeout=CALL_TIMEOUT):
        if response.error_message:
            answers.append(("ERROR", response.error_message, True))
        else:
            final = response.infer_response.parameters["triton_final_response"].bool_param
            answers.append(("OK", log_of(response.infer_response), final))
    return answers


def table(running, model: str):
    return running.server.registry.get(model).sequences.statistics()


def test_a_rescheduled_request_is_answered_on_the_execution_the_model_chose(running):
    answers = [call(running, log_request("count", 3)), call(running, log_request("count", 1))]
    assert [code for code, _ in answers] == ["OK", "OK"], answers
    first, second = (log for _, log in answers)
    # its own ids (1, then 2), START only on a first execution, the answer from the third execution
    assert (first["execution"], first["flags"], first["correlation_id"], first["START"]) == (3, 0, 1, 0)
    assert (second["execution"], second["flags"], second["correlation_id"], second["START"]) == (1, 1, 2, 1)
    none = call(running, log_request("count_none", 3))  # None for the whole list while it reschedules
    assert none[0] == "OK" and none[1]["execution"] == 3, none
    batched = call(running, log_request("count_batched", 2, batched=True))
    assert batched[0] == "OK" and batched[1]["execution"] == 2, batched
    stats = table(running, "count")
    assert stats.open == 0 and stats.running == 0 and stats.queued_turns == 0


def test_a_decoupled_model_streams_an_answer_from_each_execution(running):
    answers = streamed(running, [log_request("count_stream", 3, request_id="a")])
    assert [(code, log["execution"], final) for code, log, final in answers] == [  # type: ignore[index]
        ("OK", 1, False),
        ("OK", 2, False),
        ("OK", 3, True),
    ]
    assert table(running, "count_stream").open == 0


def test_misuse_is_answered_in_tritons_words_and_the_model_serves_on(running):
    code, text = call(running, log_request("wrong", 1))
    assert code == "INTERNAL" and "Expected a None object in the execute function return list for reschduled" in text
    for model in ("plain", "direct"):
        request = log_request(model, 2)
        if model == "direct":
            request.parameters["sequence_id"].int64_param = 31
            request.parameters["sequence_start"].bool_param = True
            request.parameters["sequence_end"].bool_param = True
        code, text = call(running, request)
        assert code == "INTERNAL" and NOT_CONFIGURED in text and f"'{model}'" in text, (model, text)
        request.raw_input_contents[0] = np.array([1], np.int32).tobytes()
        assert call(running, request)[0] == "OK", model  # the same request, answered on its first execution
    answers = streamed(running, [log_request("plain_stream", 2)])
    assert [code for code, _, _ in answers] == ["OK", "ERROR"] and NOT_CONFIGURED in str(answers[1][1]), answers
    assert table(running, "direct").open == 0  # the failed START+END request ended its sequence


def test_a_request_rescheduled_for_ever_stops_at_its_clients_deadline_and_holds_nothing(running):
    started = time.monotonic()
    code, _ = call(running, log_request("forever", 2**30), timeout=1.0)
    # The client's deadline, or the server's own check of it (the request's admission deadline), whichever is first.
    assert code in ("DEADLINE_EXCEEDED", "UNAVAILABLE")
    deadline = time.monotonic() + CALL_TIMEOUT
    while table(running, "forever").open or table(running, "forever").running:  # ends after the client's deadline
        assert time.monotonic() < deadline, table(running, "forever")
        time.sleep(0.01)  # ordering-free: polls an observable state until a deadline
    assert call(running, log_request("forever", 2))[0] == "OK"  # the slot and the worker serve the next request
    assert time.monotonic() - started < CALL_TIMEOUT
    entry = running.server.registry.get("forever")
    assert entry.status().queued_requests == 0 and entry.sequences.pending_count() == 0


def echo_request(model: str, sequence_id: tuple[str, object], *, start=False, end=False) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    shape = [1, 1] if model == "echo" else [1]
    request.inputs.add(name="INPUT", datatype="INT32", shape=shape)
    request.raw_input_contents.append(np.ones(shape, np.int32).tobytes())
    kind, value = sequence_id
    setattr(request.parameters["sequence_id"], kind, value)
    request.parameters["sequence_start"].bool_param = start
    request.parameters["sequence_end"].bool_param = end
    return request


def corrid(reply: pb.ModelInferResponse) -> int:
    index = [output.name for output in reply.outputs].index("OUT_CORRID")
    return int(np.frombuffer(reply.raw_output_contents[index], np.uint64)[0])


def test_int64_minus_one_and_uint64_all_ones_are_one_sequence(running):
    infer = stub(running).ModelInfer
    first = infer(echo_request("echo", ("int64_param", -1), start=True), timeout=CALL_TIMEOUT)
    assert table(running, "echo").open == 1
    last = infer(echo_request("echo", ("uint64_param", 2**64 - 1), end=True), timeout=CALL_TIMEOUT)  # no START
    assert corrid(first) == corrid(last) == 2**64 - 1
    assert table(running, "echo").open == 0


def test_oldest_without_a_batch_dimension_serves_each_request_alone(running):
    infer = stub(running).ModelInfer
    for step in range(3):
        reply = infer(echo_request("echo_oldest", ("int64_param", 41), start=step == 0, end=step == 2))
        batch = np.frombuffer(reply.raw_output_contents[[o.name for o in reply.outputs].index("BATCH")], np.int32)
        assert batch.tolist() == [1] and corrid(reply) == 41
    assert table(running, "echo_oldest").open == 0


def test_a_string_id_with_control_characters_reaches_the_log_only_through_logging(running, caplog, capfd):
    hostile = "evil\nERROR slotserve: forged line \x1b[31mred"
    with caplog.at_level(logging.INFO):
        code = None
        try:
            stub(running).ModelInfer(echo_request("echo", ("string_param", hostile)), timeout=CALL_TIMEOUT)
        except grpc.RpcError as error:
            code = error.code()
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    logged = [record for record in caplog.records if "evil" in record.getMessage()]
    assert logged, "the refusal is logged (rate-limited rejection log)"
    printed = capfd.readouterr()
    assert "forged line" not in printed.out and "\x1b[31m" not in printed.err + printed.out
