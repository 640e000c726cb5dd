"""The same ModelStreamInfer requests on slotserve and on real Triton 2.51 (tests/python_models' repository on both):
every answer's model, version, id, `triton_final_response` parameter and outputs agree, with and without
`triton_enable_empty_final_response`, and for an error response. tests/integration/streams/test_stream_final_response.py
holds slotserve's side alone.

Skips, naming the reason, where the reference is not set up (bench/setup.sh builds it).
"""

from __future__ import annotations

import grpc
import pytest

from generated import grpc_service_pb2_grpc as pb_grpc
from tests.differential.test_python_models import triton
from tests.integration.streams.test_stream_final_response import ENABLE, FINAL, _add_sub, _repeat
from tests.python_models import REPOSITORY

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    from service.testing import serve

    with triton(tmp_path_factory.mktemp("triton")) as reference:
        with serve(REPOSITORY, parallel_jobs=1) as running:
            yield running.address, reference


def _replies(address: str, *requests) -> list[tuple]:
    """Every stream message as (error text, model, version, id, the final parameter or None, output names)."""
    with grpc.insecure_channel(address) as channel:
        replies = pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(requests), timeout=120)
        seen = []
        for reply in replies:
            response = reply.infer_response
            final = response.parameters[FINAL].bool_param if FINAL in response.parameters else None
            outputs = sorted(o.name for o in response.outputs)
            seen.append((reply.error_message, response.model_name, response.model_version, response.id, final, outputs))
        return seen


def _same(ours: tuple, theirs: tuple) -> bool:
    """An answer the same in every field; an error the same in its id and outputs (none), Triton's text inside ours,
    and final wherever Triton says final. Differences on purpose: slotserve names the model on every error it
    makes itself (a model's own TritonError passes as it is, as on Triton), and marks every failed request's reply
    final (Triton 2.51 leaves
    the parameter off a request refused before it reached the model)."""
    if not theirs[0]:
        return ours == theirs
    same_final = ours[4] is True and theirs[4] in (True, None)
    return bool(ours[0]) and theirs[0] in ours[0] and ours[3] == theirs[3] and ours[5] == theirs[5] and same_final


CASES = {
    "responses, then the final flag alone": [_repeat(2, "a")],
    "the same, asking for the empty final answer": [_repeat(2, "a", **{ENABLE: True})],
    "no response at all, asking": [_repeat(0, "b", **{ENABLE: True})],
    "no response at all, not asking": [_repeat(0, "b"), _repeat(1, "b2")],
    "a response sent with the final flag, asking": [_repeat(997, "c", **{ENABLE: True})],
    "an ordinary model, asking and not": [_add_sub("d"), _add_sub("e", **{ENABLE: True})],
    "the ask as a string parameter": [_repeat(1, "f", **{ENABLE: "true"})],
    "an error response, asking": [_repeat(-1, "g", **{ENABLE: True}), _repeat(1, "h")],
}


@pytest.mark.parametrize("case", list(CASES))
def test_stream_answers_and_their_final_parameter_are_the_same(both, case):
    ours, theirs = (_replies(address, *CASES[case]) for address in both)
    assert len(ours) == len(theirs) and all(map(_same, ours, theirs)), (ours, theirs)
