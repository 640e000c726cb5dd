"""Ensembles with a decoupled step on a real server (in-process, python models, slotserve's own client): each response
of the decoupled step runs the step after it as a request of its own and reaches the client on the stream as it is
made; the ensemble is decoupled itself (ModelInfer refused in Triton's words); a request that ends (the client's
cancel, its deadline) ends its running steps and frees every slot; an error in a later response ends the request
with that error, named for the step (docs/ensembles.md, "Decoupled steps"). What Triton 2.51 answers to the same
calls is asked in tests/differential/qa/test_ensembles_decoupled.py."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from client import ClientError
from service.request_path.ensemble import BACKLOG
from service.request_path.internal_calls import call_model_stream

# The decoupled step: N responses OUT = [0], [1], ... on a thread of the model, then the final flag. MODE 1: the
# response at index 1 is an error (then the rest and the final flag, which the ensemble no longer reads). MODE 2:
# response 0, then it waits until the request is cancelled. MODE 3: responses [0] and [777] (which the next step
# holds), the second with the final flag. MODE 4: as 0, writing how many responses were sent (the server read them:
# a send returns once it has) into the file named by the `progress` parameter of its config.
COUNTER = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _response(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])


class TritonPythonModel:
    def initialize(self, args):
        import json

        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.progress = parameters.get("progress", {}).get("string_value", "")

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            sender = request.get_response_sender()
            threading.Thread(target=self.answer, args=(request, sender, n, mode), daemon=True).start()
        return None

    def answer(self, request, sender, n, mode):
        if mode == 3:
            sender.send(_response(0))
            sender.send(_response(777), flags=FINAL)
            return
        for index in range(n):
            if mode == 1 and index == 1:
                error = pb_utils.TritonError(f"counter failed at response {index}")
                sender.send(pb_utils.InferenceResponse(error=error))
                continue
            sender.send(_response(index))
            if mode == 4:
                with open(self.progress, "w") as progress:
                    progress.write(str(index + 1))
            if mode == 2:
                while not request.is_cancelled():
                    time.sleep(0.01)  # ordering-free: polls the request's cancellation
                break
        sender.send(flags=FINAL)
"""

# The ordinary step: Y = X + 1000; X = 777 waits until its request is cancelled.
PLUS = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if int(x[0]) == 777:
                while not request.is_cancelled():
                    time.sleep(0.01)  # ordering-free: polls the request's cancellation
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("plus: cancelled")))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1000)]))
        return responses
"""

# A second decoupled step: N responses OUT = [0], [1], ..., sent from execute, then the final flag.
RECOUNT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for index in range(int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([index], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

INT1 = "data_type: TYPE_INT32 dims: [ 1 ]"


def _python_model(root: Path, name: str, config: str, source: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n' + config)
    (root / name / "1" / "model.py").write_text(textwrap.dedent(source))


def write_repository(root: Path) -> Path:
    """counter (decoupled) -> plus, as the ensemble `chain` (outputs Y); each step model has one slot. The
    counter's progress file is root/progress."""
    _python_model(
        root,
        "counter",
        f'input [ {{ name: "N" {INT1} }}, {{ name: "MODE" {INT1} }} ]\noutput [ {{ name: "OUT" {INT1} }} ]\n'
        "model_transaction_policy { decoupled: true }\n"
        f'parameters {{ key: "progress" value: {{ string_value: "{root / "progress"}" }} }}\n',
        COUNTER,
    )
    _python_model(root, "plus", f'input [ {{ name: "X" {INT1} }} ]\noutput [ {{ name: "Y" {INT1} }} ]\n', PLUS)
    (root / "chain" / "1").mkdir(parents=True)
    (root / "chain" / "config.pbtxt").write_text(
        'name: "chain"\nplatform: "ensemble"\nmax_batch_size: 0\n'
        f'input [ {{ name: "N" {INT1} }}, {{ name: "MODE" {INT1} }} ]\noutput [ {{ name: "Y" {INT1} }} ]\n'
        "ensemble_scheduling { step [\n"
        '  { model_name: "counter" model_version: -1 input_map { key: "N" value: "N" } '
        'input_map { key: "MODE" value: "MODE" } output_map { key: "OUT" value: "counted" } },\n'
        '  { model_name: "plus" model_version: -1 input_map { key: "X" value: "counted" } '
        'output_map { key: "Y" value: "Y" } }\n'
        "] }\n"
    )
    return root


def request(n: int, mode: int = 0) -> dict[str, np.ndarray]:
    return {"N": np.array([n], np.int32), "MODE": np.array([mode], np.int32)}


def successes(running, model: str) -> tuple[int, int]:
    (stats,) = running.client.statistics(model)
    return stats.inference_stats.success.count, stats.inference_stats.fail.count


def busy(running, model: str) -> int:
    """The model's requests running or queued now."""
    status = running.server.registry.get(model).status()
    return status.active_slots + status.queued_requests


def wait_until(condition, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.02)  # ordering-free: polls an observable state until a deadline


def nothing_leased(running) -> bool:
    return all(busy(running, model) == 0 for model in ("chain", "counter", "plus"))


@pytest.fixture
def running(slotserve, tmp_path):
    return slotserve(write_repository(tmp_path))


def test_each_response_of_the_decoupled_step_runs_the_next_step_and_is_answered_on_the_stream(running):
    items = list(running.client.stream_infer("chain", [request(5)], timeout=120))
    assert [int(item["Y"][0]) for item in items] == [1000, 1001, 1002, 1003, 1004]  # each through plus, in order
    assert successes(running, "plus") == (5, 0)  # one call of the ordinary step per response
    assert successes(running, "counter") == (1, 0)
    assert successes(running, "chain") == (1, 0)
    # zero responses: the request ends with none; and the model's config says what Triton's says
    assert list(running.client.stream_infer("chain", [request(0)], timeout=120)) == []
    assert running.client.model_config("chain").model_transaction_policy.decoupled is True


def test_modelinfer_on_a_decoupled_ensemble_is_refused_in_tritons_words(running):
    with pytest.raises(ClientError) as refused:
        running.client.infer("chain", request(2), timeout=120)
    assert refused.value.code == "UNIMPLEMENTED"
    assert refused.value.message == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    assert [int(item["Y"][0]) for item in running.client.stream_infer("chain", [request(2)], timeout=120)] == [
        1000,
        1001,
    ]


@pytest.mark.parametrize("mode", [2, 3], ids=["decoupled_step_running", "next_step_running"])
def test_a_cancelled_stream_ends_the_running_steps_and_frees_every_slot(running, mode):
    items = running.client.stream_infer("chain", [request(5, mode)], timeout=120)
    assert int(next(items)["Y"][0]) == 1000  # response 0, answered through plus
    if mode == 2:  # the counter runs on, waiting
        assert busy(running, "counter") == 1
    else:  # the counter has ended; plus holds the second response's call
        wait_until(lambda: busy(running, "plus") == 1 and busy(running, "counter") == 0, "plus running the step")
    items.close()  # leaving the loop cancels the call
    wait_until(lambda: nothing_leased(running), "every slot of the ensemble and its steps free")
    # the held step saw the cancellation (plus failed on it, or the counter ended its stream), and the one-slot
    # steps serve the next request
    assert [int(item["Y"][0]) for item in running.client.stream_infer("chain", [request(2)], timeout=120)] == [
        1000,
        1001,
    ]
    assert successes(running, "chain")[1] == 1  # the cancelled request counted as a failure


def test_a_deadline_ends_the_request_and_its_steps(running):
    with pytest.raises(ClientError) as ended:
        list(running.client.stream_infer("chain", [request(5, 2)], timeout=3))
    assert ended.value.code == "DEADLINE_EXCEEDED"
    wait_until(lambda: nothing_leased(running), "every slot of the ensemble and its steps free")
    assert [int(item["Y"][0]) for item in running.client.stream_infer("chain", [request(1)], timeout=120)] == [1000]


def test_an_error_in_the_second_response_ends_the_request_with_it_named(running):
    items = list(running.client.stream_infer("chain", [request(5, 1)], timeout=120))
    # Response 0's answer goes out before the error when plus made it before the error response was read (the
    # error cancels the steps still running, as on Triton, whose order depends on the same timing); the error comes
    # last, and nothing of the responses after it.
    *answers, error = items
    assert [int(item["Y"][0]) for item in answers] in ([], [1000]), items
    assert isinstance(error, ClientError), error
    assert "ensemble 'chain': step 0 (model 'counter'): " in error.message, error.message
    assert "counter failed at response 1" in error.message, error.message
    assert successes(running, "plus")[0] <= 1
    wait_until(lambda: nothing_leased(running), "every slot of the ensemble and its steps free")
    assert [int(item["Y"][0]) for item in running.client.stream_infer("chain", [request(2)], timeout=120)] == [
        1000,
        1001,
    ]


def test_a_request_whose_answers_are_not_taken_holds_back_the_decoupled_steps_stream(running, tmp_path):
    """The ensemble's own caller (here the dataplane's internal stream, the gRPC writer in production) takes one
    answer and then none: the helper reading the counter stops once BACKLOG calls made from its responses wait, so
    the counter's sends wait too (as for a decoupled model's own stream); taking the answers again lets all through."""
    answers = call_model_stream(running.server.dataplane, "chain", request(200, 4))
    assert int(next(answers)["Y"][0]) == 1000
    progress = tmp_path / "progress"
    most = 0
    window = time.monotonic() + 1.0
    while time.monotonic() < window:  # ordering-free: watches that a bound holds until a deadline
        most = max(most, int(progress.read_text() or 0) if progress.exists() else 0)
        time.sleep(0.02)  # ordering-free: samples the progress file until the window ends
    # what was read: the first response, BACKLOG ones waiting as calls, one in the helper's hands, one in the pipe
    assert 1 < most <= BACKLOG + 3, most
    rest = [int(outputs["Y"][0]) for outputs in answers]
    assert rest == [1000 + index for index in range(1, 200)]
    assert int(progress.read_text()) == 200


def write_two_decoupled_steps(root: Path) -> Path:
    """`twice`: counter (decoupled) -> recount (a second counter, decoupled, one slot): response v of the first
    makes v responses of the second, each its own call of recount (Triton's nested decoupled ensembles, as NVIDIA's
    L0_decoupled repeat_square)."""
    write_repository(root)
    _python_model(
        root,
        "recount",
        f'input [ {{ name: "N" {INT1} }} ]\noutput [ {{ name: "OUT" {INT1} }} ]\n'
        "model_transaction_policy { decoupled: true }\n",
        RECOUNT,
    )
    (root / "twice" / "1").mkdir(parents=True)
    (root / "twice" / "config.pbtxt").write_text(
        'name: "twice"\nplatform: "ensemble"\nmax_batch_size: 0\n'
        f'input [ {{ name: "N" {INT1} }}, {{ name: "MODE" {INT1} }} ]\noutput [ {{ name: "OUT" {INT1} }} ]\n'
        "ensemble_scheduling { step [\n"
        '  { model_name: "counter" model_version: -1 input_map { key: "N" value: "N" } '
        'input_map { key: "MODE" value: "MODE" } output_map { key: "OUT" value: "counted" } },\n'
        '  { model_name: "recount" model_version: -1 input_map { key: "N" value: "counted" } '
        'output_map { key: "OUT" value: "OUT" } }\n'
        "] }\n"
    )
    return root


def test_a_decoupled_step_after_a_decoupled_step_on_one_slot_answers_more_than_the_backlog(slotserve, tmp_path):
    """Responses of the second decoupled step fill the backlog while the request's thread waits for the one slot
    that step's stream holds: the helper reading that stream must read on (it waited for room forever before,
    after 16 answers; NVIDIA's repeat_square stopped after 100 of its 510 responses)."""
    running = slotserve(write_two_decoupled_steps(tmp_path))
    n = BACKLOG + 4
    items = list(running.client.stream_infer("twice", [request(n)], timeout=120))
    assert sorted(int(item["OUT"][0]) for item in items) == sorted(i for v in range(n) for i in range(v))
    assert successes(running, "recount") == (n, 0)
    wait_until(lambda: busy(running, "recount") == 0 and busy(running, "counter") == 0, "every slot free")


def test_a_decoupled_ensemble_asking_for_the_response_cache_is_refused_by_name(slotserve, tmp_path):
    root = write_repository(tmp_path)
    config = root / "chain" / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    running = slotserve(root, response_cache_bytes=1 << 20)
    status = running.server.registry.get("chain").status()
    assert not status.loaded
    assert "the response cache does not support a model with the 'decoupled' transaction policy" in status.last_error
    assert "step 0 (model 'counter')" in status.last_error
    (refused,) = running.client.stream_infer("chain", [request(1)], timeout=120)
    assert isinstance(refused, ClientError) and "response cache" in refused.message, refused
    assert running.client.infer("plus", {"X": np.array([1], np.int32)}, timeout=120)["Y"].tolist() == [1001]


def test_a_steps_calls_enter_its_model_one_at_a_time_in_the_order_made(running, monkeypatch):
    """The counter sends [0] and [777] (which plus holds until its request is cancelled) at once, so both of plus's
    calls are ready together. They used to run on two threads at once (the request's and a helper), racing into
    plus's one-slot queue: when 777's won, or when the request's own thread took it while a helper ran plus(0), the
    answer of [0] never reached the client, which waits for it before it cancels (the 1-in-8 hang of
    test_a_cancelled_stream_...[next_step_running]). Here plus(0) is held until plus(777) starts, or a window
    passes: 777 must not start before 0 has ended."""
    import threading

    from service.request_path import ensemble

    real = ensemble.call_model
    seventy_seven_started = threading.Event()
    zero_ended = threading.Event()
    started_early: list[bool] = []

    def gated(dataplane, model, inputs, **kwargs):
        value = int(inputs["X"][0]) if model == "plus" else None
        if value == 777:
            started_early.append(not zero_ended.is_set())
            seventy_seven_started.set()
        if value == 0:
            # ordering-free: a window for the wrong order to show itself (the old code's 777 started within it)
            seventy_seven_started.wait(3.0)
        try:
            return real(dataplane, model, inputs, **kwargs)
        finally:
            if value == 0:
                zero_ended.set()

    monkeypatch.setattr(ensemble, "call_model", gated)
    items = running.client.stream_infer("chain", [request(5, 3)], timeout=30)
    assert int(next(items)["Y"][0]) == 1000  # the old code: DEADLINE_EXCEEDED here (the answer never came)
    wait_until(lambda: seventy_seven_started.is_set(), "plus(777) started")
    assert started_early == [False], "plus(777) started while plus(0) ran"
    items.close()
    wait_until(lambda: nothing_leased(running), "every slot of the ensemble and its steps free")
