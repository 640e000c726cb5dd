"""Sequence models served for real (issue 23): a real server on a real port, raw stubs over ModelInfer and
ModelStreamInfer, several sequences interleaved, the accumulate model with implicit state and the control-only
model (tests/sequence_builders.py); expectations computed here (running sums), never by the server's code."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from generated import grpc_service_pb2 as pb
from service.testing import serve
from tests.sequence_builders import expected_sums, write_accumulate, write_controls

from .._support import CALL_TIMEOUT, demo_subset, rpc_error, stub


def sequence_request(model: str, value: int, sequence_id, *, start=False, end=False, batched=False):
    message = pb.ModelInferRequest(model_name=model)
    shape = [1, 1] if batched else [1]
    message.inputs.add(name="INPUT", datatype="INT32", shape=shape)
    message.raw_input_contents.append(np.array([value], np.int32).tobytes())
    if isinstance(sequence_id, str):
        message.parameters["sequence_id"].string_param = sequence_id
    elif sequence_id:
        message.parameters["sequence_id"].int64_param = sequence_id
    if start:
        message.parameters["sequence_start"].bool_param = True
    if end:
        message.parameters["sequence_end"].bool_param = True
    return message


def output(response, name: str = "OUTPUT", dtype=np.int32):
    index = [o.name for o in response.outputs].index(name)
    return np.frombuffer(response.raw_output_contents[index], dtype)


def run_sequence(infer, model: str, sequence_id, values: list[int], batched=False) -> list[int]:
    answers = []
    for index, value in enumerate(values):
        request = sequence_request(
            model, value, sequence_id, start=index == 0, end=index == len(values) - 1, batched=batched
        )
        answers.append(int(output(infer(request, timeout=CALL_TIMEOUT))[0]))
    return answers


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "models"
    write_accumulate(root, "accumulate", slots=2)
    write_accumulate(root, "accumulate_batched", slots=1, batched=True)
    write_controls(root, "controls", slots=2)
    return root


def test_a_sequence_accumulates_with_implicit_state_the_client_never_sees(repository):
    with serve(repository) as running:
        answers = run_sequence(stub(running).ModelInfer, "accumulate", 7, [1, 2, 3, 4])
        assert answers == expected_sums([1, 2, 3, 4])
        response = stub(running).ModelInfer(sequence_request("accumulate", 5, 8, start=True), timeout=CALL_TIMEOUT)
        assert [o.name for o in response.outputs] == ["OUTPUT"]  # STATE_OUT stays on the server
        metadata = stub(running).ModelMetadata(pb.ModelMetadataRequest(name="accumulate"), timeout=CALL_TIMEOUT)
        assert [t.name for t in metadata.inputs] == ["INPUT"] and [t.name for t in metadata.outputs] == ["OUTPUT"]
        # A batching sequence model takes requests of batch size 1 and fills [1, 1] controls and [1, 1] state.
        assert run_sequence(stub(running).ModelInfer, "accumulate_batched", "s-1", [4, 5], batched=True) == [4, 9]


def test_interleaved_sequences_over_threads_each_keep_their_own_state(repository):
    """Four sequences on two slots (two at a time; the others wait for a slot), each from its own thread."""
    values = {sequence_id: [sequence_id * 10 + k for k in range(6)] for sequence_id in (1, 2, 3, 4)}
    results: dict[int, list[int]] = {}
    with serve(repository, parallel_jobs=2) as running:
        infer = stub(running).ModelInfer

        def drive(sequence_id: int) -> None:
            results[sequence_id] = run_sequence(infer, "accumulate", sequence_id, values[sequence_id])

        threads = [threading.Thread(target=drive, args=(sequence_id,)) for sequence_id in values]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(CALL_TIMEOUT)
    assert results == {sequence_id: expected_sums(v) for sequence_id, v in values.items()}


def test_sequences_interleaved_on_one_stream_keep_order_and_state(repository):
    """Two sequences' requests alternate on one ModelStreamInfer stream; each answer carries its sequence's sum."""
    a, b = [1, 2, 3], [100, 200, 300]
    requests = []
    for index in range(3):
        for sequence_id, values in ((11, a), (12, b)):
            requests.append(
                sequence_request("accumulate", values[index], sequence_id, start=index == 0, end=index == 2)
            )
    with serve(repository, parallel_jobs=2) as running:  # a slot per sequence: a stream runs its requests in turn
        answers = list(stub(running).ModelStreamInfer(iter(requests), timeout=CALL_TIMEOUT))
    assert all(not answer.error_message for answer in answers), [answer.error_message for answer in answers]
    sums = [int(output(answer.infer_response)[0]) for answer in answers]
    assert sums == [1, 100, 3, 300, 6, 600]


def test_direct_opens_max_batch_size_times_instances_sequences_at_once(tmp_path):
    """As Triton's direct: max_batch_size 2 x 2 instances = 4 sequences open at once from one client (their
    requests interleaved, each keeping its own sum); a fifth start waits, past its timeout UNAVAILABLE naming the
    4 sequence slots, and the four sequences go on untouched."""
    write_accumulate(tmp_path, "acc_2x2", slots=2, batched=True, max_batch_size=2)
    values = {sequence_id: [sequence_id, 10 * sequence_id, 100 * sequence_id] for sequence_id in (1, 2, 3, 4)}
    sums: dict[int, list[int]] = {sequence_id: [] for sequence_id in values}
    with serve(tmp_path, parallel_jobs=2) as running:
        infer = stub(running).ModelInfer
        for step in range(3):
            if step == 1:
                fifth = sequence_request("acc_2x2", 5, 5, start=True, end=True, batched=True)
                fifth.parameters["timeout"].int64_param = 300_000
                refused = rpc_error(infer, fifth)
                assert refused.code == "UNAVAILABLE" and refused.reason == "server_busy", refused
                assert "4 sequence slots" in refused.message, refused
            for sequence_id, steps in values.items():
                request = sequence_request(
                    "acc_2x2", steps[step], sequence_id, start=step == 0, end=step == 2, batched=True
                )
                sums[sequence_id].append(int(output(infer(request, timeout=CALL_TIMEOUT))[0]))
    assert sums == {sequence_id: expected_sums(steps) for sequence_id, steps in values.items()}


def test_a_string_id_for_a_numeric_corrid_is_refused_by_name_and_holds_no_slot(repository):
    """`controls` has a UINT64 CORRID and one slot here: a string id is refused before it takes a sequence slot,
    so the next sequence starts at once (within its 2 s timeout) and the refused id has no open sequence."""
    with serve(repository) as running:
        infer = stub(running).ModelInfer
        refused = rpc_error(infer, sequence_request("controls", 1, "abc", start=True))
        assert refused.code == "INVALID_ARGUMENT", refused
        assert "'abc'" in refused.message and "UINT64" in refused.message, refused
        after = sequence_request("controls", 2, 77, start=True, end=True)
        after.parameters["timeout"].int64_param = 2_000_000
        assert int(output(infer(after, timeout=CALL_TIMEOUT), "CORRID_OUT", np.uint64)[0]) == 77


def test_control_inputs_are_filled_as_configured(repository):
    with serve(repository) as running:
        infer = stub(running).ModelInfer
        first = infer(sequence_request("controls", 5, 42, start=True), timeout=CALL_TIMEOUT)
        middle = infer(sequence_request("controls", 6, 42), timeout=CALL_TIMEOUT)
        last = infer(sequence_request("controls", 7, 42, end=True), timeout=CALL_TIMEOUT)
    seen = [
        (
            int(output(r, "INPUT_OUT")[0]),
            int(output(r, "START_OUT")[0]),
            float(output(r, "END_OUT", np.float32)[0]),
            bool(output(r, "READY_OUT", np.bool_)[0]),
            int(output(r, "CORRID_OUT", np.uint64)[0]),
        )
        for r in (first, middle, last)
    ]
    assert seen == [(5, 1, 0.0, True, 42), (6, 0, 0.0, True, 42), (7, 0, 1.0, True, 42)]


def test_sequence_errors_are_invalid_argument_and_lose_nothing(repository):
    with serve(repository) as running:
        infer = stub(running).ModelInfer
        assert run_sequence(infer, "accumulate", 3, [1]) == [1]  # a sequence of one request
        infer(sequence_request("accumulate", 2, 5, start=True), timeout=CALL_TIMEOUT)  # stays open
        no_id = rpc_error(infer, sequence_request("accumulate", 1, 0))
        assert no_id.code == "INVALID_ARGUMENT"
        assert "must specify a non-zero or non-empty correlation ID" in no_id.message
        never = rpc_error(infer, sequence_request("accumulate", 1, 99))
        assert never.code == "INVALID_ARGUMENT"
        assert "sequence 99" in never.message and "must specify the START flag" in never.message
        ended = rpc_error(infer, sequence_request("accumulate", 1, 3))
        assert ended.message == (  # Triton's words first (its clients read them), then why the sequence ended
            "inference request for sequence 3 to model 'accumulate' must specify the START flag on the first request "
            "of the sequence: the sequence was ended because its END request was served; start a new one with "
            "sequence_start"
        )
        wrong = sequence_request("accumulate", 1, 5)
        wrong.parameters["sequence_end"].string_param = "yes"
        bad_type = rpc_error(infer, wrong)
        assert bad_type.code == "INVALID_ARGUMENT" and "'sequence_end' parameter, expected bool_param" in (
            bad_type.message
        )
        wrong_id = sequence_request("accumulate", 1, 0)
        wrong_id.parameters["sequence_id"].double_param = 1.5
        assert "'sequence_id' parameter, expected int64_param" in rpc_error(infer, wrong_id).message
        batch = sequence_request("accumulate_batched", 1, 9, start=True, batched=True)
        batch.inputs[0].shape[:] = [2, 1]
        batch.raw_input_contents[0] = np.array([1, 2], np.int32).tobytes()
        assert "must specify batch-size 1" in rpc_error(infer, batch).message
        # Sequence 5 lost nothing: its sum goes on from 2.
        last = infer(sequence_request("accumulate", 3, 5, end=True), timeout=CALL_TIMEOUT)
        assert int(output(last)[0]) == 5


def test_the_demo_silero_vad_stream_keeps_each_streams_state_on_the_server(tmp_path):
    """The demo's silero_vad_stream over a sequence (the client sends chunks and `sr` only) equals the checkpoint
    run by ONNX Runtime here with the recurrent state carried by hand, chunk by chunk, for two interleaved
    streams."""
    import onnxruntime

    from engine.config.repository import ModelRepository
    from engine.onnxruntime_backend import session_options

    repository = demo_subset(tmp_path / "models", "silero_vad_stream")
    spec = ModelRepository(repository).read("silero_vad_stream")
    reference = onnxruntime.InferenceSession(
        str(spec.model_file), session_options(spec), providers=["CPUExecutionProvider"]
    )
    rng = np.random.default_rng(23)
    chunks = {
        1: rng.normal(0, 0.1, (5, 1, 576)).astype(np.float32),
        2: rng.normal(0, 0.3, (5, 1, 576)).astype(np.float32),
    }
    sr = np.array(16000, np.int64)
    expected = {}
    for sequence_id, audio in chunks.items():
        state = np.zeros((2, 1, 128), np.float32)
        expected[sequence_id] = []
        for chunk in audio:
            probability, state = reference.run(["output", "stateN"], {"input": chunk, "state": state, "sr": sr})
            expected[sequence_id].append(probability)
    served: dict[int, list] = {1: [], 2: []}
    with serve(repository, parallel_jobs=2) as running:
        infer = stub(running).ModelInfer
        for index in range(5):
            for sequence_id, audio in chunks.items():
                request = pb.ModelInferRequest(model_name="silero_vad_stream")
                request.inputs.add(name="input", datatype="FP32", shape=[1, 576])
                request.raw_input_contents.append(audio[index].tobytes())
                request.inputs.add(name="sr", datatype="INT64", shape=[])
                request.raw_input_contents.append(sr.tobytes())
                request.parameters["sequence_id"].int64_param = sequence_id
                request.parameters["sequence_start"].bool_param = index == 0
                request.parameters["sequence_end"].bool_param = index == 4
                response = infer(request, timeout=CALL_TIMEOUT)
                assert [o.name for o in response.outputs] == ["output"]
                served[sequence_id].append(output(response, "output", np.float32).reshape(1, 1))
    for sequence_id in chunks:
        np.testing.assert_array_equal(np.array(served[sequence_id]), np.array(expected[sequence_id]))


PYTHON_ACCUMULATE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}  # per CORRID, inside this slot's worker: needs every request of a sequence on this slot

    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()[0])
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy()[0])
            corrid = int(pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()[0])
            state = pb_utils.get_input_tensor_by_name(request, "STATE_IN").as_numpy()
            self.sums[corrid] = (0 if start else self.sums.get(corrid, 0)) + value
            carried = (state * (1 - start) + value).astype(np.int32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", np.array([self.sums[corrid]], np.int32)),
                pb_utils.Tensor("CARRIED", carried),
                pb_utils.Tensor("STATE_OUT", carried),
            ]))
        return responses
"""


def test_a_python_sequence_model_gets_its_controls_its_state_and_always_its_own_worker(tmp_path):
    """A python model keeping a sum per CORRID in its worker answers running sums only if every request of a
    sequence reaches the same slot's worker; its implicit state (CARRIED) accumulates the same."""
    root = tmp_path / "models"
    (root / "pyacc" / "1").mkdir(parents=True)
    (root / "pyacc" / "1" / "model.py").write_text(PYTHON_ACCUMULATE)
    (root / "pyacc" / "config.pbtxt").write_text(
        'name: "pyacc"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },'
        ' { name: "CARRIED" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "instance_group [ { count: 3 } ]\n"
        "sequence_batching {\n  control_input [\n"
        '    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },\n'
        '    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ]\n'
        '  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n}\n'
    )
    values = {sequence_id: [sequence_id * 7 + k for k in range(5)] for sequence_id in (1, 2, 3)}
    got: dict[int, list[tuple[int, int]]] = {s: [] for s in values}
    with serve(root, parallel_jobs=3) as running:
        infer = stub(running).ModelInfer
        for index in range(5):
            for sequence_id, vals in values.items():
                request = sequence_request("pyacc", vals[index], sequence_id, start=index == 0, end=index == 4)
                response = infer(request, timeout=CALL_TIMEOUT)
                assert sorted(o.name for o in response.outputs) == ["CARRIED", "OUTPUT"]
                got[sequence_id].append((int(output(response)[0]), int(output(response, "CARRIED")[0])))
    assert got == {s: [(total, total) for total in expected_sums(v)] for s, v in values.items()}
