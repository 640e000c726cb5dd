"""Sequence batching (issue 23) on slotserve and on real Triton 2.51: the same python sequence models
(tests/sequence_models.py: `echo` answers the control tensors the server filled, `accumulate` keeps a running sum
per correlation id in its worker) and the same ModelInfer / ModelStreamInfer calls, through the generated stub
(see conftest.py for why not tritonclient). Answers and status codes are compared; Triton's own answer is asserted
too, so that a change on either side shows. The facts these rely on, with Triton's exact texts, are in
/work/notes/triton-sequences.md (helper `seqmodels`), summarised where each test uses one.

Messages are not compared word for word: slotserve has its own wording. A slotserve refusal must have Triton's
status code and name what is wrong (the sequence id, the parameter, the model) - the issue's "refused by name".

Skips, naming the reason, without the reference (tests/differential/README.md).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf import json_format

from generated import grpc_service_pb2 as pb
from tests import sequence_models as models

from .calls import CALL_TIMEOUT, outputs_by_name
from .conftest import INSTALLATION, MISSING_REASON, Endpoint, _start_slotserve, _start_triton

IDLE_MICROSECONDS = 300_000  # echo_idle: a sequence idle this long is released
IDLE_WAIT_SECONDS = 2.0  # how long the idle tests stay silent: over 6x the timeout, for a loaded machine
ONE_SLOT_IDLE_MICROSECONDS = 1_000_000  # echo_one_slot_idle: the holder of the only slot goes idle after 1 s
LONG_IDLE_MICROSECONDS = 120_000_000  # models whose sequences must not go idle during a test
# echo_oldest_two_stream: long enough that a loaded machine never idles a sequence between two of its requests on
# a stream that runs them as they arrive; short enough that a stream holding them back ends them within the test.
STREAM_IDLE_MICROSECONDS = 4_000_000

# name -> writer; every model has one instance (the accumulator's sums live in that one worker).
MODELS = {
    "echo_direct": lambda root: models.write_python_echo(root, "echo_direct"),
    "echo_oldest": lambda root: models.write_python_echo(
        root, "echo_oldest", models.SequenceOptions(strategy=models.OLDEST, max_candidate_sequences=4)
    ),
    "echo_nobatch": lambda root: models.write_python_echo(
        root, "echo_nobatch", models.SequenceOptions(max_batch_size=0)
    ),
    "echo_int64": lambda root: models.write_python_echo(
        root, "echo_int64", models.SequenceOptions(corrid_type="TYPE_INT64")
    ),
    "echo_idle": lambda root: models.write_python_echo(
        root, "echo_idle", models.SequenceOptions(max_sequence_idle_microseconds=IDLE_MICROSECONDS)
    ),
    "echo_one_slot": lambda root: models.write_python_echo(
        root,
        "echo_one_slot",
        models.SequenceOptions(max_batch_size=1, max_sequence_idle_microseconds=LONG_IDLE_MICROSECONDS),
    ),
    "echo_one_slot_idle": lambda root: models.write_python_echo(
        root,
        "echo_one_slot_idle",
        models.SequenceOptions(max_batch_size=1, max_sequence_idle_microseconds=ONE_SLOT_IDLE_MICROSECONDS),
    ),
    "echo_oldest_two": lambda root: models.write_python_echo(
        root,
        "echo_oldest_two",
        models.SequenceOptions(
            strategy=models.OLDEST,
            max_candidate_sequences=2,
            max_batch_size=2,
            max_sequence_idle_microseconds=LONG_IDLE_MICROSECONDS,
        ),
    ),
    "echo_oldest_nobatch": lambda root: models.write_python_echo(
        root,
        "echo_oldest_nobatch",
        models.SequenceOptions(strategy=models.OLDEST, max_candidate_sequences=2, max_batch_size=0),
    ),
    "echo_oldest_two_idle": lambda root: models.write_python_echo(
        root,
        "echo_oldest_two_idle",
        models.SequenceOptions(
            strategy=models.OLDEST,
            max_candidate_sequences=2,
            max_batch_size=2,
            max_sequence_idle_microseconds=ONE_SLOT_IDLE_MICROSECONDS,
        ),
    ),
    "echo_oldest_two_stream": lambda root: models.write_python_echo(
        root,
        "echo_oldest_two_stream",
        models.SequenceOptions(
            strategy=models.OLDEST,
            max_candidate_sequences=2,
            max_batch_size=2,
            max_sequence_idle_microseconds=STREAM_IDLE_MICROSECONDS,
        ),
    ),
    "echo_oldest_instances": lambda root: models.write_python_echo(
        root,
        "echo_oldest_instances",
        models.SequenceOptions(
            strategy=models.OLDEST,
            max_candidate_sequences=2,
            max_batch_size=2,
            instances=2,
            max_sequence_idle_microseconds=LONG_IDLE_MICROSECONDS,
        ),
    ),
    "echo_four_slots": lambda root: models.write_python_echo(
        root,
        "echo_four_slots",
        models.SequenceOptions(max_batch_size=2, instances=2, max_sequence_idle_microseconds=LONG_IDLE_MICROSECONDS),
    ),
    "acc_direct": lambda root: models.write_python_accumulate(root, "acc_direct"),
    "acc_oldest": lambda root: models.write_python_accumulate(
        root, "acc_oldest", models.SequenceOptions(strategy=models.OLDEST)
    ),
    "acc_stats": lambda root: models.write_python_accumulate(root, "acc_stats"),
    "acc_string": lambda root: models.write_python_accumulate(
        root, "acc_string", models.SequenceOptions(corrid_type="TYPE_STRING")
    ),
}

PLAIN_CONFIG = """name: "plain"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

PLAIN_MODEL_PY = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", value)]))
        return out
"""

SequenceId = int | str  # what tritonclient sends as sequence_id
NO_BATCH_DIMENSION = ("echo_nobatch", "echo_oldest_nobatch")  # max_batch_size 0: INPUT [1]

pytestmark = pytest.mark.interop


@dataclass
class Servers:
    triton: Endpoint
    slotserve: Endpoint

    def each(self) -> tuple[Endpoint, Endpoint]:
        return self.triton, self.slotserve


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[Servers]:
    """Triton and slotserve on one repository of the sequence models above, started once for the module. Each
    test uses its own sequence ids (and, where it counts, its own model), so the tests do not meet."""
    if INSTALLATION is None:
        pytest.skip(MISSING_REASON)
    root = tmp_path_factory.mktemp("sequences")
    repository = root / "models"
    for write in MODELS.values():
        write(repository)
    from demo import build_repository as builders

    builders.write_python_model(repository, "plain", PLAIN_CONFIG, PLAIN_MODEL_PY)
    with ExitStack() as stack:
        reference = _start_triton(stack, root / "triton-run", repository)
        # parallel_jobs 2: instance_group counts are honoured (echo_four_slots has 2 instances, as on Triton)
        yield Servers(reference, _start_slotserve(stack, repository, parallel_jobs=2))


# ------------------------------------------------------------------------------------------------------ requests


def sequence_request(
    model: str,
    sequence_id: int | str | None,
    *,
    start: bool | None = None,
    end: bool | None = None,
    value: int = 1,
    rows: int = 1,
    request_id: str = "",
) -> pb.ModelInferRequest:
    """One request of a sequence as tritonclient sends it: INPUT [rows, 1] INT32 (or [1] without a batch dimension),
    the id as int64_param (a number) or string_param (a string), the flags as bool_param where given."""
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    shape = [1] if model in NO_BATCH_DIMENSION else [rows, 1]
    request.inputs.add(name="INPUT", datatype="INT32", shape=shape)
    request.raw_input_contents.append(np.full(shape, value, dtype=np.int32).tobytes())
    if isinstance(sequence_id, str):
        request.parameters["sequence_id"].string_param = sequence_id
    elif sequence_id is not None:
        request.parameters["sequence_id"].int64_param = sequence_id
    if start is not None:
        request.parameters["sequence_start"].bool_param = start
    if end is not None:
        request.parameters["sequence_end"].bool_param = end
    return request


_NUMPY = {"INT32": np.int32, "INT64": np.int64, "UINT64": np.uint64, "FP32": np.float32, "BOOL": np.bool_}


def values(reply: pb.ModelInferResponse) -> dict[str, list]:
    """{output name: flat list of values} of a reply."""
    return {
        name: np.frombuffer(raw, dtype=_NUMPY[datatype]).tolist()
        for name, (datatype, _shape, raw) in outputs_by_name(reply).items()
    }


def infer(endpoint: Endpoint, request: pb.ModelInferRequest, timeout: float = CALL_TIMEOUT) -> tuple[str, Any]:
    """("OK", {output: values}) or (code name, details)."""
    try:
        return "OK", values(endpoint.stub.ModelInfer(request, timeout=timeout))
    except grpc.RpcError as error:
        return error.code().name, error.details()


def stream(endpoint: Endpoint, requests: Iterable[pb.ModelInferRequest]) -> list[tuple[str, Any, str]]:
    """Send `requests` on one ModelStreamInfer stream; the responses as received: ("OK", values, id) or
    ("ERROR", error_message, "")."""
    answers = []
    for response in endpoint.stub.ModelStreamInfer(iter(list(requests)), timeout=CALL_TIMEOUT):
        if response.error_message:
            answers.append(("ERROR", response.error_message, ""))
        else:
            answers.append(("OK", values(response.infer_response), response.infer_response.id))
    return answers


def interleaved(sequences: dict[SequenceId, list[int]]) -> list[tuple[SequenceId, int, bool, bool]]:
    """Round-robin order of the steps of several sequences: (id, value, start, end) per request."""
    order = []
    for step in range(max(len(steps) for steps in sequences.values())):
        for sequence_id, steps in sequences.items():
            if step < len(steps):
                order.append((sequence_id, steps[step], step == 0, step == len(steps) - 1))
    return order


# ----------------------------------------------------------------------------------------------- control tensors


@pytest.mark.parametrize("model", ["echo_direct", "echo_oldest", "echo_nobatch", "echo_int64"])
def test_control_tensors_hold_what_triton_puts_in_them(servers, model):
    # Triton fact: START (int32_false_true) is 1 only on the request with sequence_start, END (fp32_false_true) 1.0
    # only on the one with sequence_end, READY (bool_false_true) true on every request a model gets, CORRID the id
    # in its configured type; one request per execution when the client waits for each answer.
    steps = [dict(start=True, value=5), dict(value=6), dict(end=True, value=7)]
    answers = {}
    for endpoint in servers.each():
        sequence_id = 1000 + len(answers)  # the ids differ; CORRID is compared against each one
        answers[endpoint.name] = [infer(endpoint, sequence_request(model, sequence_id, **step)) for step in steps]
        answers[endpoint.name].append(infer(endpoint, sequence_request(model, sequence_id, start=True, end=True)))
        for code, answer in answers[endpoint.name]:
            assert code == "OK", (endpoint.name, answer)
            assert answer["OUT_CORRID"] == [sequence_id], (endpoint.name, answer)
            answer.pop("OUT_CORRID")
    reference = [answer for _code, answer in answers["triton"]]
    assert [a["OUT_START"] for a in reference] == [[1], [0], [0], [1]]
    assert [a["OUT_END"] for a in reference] == [[0.0], [0.0], [1.0], [1.0]]
    assert [a["OUT_READY"] for a in reference] == [[True]] * 4
    assert [a["OUT_INPUT"] for a in reference] == [[5], [6], [7], [1]]
    assert [a["BATCH"] for a in reference] == [[1]] * 4
    assert answers["slotserve"] == answers["triton"]


def test_a_negative_int64_id_reaches_a_uint64_corrid_as_its_bits_as_on_triton(servers):
    # Triton fact: sequence_id int64_param -3 is accepted; a TYPE_UINT64 CORRID holds 2**64 - 3.
    for endpoint in servers.each():
        code, answer = infer(endpoint, sequence_request("echo_direct", -3, start=True, end=True))
        assert code == "OK", (endpoint.name, answer)
        assert answer["OUT_CORRID"] == [2**64 - 3], endpoint.name


# ------------------------------------------------------------------------------------------ interleaved sequences


def _accumulate_unary(endpoint: Endpoint, model: str, sequences: dict[SequenceId, list[int]]) -> dict[SequenceId, list]:
    sums: dict[SequenceId, list] = {sequence_id: [] for sequence_id in sequences}
    for sequence_id, value, start, end in interleaved(sequences):
        code, answer = infer(endpoint, sequence_request(model, sequence_id, start=start, end=end, value=value))
        sums[sequence_id].append(answer["OUTPUT"][0] if code == "OK" else (code, answer))
    return sums


def _accumulate_stream(
    endpoint: Endpoint, model: str, sequences: dict[SequenceId, list[int]]
) -> dict[SequenceId, list]:
    order = interleaved(sequences)
    requests = [
        sequence_request(model, sequence_id, start=start, end=end, value=value, request_id=f"{sequence_id}/{index}")
        for index, (sequence_id, value, start, end) in enumerate(order)
    ]
    answers = stream(endpoint, requests)
    assert len(answers) == len(requests), (endpoint.name, answers)
    errors = [answer for answer in answers if answer[0] != "OK"]
    assert not errors, (endpoint.name, errors)
    # Answers of different sequences may come back in any order; those of one sequence in the order sent.
    sums: dict[SequenceId, list] = {sequence_id: [] for sequence_id in sequences}
    for _code, answer, request_id in answers:
        sequence_id = request_id.rsplit("/", 1)[0]
        key = next(key for key in sequences if str(key) == sequence_id)
        sums[key].append(answer["OUTPUT"][0])
    return sums


@pytest.mark.parametrize("call", ["unary", "stream"])
@pytest.mark.parametrize("model", ["acc_direct", "acc_oldest"])
def test_interleaved_sequences_keep_their_own_sums_as_on_triton(servers, model, call):
    # Triton fact: direct and oldest both keep every request of a sequence on the instance that saw its START, in
    # order (the accumulator answers running sums per sequence), over ModelInfer and on one ModelStreamInfer.
    run = _accumulate_unary if call == "unary" else _accumulate_stream
    base = {"acc_direct": 2000, "acc_oldest": 3000}[model] + (0 if call == "unary" else 500)
    results = {}
    for offset, endpoint in enumerate(servers.each()):
        start = base + 100 * offset
        sequences = {start + 1: [1, 2, 3, 4], start + 2: [10, 20, 30], start + 3: [100, 200], start + 4: [7]}
        sums = run(endpoint, model, sequences)
        expected = {sequence_id: models.expected_sums(steps) for sequence_id, steps in sequences.items()}
        assert sums == expected, endpoint.name
        results[endpoint.name] = list(sums.values())
    assert results["slotserve"] == results["triton"]


def test_a_string_id_on_a_uint64_corrid_is_refused_by_name_where_triton_fills_in_its_bytes(servers):
    # A DELIBERATE DIFFERENCE (docs/sequences.md, "Differences from Triton 2.51"). Triton fact: a string_param
    # sequence_id is accepted on a model whose CORRID is TYPE_UINT64, and CORRID then holds the string's serialized
    # bytes (4-byte length + bytes read as a number: "42" is not 42), so distinct strings stay apart only by
    # accident of their bytes. slotserve refuses such a request with INVALID_ARGUMENT naming the id and the CORRID
    # type, before it takes a sequence slot: a model keyed by CORRID would otherwise get a meaningless number.
    reference, ours = servers.each()
    sequences = {"triton-alpha": [1, 2, 3], "triton-beta": [5, 5], "42": [9, 1]}
    sums = _accumulate_unary(reference, "acc_direct", sequences)
    assert sums == {key: models.expected_sums(steps) for key, steps in sequences.items()}
    for sequence_id, _value, start, end in interleaved({"slotserve-alpha": [1, 2], "42": [9]}):
        code, text = infer(ours, sequence_request("acc_direct", sequence_id, start=start, end=end))
        assert code == "INVALID_ARGUMENT" and f"'{sequence_id}'" in text and "UINT64" in text, (code, text)
    # Nothing of the refused requests holds a slot or a sum: a numeric sequence runs as usual afterwards.
    assert _accumulate_unary(ours, "acc_direct", {2900: [4, 5]}) == {2900: [4, 9]}


def test_string_ids_keep_their_sequences_apart_on_a_string_corrid_which_triton_2_51_refuses(servers):
    # Triton fact: a TYPE_STRING CORRID is broken in 2.51 with the python backend: every request is refused
    # ("unexpected number of string elements 2 for inference input 'CORRID', expecting 1"), so string ids cannot be
    # compared; slotserve defines it on its own (CORRID holds the id's UTF-8 bytes; a number id as its digits) and
    # routes by the string. Triton's refusal is asserted so that a fixed Triton turns this into a comparison.
    reference, ours = servers.each()
    code, text = infer(reference, sequence_request("acc_string", "triton-alpha", start=True, end=True))
    assert (code, text) == (
        "INVALID_ARGUMENT",
        "unexpected number of string elements 2 for inference input 'CORRID', expecting 1",
    )
    sequences = {"slotserve-alpha": [1, 2, 3], "slotserve-beta": [5, 5], "42": [9, 1], 43: [7, 7]}
    sums = _accumulate_unary(ours, "acc_string", sequences)
    assert sums == {key: models.expected_sums(steps) for key, steps in sequences.items()}


@pytest.mark.parametrize("call", ["unary", "stream"])
def test_a_second_start_restarts_an_open_sequence_as_on_triton(servers, call):
    # Triton fact: START on an open sequence is no error; the model gets START=1 and the sequence starts again
    # (Triton logs "The previous sequence did not end before this sequence start").
    steps = [dict(start=True, value=1), dict(value=2), dict(start=True, value=10), dict(end=True, value=1)]
    results = {}
    for offset, endpoint in enumerate(servers.each()):
        sequence_id = 4000 + offset + (10 if call == "stream" else 0)
        requests = [sequence_request("acc_direct", sequence_id, **step) for step in steps]
        if call == "unary":
            results[endpoint.name] = [infer(endpoint, request) for request in requests]
        else:
            results[endpoint.name] = [answer[:2] for answer in stream(endpoint, requests)]
    assert [answer for _code, answer in results["triton"]] == [{"OUTPUT": [s]} for s in (1, 3, 10, 11)]
    assert results["slotserve"] == results["triton"]


# ----------------------------------------------------------------------------------------------------- refusals


def _with_parameter(request: pb.ModelInferRequest, name: str, kind: str, value) -> pb.ModelInferRequest:
    request.parameters[name].Clear()
    setattr(request.parameters[name], kind, value)
    return request


def _with_control_input(request: pb.ModelInferRequest) -> pb.ModelInferRequest:
    request.inputs.add(name="START", datatype="INT32", shape=[1, 1])
    request.raw_input_contents.append(np.zeros((1, 1), dtype=np.int32).tobytes())
    return request


# What names the correlation id in a message: the parameter's name or Triton's word for it.
ID_WORDS = ("sequence_id", "correlation ID")

# case -> (request, Triton's exact message, what slotserve's message must hold: each entry a word, or a tuple of
# words one of which it holds)
REFUSALS = {
    "no_sequence_id": (
        lambda: sequence_request("echo_direct", None, start=True),
        "inference request to model 'echo_direct' must specify a non-zero or non-empty correlation ID",
        ("echo_direct", ID_WORDS),
    ),
    "sequence_id_zero": (
        lambda: sequence_request("echo_direct", 0, start=True),
        "inference request to model 'echo_direct' must specify a non-zero or non-empty correlation ID",
        ("echo_direct", ID_WORDS),
    ),
    "sequence_id_empty_string": (
        lambda: sequence_request("echo_direct", "", start=True),
        "inference request to model 'echo_direct' must specify a non-zero or non-empty correlation ID",
        ("echo_direct", ID_WORDS),
    ),
    "never_started": (
        lambda: sequence_request("echo_direct", 5007),
        "inference request for sequence 5007 to model 'echo_direct' must specify the START flag on the first "
        "request of the sequence",
        ("echo_direct", "5007"),
    ),
    "never_started_end": (
        lambda: sequence_request("echo_direct", 5008, end=True),
        "inference request for sequence 5008 to model 'echo_direct' must specify the START flag on the first "
        "request of the sequence",
        ("echo_direct", "5008"),
    ),
    "sequence_id_double_param": (
        lambda: _with_parameter(sequence_request("echo_direct", None, start=True), "sequence_id", "double_param", 3.0),
        "invalid value type for 'sequence_id' parameter, expected int64_param or string_param.",
        ("sequence_id",),
    ),
    "sequence_start_string": (
        lambda: _with_parameter(sequence_request("echo_direct", 5009), "sequence_start", "string_param", "true"),
        "invalid value type for 'sequence_start' parameter, expected bool_param.",
        ("sequence_start",),
    ),
    "sequence_end_int": (
        lambda: _with_parameter(sequence_request("echo_direct", 5010, start=True), "sequence_end", "int64_param", 1),
        "invalid value type for 'sequence_end' parameter, expected bool_param.",
        ("sequence_end",),
    ),
    "two_rows": (
        lambda: sequence_request("echo_direct", 5011, start=True, end=True, rows=2),
        "inference request to model 'echo_direct' must specify batch-size 1 due to requirements of sequence batcher",
        ("echo_direct", "1"),
    ),
    "control_input_sent": (
        lambda: _with_control_input(sequence_request("echo_direct", 5012, start=True, end=True)),
        "[request id: <id_unknown>] expected 1 inputs but got 2 inputs for model 'echo_direct'. Got input(s) "
        "['START','INPUT'], but missing required input(s) ]. Please provide all required input(s).",
        ("START",),
    ),
    "plain_model_bad_flag_type": (
        lambda: _with_parameter(sequence_request("plain", None), "sequence_start", "string_param", "x"),
        "invalid value type for 'sequence_start' parameter, expected bool_param.",
        ("sequence_start",),
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_bad_sequence_request_is_refused_with_triton_code_and_named(servers, case):
    build, triton_text, named = REFUSALS[case]
    reference, ours = (infer(endpoint, build()) for endpoint in servers.each())
    assert reference == ("INVALID_ARGUMENT", triton_text)
    assert ours[0] == reference[0], ours
    for words in named:
        alternatives = (words,) if isinstance(words, str) else words
        assert any(word in ours[1] for word in alternatives), (alternatives, ours)


def test_a_uint64_sequence_id_is_accepted_where_triton_refuses_it(servers):
    # A DELIBERATE DIFFERENCE (docs/sequences.md). Triton fact: sequence_id as uint64_param (even 5) is refused,
    # "invalid value type for 'sequence_id' parameter, expected int64_param or string_param.". tritonclient never
    # sends one (int64_param; an id >= 2**63 fails in its protobuf), so a Triton client is not affected; slotserve
    # accepts it, the KServe protocol's natural type for an id, which sends an id >= 2**63 as itself.
    reference, ours = (
        infer(
            endpoint,
            _with_parameter(
                sequence_request("echo_direct", None, start=True, end=True), "sequence_id", "uint64_param", 2**63 + 5
            ),
        )
        for endpoint in servers.each()
    )
    assert reference == (
        "INVALID_ARGUMENT",
        "invalid value type for 'sequence_id' parameter, expected int64_param or string_param.",
    )
    assert ours[0] == "OK" and ours[1]["OUT_CORRID"] == [2**63 + 5], ours


def test_a_request_after_end_is_refused_and_the_model_serves_on_as_on_triton(servers):
    # Triton fact: after END the sequence is gone; its next request gets the START-flag refusal; other sequences
    # are not affected.
    for offset, endpoint in enumerate(servers.each()):
        sequence_id = 5100 + offset
        assert infer(endpoint, sequence_request("acc_direct", sequence_id, start=True, value=4))[0] == "OK"
        assert infer(endpoint, sequence_request("acc_direct", sequence_id, end=True, value=1)) == (
            "OK",
            {"OUTPUT": [5]},
        )
        code, text = infer(endpoint, sequence_request("acc_direct", sequence_id, value=1))
        assert code == "INVALID_ARGUMENT" and str(sequence_id) in text, (endpoint.name, text)
        again = [infer(endpoint, sequence_request("acc_direct", sequence_id, start=True, end=True, value=8))]
        assert again == [("OK", {"OUTPUT": [8]})], endpoint.name


def test_valid_sequence_parameters_on_a_model_without_sequence_batching_are_ignored_as_on_triton(servers):
    # Triton fact: a model without sequence_batching answers requests that carry sequence_id / start / end.
    for endpoint in servers.each():
        assert infer(endpoint, sequence_request("plain", 5200, start=True, value=3)) == ("OK", {"OUTPUT": [3]})
        assert infer(endpoint, sequence_request("plain", None, end=True, value=4)) == ("OK", {"OUTPUT": [4]})


def test_refusals_on_a_stream_are_error_messages_and_the_stream_goes_on_as_on_triton(servers):
    # Triton fact: on ModelStreamInfer a refused request gets a response with error_message (Triton's text is the
    # same as the unary one) and the stream serves its later requests.
    answers = {}
    for offset, endpoint in enumerate(servers.each()):
        sequence_id = 5300 + offset
        requests = [
            sequence_request("echo_direct", None, start=True, request_id="no-id"),
            sequence_request("echo_direct", sequence_id + 50, request_id="not-started"),
            sequence_request("echo_direct", sequence_id, start=True, end=True, value=3, request_id="fine"),
        ]
        answers[endpoint.name] = stream(endpoint, requests)
    reference, ours = answers["triton"], answers["slotserve"]
    assert [answer[0] for answer in reference] == ["ERROR", "ERROR", "OK"]
    assert (
        reference[0][1]
        == "inference request to model 'echo_direct' must specify a non-zero or non-empty correlation ID"
    )
    assert reference[1][1] == (
        "inference request for sequence 5350 to model 'echo_direct' must specify the START flag on the first request "
        "of the sequence"
    )
    assert [answer[0] for answer in ours] == ["ERROR", "ERROR", "OK"], ours
    assert any(word in ours[0][1] for word in ID_WORDS) and "5351" in ours[1][1], ours
    assert ours[2][2] == reference[2][2] == "fine"
    assert ours[2][1]["OUT_INPUT"] == reference[2][1]["OUT_INPUT"] == [3]


# ---------------------------------------------------------------------------------------------- idle and slots


def test_an_idle_sequence_is_released_and_its_next_request_refused_as_on_triton(servers):
    # Triton fact: after max_sequence_idle_microseconds without a request the sequence is gone; its next request
    # (a middle one or its END) gets the START-flag refusal: INVALID_ARGUMENT, no distinct "timed out" text.
    for offset, endpoint in enumerate(servers.each()):
        sequence_id = 6000 + offset
        assert infer(endpoint, sequence_request("echo_idle", sequence_id, start=True))[0] == "OK"
        time.sleep(IDLE_WAIT_SECONDS)  # ordering-free: the idle timeout under test must pass (over 6x its length)
        code, text = infer(endpoint, sequence_request("echo_idle", sequence_id, value=2))
        assert code == "INVALID_ARGUMENT" and str(sequence_id) in text, (endpoint.name, text)
        if endpoint.name == "triton":
            assert "must specify the START flag on the first request of the sequence" in text
        assert infer(endpoint, sequence_request("echo_idle", sequence_id, end=True))[0] == "INVALID_ARGUMENT"


class Pending:
    """A ModelInfer sent from another thread: `done` is set when its answer has come."""

    def __init__(self, endpoint: Endpoint, request: pb.ModelInferRequest, timeout: float = CALL_TIMEOUT):
        self.done = threading.Event()
        self.answer: tuple[str, Any] | None = None
        self.thread = threading.Thread(target=self._run, args=(endpoint, request, timeout), daemon=True)
        self.thread.start()

    def _run(self, endpoint, request, timeout):
        self.answer = infer(endpoint, request, timeout)
        self.done.set()

    def result(self) -> tuple[str, Any]:
        assert self.done.wait(CALL_TIMEOUT), "no answer"
        assert self.answer is not None
        return self.answer


PENDING_SECONDS = 60.0  # a loaded machine; the request reaches the server in milliseconds otherwise


def pending_requests(endpoint: Endpoint, model: str) -> float:
    """nv_inference_pending_request_count of `model` (both servers export it): requests waiting to run."""
    text = urllib.request.urlopen(endpoint.metrics_url, timeout=CALL_TIMEOUT).read().decode()
    prefix = f'nv_inference_pending_request_count{{model="{model}",'
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)]
    assert values, f"{endpoint.name} has no pending count for {model}"
    return sum(values)


def wait_until_pending(endpoint: Endpoint, model: str, count: int) -> None:
    """Poll the pending count of `model` until it is `count` (fails after PENDING_SECONDS)."""
    deadline = time.monotonic() + PENDING_SECONDS
    while (seen := pending_requests(endpoint, model)) != count:
        assert time.monotonic() < deadline, f"{endpoint.name}: {model} pending {seen}, not {count}"
        time.sleep(0.05)  # ordering-free: polls an observable state until a deadline


@pytest.mark.parametrize("model,holders", [("echo_one_slot", 1), ("echo_oldest_two", 2)])
def test_a_new_sequence_waits_for_a_free_slot_as_on_triton(servers, model, holders):
    # Triton facts: direct with one slot (max_batch_size 1, one instance), and oldest with max_candidate_sequences
    # 2: a START beyond the slots WAITS (no error) while the holders are open; the holders are served meanwhile;
    # once one ends, the waiting START is answered, with START=1.
    for offset, endpoint in enumerate(servers.each()):
        base = 7000 + 100 * offset + (50 if holders == 2 else 0)
        held = [base + index for index in range(holders)]
        for sequence_id in held:
            assert infer(endpoint, sequence_request(model, sequence_id, start=True))[0] == "OK", endpoint.name
        waiting = Pending(endpoint, sequence_request(model, base + 9, start=True, value=9))
        wait_until_pending(endpoint, model, 1)  # the new sequence's START has reached the server and waits
        # The holders' requests are answered while the new sequence waits; it is still waiting after them.
        for sequence_id in held:
            assert infer(endpoint, sequence_request(model, sequence_id, value=2))[0] == "OK", endpoint.name
        assert not waiting.done.is_set(), (endpoint.name, waiting.answer)
        assert infer(endpoint, sequence_request(model, held[0], end=True))[0] == "OK", endpoint.name
        code, answer = waiting.result()
        assert code == "OK", (endpoint.name, answer)
        assert answer["OUT_START"] == [1] and answer["OUT_CORRID"] == [base + 9], endpoint.name
        for sequence_id in (*held[1:], base + 9):
            assert infer(endpoint, sequence_request(model, sequence_id, end=True))[0] == "OK", endpoint.name


def test_direct_runs_max_batch_size_times_instances_sequences_at_once_as_on_triton(servers):
    # Triton fact: `direct` has max_batch_size x instances sequence slots (2 x 2 here): four sequences open at once
    # are all served; a fifth START waits until one of them ends.
    model = "echo_four_slots"
    for offset, endpoint in enumerate(servers.each()):
        base = 7300 + 100 * offset
        held = [base + index for index in range(4)]
        for sequence_id in held:
            assert infer(endpoint, sequence_request(model, sequence_id, start=True))[0] == "OK", endpoint.name
        for sequence_id in held:
            assert infer(endpoint, sequence_request(model, sequence_id, value=2))[0] == "OK", endpoint.name
        waiting = Pending(endpoint, sequence_request(model, base + 9, start=True))
        wait_until_pending(endpoint, model, 1)
        assert not waiting.done.is_set(), (endpoint.name, waiting.answer)
        assert infer(endpoint, sequence_request(model, held[0], end=True))[0] == "OK", endpoint.name
        assert waiting.result()[0] == "OK", (endpoint.name, waiting.answer)
        for sequence_id in (*held[1:], base + 9):
            assert infer(endpoint, sequence_request(model, sequence_id, end=True))[0] == "OK", endpoint.name


def test_oldest_has_max_candidate_sequences_per_instance_as_on_triton(servers):
    # Triton fact: `oldest`'s max_candidate_sequences counts per instance (each instance's batcher has that many
    # sequence slots): two candidates x two instances keep four sequences open; a fifth START waits.
    model = "echo_oldest_instances"
    for offset, endpoint in enumerate(servers.each()):
        held = [7350 + 10 * offset + k for k in range(4)]
        for sequence_id in held:
            assert infer(endpoint, sequence_request(model, sequence_id, start=True))[0] == "OK", endpoint.name
        waiting = Pending(endpoint, sequence_request(model, 7350 + 10 * offset + 9, start=True))
        wait_until_pending(endpoint, model, 1)
        assert not waiting.done.is_set(), (endpoint.name, waiting.answer)
        assert infer(endpoint, sequence_request(model, held[0], end=True))[0] == "OK", endpoint.name
        assert waiting.result()[0] == "OK", (endpoint.name, waiting.answer)
        for sequence_id in (*held[1:], 7350 + 10 * offset + 9):
            assert infer(endpoint, sequence_request(model, sequence_id, end=True))[0] == "OK", endpoint.name


def test_the_slot_of_an_idle_sequence_goes_to_a_waiting_one_as_on_triton(servers):
    # Triton fact: a START waiting for the only slot is answered once the holder has been idle for
    # max_sequence_idle_microseconds (1 s here; 0.97 s measured), and the holder's next request is refused.
    for offset, endpoint in enumerate(servers.each()):
        holder, newcomer = 7500 + offset, 7510 + offset
        assert infer(endpoint, sequence_request("echo_one_slot_idle", holder, start=True))[0] == "OK"
        assert infer(endpoint, sequence_request("echo_one_slot_idle", newcomer, start=True))[0] == "OK", endpoint.name
        code, text = infer(endpoint, sequence_request("echo_one_slot_idle", holder, end=True))
        assert code == "INVALID_ARGUMENT" and str(holder) in text, (endpoint.name, text)
        assert infer(endpoint, sequence_request("echo_one_slot_idle", newcomer, end=True))[0] == "OK", endpoint.name


def test_a_waiting_start_given_up_by_its_client_does_not_open_the_sequence_as_on_triton(servers):
    # Triton facts: a START waiting for a slot past the client's deadline ends DEADLINE_EXCEEDED; it does not take
    # the slot later: the sequence is not open afterwards (its END gets the START-flag refusal), and the slot is
    # free for the next sequence once the holder ends (no slot leaks).
    for offset, endpoint in enumerate(servers.each()):
        holder, given_up, later = 7600 + offset, 7610 + offset, 7620 + offset
        assert infer(endpoint, sequence_request("echo_one_slot", holder, start=True))[0] == "OK"
        code, _text = infer(endpoint, sequence_request("echo_one_slot", given_up, start=True), timeout=3.0)
        assert code == "DEADLINE_EXCEEDED", (endpoint.name, code)
        assert infer(endpoint, sequence_request("echo_one_slot", holder, end=True))[0] == "OK", endpoint.name
        wait_until_pending(endpoint, "echo_one_slot", 0)  # nothing of the given-up START is left waiting
        code, text = infer(endpoint, sequence_request("echo_one_slot", given_up, end=True))
        assert code == "INVALID_ARGUMENT" and str(given_up) in text, (endpoint.name, code, text)
        assert infer(endpoint, sequence_request("echo_one_slot", later, start=True, end=True))[0] == "OK", endpoint.name


def test_oldest_without_a_batch_dimension_runs_each_request_alone_as_on_triton(servers):
    # Triton facts: `oldest` with max_batch_size 0 loads; each request runs alone (BATCH 1) with its controls, four
    # sequences at once on two candidates included (the other two wait for a candidate, then run).
    model = "echo_oldest_nobatch"
    answers = {}
    for offset, endpoint in enumerate(servers.each()):
        sequence_id = 7700 + 10 * offset
        steps = [dict(start=True, value=5), dict(value=6), dict(end=True, value=7)]
        answers[endpoint.name] = [infer(endpoint, sequence_request(model, sequence_id, **step)) for step in steps]
        together = [
            Pending(endpoint, sequence_request(model, sequence_id + k, start=True, end=True)) for k in (1, 2, 3, 4)
        ]
        assert [pending.result()[0] for pending in together] == ["OK"] * 4, endpoint.name
        assert all(pending.result()[1]["BATCH"] == [1] for pending in together), endpoint.name
        for code, answer in answers[endpoint.name]:
            assert code == "OK", (endpoint.name, answer)
            assert answer.pop("OUT_CORRID") == [sequence_id], endpoint.name
    reference = [answer for _code, answer in answers["triton"]]
    assert [(a["OUT_START"], a["OUT_END"], a["OUT_INPUT"], a["BATCH"]) for a in reference] == [
        ([1], [0.0], [5], [1]),
        ([0], [0.0], [6], [1]),
        ([0], [1.0], [7], [1]),
    ]
    assert answers["slotserve"] == answers["triton"]


def test_starts_beyond_the_candidates_wait_longer_than_the_idle_timeout_and_then_run_as_on_triton(servers):
    # Triton facts: `oldest` with two candidates and a 1 s idle timeout; two sequences open and kept busy for 2.5 s
    # while two more STARTs wait: the waiting ones are not ended (however long past the idle timeout they wait);
    # once the first two end, both are answered (START 1). Then A DELIBERATE DIFFERENCE (docs/sequences.md):
    # Triton's idle clock of a waiting sequence ran while it waited, so its reaper ends it about 50 ms after it got
    # its slot unless its next request comes at once (0.5 s later its END is refused); slotserve starts the idle
    # clock when the sequence gets its slot, and its END is served.
    model = "echo_oldest_two_idle"
    for offset, endpoint in enumerate(servers.each()):
        held, waiting_ids = [7900 + 10 * offset + k for k in (1, 2)], [7900 + 10 * offset + k for k in (3, 4)]
        for sequence_id in held:
            assert infer(endpoint, sequence_request(model, sequence_id, start=True))[0] == "OK", endpoint.name
        waiting = [Pending(endpoint, sequence_request(model, sequence_id, start=True)) for sequence_id in waiting_ids]
        wait_until_pending(endpoint, model, 2)
        busy_until = time.monotonic() + 2.5 * ONE_SLOT_IDLE_MICROSECONDS / 1e6
        while time.monotonic() < busy_until:  # the holders never go idle; the waiting starts wait past the timeout
            for sequence_id in held:
                assert infer(endpoint, sequence_request(model, sequence_id, value=2))[0] == "OK", endpoint.name
        assert not any(pending.done.is_set() for pending in waiting), endpoint.name
        for sequence_id in held:
            assert infer(endpoint, sequence_request(model, sequence_id, end=True))[0] == "OK", endpoint.name
        for pending, sequence_id in zip(waiting, waiting_ids, strict=True):
            code, answer = pending.result()
            assert code == "OK" and answer["OUT_START"] == [1] and answer["OUT_CORRID"] == [sequence_id], endpoint.name
        time.sleep(0.5 * ONE_SLOT_IDLE_MICROSECONDS / 1e6)  # ordering-free: 10x Triton's 50 ms reaper recheck
        expected = "OK" if endpoint.name == "slotserve" else "INVALID_ARGUMENT"
        for sequence_id in waiting_ids:
            code, answer = infer(endpoint, sequence_request(model, sequence_id, end=True))
            assert code == expected, (endpoint.name, answer)


def test_sequences_beyond_the_candidates_on_one_stream_wait_without_ending_the_others_as_on_triton(servers):
    # Triton facts (NVIDIA's SequenceBatcherPreserveOrderingTest, oldest on one stream): four sequences streamed on
    # one ModelStreamInfer call, each START, then each middle, then each END, to an `oldest` model with two
    # candidates (idle after 4 s): the third and fourth sequences wait for a candidate in the backlog while the
    # stream goes on, the first two run to their END, and every request is answered, in the order sent. (slotserve
    # ran a stream's requests one after another: the third START held the stream, the first two sequences went
    # idle behind it and their later requests were refused as ended.)
    model = "echo_oldest_two_stream"
    answers = {}
    for offset, endpoint in enumerate(servers.each()):
        ids = [7800 + 10 * offset + k for k in range(4)]
        requests = [
            sequence_request(model, i, start=step == 0, end=step == 2, value=step, request_id=f"{i}/{step}")
            for step in range(3)
            for i in ids
        ]
        answers[endpoint.name] = [(code, request_id, answer) for code, answer, request_id in stream(endpoint, requests)]
        assert [code for code, _, _ in answers[endpoint.name]] == ["OK"] * 12, (endpoint.name, answers[endpoint.name])
        assert [request_id for _, request_id, _ in answers[endpoint.name]] == [r.id for r in requests], endpoint.name
    for endpoint in servers.each():
        shown = [
            (answer["OUT_START"], answer["OUT_END"], answer["OUT_INPUT"]) for _, _, answer in answers[endpoint.name]
        ]
        assert shown == [([1], [0.0], [0])] * 4 + [([0], [0.0], [1])] * 4 + [([0], [1.0], [2])] * 4, endpoint.name


def test_a_negative_id_is_named_by_its_64_bit_value_as_on_triton(servers):
    # Triton fact: an int64_param sequence_id of -7003 is the sequence 2**64 - 7003 (its 64 bits unsigned): a
    # request of it that is not a START is refused naming that number (slotserve names the same sequence).
    for endpoint in servers.each():
        assert infer(endpoint, sequence_request("echo_direct", -7003)) == (
            "INVALID_ARGUMENT",
            f"inference request for sequence {2**64 - 7003} to model 'echo_direct' must specify the START flag on "
            "the first request of the sequence",
        ), endpoint.name


# ------------------------------------------------------------------------------------ metadata and statistics


def test_metadata_does_not_list_the_control_inputs_as_on_triton(servers):
    # Triton fact: ModelMetadata lists INPUT only (START, END, READY, CORRID are filled by the server).
    reference, ours = (
        json_format.MessageToDict(endpoint.stub.ModelMetadata(pb.ModelMetadataRequest(name="echo_direct")))
        for endpoint in servers.each()
    )
    assert [tensor["name"] for tensor in reference["inputs"]] == ["INPUT"]
    assert ours["inputs"] == reference["inputs"]
    assert ours["outputs"] == reference["outputs"]


def test_sequence_requests_are_counted_as_triton_counts_them(servers):
    # Triton fact: every answered request of a sequence counts once in inference_count and success; a refused one
    # (the START-flag refusal) is no failure on Triton: fail stays 0 (slotserve counts refusals as failures for
    # every model, the difference test_statistics.py keeps as an xfail, so its fail count is not compared here).
    counts = {}
    for offset, endpoint in enumerate(servers.each()):
        sequences = {8000 + 10 * offset + 1: [1, 2, 3], 8000 + 10 * offset + 2: [4, 5]}
        _accumulate_unary(endpoint, "acc_stats", sequences)
        assert infer(endpoint, sequence_request("acc_stats", 8099))[0] == "INVALID_ARGUMENT"
        reply = endpoint.stub.ModelStatistics(pb.ModelStatisticsRequest(name="acc_stats"), timeout=CALL_TIMEOUT)
        (stats,) = reply.model_stats
        counts[endpoint.name] = {
            "inference_count": stats.inference_count,
            "success": stats.inference_stats.success.count,
            "fail": stats.inference_stats.fail.count,
        }
    assert counts["triton"] == {"inference_count": 5, "success": 5, "fail": 0}
    for key in ("inference_count", "success"):
        assert counts["slotserve"][key] == counts["triton"][key], counts
