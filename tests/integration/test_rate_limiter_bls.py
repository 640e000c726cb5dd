"""Triton core#448's shape on slotserve's rate limiter: a BLS caller holding a resource its callee needs. The
callee's wait for the resource ends at the call's deadline (the BLS request's timeout, or the caller's request's
deadline) with an error that names the resource, the caller answers, and both models serve again: nothing
deadlocks and nothing is lost (docs/lifecycle.md, "Rate limiter"). An ensemble whose steps share a resource runs
(the ensemble itself needs none: each step takes and gives back its own)."""

from __future__ import annotations

import json
import textwrap

import numpy as np

from service.core.rate_limiter import RateLimitMode
from service.testing import serve

WAIT = 60.0

GROUP = 'instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ { name: "GPU_MEM" count: 1 } ] } } ]\n'

CALLER = textwrap.dedent(
    """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                timeout_us = int(x[0])
                call = pb_utils.InferenceRequest(
                    model_name="callee",
                    inputs=[pb_utils.Tensor("X", x)],
                    requested_output_names=["Y"],
                    timeout=timeout_us,
                )
                answer = call.exec()
                if answer.has_error():
                    text = {"error": answer.error().message()}
                else:
                    text = {"Y": pb_utils.get_output_tensor_by_name(answer, "Y").as_numpy().tolist()}
                out = np.array([json.dumps(text).encode()], dtype=np.object_)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", out)]))
            return responses
    """
)

CALLEE = textwrap.dedent(
    """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests
            ]
    """
)


def _python_model(root, name: str, source: str, outputs: str, group: str = GROUP) -> None:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(source)
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f"output [ {outputs} ]\n" + group
    )


def _repository(root, caller_group: str = GROUP) -> None:
    _python_model(root, "caller", CALLER, '{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }', caller_group)
    _python_model(root, "callee", CALLEE, '{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }')


def _ask(running, timeout_us: float) -> dict:
    outputs = running.client.infer("caller", {"X": np.array([timeout_us], "f")}, timeout=WAIT)
    return json.loads(outputs["TEXT"][0])


def test_a_bls_caller_holding_the_resource_its_callee_needs_ends_at_the_deadline_naming_it(tmp_path):
    _repository(tmp_path)
    with serve(tmp_path, rate_limit=RateLimitMode.EXECUTION_COUNT) as running:
        limiter = running.server.runtime.rate_limiter
        assert limiter is not None
        answer = _ask(running, 500_000)  # the BLS call's own timeout: 0.5 s
        assert "error" in answer, answer
        assert "GPU_MEM" in answer["error"] and "model 'callee'" in answer["error"], answer
        assert "deadline" in answer["error"]
        assert limiter.queued() == 0  # the wait left the queue
        # Nothing held, nothing lost: the callee serves a client, and the caller asks again (and fails again:
        # the same shape, the same bounded answer).
        outputs = running.client.infer("callee", {"X": np.array([7.0], "f")}, timeout=WAIT)
        np.testing.assert_array_equal(outputs["Y"], np.array([7.0], "f"))
        assert "GPU_MEM" in _ask(running, 200_000)["error"]


def test_the_same_call_runs_when_the_caller_needs_no_resource(tmp_path):
    _repository(tmp_path, caller_group="instance_group [ { count: 1 kind: KIND_CPU } ]\n")
    with serve(tmp_path, rate_limit=RateLimitMode.EXECUTION_COUNT) as running:
        assert _ask(running, 5_000_000) == {"Y": [5_000_000.0]}


def test_with_the_rate_limiter_off_the_same_call_runs(tmp_path):
    _repository(tmp_path)
    with serve(tmp_path) as running:  # --rate-limit off: the default
        assert running.server.runtime.rate_limiter is None
        assert _ask(running, 5_000_000) == {"Y": [5_000_000.0]}
