"""L0_sequence_batcher's python cases (its `python_nobatch_sequence_int32` and `python_sequence_int32` models, the
QA's sequence_int32 model.py over the ONNX models' configurations), rewritten: whole sequences (the no-batch model
keeps a running sum per instance; the batching one answers START + INPUT), a one-request sequence, and the
refusals in Triton's words: a batch of two, no correlation id, no START first, a request after END without START.
The timing cases (queue delays, backlogs, idle timeouts with sleeps) are covered by tests/differential/
test_sequences.py with gates instead and are not repeated here."""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import numpy as np
import pytest

from .harness import Model, build_request, python_model, slotserve_fails

SEQUENCE = """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            config = json.loads(args["model_config"])
            self.dtype = pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, "OUTPUT")["data_type"])
            self.batching = config["max_batch_size"] > 0
            self.total = np.zeros(1)

        def execute(self, requests):
            responses = []
            for request in requests:
                value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().astype(np.int32)
                start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy().astype(np.int32)
                ready = pb_utils.get_input_tensor_by_name(request, "READY").as_numpy().astype(np.int32)
                if self.batching:
                    out = np.where(ready == 1, start + value, np.zeros_like(value))
                else:
                    added = np.where(start == 1, value, self.total + value)
                    self.total = np.where(ready == 1, added, self.total)
                    out = self.total
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out.astype(self.dtype))]))
            return responses
"""


def config(max_batch_size: int) -> str:
    return f"""
        max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        sequence_batching {{
          max_sequence_idle_microseconds: 60000000
          control_input [
            {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
            {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}
          ]
        }}
    """


NOBATCH = "python_nobatch_sequence_int32"
BATCH = "python_sequence_int32"
MODELS: dict[str, Model] = {NOBATCH: python_model(config(0), SEQUENCE), BATCH: python_model(config(8), SEQUENCE)}


def _request(model: str, sequence: int, flags: str | None, value: int, rows: int = 1):
    parameters = {"sequence_id": sequence}
    if flags and "start" in flags:
        parameters["sequence_start"] = True
    if flags and "end" in flags:
        parameters["sequence_end"] = True
    shape = [rows, 1] if model == BATCH else [1]
    return build_request(model, {"INPUT": np.full(shape, value, np.int32)}, parameters=parameters)


def _run(server, model: str, sequence: int, steps) -> list:
    return [server.send(_request(model, sequence, flags, value)) for flags, value in steps]


def _value(answer) -> int:
    assert answer.ok, answer
    return int(answer["OUTPUT"].reshape(-1)[0])


@pytest.mark.parametrize("model", [NOBATCH, BATCH])
def test_simple_sequence(server, model):
    steps = [("start", 1), *[(None, value) for value in range(2, 9)], ("end", 9)]
    answers = _run(server, model, 5 if model == NOBATCH else 6, steps)
    expected = [sum(range(1, value + 1)) for value in range(1, 10)] if model == NOBATCH else [2, *range(2, 10)]
    assert [_value(answer) for answer in answers] == expected


@pytest.mark.parametrize("model", [NOBATCH, BATCH])
def test_length1_sequence(server, model):
    (answer,) = _run(server, model, 99 if model == NOBATCH else 98, [("start,end", 42)])
    assert _value(answer) == (42 if model == NOBATCH else 43)


SEQUENCE_WORDS = (
    "34.8 a request after its sequence's END without START is refused as \"the sequence was ended because its END "
    'request was served", not Triton\'s "... must specify the START flag on the first request of the sequence" '
    "(service/core/sequences.py, nobody this round)"
)


def test_batch_size(server):
    answer = server.send(_request(BATCH, 27, "start", 1, rows=2))
    assert not answer.ok
    assert answer.message.startswith(
        f"inference request to model '{BATCH}' must specify batch-size 1 due to requirements of sequence batcher"
    ), answer.message


@pytest.mark.parametrize("model", [NOBATCH, BATCH])
def test_no_correlation_id(server, model):
    answer = server.send(_request(model, 0, "start", 1))
    assert not answer.ok
    assert answer.message.startswith(
        f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID"
    ), answer.message


@pytest.mark.parametrize("model", [NOBATCH, BATCH])
def test_no_sequence_start(server, model):
    answer = server.send(_request(model, 37469245, None, 1))
    assert not answer.ok
    assert answer.message.startswith(
        f"inference request for sequence 37469245 to model '{model}' must specify the START flag on the first "
        "request of the sequence"
    ), answer.message


@slotserve_fails(SEQUENCE_WORDS)
@pytest.mark.parametrize("model", [NOBATCH, BATCH])
def test_no_sequence_start2(server, model):
    """A request after the sequence's END, without START: refused."""
    answers = _run(server, model, 3, [("start", 1), (None, 2), ("end", 3), (None, 55)])
    assert all(answer.ok for answer in answers[:3]), answers
    assert not answers[3].ok
    assert answers[3].message.startswith(
        f"inference request for sequence 3 to model '{model}' must specify the START flag on the first request of "
        "the sequence"
    ), answers[3].message


def test_no_sequence_end(server):
    """A second START in an open sequence starts it again: 42 + 9 = 51 at its END."""
    answers = _run(server, NOBATCH, 4566, [("start", 1), (None, 2), ("start", 42), ("end", 9)])
    assert [_value(answer) for answer in answers] == [1, 3, 42, 51]
