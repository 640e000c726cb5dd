"""BLS calls from python models (pb_utils.InferenceRequest(...).exec()) on a real server: to an ONNX model and to a
python model, through the callee's admission; errors arriving as has_error() with their codes; a cancelled caller
cancelling its calls; a model calling itself with every slot held failing at the deadline; BLS in a batched
execute and from initialize (refused). The repository models (tests/python_models/repository/bls) are also run by
tritonclient from a separate process (tests/interop/test_bls.py) and against real Triton (tests/differential)."""

from __future__ import annotations

import json
import shutil
import threading
import time

import numpy as np
import pytest

from client import ClientError
from tests.integration._support import demo_subset
from tests.integration.python_models.test_python_models import shared_memory_files, write_model
from tests.python_models import REPOSITORY

BOUND = 30.0  # seconds within which a bounded failure must arrive, however loaded the machine


def ask_bls(running, mode: str, arg: dict | None = None, **kwargs):
    """What the repository's `bls` model answered (JSON)."""
    inputs = {
        "MODE": np.array([mode.encode()], dtype=object),
        "ARG": np.array([json.dumps(arg or {}).encode()], dtype=object),
    }
    return json.loads(running.client.infer("bls", inputs, **kwargs)["TEXT"][0])


def python_repository(tmp_path, *names):
    """A repository at tmp_path/repo with copies of the named tests/python_models models."""
    root = tmp_path / "repo"
    root.mkdir(exist_ok=True)
    for name in names:
        shutil.copytree(REPOSITORY / name, root / name)
    return root


def successes(running, model: str) -> int:
    (stats,) = running.client.statistics(model)
    return stats.inference_stats.success.count


CHAIN = """
class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            onnx = pb_utils.InferenceRequest(
                model_name="simple",
                inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", np.ones_like(x))],
                requested_output_names=["OUTPUT0"],
            ).exec()
            if onnx.has_error():
                responses.append(pb_utils.InferenceResponse(error=onnx.error()))
                continue
            plus_one = pb_utils.get_output_tensor_by_name(onnx, "OUTPUT0").as_numpy()
            python = pb_utils.InferenceRequest(
                model_name="add_sub",
                inputs=[pb_utils.Tensor("INPUT0", plus_one.reshape(-1)), pb_utils.Tensor("INPUT1", x.reshape(-1))],
                requested_output_names=["OUTPUT0"],
                model_version=1,
            ).exec()
            total = pb_utils.get_output_tensor_by_name(python, "OUTPUT0").as_numpy()
            plus_one += 1  # a BLS output is the model's own array: writable
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", total.reshape(1, 16)), pb_utils.Tensor("Z", plus_one)
            ]))
        return responses
"""

CHAIN_IO = """
max_batch_size: 8
input [ { name: "X" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "Z" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""


def test_bls_to_an_onnx_model_then_to_a_python_model_goes_through_their_admissions(slotserve, tmp_path):
    root = python_repository(tmp_path, "add_sub")
    demo_subset(root, "simple")
    write_model(root, "chain", CHAIN, CHAIN_IO)
    running = slotserve(root)
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    answer = running.client.infer("chain", {"X": x})
    np.testing.assert_array_equal(answer["Y"], 2 * x + 1)
    np.testing.assert_array_equal(answer["Z"], x + 2)
    assert successes(running, "simple") == 1 and successes(running, "add_sub") == 1  # counted by their admissions
    assert shared_memory_files() == []  # every BLS segment's file is gone


def test_bls_calls_several_at_once_from_threads_decoupled_and_async(slotserve):
    running = slotserve(REPOSITORY, parallel_jobs=2)
    assert ask_bls(running, "add_sub", {"a": [1, 2], "b": [3, 4]}) == {"OUTPUT0": [4, 6], "OUTPUT1": [-2, -2]}
    assert ask_bls(running, "several") == [{"OUTPUT0": [k + 1, k + 2], "OUTPUT1": [k - 1, k - 2]} for k in range(3)]
    assert ask_bls(running, "thread", {"a": [7], "b": [1]}) == {"OUTPUT0": [8], "OUTPUT1": [6]}
    # a decoupled callee: every response, then the empty final one (as Triton's iterator ends)
    assert ask_bls(running, "stream", {"n": 3}) == [[0], [1], [2], {}]
    assert ask_bls(running, "stream", {"n": 0}) == [{}]
    answer = running.client.infer("bls_async", {"A": np.array([4, 5, 6], dtype=np.int32)})
    assert {name: answer[name].tolist() for name in ("SUM", "DIFF", "STREAM")} == {
        "SUM": [8, 10, 12],
        "DIFF": [3, 4, 5],
        "STREAM": [0, 1, 2],
    }


def test_callee_errors_arrive_as_has_error_with_their_codes_and_nothing_is_lost(slotserve):
    running = slotserve(REPOSITORY, parallel_jobs=2)
    unknown = ask_bls(running, "unknown")["error"]
    assert unknown[0] == 2 and "'no_such_model'" in unknown[1]  # NOT_FOUND
    bad = ask_bls(running, "bad_input")["error"]
    assert bad[0] == 3 and "INPUT0" in bad[1] and "FP32" in bad[1] and "INT32" in bad[1]  # INVALID_ARG
    assert ask_bls(running, "callee_error", {"code": "UNAVAILABLE"})["error"] == [
        4,
        "refused by the callee",  # the callee's words as they are, as Triton passes a TritonError
    ]
    raised = ask_bls(running, "callee_raise")["error"]
    assert raised[0] == 1 and "ValueError: the callee is broken" in raised[1]  # INTERNAL
    assert ask_bls(running, "stream", {"n": -1}) == [{"error": [3, "n must be >= 0, got -1"]}]
    unary = ask_bls(running, "stream_unary")["error"]  # a decoupled callee without exec(decoupled=True)
    assert unary[0] == 5 and "decoupled transaction policy" in unary[1]  # UNSUPPORTED
    # the caller, the callees and the server serve on
    assert ask_bls(running, "add_sub", {"a": [1], "b": [1]}) == {"OUTPUT0": [2], "OUTPUT1": [0]}


def test_request_id_parameters_and_sequence_fields_reach_the_model_and_its_bls_calls(slotserve):
    running = slotserve(REPOSITORY, parallel_jobs=2)
    assert ask_bls(running, "info") == {"request_id": "", "parameters": {}, "correlation_id": 0, "flags": 0}
    seen = ask_bls(
        running, "info", request_id="req-7", parameters={"key": "value", "count": 3, "flag": True, "timeout": 5000000}
    )
    assert seen == {
        "request_id": "req-7",
        "parameters": {"key": "value", "count": 3, "flag": True},  # the protocol's own `timeout` is left out
        "correlation_id": 0,
        "flags": 0,
    }
    sequence = ask_bls(running, "info", parameters={"sequence_id": 42, "sequence_start": True, "sequence_end": True})
    assert sequence["correlation_id"] == 42 and sequence["flags"] == 3 and sequence["parameters"] == {}
    forwarded = ask_bls(running, "forward", request_id="r8")
    assert forwarded == {
        "request_id": "inner-r8",
        "parameters": {"from": "outer", "hop": 2},
        "correlation_id": 77,
        "flags": 0,
    }


def test_a_cancelled_caller_cancels_its_bls_call(slotserve, tmp_path):
    running = slotserve(REPOSITORY, parallel_jobs=2)
    marker = tmp_path / "callee-saw-cancel"
    started = time.monotonic()
    with pytest.raises(ClientError) as failed:
        ask_bls(running, "wait_cancel", {"marker": str(marker)}, timeout=1.0)
    assert failed.value.code == "DEADLINE_EXCEEDED"
    # the callee (probe, waiting for is_cancelled()) saw its request cancelled: the caller's deadline reached it
    while not marker.exists() and time.monotonic() - started < BOUND:
        time.sleep(0.05)  # ordering-free: polls an observable state until a deadline
    assert marker.exists(), "the BLS callee never saw its request cancelled"
    assert ask_bls(running, "add_sub", {"a": [2], "b": [1]}) == {"OUTPUT0": [3], "OUTPUT1": [1]}


SELF_CALLER = """
import json

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            text = "inner"
            if x[0] >= 1:  # call this model itself (timeout in microseconds when x[0] == 2)
                call = pb_utils.InferenceRequest(
                    model_name="self_caller",
                    inputs=[pb_utils.Tensor("X", np.zeros(1, np.int32))],
                    requested_output_names=["TEXT"],
                    timeout=500000 if x[0] == 2 else 0,
                )
                response = call.exec()
                text = json.dumps([response.has_error(), response.error().code() if response.has_error() else 0,
                                   response.error().message() if response.has_error() else ""])
            out = pb_utils.Tensor("TEXT", np.array([text.encode()], dtype=object))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""

SELF_CALLER_IO = """
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 } ]
"""


def self_call(running, x: int, **kwargs):
    return running.client.infer("self_caller", {"X": np.array([x], dtype=np.int32)}, **kwargs)["TEXT"][0]


def test_a_model_calling_itself_with_its_only_slot_held_fails_at_the_admission_timeout(slotserve, tmp_path):
    write_model(tmp_path, "self_caller", SELF_CALLER, SELF_CALLER_IO)
    running = slotserve(tmp_path, admission_timeout=1.0)
    started = time.monotonic()
    has_error, code, message = json.loads(self_call(running, 1))
    assert time.monotonic() - started < BOUND
    assert has_error and code == 4  # UNAVAILABLE: server_busy
    assert "had no free slot before the admission deadline" in message and "calling model itself" in message
    assert self_call(running, 0) == b"inner"  # the slot is free again


def test_a_self_call_fails_at_the_calls_own_timeout_and_at_the_callers_deadline(slotserve, tmp_path):
    write_model(tmp_path, "self_caller", SELF_CALLER, SELF_CALLER_IO)
    running = slotserve(tmp_path)  # no admission timeout: only the deadlines bound the wait
    has_error, code, message = json.loads(self_call(running, 2))  # the call's own timeout: 0.5 s
    assert has_error and code == 4 and "calling model itself" in message
    started = time.monotonic()
    try:
        answer = self_call(running, 1, timeout=2.0)  # the caller's deadline ends the call
    except ClientError as failed:
        assert failed.code == "DEADLINE_EXCEEDED", failed
    else:
        # The server's copy of the deadline is the client's less the request's way there: on a loaded machine the
        # model may see its call end at it and answer before the client's own deadline fires. Either way the
        # call ended at the caller's deadline: UNAVAILABLE naming the self-call (its admission deadline), or
        # CANCELLED (the caller's cancellation at that deadline came first).
        has_error, code, message = json.loads(answer)
        assert has_error and (code == 7 or (code == 4 and "calling model itself" in message)), (code, message)
    assert time.monotonic() - started < BOUND
    # the caller's cancellation ended its call: the slot is free again, no hang
    deadline = time.monotonic() + BOUND
    while True:
        try:
            assert self_call(running, 0, timeout=5.0) == b"inner"
            break
        except ClientError:
            assert time.monotonic() < deadline, "the slot was never freed"


BATCHED_CALLER = """
class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            doubled = pb_utils.InferenceRequest(
                model_name="add_sub",
                inputs=[pb_utils.Tensor("INPUT0", x.reshape(-1)), pb_utils.Tensor("INPUT1", x.reshape(-1))],
                requested_output_names=["OUTPUT0"],
            ).exec()
            y = pb_utils.get_output_tensor_by_name(doubled, "OUTPUT0").as_numpy().reshape(1, 1)
            n = np.array([[len(requests)]], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y), pb_utils.Tensor("N", n)]))
        return responses
"""

BATCHED_IO = """
max_batch_size: 8
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 20000000 }
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 } ]
"""


def test_bls_in_a_batched_execute_answers_each_request(slotserve, tmp_path):
    root = python_repository(tmp_path, "add_sub")
    write_model(root, "batched_caller", BATCHED_CALLER, BATCHED_IO)
    running = slotserve(root)
    answers: dict[int, dict] = {}

    def one(value: int) -> None:
        answers[value] = running.client.infer("batched_caller", {"X": np.array([[value]], dtype=np.int32)})

    threads = [threading.Thread(target=one, args=(value,)) for value in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(answers) == [0, 1, 2, 3]
    for value, answer in answers.items():
        assert answer["Y"].tolist() == [[2 * value]] and answer["N"].tolist() == [[4]]  # one execute of the 4


FROM_INITIALIZE = """
class TritonPythonModel:
    def initialize(self, args):
        try:
            pb_utils.InferenceRequest(model_name="x", inputs=[], requested_output_names=[]).exec()
            self.text = "allowed"
        except pb_utils.TritonModelException as error:
            self.text = str(error)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", np.array([self.text.encode()], dtype=object))])
                for _ in requests]
"""


def test_a_bls_call_outside_execute_is_refused_by_name(slotserve, tmp_path):
    write_model(tmp_path, "early", FROM_INITIALIZE, SELF_CALLER_IO)
    running = slotserve(tmp_path)
    text = running.client.infer("early", {"X": np.zeros(1, np.int32)})["TEXT"][0].decode()
    assert "a BLS call can only be made while execute runs" in text


RELAY = """
class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="repeat", inputs=[pb_utils.Tensor("IN", n)], requested_output_names=["OUT"]
            )
            for response in call.exec(decoupled=True):  # each response of the callee as it comes
                tensor = pb_utils.get_output_tensor_by_name(response, "OUT")
                if tensor is not None:
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", tensor.as_numpy() + 100)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

RELAY_IO = """
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def test_a_decoupled_callees_responses_reach_the_caller_as_they_come_and_its_cancel_reaches_the_callee(
    slotserve, tmp_path
):
    root = python_repository(tmp_path, "repeat")
    write_model(root, "relay", RELAY, RELAY_IO)
    running = slotserve(root)
    assert [
        int(item["OUT"][0]) for item in running.client.stream_infer("relay", [{"IN": np.array([3], np.int32)}])
    ] == [
        100,
        101,
        102,
    ]
    (before,) = running.client.stream_infer("repeat", [{"IN": np.array([997], np.int32)}], timeout=60)
    # repeat(999) sends [0], then waits until its request is cancelled: the relay forwards [0] while it waits
    items = running.client.stream_infer("relay", [{"IN": np.array([999], np.int32)}], timeout=60)
    assert int(next(items)["OUT"][0]) == 100
    items.close()  # the client goes: the relay's request is cancelled, so is its BLS call, and repeat ends
    # repeat has one slot: it serves again only once the cancelled call let it go (no kill: the same worker)
    (after,) = running.client.stream_infer("repeat", [{"IN": np.array([997], np.int32)}], timeout=60)
    assert int(after["OUT"][0]) == int(before["OUT"][0])


LATE_CALLER = """
import threading

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:  # answered from a thread, after execute returned: the call runs until the final flag
            threading.Thread(target=self.answer, args=(request,)).start()
        return None

    def answer(self, request):
        sender = request.get_response_sender()
        n = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        call = pb_utils.InferenceRequest(
            model_name="add_sub", inputs=[pb_utils.Tensor("INPUT0", n), pb_utils.Tensor("INPUT1", n)],
            requested_output_names=["OUTPUT0"],
        )
        doubled = pb_utils.get_output_tensor_by_name(call.exec(), "OUTPUT0").as_numpy()
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", doubled)]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


def test_a_decoupled_models_thread_may_call_until_its_final_flag(slotserve, tmp_path):
    root = python_repository(tmp_path, "add_sub")
    write_model(root, "late_caller", LATE_CALLER, RELAY_IO)
    running = slotserve(root)
    (answer,) = running.client.stream_infer("late_caller", [{"IN": np.array([21], np.int32)}], timeout=60)
    assert answer["OUT"].tolist() == [42]


WAITER = """
import time

class TritonPythonModel:
    def execute(self, requests):
        folder = pb_utils.get_input_tensor_by_name(requests[0], "TEXT").as_numpy()[0].decode()
        open(os.path.join(folder, "started"), "w").close()
        deadline = time.monotonic() + 60
        while not requests[0].is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)  # ordering-free: polls is_cancelled() until a deadline
        if requests[0].is_cancelled():
            open(os.path.join(folder, "cancelled"), "w").close()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", np.array([b"x" * 100000], dtype=object))])]
"""

DIER = """
import threading
import time

class TritonPythonModel:
    def execute(self, requests):
        folder = pb_utils.get_input_tensor_by_name(requests[0], "TEXT").as_numpy()[0].decode()

        def die_once_the_callee_runs():
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(folder, "started")) and time.monotonic() < deadline:
                time.sleep(0.01)  # ordering-free: polls for the callee's file until a deadline
            os._exit(9)

        threading.Thread(target=die_once_the_callee_runs, daemon=True).start()
        pb_utils.InferenceRequest(
            model_name="waiter", inputs=[requests[0].inputs()[0]], requested_output_names=["TEXT"]
        ).exec()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", np.array([b"unreachable"], dtype=object))])]
"""

TEXT_IO = """
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def test_a_caller_whose_worker_dies_mid_call_cancels_the_call_and_leaves_no_files(slotserve, tmp_path):
    write_model(tmp_path / "repo", "waiter", WAITER, TEXT_IO)
    write_model(tmp_path / "repo", "dier", DIER, TEXT_IO)
    running = slotserve(tmp_path / "repo")
    folder = tmp_path / "marks"
    folder.mkdir()
    with pytest.raises(ClientError) as failed:
        running.client.infer("dier", {"TEXT": np.array([str(folder).encode()], dtype=object)}, timeout=60)
    assert failed.value.code == "INTERNAL" and "exited with code 9" in failed.value.message
    deadline = time.monotonic() + BOUND
    while not (folder / "cancelled").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # ordering-free: polls an observable state until a deadline
    assert (folder / "cancelled").exists(), "the callee never saw the call cancelled"
    # the callee's answer had nowhere to go: its reply segment's file is gone too (polled: it is written last)
    while shared_memory_files() and time.monotonic() < deadline:
        time.sleep(0.05)  # ordering-free: polls an observable state until a deadline
    assert shared_memory_files() == []
