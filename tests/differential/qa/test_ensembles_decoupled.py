"""Not NVIDIA's cases: ensembles with a decoupled step asked of Triton 2.51 directly, kept as differential questions
(docs/ensembles.md, "Decoupled steps"). The ensemble is decoupled itself (ModelInfer refused, ModelConfig says so,
whatever its config.pbtxt said); each response of the decoupled step runs the next step and is answered on the
stream, the last one with the final flag; an error in a later response ends the request with it; the load refuses
a step, or the ensemble's outputs, reading values that descend from different decoupled steps (or from one and from
the request itself)."""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import numpy as np

from .harness import build_request, ensemble, python_model

# N responses OUT = [i], IDX = [i] from a thread of the model, then the final flag alone; the response at FAIL_AT
# is an error instead (and the rest follow).
COUNTER = """
    import threading

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
                fail = int(pb_utils.get_input_tensor_by_name(request, "FAIL_AT").as_numpy()[0])
                threading.Thread(target=self.answer, args=(request.get_response_sender(), n, fail), daemon=True).start()
            return None

        def answer(self, sender, n, fail):
            for index in range(n):
                if index == fail:
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"counter failed at {index}")))
                    continue
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([index], np.int32)), pb_utils.Tensor("IDX", np.array([index], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
COUNTER_CONFIG = """
    max_batch_size: 0
    model_transaction_policy { decoupled: true }
    input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "FAIL_AT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
# Two responses that each leave one output out, then a whole one with the final flag.
PARTIAL = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([7], np.int32))]))
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("IDX", np.array([8], np.int32))]))
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([9], np.int32)), pb_utils.Tensor("IDX", np.array([10], np.int32))]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
"""
PLUS = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1000)]) for r in requests]
"""
PLUS_CONFIG = """
    max_batch_size: 0
    input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
ADDER = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("S", pb_utils.get_input_tensor_by_name(r, "A").as_numpy() + pb_utils.get_input_tensor_by_name(r, "B").as_numpy())]) for r in requests]
"""
ADDER_CONFIG = """
    max_batch_size: 0
    input [ { name: "A" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "B" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "S" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
IO = 'input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "FAIL_AT" data_type: TYPE_INT32 dims: [ 1 ] } ]'
Y = '{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }'
IDX = '{ name: "IDX" data_type: TYPE_INT32 dims: [ 1 ] }'
COUNT_STEP = '{ model_name: "%s" model_version: -1 input_map { key: "N" value: "N" } input_map { key: "FAIL_AT" value: "FAIL_AT" } output_map { key: "OUT" value: "counted" } %s }'
IDX_MAP = 'output_map { key: "IDX" value: "IDX" }'
PLUS_STEP = (
    '{ model_name: "plus" model_version: -1 input_map { key: "X" value: "%s" } output_map { key: "Y" value: "%s" } }'
)
MIXED = "receives inputs originated from different decoupled models"  # Triton's words


def _ensemble(outputs: str, steps: list[str], extra: str = "", io: str = IO):
    return ensemble(
        f"""
        platform: "ensemble"
        max_batch_size: 0
        {io}
        output [ {outputs} ]
        ensemble_scheduling {{ step [ {", ".join(steps)} ] }}
        {extra}
        """
    )


def _chain(counter: str = "counter", extra: str = ""):
    """counter -> plus; outputs Y (through plus) and IDX (the counter's own)."""
    return _ensemble(f"{Y}, {IDX}", [COUNT_STEP % (counter, IDX_MAP), PLUS_STEP % ("counted", "Y")], extra)


def MODELS():
    return {
        "counter": python_model(COUNTER_CONFIG, COUNTER),
        "partial": python_model(COUNTER_CONFIG, PARTIAL),
        "plus": python_model(PLUS_CONFIG, PLUS),
        "adder": python_model(ADDER_CONFIG, ADDER),
        "chain": _chain(),
        "partial_chain": _chain("partial"),
        # says it is not decoupled; its step is
        "chain_says_not": _chain(extra="model_transaction_policy { decoupled: false }"),
        # says it is decoupled; no step is
        "plain_says_decoupled": _ensemble(
            Y,
            [PLUS_STEP % ("N", "Y")],
            extra="model_transaction_policy { decoupled: true }",
            io='input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]',
        ),
        # refused: adder reads the counter's responses and the request's N
        "mixed_inputs": _ensemble(
            Y,
            [
                COUNT_STEP % ("counter", ""),
                '{ model_name: "adder" model_version: -1 input_map { key: "A" value: "counted" } input_map { key: "B" value: "N" } output_map { key: "S" value: "Y" } }',
            ],
        ),
        # refused: Y descends from the counter's responses, Z from the request
        "mixed_outputs": _ensemble(
            f'{Y}, {{ name: "Z" data_type: TYPE_INT32 dims: [ 1 ] }}',
            [COUNT_STEP % ("counter", ""), PLUS_STEP % ("counted", "Y"), PLUS_STEP % ("N", "Z")],
        ),
    }


TRITON_ARGS = ("--exit-on-error=false",)  # the refused ensembles leave Triton live, not ready


def _inputs(n: int, fail: int = -1) -> dict:
    return {"N": np.array([n], np.int32), "FAIL_AT": np.array([fail], np.int32)}


def _answers(server, model: str, n: int, fail: int = -1, outputs=(), **parameters) -> list:
    """(error text, {output: values}, final flag) of every message of one request's stream."""
    request = build_request(model, _inputs(n, fail), outputs, id="r", parameters=parameters or None)
    items = server.stream_all([request])
    return [(item.error, {name: a.tolist() for name, a in item.outputs.items()}, item.final) for item in items]


def test_a_decoupled_ensemble_refuses_modelinfer_and_says_it_is_decoupled(server):
    for model in ("chain", "chain_says_not"):
        answer = server.infer(model, _inputs(2))
        assert answer.code == "UNIMPLEMENTED", (model, answer)
        assert answer.message == "ModelInfer RPC doesn't support models with decoupled transaction policy"
        assert server.config(model).model_transaction_policy.decoupled is True, model


def test_an_ensemble_without_a_decoupled_step_is_not_decoupled_whatever_its_config_says(server):
    answer = server.infer("plain_says_decoupled", {"N": np.array([5], np.int32)})
    assert answer.ok, answer
    assert answer["Y"].tolist() == [1005]
    assert server.config("plain_says_decoupled").model_transaction_policy.decoupled is False


def test_each_response_runs_the_next_step_and_is_answered_as_it_comes(server):
    answers = _answers(server, "chain", 3)
    assert [(error, outputs) for error, outputs, _ in answers] == [
        ("", {"Y": [1000 + index], "IDX": [index]}) for index in range(3)
    ]
    # more follow the first two; the last one carries the final flag when the counter's own final flag came before
    # it was made (Triton's timing here; slotserve's when a helper thread reads the counter: docs/ensembles.md)
    assert [final for *_, final in answers][:-1] == [False, False]
    assert [outputs for _, outputs, _ in _answers(server, "chain", 2, outputs=["Y"])] == [{"Y": [1000]}, {"Y": [1001]}]
    # no response at all: only the final flag, as an empty response when asked for
    assert _answers(server, "chain", 0, triton_enable_empty_final_response=True) == [("", {}, True)]


def test_an_error_in_a_later_response_ends_the_request_with_it(server):
    *before, error = _answers(server, "chain", 4, fail=1)
    # The answer of response 0 goes out unless the error came first (then Triton drops it: its timing); nothing
    # follows the error.
    assert [item[:2] for item in before] in ([], [("", {"Y": [1000], "IDX": [0]})]), before
    assert "counter failed at 1" in error[0] and error[1] == {}, error
    # Triton: "in ensemble 'chain', counter failed at 1"; slotserve names the step too:
    # "ensemble 'chain': step 0 (model 'counter'): counter failed at 1"
    assert "'chain'" in error[0]


def test_a_response_that_leaves_an_output_out(server):
    answers = _answers(server, "partial_chain", 0)
    if server.kind == "triton":
        # Triton runs the next step on what the response has and answers without what it lacks: Y from OUT = 7, no
        # IDX; the second response (IDX only) leaves plus without its input, and the request ends there.
        # (the first answer is dropped when the second response's failure comes first: its timing)
        *before, error = answers
        assert [item[:2] for item in before] in ([], [("", {"Y": [1007]})]), answers
        assert "expected 1 inputs but got 0 inputs for model 'plus'" in error[0], answers
    else:
        # A difference: slotserve's python backend refuses a response without an output its caller asked for (the
        # ensemble asks for the outputs its maps name), so the request ends at the first response, naming the step.
        assert len(answers) == 1
        assert "ensemble 'partial_chain': step 0 (model 'partial'): " in answers[0][0]
        assert "did not return the requested output 'IDX'" in answers[0][0]


def test_values_of_different_decoupled_origins_meeting_are_refused_at_load(server, logged):
    index = server.index()
    for model in ("mixed_inputs", "mixed_outputs"):
        version, state, reason = index[model]
        if server.kind == "triton":  # listed with no state; the reason is in its log
            assert state != "READY", (model, index[model])
            logged(server, f"in ensemble {model}, step of model '{model}' {MIXED}")
        else:
            assert state == "UNAVAILABLE" and MIXED in reason, (model, index[model])
    if server.kind == "slotserve":
        assert "step 1 (model 'adder') receives" in index["mixed_inputs"][2]
        assert "'counted' from step 0 (model 'counter') (decoupled)" in index["mixed_inputs"][2]
        assert "ensemble 'mixed_outputs', as the step collecting its outputs, receives" in index["mixed_outputs"][2]


def test_the_steps_are_counted_once_per_response(server):
    before = server.statistics("plus").inference_stats.success.count
    assert len(_answers(server, "chain", 4)) == 4
    assert server.statistics("plus").inference_stats.success.count - before == 4
