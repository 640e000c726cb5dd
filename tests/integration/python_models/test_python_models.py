"""Python models on a real server (in-process, slotserve's own client): loading, faults that stay in their
slot, model errors, memory accounting, tensors larger than the shared-memory segments. The flows a stock Triton
client sees are in tests/interop/test_python_models.py."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np
import pytest

from client import ClientError
from tests.python_models import REPOSITORY

HEADER = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils
"""


def write_model(root: Path, name: str, body: str, config: str, version: str = "1") -> Path:
    directory = root / name
    (directory / version).mkdir(parents=True)
    (directory / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n' + textwrap.dedent(config))
    (directory / version / "model.py").write_text(HEADER + textwrap.dedent(body))
    return directory


FLOAT_IO = """
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

DOUBLER = """
class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)])
            for r in requests
        ]
"""

EXITER = """
class TritonPythonModel:
    def execute(self, requests):
        os._exit(5)
"""


def shared_memory_files() -> list[str]:
    """This process's python-worker segments still named in /dev/shm."""
    folder = Path("/dev/shm")
    return sorted(p.name for p in folder.glob(f"slotserve-py-{os.getpid()}-*")) if folder.is_dir() else []


def test_a_large_tensor_grows_the_shared_memory_and_comes_back_whole(tmp_path):
    from service.testing import serve

    write_model(tmp_path, "doubler", DOUBLER, FLOAT_IO)
    with serve(tmp_path) as running:
        assert shared_memory_files() == []  # the worker mapped its segments while starting
        rng = np.random.default_rng(1)
        for size in (10, 3_000_000, 100, 5_000_000):  # grows twice (past the 64 KiB start), then reuses
            x = rng.standard_normal(size).astype(np.float32)
            np.testing.assert_array_equal(running.client.infer("doubler", {"X": x})["Y"], x * 2)
            # each segment's file is unlinked once both sides map it: a killed server leaves none behind
            assert shared_memory_files() == []
    assert shared_memory_files() == []


def test_bad_input_is_refused_by_name_and_the_model_keeps_serving(slotserve, tmp_path):
    write_model(tmp_path, "doubler", DOUBLER, FLOAT_IO)
    running = slotserve(tmp_path)
    with pytest.raises(ClientError) as refused:
        running.client.infer("doubler", {"X": np.zeros(3, dtype=np.int32)})
    assert refused.value.code == "INVALID_ARGUMENT" and "expects FP32" in refused.value.message
    np.testing.assert_array_equal(running.client.infer("doubler", {"X": np.ones(2, np.float32)})["Y"], [2, 2])


def test_repeated_worker_deaths_take_the_model_out_of_service_with_the_reason(slotserve, tmp_path):
    write_model(tmp_path, "exiter", EXITER, FLOAT_IO)
    running = slotserve(tmp_path)
    x = {"X": np.ones(1, np.float32)}
    for _ in range(2):
        with pytest.raises(ClientError) as died:
            running.client.infer("exiter", x)
        assert died.value.code == "INTERNAL" and "exited with code 5" in died.value.message
    with pytest.raises(ClientError) as out:
        running.client.infer("exiter", x)
    assert out.value.code == "UNAVAILABLE" and out.value.reason == "device_failed"
    assert "out of service" in out.value.message and "died 3 times" in out.value.message
    status = running.management.get("exiter")
    assert not status.loaded and "died 3 times" in status.last_error


def test_execute_returning_the_wrong_responses_fails_with_the_models_mistake(slotserve, tmp_path):
    body = """
    class TritonPythonModel:
        def execute(self, requests):
            mode = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()[0]
            if mode == 0:
                return []
            if mode == 1:
                return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.zeros(1, np.float64))])]
            if mode == 2:
                return [pb_utils.InferenceResponse([pb_utils.Tensor("Z", np.zeros(1, np.float32))])]
            return ["not a response"]
    """
    write_model(tmp_path, "wrong", body, FLOAT_IO)
    running = slotserve(tmp_path)
    expected = {
        0: "execute returned 0 responses for 1 requests",
        2: "returned output 'Z', which its configuration lacks",
        3: "must return pb_utils.InferenceResponse objects, got str",
    }
    for mode, message in expected.items():
        with pytest.raises(ClientError) as failed:
            running.client.infer("wrong", {"X": np.full(1, mode, np.float32)})
        assert failed.value.code == "INTERNAL" and message in failed.value.message, (mode, failed.value.message)
    # A numeric output of another datatype than configured is accepted, as on Triton, and converted to the
    # configured one (Triton would send the FP64 as it is).
    answer = running.client.infer("wrong", {"X": np.full(1, 1, np.float32)})
    assert answer["Y"].dtype == np.float32 and answer["Y"].tolist() == [0.0]


def test_initialize_args_are_tritons(slotserve, tmp_path):
    body = """
    import json
    class TritonPythonModel:
        def initialize(self, args):
            self.args = args
        def execute(self, requests):
            args = dict(self.args, model_config=json.loads(self.args["model_config"])["name"])
            text = np.array([json.dumps(args, sort_keys=True).encode()], dtype=np.object_)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", text)]) for r in requests]
    """
    config = """
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_STRING dims: [ 1 ] } ]
    """
    directory = write_model(tmp_path, "args", body, config, version="3")
    running = slotserve(tmp_path)
    import json

    args = json.loads(running.client.infer("args", {"X": np.zeros(1, np.float32)})["Y"][0])
    assert args == {
        "model_config": "args",
        "model_instance_device_id": "0",
        "model_instance_kind": "CPU",
        "model_instance_name": "args_0_0",
        "model_name": "args",
        "model_repository": str(directory),
        "model_version": "3",
    }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("class Other:\n    pass\n", "defines no class TritonPythonModel"),
        (
            "class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('no weights')\n",
            "RuntimeError: no weights",
        ),
        ("import not_a_module_anywhere\n", "No module named 'not_a_module_anywhere'"),
    ],
)
def test_a_model_py_that_cannot_load_is_refused_with_its_reason(slotserve, tmp_path, body, message):
    write_model(tmp_path, "broken", body, FLOAT_IO)
    write_model(tmp_path, "fine", DOUBLER, FLOAT_IO)
    running = slotserve(tmp_path)
    with pytest.raises(ClientError) as failed:
        running.client.infer("broken", {"X": np.ones(1, np.float32)})
    assert failed.value.code == "FAILED_PRECONDITION" and message in failed.value.message
    np.testing.assert_array_equal(running.client.infer("fine", {"X": np.ones(1, np.float32)})["Y"], [2])


def test_execution_env_path_is_refused_by_name(slotserve, tmp_path):
    config = FLOAT_IO + 'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "env.tar.gz" } }\n'
    write_model(tmp_path, "envmodel", DOUBLER, config)
    running = slotserve(tmp_path)
    with pytest.raises(ClientError) as failed:
        running.client.infer("envmodel", {"X": np.ones(1, np.float32)})
    assert "EXECUTION_ENV_PATH 'env.tar.gz' does not exist" in failed.value.message


def test_every_worker_counts_in_the_models_memory(slotserve, tmp_path):
    write_model(tmp_path, "doubler", DOUBLER, FLOAT_IO + "instance_group [ { count: 2 kind: KIND_CPU } ]\n")
    running = slotserve(tmp_path, parallel_jobs=2)
    status = running.management.get("doubler")
    assert status.slots == 2
    # each slot is a python process of its own (tens of MB with numpy): counted once per slot
    assert status.memory_bytes is not None and status.memory_bytes >= 2 * 10_000_000, status.memory_bytes


def repeat(n: int) -> dict:
    return {"IN": np.array([n], np.int32)}


def streamed(running, *counts: int, timeout: float = 60) -> list:
    """Every item of one ModelStreamInfer call to tests/python_models' decoupled `repeat`: OUT values, errors."""
    items = running.client.stream_infer("repeat", [repeat(n) for n in counts], timeout=timeout)
    return [item if isinstance(item, ClientError) else int(item["OUT"][0]) for item in items]


def test_a_decoupled_model_streams_each_response_as_it_is_sent_and_the_final_flag_ends_the_request(slotserve):
    running = slotserve(REPOSITORY)
    # 3 responses, then none at all (the final flag alone), then 2 sent from a thread after execute returned:
    # each request's responses in order, and the zero-response request answers nothing and ends
    assert streamed(running, 3, 0, 1002) == [0, 1, 2, 0, 1]
    (stats,) = running.client.statistics("repeat")
    assert stats.inference_stats.success.count == 3
    assert stats.inference_stats.fail.count == 0
    assert dict(stats.response_stats) == {}  # as on Triton 2.51, which leaves them empty for a python model


def test_an_error_response_reaches_its_request_and_the_stream_goes_on(slotserve):
    running = slotserve(REPOSITORY)
    error, *rest = streamed(running, -1, 2)
    assert isinstance(error, ClientError), error
    assert "n must be >= 0, got -1" in error.message
    assert rest == [0, 1]


def test_execute_raising_in_a_decoupled_model_fails_its_request_and_the_model_keeps_serving(slotserve, tmp_path):
    body = """
    class TritonPythonModel:
        def execute(self, requests):
            sender = requests[0].get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.ones(1, np.float32))]))
            if pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()[0] < 0:
                raise ValueError("negative input")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    """
    write_model(tmp_path, "raiser", body, FLOAT_IO + "model_transaction_policy { decoupled: true }\n")
    running = slotserve(tmp_path)
    requests = [{"X": -np.ones(1, np.float32)}, {"X": np.ones(1, np.float32)}]
    items = list(running.client.stream_infer("raiser", requests, timeout=60))
    assert len(items) == 3, items  # the first: a response, then the error; the second: its response (the final flag
    # alone sends nothing)
    assert not isinstance(items[0], ClientError) and not isinstance(items[2], ClientError), items
    assert isinstance(items[1], ClientError) and "ValueError: negative input" in items[1].message, items[1]


def test_unary_infer_on_a_decoupled_model_is_refused_as_triton_refuses_it(slotserve):
    running = slotserve(REPOSITORY)
    with pytest.raises(ClientError) as refused:
        running.client.infer("repeat", repeat(2))
    assert refused.value.code == "UNIMPLEMENTED"
    assert refused.value.message == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    assert streamed(running, 1) == [0]  # the model is intact


def test_a_cancelled_stream_shows_is_cancelled_to_the_model_and_frees_its_slot(slotserve):
    running = slotserve(REPOSITORY)  # one slot: the next request runs only once the cancelled one let it go
    (pid,) = streamed(running, 997)
    items = running.client.stream_infer("repeat", [repeat(999)], timeout=60)
    assert int(next(items)["OUT"][0]) == 0  # the model now waits for is_cancelled()
    items.close()  # leaving the loop cancels the call
    # the model saw the cancellation and sent its final flag: its worker was not killed, and the slot is free
    assert streamed(running, 997) == [pid]
    assert streamed(running, 2) == [0, 1]


IGNORES_CANCELLATION = """
import time
class TritonPythonModel:
    def execute(self, requests):
        sender = requests[0].get_response_sender()
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([float(os.getpid())], np.float32))]))
        if pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()[0] > 0:
            while True:  # never looks at is_cancelled()
                time.sleep(0.01)  # ordering-free: a model that hangs on purpose
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


def test_a_decoupled_worker_that_ignores_its_cancelled_stream_is_replaced_and_frees_its_slot(slotserve, tmp_path):
    kill_soon = 'parameters { key: "cancel_kill_seconds" value: { string_value: "0.5" } }\n'
    config = FLOAT_IO + "model_transaction_policy { decoupled: true }\n" + kill_soon
    write_model(tmp_path, "stubborn", IGNORES_CANCELLATION, config)
    running = slotserve(tmp_path)

    items = running.client.stream_infer("stubborn", [{"X": np.ones(1, np.float32)}], timeout=60)
    hung = int(next(items)["Y"][0])  # its worker now loops for ever
    items.close()  # leaving the loop cancels the call
    # the one slot is free again only once that worker was killed: the next request runs on a new one
    (answer,) = running.client.stream_infer("stubborn", [{"X": np.zeros(1, np.float32)}], timeout=60)
    assert int(answer["Y"][0]) != hung
    assert running.management.get("stubborn").loaded  # one kill is no reason to take the model out of service


DECOUPLED_DOUBLER = """
class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            doubled = pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(request, "X").as_numpy() * 2)
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            request.get_response_sender().send(pb_utils.InferenceResponse([doubled]), flags=final)
"""


def test_a_decoupled_model_with_dynamic_batching_streams_and_refuses_model_infer_as_triton(slotserve, tmp_path):
    """Accepted as Triton accepts it (tests/integration/python_models/test_decoupled_batching.py: its batches);
    ModelInfer is refused with Triton's code and words for a decoupled model, the model intact."""
    config = FLOAT_IO.replace("[ -1 ]", "[ 1 ]") + "max_batch_size: 4\ndynamic_batching { }\n"
    write_model(tmp_path, "batching", DECOUPLED_DOUBLER, config + "model_transaction_policy { decoupled: true }\n")
    running = slotserve(tmp_path)
    with pytest.raises(ClientError) as refused:
        running.client.infer("batching", {"X": np.ones((1, 1), np.float32)})
    assert refused.value.code == "UNIMPLEMENTED"
    assert refused.value.message == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    (answer,) = running.client.stream_infer("batching", [{"X": np.full((1, 1), 3, np.float32)}], timeout=60)
    assert not isinstance(answer, ClientError), answer
    np.testing.assert_array_equal(answer["Y"], [[6]])


def test_responses_sent_through_response_senders_answer_their_requests(slotserve, tmp_path):
    body = """
    class TritonPythonModel:
        def execute(self, requests):
            for r in requests:
                y = pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1
                final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                r.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]), flags=final)
            return None
    """
    write_model(tmp_path, "sender", body, FLOAT_IO)
    running = slotserve(tmp_path)
    np.testing.assert_array_equal(running.client.infer("sender", {"X": np.zeros(2, np.float32)})["Y"], [1, 1])


SIGNALS = """
import ctypes, signal, time
class TritonPythonModel:
    def execute(self, requests):
        mode = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()[0]
        if mode == 1:
            ctypes.string_at(0)  # a segmentation fault
        if mode == 2:
            open(os.environ["SLOTSERVE_TEST_MARKER"] + str(os.getpid()), "w").close()
            time.sleep(300)  # ordering-free: a model that hangs until it is killed
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([float(os.getpid())], np.float32))])]
"""


def test_a_segfault_or_a_kill_fails_the_request_naming_the_signal(slotserve, tmp_path, monkeypatch):
    monkeypatch.setenv("SLOTSERVE_TEST_MARKER", str(tmp_path / "sleeping-"))
    write_model(tmp_path / "repo", "signals", SIGNALS, FLOAT_IO)
    running = slotserve(tmp_path / "repo")
    with pytest.raises(ClientError) as crashed:
        running.client.infer("signals", {"X": np.ones(1, np.float32)})
    assert crashed.value.code == "INTERNAL" and "was killed by signal 11 (SIGSEGV)" in crashed.value.message
    assert "model 'signals'" in crashed.value.message

    import signal
    import threading
    import time

    outcome: list = []

    def sleeping_request() -> None:
        try:
            running.client.infer("signals", {"X": np.full(1, 2, np.float32)}, timeout=120)
        except ClientError as error:
            outcome.append(error)

    caller = threading.Thread(target=sleeping_request)
    caller.start()
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("sleeping-*")):
        assert time.monotonic() < deadline, "the model never started its sleep"
        time.sleep(0.02)  # ordering-free: polls for the model's file until a deadline
    (marker,) = tmp_path.glob("sleeping-*")
    os.kill(int(marker.name.split("-")[1]), signal.SIGKILL)  # as the OOM killer would
    caller.join(60)
    assert outcome and outcome[0].code == "INTERNAL", outcome
    assert "was killed by signal 9 (SIGKILL)" in outcome[0].message
    answer = running.client.infer("signals", {"X": np.zeros(1, np.float32)})["Y"]  # a new worker serves
    assert int(answer[0]) != int(marker.name.split("-")[1])


TORCH_MODEL = """
import torch
class TritonPythonModel:
    def initialize(self, args):
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 2)
    def execute(self, requests):
        responses = []
        for r in requests:
            x = torch.from_numpy(pb_utils.get_input_tensor_by_name(r, "X").as_numpy().copy())
            with torch.no_grad():
                y = self.layer(x).numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return responses
"""


def test_a_pytorch_model_in_model_py(slotserve, tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0 to run this)")
    config = """
    max_batch_size: 8
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
    """
    write_model(tmp_path, "torchy", TORCH_MODEL, config)
    running = slotserve(tmp_path)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 2)
    with torch.no_grad():
        expected = layer(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(running.client.infer("torchy", {"X": x})["Y"], expected, rtol=1e-6)


HANGER = """
class TritonPythonModel:
    def execute(self, requests):
        if pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()[0] == 1:
            while True:  # ignores is_cancelled()
                pass
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([float(os.getpid())], np.float32))])]
"""


def test_a_worker_that_ignores_its_cancelled_request_is_replaced_and_frees_its_slot(slotserve, tmp_path):
    write_model(tmp_path, "hanger", HANGER, FLOAT_IO)  # one slot
    running = slotserve(tmp_path)
    first = int(running.client.infer("hanger", {"X": np.zeros(1, np.float32)})["Y"][0])
    with pytest.raises(ClientError) as gave_up:
        running.client.infer("hanger", {"X": np.ones(1, np.float32)}, timeout=1.0)
    assert gave_up.value.code == "DEADLINE_EXCEEDED"
    # the only slot is free again once its worker is killed (cancel_kill_seconds, 2 s after the cancellation)
    answer = running.client.infer("hanger", {"X": np.zeros(1, np.float32)}, timeout=60)
    assert int(answer["Y"][0]) != first  # served by a new worker
    assert running.management.get("hanger").loaded  # a kill after a cancellation is no failure of the model


def test_a_worker_killed_while_idle_fails_no_request(slotserve, tmp_path):
    import signal

    write_model(tmp_path, "idle", HANGER, FLOAT_IO)
    running = slotserve(tmp_path)
    first = int(running.client.infer("idle", {"X": np.zeros(1, np.float32)})["Y"][0])
    os.kill(first, signal.SIGKILL)
    wait_until_dead(first)  # dead before the next request arrives: it was idle when it died
    answer = running.client.infer("idle", {"X": np.zeros(1, np.float32)}, timeout=60)  # no error: a new worker
    assert int(answer["Y"][0]) != first


def wait_until_dead(pid: int, timeout: float = 30.0) -> None:
    """Until `pid` is a zombie with no thread left, or gone (its death is then visible to its parent)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            threads = len(list(Path(f"/proc/{pid}/task").iterdir()))
        except (OSError, IndexError):
            return
        if state in ("Z", "X") and threads <= 1:  # a leader is a zombie before its other threads have ended
            return
        assert time.monotonic() < deadline, f"process {pid} still {state} after {timeout} s"
        time.sleep(0.01)  # ordering-free: polls a process state until a deadline


BATCH_CANCEL = """
import time
class TritonPythonModel:
    def execute(self, requests):
        flags = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy()[0, 0] for r in requests]
        deadline = time.monotonic() + 120  # past the other caller's 60 s: it answers only if the cancel was seen
        waiting = [r for r, flag in zip(requests, flags) if flag == 1]
        while waiting and not all(r.is_cancelled() for r in waiting) and time.monotonic() < deadline:
            time.sleep(0.01)  # ordering-free: polls is_cancelled() until a deadline
        seen = np.array([[float(r.is_cancelled()), float(len(requests))] for r in requests], np.float32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", seen[i : i + 1])]) for i in range(len(requests))]
"""


def test_in_a_batch_only_the_cancelled_request_shows_is_cancelled(slotserve, tmp_path):
    import threading

    config = """
    max_batch_size: 4
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
    dynamic_batching { max_queue_delay_microseconds: 5000000 preferred_batch_size: [ 2 ] }
    """
    write_model(tmp_path, "batchcancel", BATCH_CANCEL, config)
    running = slotserve(tmp_path)
    answers: dict = {}

    def call(flag: int, timeout: float) -> None:
        try:
            answers[flag] = running.client.infer(
                "batchcancel", {"X": np.full((1, 1), flag, np.float32)}, timeout=timeout
            )
        except ClientError as error:
            answers[flag] = error

    callers = [threading.Thread(target=call, args=(1, 3.0)), threading.Thread(target=call, args=(0, 60.0))]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(90)
    assert isinstance(answers[1], ClientError) and answers[1].code == "DEADLINE_EXCEEDED", answers
    # the other member of the batch was not cancelled, waited for the model, and got its own answer
    np.testing.assert_array_equal(answers[0]["Y"], [[0.0, 2.0]])
