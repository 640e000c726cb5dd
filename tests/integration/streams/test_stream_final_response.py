"""ModelStreamInfer tells the client which answer ends a request, as Triton 2.51 does (tests/differential/
test_stream_final_response.py asks Triton the same questions):

- every answer carries the bool parameter `triton_final_response`: true on an ordinary model's one answer and on a
  decoupled model's response sent with the final flag, false on a response that more may follow;
- a request with `triton_enable_empty_final_response` true whose final flag came alone (or with no response at all)
  ends with an empty answer: no outputs, the final parameter true, the model's name and the request's id;
- unary ModelInfer answers carry no such parameter.

tests/python_models' decoupled `repeat`: IN = [n] answers n responses, then the final flag alone; n == 997 sends
one response together with the final flag.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from tests.python_models import REPOSITORY

FINAL = "triton_final_response"
ENABLE = "triton_enable_empty_final_response"


def _request(model: str, name: str, values: np.ndarray, request_id: str, **parameters) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    tensor = request.inputs.add(name=name, datatype="INT32", shape=list(values.shape))
    tensor.contents.int_contents.extend(int(v) for v in values.reshape(-1))
    for key, value in parameters.items():
        if isinstance(value, bool):
            request.parameters[key].bool_param = value
        else:
            request.parameters[key].string_param = str(value)
    return request


def _add_sub(request_id: str, **parameters) -> pb.ModelInferRequest:
    request = _request("add_sub", "INPUT0", np.arange(4, dtype=np.int32), request_id, **parameters)
    other = request.inputs.add(name="INPUT1", datatype="INT32", shape=[4])
    other.contents.int_contents.extend([1, 1, 1, 1])
    return request


def _repeat(n: int, request_id: str, **parameters) -> pb.ModelInferRequest:
    return _request("repeat", "IN", np.array([n], np.int32), request_id, **parameters)


def _answers(address: str, *requests: pb.ModelInferRequest) -> list[tuple[str, str, str, object, list[str]]]:
    """(model, version, id, the final parameter or None, output names) of every answer, in order."""
    with grpc.insecure_channel(address) as channel:
        replies = pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(requests), timeout=60)
        answers = []
        for reply in replies:
            assert not reply.error_message, reply.error_message
            response = reply.infer_response
            final = response.parameters[FINAL].bool_param if FINAL in response.parameters else None
            answers.append(
                (
                    response.model_name,
                    response.model_version,
                    response.id,
                    final,
                    sorted(o.name for o in response.outputs),
                )
            )
        return answers


@pytest.fixture(scope="module")
def address():
    from service.testing import serve

    with serve(REPOSITORY, parallel_jobs=1) as running:
        yield running.address


def test_a_decoupled_models_responses_say_they_are_not_final_and_the_flag_alone_adds_nothing(address):
    assert _answers(address, _repeat(2, "a")) == [("repeat", "1", "a", False, ["OUT"])] * 2


def test_an_empty_final_answer_ends_the_request_when_the_client_asks_for_it(address):
    answers = _answers(address, _repeat(2, "a", **{ENABLE: True}), _repeat(0, "b", **{ENABLE: True}))
    assert answers == [
        ("repeat", "1", "a", False, ["OUT"]),
        ("repeat", "1", "a", False, ["OUT"]),
        ("repeat", "", "a", True, []),
        ("repeat", "", "b", True, []),  # no response at all: the empty final answer alone
    ]


def test_a_response_sent_with_the_final_flag_is_final_and_needs_no_empty_answer(address):
    assert _answers(address, _repeat(997, "c", **{ENABLE: True})) == [("repeat", "1", "c", True, ["OUT"])]


def test_an_ordinary_models_one_answer_is_final_with_or_without_the_ask(address):
    answers = _answers(address, _add_sub("d"), _add_sub("e", **{ENABLE: True}))
    assert answers == [
        ("add_sub", "1", "d", True, ["OUTPUT0", "OUTPUT1"]),
        ("add_sub", "1", "e", True, ["OUTPUT0", "OUTPUT1"]),
    ]


def test_an_ask_that_is_not_a_bool_parameter_is_refused_by_name_and_the_stream_goes_on(address):
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        replies = list(stub.ModelStreamInfer(iter([_repeat(1, "f", **{ENABLE: "true"}), _repeat(1, "f2")]), timeout=60))
        with pytest.raises(grpc.RpcError) as unary:
            stub.ModelInfer(_add_sub("f3", **{ENABLE: "yes"}), timeout=60)
    expected = "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param."
    refused, answered = replies
    assert expected in refused.error_message
    assert refused.infer_response.id == "f" and refused.infer_response.parameters[FINAL].bool_param is True
    assert not answered.error_message and answered.infer_response.id == "f2"
    assert unary.value.code() is grpc.StatusCode.INVALID_ARGUMENT and expected in unary.value.details()


def test_unary_answers_carry_no_final_parameter(address):
    with grpc.insecure_channel(address) as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(_add_sub("g"), timeout=60)
    assert FINAL not in response.parameters
