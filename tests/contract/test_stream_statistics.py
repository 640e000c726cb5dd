"""Statistics of stream requests (not a contract cell): a request answered in full counts as one success even
when its stream is closed right after the answer, as ModelInfer counts before it returns (found by the soak)."""

from __future__ import annotations

import numpy as np

from generated import grpc_service_pb2 as pb
from service.request_path.dataplane import Dataplane
from service.transport.tensors import as_message, inference_request


def _request(model: str):
    request = pb.ModelInferRequest(model_name=model, id="r1")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[2])
    request.raw_input_contents.append(np.ones(2, np.float32).tobytes())
    return inference_request(request, as_message)


def _counts(lab, model: str) -> tuple[int, int]:
    snapshot = lab.registry.get(model).statistics.snapshot()
    return snapshot.success.count, snapshot.fail.count


def test_an_answer_taken_then_the_stream_closed_counts_one_success_and_frees_the_slot(lab_factory):
    lab = lab_factory({"a": {}}, parallel_jobs=1)
    responses = Dataplane(lab.registry).infer_stream(_request("a"))
    answer = next(responses)
    assert answer.id == "r1" and np.frombuffer(answer.raw_output_contents[0], np.float32).tolist() == [1.0, 1.0]
    responses.close()  # what a cancelled stream does: the generator never resumes after its yield
    assert _counts(lab, "a") == (1, 0)
    assert lab.status("a").active_slots == 0


def test_a_streaming_model_closed_before_its_last_answer_counts_one_failure_and_frees_the_slot(lab_factory):
    lab = lab_factory({"s": {"stream_responses": 3}}, parallel_jobs=1)
    responses = Dataplane(lab.registry).infer_stream(_request("s"))
    next(responses)
    responses.close()  # two answers were never produced
    assert _counts(lab, "s") == (0, 1)
    assert lab.status("s").active_slots == 0


def test_a_streaming_model_read_to_the_end_counts_one_success(lab_factory):
    lab = lab_factory({"s": {"stream_responses": 3}}, parallel_jobs=1)
    assert len(list(Dataplane(lab.registry).infer_stream(_request("s")))) == 3
    assert _counts(lab, "s") == (1, 0)
