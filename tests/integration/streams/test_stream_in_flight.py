"""ModelStreamInfer admits a stream's requests as they arrive (issue 34 item 4), through a real server and channel:
requests sent together on one stream to a batching model reach one engine call as a batch (fixture, ONNX and
python models), each answer is paired with its own request (outputs, a model's error for one member), a
non-decoupled model's answers keep the requests' order while a decoupled model's come as they are sent (Triton
2.51's rule: tests/differential/test_stream_in_flight.py asks it), and cancelling the stream cancels every request
in flight and gives back their slots and memory. Gates order the events; nothing sleeps to order them.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from engine.testing.fixture import FixtureBackend
from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from service.testing import serve

from .._support import CALL_TIMEOUT, demo_subset, write_fixture_model

WAIT = 60.0  # "eventually" on a loaded machine


def eventually(predicate, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)  # ordering-free: re-checks an observable state until a deadline


class Stream:
    """One ModelStreamInfer call whose requests the test sends one by one (`send`) and whose replies it reads as
    they come (`receive`). Bounded by CALL_TIMEOUT: a server that never answers fails the test with
    DEADLINE_EXCEEDED instead of hanging it."""

    def __init__(self, address: str, timeout: float = CALL_TIMEOUT) -> None:
        self._messages: queue.SimpleQueue = queue.SimpleQueue()
        self._channel = grpc.insecure_channel(address)
        self.call = pb_grpc.GRPCInferenceServiceStub(self._channel).ModelStreamInfer(
            iter(self._messages.get, None), timeout=timeout
        )

    def send(self, message: pb.ModelInferRequest) -> None:
        self._messages.put(message)

    def receive(self, count: int) -> list[pb.ModelStreamInferResponse]:
        return [next(self.call) for _ in range(count)]

    def close(self) -> None:
        """End the sending side and read the stream to its end (what is left of it)."""
        self._messages.put(None)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._messages.put(None)
        self.call.cancel()
        self._channel.close()


def request(model: str, name: str, values: np.ndarray, request_id: str, **parameters) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model, id=request_id)
    datatype = {"float32": "FP32", "int32": "INT32"}[values.dtype.name]
    message.inputs.add(name=name, datatype=datatype, shape=list(values.shape))
    message.raw_input_contents.append(values.tobytes())
    for key, value in parameters.items():
        if isinstance(value, bool):
            message.parameters[key].bool_param = value
        else:
            message.parameters[key].int64_param = value
    return message


def output(reply: pb.ModelStreamInferResponse, name: str, dtype: str = "<f4") -> np.ndarray:
    response = reply.infer_response
    index = [o.name for o in response.outputs].index(name)
    shape = list(response.outputs[index].shape)
    return np.frombuffer(response.raw_output_contents[index], dtype).reshape(shape)


def batch_stats(address: str, model: str) -> dict[int, int]:
    """ModelStatistics' batch_stats of `model`: {batch size: executions}."""
    with grpc.insecure_channel(address) as channel:
        reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelStatistics(
            pb.ModelStatisticsRequest(name=model), timeout=CALL_TIMEOUT
        )
    return {stat.batch_size: stat.compute_infer.count for stat in reply.model_stats[0].batch_stats}


def success_count(address: str, model: str) -> int:
    with grpc.insecure_channel(address) as channel:
        reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelStatistics(
            pb.ModelStatisticsRequest(name=model), timeout=CALL_TIMEOUT
        )
    return reply.model_stats[0].inference_stats.success.count


def rows(value: float) -> np.ndarray:
    return np.full((1, 4), value, np.float32)


# ---- batching -------------------------------------------------------------------------------------------------


def _fixture_batching_model(root: Path, name: str = "b", slots: int = 1) -> None:
    write_fixture_model(
        root,
        name,
        inputs=[("INPUT0", "FP32", [4])],
        outputs=[("OUTPUT0", "FP32", [4])],
        max_batch_size=8,
        extra=f"dynamic_batching {{ }}\ninstance_group [ {{ count: {slots} }} ]\n",
    )


def test_requests_sent_together_on_one_stream_to_a_batching_model_run_as_one_batch(tmp_path, controls):
    """The first request holds the model's one slot at its gate; four more are sent on the same stream and all
    queue at once (the old stream read the next request only after answering the previous one: one at a time, never
    more than one queued). Released, the four run as one batch; each answer carries its own request's id and
    rows, in the order sent."""
    _fixture_batching_model(tmp_path)
    with serve(tmp_path, backends={"fixture": FixtureBackend(controls)}, allow_management=True) as running:
        execute = controls.gate("b", "execute").hold()
        with Stream(running.address) as stream:
            stream.send(request("b", "INPUT0", rows(0), "r0"))
            execute.wait_blocked(1, timeout=WAIT)
            for n in range(1, 5):
                stream.send(request("b", "INPUT0", rows(n), f"r{n}"))
            eventually(lambda: running.management.get("b").queued_requests == 4, "four requests of the stream queued")
            execute.release()
            replies = stream.receive(5)
        assert [reply.error_message for reply in replies] == [""] * 5
        assert [reply.infer_response.id for reply in replies] == [f"r{n}" for n in range(5)]
        for n, reply in enumerate(replies):
            np.testing.assert_array_equal(output(reply, "OUTPUT0"), rows(n))
        assert controls.batches("b") == [1, 4]
        assert batch_stats(running.address, "b") == {1: 1, 4: 1}


def test_requests_sent_together_on_one_stream_batch_on_an_onnx_model(tmp_path):
    """The demo's ONNX add/sub with dynamic batching that waits (10 s) for a preferred batch of four: four requests
    sent back-to-back on one stream go at once as one batch of four (one at a time, each would wait the 10 s
    alone, and the stream's deadline comes first)."""
    repository = demo_subset(tmp_path / "repository", "simple")
    config = repository / "simple" / "config.pbtxt"
    config.write_text(
        config.read_text()
        + "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 10000000 }\n"
        + "instance_group [ { count: 1 } ]\n"
    )
    messages = []
    for n in range(4):
        message = request("simple", "INPUT0", np.full((1, 16), n, np.int32), f"s{n}")
        message.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
        message.raw_input_contents.append(np.ones((1, 16), np.int32).tobytes())
        messages.append(message)
    with serve(repository) as running, grpc.insecure_channel(running.address) as channel:
        replies = list(pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(messages), timeout=8.0))
        assert [reply.infer_response.id for reply in replies] == ["s0", "s1", "s2", "s3"]
        for n, reply in enumerate(replies):
            np.testing.assert_array_equal(output(reply, "OUTPUT0", "<i4"), np.full((1, 16), n + 1, np.int32))
            np.testing.assert_array_equal(output(reply, "OUTPUT1", "<i4"), np.full((1, 16), n - 1, np.int32))
        assert batch_stats(running.address, "simple") == {4: 1}


# A python model with dynamic batching that answers each request with its own input and the size of the batch it
# came in (len(requests)), and a request whose input is negative with an error naming it. While the file `hold`
# exists in its gate folder, an execute waits for the file `release` (after writing `arrived-<batch size>`).
BATCH_SIZES = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.gate = config["parameters"]["gate_dir"]["string_value"]

    def execute(self, requests):
        if os.path.exists(os.path.join(self.gate, "hold")):
            open(os.path.join(self.gate, "arrived-%d" % len(requests)), "w").close()
            while not os.path.exists(os.path.join(self.gate, "release")):
                time.sleep(0.005)  # ordering-free: a gate the test opens
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x < 0).any():
                error = pb_utils.TritonError("negative input %d" % int(x.ravel()[0]))
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            size = np.full((x.shape[0], 1), len(requests), np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x), pb_utils.Tensor("BATCH", size)]))
        return responses
"""


def batch_sizes_config(gate: Path, extra: str = "dynamic_batching { }\n") -> str:
    return f"""
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }}, {{ name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "gate_dir" value {{ string_value: "{gate}" }} }}
{extra}"""


def write_python_model(root: Path, name: str, source: str, config: str) -> None:
    directory = root / name
    (directory / "1").mkdir(parents=True)
    (directory / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{config}')
    (directory / "1" / "model.py").write_text(source)


def test_requests_on_one_stream_reach_one_python_execute_and_each_gets_its_own_answer_or_error(tmp_path):
    """A python model with dynamic batching returns len(requests) with each answer. The first request holds the
    model's one slot at its gate; three more are sent on the same stream and queue; released, they reach one
    `execute` (BATCH 3), and the model's error for the middle one comes back for that one alone, with its id."""
    gate = tmp_path / "gate"
    gate.mkdir()
    write_python_model(tmp_path / "repository", "sizes", BATCH_SIZES, batch_sizes_config(gate))
    (gate / "hold").touch()
    with serve(tmp_path / "repository", allow_management=True) as running, Stream(running.address) as stream:
        stream.send(request("sizes", "X", np.array([[0]], np.float32), "p0"))
        eventually(lambda: (gate / "arrived-1").exists(), "the first request inside execute")
        for n, value in ((1, 1.0), (2, -2.0), (3, 3.0)):
            stream.send(request("sizes", "X", np.array([[value]], np.float32), f"p{n}"))
        eventually(lambda: running.management.get("sizes").queued_requests == 3, "three requests queued")
        (gate / "hold").unlink()
        (gate / "release").touch()
        replies = stream.receive(4)
    assert [reply.infer_response.id for reply in replies] == ["p0", "p1", "p2", "p3"]
    assert [reply.error_message for reply in replies[:2] + replies[3:]] == ["", "", ""]
    assert "negative input -2" in replies[2].error_message
    assert [int(output(reply, "BATCH", "<i4")[0, 0]) for reply in (replies[0], replies[1], replies[3])] == [1, 3, 3]
    assert [float(output(reply, "Y")[0, 0]) for reply in (replies[0], replies[1], replies[3])] == [0.0, 1.0, 3.0]


# ---- order of the answers ---------------------------------------------------------------------------------------


def _plain_model(root: Path, name: str, slots: int = 1) -> None:
    write_fixture_model(
        root,
        name,
        inputs=[("INPUT0", "FP32", [4])],
        outputs=[("OUTPUT0", "FP32", [4])],
        extra=f"instance_group [ {{ count: {slots} }} ]\n",
    )


def test_a_later_request_runs_while_an_earlier_one_is_held_and_its_answer_keeps_its_place(tmp_path, controls):
    """On one stream: a request to `slow` (held at its gate), then one to `fast`. The second runs to its end while
    the first is held (the old stream would not read it before answering the first); its answer is written after
    the first's, as Triton writes a non-decoupled model's answers in the order of the requests."""
    _plain_model(tmp_path, "slow")
    _plain_model(tmp_path, "fast")
    with serve(tmp_path, backends={"fixture": FixtureBackend(controls)}) as running, Stream(running.address) as stream:
        held = controls.gate("slow", "execute").hold()
        stream.send(request("slow", "INPUT0", np.full(4, 1, np.float32), "first"))
        held.wait_blocked(1, timeout=WAIT)
        stream.send(request("fast", "INPUT0", np.full(4, 2, np.float32), "second"))
        eventually(lambda: success_count(running.address, "fast") == 1, "the second request served")
        held.release()
        replies = stream.receive(2)
    assert [reply.infer_response.id for reply in replies] == ["first", "second"]
    assert [reply.error_message for reply in replies] == ["", ""]
    np.testing.assert_array_equal(output(replies[0], "OUTPUT0"), np.full(4, 1, np.float32))
    np.testing.assert_array_equal(output(replies[1], "OUTPUT0"), np.full(4, 2, np.float32))


# A decoupled python model with two instances: a request whose input is 1 waits (after writing `arrived-<id>`) for
# the file `release-<id>` of its gate folder; each request gets one response (its input) and the final flag.
DECOUPLED_GATED = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.gate = config["parameters"]["gate_dir"]["string_value"]

    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if int(x[0]) == 1:
                open(os.path.join(self.gate, "arrived-" + request.request_id()), "w").close()
                while not os.path.exists(os.path.join(self.gate, "release-" + request.request_id())):
                    time.sleep(0.005)  # ordering-free: a gate the test opens
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def decoupled_gated_config(gate: Path) -> str:
    return f"""
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
parameters {{ key: "gate_dir" value {{ string_value: "{gate}" }} }}
"""


def test_a_decoupled_models_requests_on_one_stream_run_at_once_and_answer_as_they_are_sent(tmp_path):
    """On one stream to a decoupled python model with two instances: a request held at its gate, then another.
    The second's answer arrives while the first is still held (as on Triton; the old stream ran them one after
    another), then the first's."""
    gate = tmp_path / "gate"
    gate.mkdir()
    write_python_model(tmp_path / "repository", "dec", DECOUPLED_GATED, decoupled_gated_config(gate))
    with serve(tmp_path / "repository", parallel_jobs=2) as running, Stream(running.address) as stream:
        stream.send(request("dec", "X", np.array([1], np.float32), "held"))
        eventually(lambda: (gate / "arrived-held").exists(), "the first request inside execute")
        stream.send(request("dec", "X", np.array([2], np.float32), "free"))
        early = stream.receive(1)  # (never, on a stream that runs its requests one at a time: DEADLINE_EXCEEDED)
        (gate / "release-held").touch()
        late = stream.receive(1)
    assert [(reply.infer_response.id, reply.error_message) for reply in early + late] == [("free", ""), ("held", "")]
    assert float(output(early[0], "Y")[0]) == 2.0 and float(output(late[0], "Y")[0]) == 1.0


# ---- cancellation and limits ------------------------------------------------------------------------------------


def test_cancelling_a_stream_cancels_every_request_in_flight_and_gives_back_their_slots_and_memory(tmp_path, controls):
    """Three requests of one stream run at once on a model of four slots, all held at the gate; the client cancels
    the call: each run is cancelled, every slot is free again and the stream's tensor memory is given back."""
    _plain_model(tmp_path, "m", slots=4)
    with serve(
        tmp_path, backends={"fixture": FixtureBackend(controls)}, parallel_jobs=4, allow_management=True
    ) as running:
        held = controls.gate("m", "execute").hold()
        stream = Stream(running.address)
        try:
            for n in range(3):
                stream.send(request("m", "INPUT0", np.full(4, n, np.float32), f"c{n}"))
            held.wait_blocked(3, timeout=WAIT)  # three in flight at once on one stream
            assert running.management.get("m").active_slots == 3
            stream.call.cancel()
            eventually(lambda: running.management.get("m").active_slots == 0, "every slot given back")
            eventually(lambda: held.blocked == 0, "every run cancelled at its gate")
            eventually(lambda: running.server.calls.active == 0, "the stream's handler returned")
            assert running.server.dataplane.tensor_memory.statistics().in_flight_bytes == 0
            assert controls.count("m", "execute") == 3
        finally:
            stream.__exit__()
        eventually(lambda: not stream_threads(), "the stream's threads ended")


def stream_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("stream-request")]


def test_a_streams_threads_end_with_it(tmp_path, controls):
    """The threads that ran a stream's requests belong to the stream: once its last answer is read and the call
    has ended, none of them is left."""
    _plain_model(tmp_path, "m", slots=2)
    with serve(tmp_path, backends={"fixture": FixtureBackend(controls)}, parallel_jobs=2) as running:
        messages = [request("m", "INPUT0", np.full(4, n, np.float32), str(n)) for n in range(20)]
        with grpc.insecure_channel(running.address) as channel:
            replies = list(pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(messages), timeout=60))
        assert [reply.infer_response.id for reply in replies] == [str(n) for n in range(20)]
        assert not stream_threads()  # joined before the call ended (the reader had ended with the requests)


@pytest.fixture
def small_limit(monkeypatch):
    from service import stream_requests

    monkeypatch.setattr(stream_requests, "MAX_IN_FLIGHT", 2)
    return 2


def test_a_stream_past_its_limit_of_requests_in_flight_reads_on_as_they_finish(tmp_path, controls, small_limit):
    """With the per-stream limit at two and a model of eight slots held at its gate, five requests sent on one
    stream: two run (the others wait unread: tests/unit/service/test_stream_requests.py shows the pause); released, all
    five are answered, in order."""
    _plain_model(tmp_path, "m", slots=8)
    with serve(
        tmp_path, backends={"fixture": FixtureBackend(controls)}, parallel_jobs=8, allow_management=True
    ) as running:
        held = controls.gate("m", "prepare").hold()
        with Stream(running.address) as stream:
            for n in range(5):
                stream.send(request("m", "INPUT0", np.full(4, n, np.float32), f"l{n}"))
            held.wait_blocked(2, timeout=WAIT)
            held.release()
            replies = stream.receive(5)
        assert [reply.infer_response.id for reply in replies] == [f"l{n}" for n in range(5)]
        assert [reply.error_message for reply in replies] == [""] * 5


# ---- sequences --------------------------------------------------------------------------------------------------


def test_a_sequence_start_waiting_for_a_slot_does_not_hold_up_the_streams_open_sequence(tmp_path):
    """One sequence slot; on one stream: A starts, B starts (it waits for A's slot), then A's next requests and its
    end. A's requests run while B's start waits (the old stream held everything behind B's start, A never ended,
    and the stream ran out of time); B runs once A ended. Answers in the order of the requests, each sequence with
    its own running sum."""
    from tests.integration.sequences.test_sequences import output as sequence_output
    from tests.integration.sequences.test_sequences import sequence_request
    from tests.sequence_builders import write_accumulate

    write_accumulate(tmp_path, "acc", slots=1)
    plan = [("A", 1, True, False), ("B", 100, True, False), ("A", 2, False, False), ("A", 3, False, True)]
    plan += [("B", 200, False, False), ("B", 300, False, True)]
    ids = {"A": 21, "B": 22}
    messages = [sequence_request("acc", value, ids[name], start=start, end=end) for name, value, start, end in plan]
    with serve(tmp_path) as running, grpc.insecure_channel(running.address) as channel:
        replies = list(pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(messages), timeout=20))
    assert [reply.error_message for reply in replies] == [""] * 6
    assert [int(sequence_output(reply.infer_response)[0]) for reply in replies] == [1, 100, 3, 6, 300, 600]


def test_many_requests_of_interleaved_sequences_sent_together_keep_each_sequences_order(tmp_path):
    """Three sequences of eight requests each, interleaved and sent back-to-back on one stream to a model of three
    slots (a sequence slot each: see docs/sequences.md for more sequences than slots on one stream): requests of
    one sequence run one after another in the order sent (each answer is its running sum), requests of different
    sequences at once."""
    from tests.integration.sequences.test_sequences import output as sequence_output
    from tests.integration.sequences.test_sequences import sequence_request
    from tests.sequence_builders import expected_sums, write_accumulate

    write_accumulate(tmp_path, "acc", slots=3)
    values = {sequence_id: [sequence_id * 100 + k for k in range(8)] for sequence_id in (31, 32, 33)}
    messages, order = [], []
    for k in range(8):
        for sequence_id, sequence in values.items():
            messages.append(sequence_request("acc", sequence[k], sequence_id, start=k == 0, end=k == 7))
            order.append((sequence_id, k))
    with serve(tmp_path, parallel_jobs=3) as running, grpc.insecure_channel(running.address) as channel:
        replies = list(pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(messages), timeout=60))
    assert [reply.error_message for reply in replies] == [""] * len(messages)
    sums = {sequence_id: expected_sums(sequence) for sequence_id, sequence in values.items()}
    assert [int(sequence_output(reply.infer_response)[0]) for reply in replies] == [sums[s][k] for s, k in order]


# ---- shutdown ---------------------------------------------------------------------------------------------------


def test_requests_of_one_stream_still_running_at_the_end_of_the_grace_each_get_shutting_down(tmp_path, controls):
    """Three requests of one stream held in a model of four slots when the shutdown's grace runs out: each is
    cancelled and gets its `shutting_down` error on the stream, the handler returns (nothing abandoned) and the
    engine is closed."""
    _plain_model(tmp_path, "m", slots=4)
    with serve(tmp_path, backends={"fixture": FixtureBackend(controls)}, parallel_jobs=4) as running:
        held = controls.gate("m", "execute").hold()
        stream = Stream(running.address)
        try:
            for n in range(3):
                stream.send(request("m", "INPUT0", np.full(4, n, np.float32), f"d{n}"))
            held.wait_blocked(3, timeout=WAIT)
            received: list = []
            reader = threading.Thread(target=lambda: received.extend(stream.receive(3)), daemon=True)
            reader.start()  # the client reads while the server shuts down
            report = running.server.shutdown(drain_seconds=0.0, grace=0.3)
            reader.join(WAIT)
            replies = received
        finally:
            stream.__exit__()
        assert sorted(reply.infer_response.id for reply in replies) == ["d0", "d1", "d2"]
        assert all("shutting_down" in reply.error_message for reply in replies), replies
        assert report.abandoned_calls == 0 and report.closed_models == ["m"]
        assert controls.live_engines("m") == 0


def test_a_streaming_models_error_is_on_its_way_before_the_next_request_takes_its_slot(tmp_path, controls, monkeypatch):
    """A streaming model whose engine has one slot (two configured: the stream runs two of its requests at once);
    on one stream a request whose second response fails, and a second request queued behind it for the slot. The
    first's error message is made while its slot is still held (the second still queued), so it is written before
    anything of the second, as on Triton, where the model's instance sends the error before it takes the next
    request. (Made after the slot was freed, the second could take the slot and answer first.)"""
    parameters = {"stream_responses": "2", "capacity": "1"}
    extra = "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in parameters.items())
    write_fixture_model(
        tmp_path, "s", inputs=[("INPUT0", "FP32", [4])], outputs=[("OUTPUT0", "FP32", [4])], extra=extra
    )
    from service.servicers import inference

    seen_when_failing = []
    describe = inference.status_codes.describe

    def describing(error):
        status = running.server.registry.get("s").status()
        seen_when_failing.append((status.active_slots, status.queued_requests))
        return describe(error)

    monkeypatch.setattr(inference.status_codes, "describe", describing)
    backends = {"fixture": FixtureBackend(controls)}
    with serve(tmp_path, backends=backends, parallel_jobs=2) as running, Stream(running.address) as stream:
        gate = controls.gate("s", "stream").hold_from(2).fail_arrival(2)
        stream.send(request("s", "INPUT0", np.full(4, 1, np.float32), "first"))
        first = stream.receive(1)
        gate.wait_blocked(1, timeout=WAIT)
        assert running.server.registry.get("s").status().slots == 1
        stream.send(request("s", "INPUT0", np.full(4, 2, np.float32), "second"))
        eventually(lambda: running.server.registry.get("s").status().queued_requests == 1, "the second queued")
        gate.release()
        replies = first + stream.receive(3)
    assert seen_when_failing == [(1, 1)]  # the first's slot held, the second still queued
    assert [(reply.infer_response.id, bool(reply.error_message)) for reply in replies] == [
        ("first", False),
        ("first", True),
        ("second", False),
        ("second", False),
    ]


def test_the_two_spellings_of_one_sequence_id_take_one_lane_on_a_stream(tmp_path):
    """int64 -1 and uint64 2**64-1 name one sequence (core/sequences.py reads an id as its 64-bit value): on a
    stream their requests must share the sequence's lane, so they run one after another in arrival order."""
    from service.dataplane import InferenceRequest
    from tests.sequence_models import write_python_echo

    write_python_echo(tmp_path)
    with serve(tmp_path) as running:
        dataplane = running.server.dataplane

        def lane(sequence_id):
            return dataplane.stream_placement(
                InferenceRequest(
                    "echo", "", "", None, lambda response: response, parameters={"sequence_id": sequence_id}
                )
            ).lane

        assert lane(-1) == lane(2**64 - 1) != lane(7)
        assert lane("7") != lane(7)  # a string id is another sequence
