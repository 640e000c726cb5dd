"""L0_decoupled's python trial, rewritten: a decoupled `repeat` model (IN values answered one response each, after
WAIT and each value's DELAY) alone and inside ensembles (one step; then an identity; fanned out to an identity and
an adder; followed by the decoupled `square`; and an ensemble nested in another), asked for zero, one and many
responses by one and by five requests on a stream, with and without the empty final response; unary inference
refused; and the model's own error for IN and DELAY of different shapes. The QA's ordering case (which relies on
timed delays) and its HTTP half are left out."""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import numpy as np
import pytest

from .harness import Model, build_request, ensemble, python_model
from .models import SQUARE, SQUARE_CONFIG

# The repeat model, with the C++ repeat backend's shape check.
REPEAT = """
    import threading
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
                delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy().copy()
                wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy().copy()
                sender = request.get_response_sender()
                if values.shape != delays.shape:
                    error = pb_utils.TritonError(
                        f"expected IN and DELAY shape to match, got {list(values.shape)} and {list(delays.shape)}"
                    )
                    sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                threading.Thread(target=self.answer, args=(sender, values, delays, wait), daemon=True).start()
            return None

        def answer(self, sender, values, delays, wait):
            time.sleep(float(wait[0]) / 1000)  # ordering-free: the model's WAIT input, timing under test
            for index, (value, delay) in enumerate(zip(values, delays)):
                time.sleep(float(delay) / 1000)  # ordering-free: its DELAY input; one thread sends in order
                outputs = [pb_utils.Tensor("OUT", np.array([value], np.int32)), pb_utils.Tensor("IDX", np.array([index], np.uint32))]
                sender.send(pb_utils.InferenceResponse(outputs))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

REPEAT_CONFIG = """
    max_batch_size: 0
    model_transaction_policy { decoupled: true }
    input [
      { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
      { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
      { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
    ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
    instance_group [ { kind: KIND_CPU } ]
"""

IDENTITY = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""

ADD = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                total = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy() + pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT__1", total)]))
            return responses
"""

REPEAT_IO = """
    input [
      { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
      { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
      { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
    ]
"""
REPEAT_STEP = """{ model_name: "%s" model_version: -1
  input_map { key: "IN" value: "IN" } input_map { key: "DELAY" value: "DELAY" } input_map { key: "WAIT" value: "WAIT" }
  output_map { key: "OUT" value: "%s" } %s }"""


def _ensemble(steps: list[str], outputs: str) -> Model:
    return ensemble(
        f"""
        platform: "ensemble"
        max_batch_size: 0
        {REPEAT_IO}
        output [ {outputs} ]
        ensemble_scheduling {{ step [ {", ".join(steps)} ] }}
        """
    )


OUT = '{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }'
IDX = '{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }'


def MODELS() -> dict[str, Model]:
    identity_config = """
        max_batch_size: 0
        input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
    """
    add_config = """
        max_batch_size: 0
        input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT__1" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """
    identity_step = (
        '{ model_name: "identity_int32" model_version: -1 input_map { key: "INPUT0" value: "repeat_out" } '
        'output_map { key: "OUTPUT0" value: "%s" } }'
    )
    square_step = (
        '{ model_name: "square_int32" model_version: -1 input_map { key: "IN" value: "repeat_out" } '
        'output_map { key: "OUT" value: "OUT" } }'
    )
    return {
        "repeat_int32": python_model(REPEAT_CONFIG, REPEAT),
        "square_int32": python_model(SQUARE_CONFIG, SQUARE),
        "identity_int32": python_model(identity_config, IDENTITY),
        "add_int32": python_model(add_config, ADD),
        "simple_repeat": _ensemble(
            [REPEAT_STEP % ("repeat_int32", "OUT", 'output_map { key: "IDX" value: "IDX" }')], f"{OUT}, {IDX}"
        ),
        "sequence_repeat": _ensemble(
            [
                REPEAT_STEP % ("repeat_int32", "repeat_out", 'output_map { key: "IDX" value: "IDX" }'),
                identity_step % "OUT",
            ],
            f"{OUT}, {IDX}",
        ),
        "fan_repeat": _ensemble(
            [
                REPEAT_STEP % ("repeat_int32", "repeat_out", ""),
                identity_step % "identity_out",
                '{ model_name: "add_int32" model_version: -1 input_map { key: "INPUT0" value: "repeat_out" } '
                'input_map { key: "INPUT1" value: "identity_out" } output_map { key: "OUTPUT__1" value: "OUT" } }',
            ],
            OUT,
        ),
        "repeat_square": _ensemble([REPEAT_STEP % ("repeat_int32", "repeat_out", ""), square_step], OUT),
        "nested_square": _ensemble([REPEAT_STEP % ("simple_repeat", "repeat_out", ""), square_step], OUT),
    }


def _fan(items, offset: int, count: int) -> None:
    assert [item.outputs["OUT"].tolist() for item in items] == [[2 * (offset + index)] for index in range(count)]


def _nested(items, offset: int, count: int) -> None:
    """value v of the repeat step becomes v responses of v (the square step's threads may interleave them: the QA's
    one-second delays kept them apart, so its order is not checked here)."""
    expected = [[value] for value in range(offset, offset + count) for _ in range(value)]
    assert sorted(item.outputs["OUT"].tolist() for item in items) == expected


def _plain(items, offset: int, count: int) -> None:
    assert [item.outputs["OUT"].tolist() for item in items] == [[offset + index] for index in range(count)]
    assert [item.outputs["IDX"].tolist() for item in items] == [[index] for index in range(count)]


TRIALS = {
    "repeat_int32": _plain,
    "simple_repeat": _plain,
    "sequence_repeat": _plain,
    "fan_repeat": _fan,
    "repeat_square": _nested,
    "nested_square": _nested,
}


def _trials() -> list:
    return [pytest.param(name, id=name) for name in TRIALS]


def _infer(server, model: str, requests: int, repeat: int, wait_ms: int, empty_final: bool) -> None:
    offset = 100
    validate = TRIALS[model]
    outputs = ["OUT", "IDX"] if validate is _plain else ["OUT"]
    sent = []
    for index in range(requests):
        parameters = {"triton_enable_empty_final_response": True} if empty_final else None
        inputs = {
            "IN": np.arange(offset, offset + repeat, dtype=np.int32),
            "DELAY": np.full([repeat], 10, np.uint32),
            "WAIT": np.array([wait_ms], np.uint32),
        }
        sent.append(build_request(model, inputs, outputs, id=str(index), parameters=parameters))
    items = server.stream_all(sent)
    assert not [item.error for item in items if item.error], items
    for index in range(requests):
        mine = [item for item in items if item.id == str(index) and item.outputs]
        if repeat == 0:
            assert mine == [], (index, items)
        else:
            validate(mine, offset, repeat)
        if empty_final:
            finals = [item for item in items if item.id == str(index) and item.final]
            assert len(finals) == 1, (index, items)


@pytest.mark.parametrize("model", _trials())
def test_one_to_none(server, model):
    for requests in (1, 5):
        for empty_final in (False, True):
            _infer(server, model, requests, 0, 50, empty_final)


@pytest.mark.parametrize("model", _trials())
def test_one_to_one(server, model):
    for requests in (1, 5):
        for wait in (5, 200):
            for empty_final in (False, True):
                _infer(server, model, requests, 1, wait, empty_final)


@pytest.mark.parametrize("model", _trials())
def test_one_to_many(server, model):
    for requests in (1, 5):
        for wait in (5, 200):
            for empty_final in (False, True):
                _infer(server, model, requests, 5, wait, empty_final)


def test_no_streaming(server):
    """Unary inference on a decoupled model is refused."""
    inputs = {"IN": np.array([1], np.int32), "DELAY": np.array([1], np.uint32), "WAIT": np.array([1], np.uint32)}
    answer = server.infer("repeat_int32", inputs)
    assert answer.code == "UNIMPLEMENTED"
    assert "doesn't support models with decoupled transaction policy" in answer.message, answer.message


def test_wrong_shape(server):
    inputs = {"IN": np.array([100], np.int32), "DELAY": np.array([10, 10], np.uint32), "WAIT": np.array([5], np.uint32)}
    items = server.stream_all([build_request("repeat_int32", inputs, ["OUT", "IDX"], id="0")])
    assert len(items) == 1 and "expected IN and DELAY shape to match, got [1] and [2]" in items[0].error, items
