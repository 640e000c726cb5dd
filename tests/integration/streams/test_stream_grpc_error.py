"""Triton's `triton_grpc_error: true` stream header (issue 34 item 8; tests/differential/qa/test_triton_words.py and
the QA's test_triton_grpc_error_* ask Triton 2.51), through a real server and channel: a request whose run fails
ends the stream with that error's status and message, and the requests still in flight are cancelled (their slots
given back); a request refused before it runs is answered on the stream as without the header; a header of any
other value is no header. Gates order the events; nothing sleeps to order them.
"""

from __future__ import annotations

import queue
import time

import grpc
import numpy as np

from engine.errors import ModelError, ModelErrorInvalidArgument
from engine.testing.fixture import FixtureBackend
from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from service.testing import serve

from .._support import CALL_TIMEOUT, write_fixture_model

WAIT = 60.0  # "eventually" on a loaded machine
GRPC_ERROR = (("triton_grpc_error", "true"),)


def eventually(predicate, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)  # ordering-free: re-checks an observable state until a deadline


class Stream:
    """A ModelStreamInfer call with `metadata`: requests sent one by one, replies read as they come; `end()` reads
    what is left and gives the call's status (code name, details)."""

    def __init__(self, address: str, metadata=()) -> None:
        self._messages: queue.SimpleQueue = queue.SimpleQueue()
        self._channel = grpc.insecure_channel(address)
        stub = pb_grpc.GRPCInferenceServiceStub(self._channel)
        self.call = stub.ModelStreamInfer(iter(self._messages.get, None), timeout=CALL_TIMEOUT, metadata=metadata)

    def send(self, message: pb.ModelInferRequest) -> None:
        self._messages.put(message)

    def receive(self) -> pb.ModelStreamInferResponse:
        return next(self.call)

    def end(self) -> tuple[str, str, list[pb.ModelStreamInferResponse]]:
        """(code, details, the replies still read) once the call ended; the requests' side is closed first."""
        self._messages.put(None)
        rest = []
        try:
            for reply in self.call:
                rest.append(reply)
        except grpc.RpcError as error:
            return error.code().name, error.details() or "", rest
        return "OK", "", rest

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._messages.put(None)
        self.call.cancel()
        self._channel.close()


def request(model: str, value: float, request_id: str, datatype: str = "FP32") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model, id=request_id)
    message.inputs.add(name="INPUT0", datatype=datatype, shape=[4])
    array = np.full(4, value, np.float32 if datatype == "FP32" else np.int32)
    message.raw_input_contents.append(array.tobytes())
    return message


def _models(root, slots: int = 1) -> None:
    for name, extra in (("m", ""), ("s", 'parameters { key: "stream_responses" value { string_value: "2" } }\n')):
        write_fixture_model(
            root,
            name,
            inputs=[("INPUT0", "FP32", [4])],
            outputs=[("OUTPUT0", "FP32", [4])],
            extra=extra + f"instance_group [ {{ count: {slots} }} ]\n",
        )


def test_a_failed_run_ends_the_stream_with_its_status_and_a_refusal_does_not(tmp_path, controls):
    _models(tmp_path)
    with serve(tmp_path, backends={"fixture": FixtureBackend(controls)}) as running:
        with Stream(running.address, GRPC_ERROR) as stream:
            stream.send(request("m", 1, "wrong-datatype", datatype="INT32"))  # refused before it runs
            refused = stream.receive()
            assert "'INPUT0'" in refused.error_message and refused.infer_response.id == "wrong-datatype", refused
            stream.send(request("nowhere", 1, "unknown-model"))
            assert "Request for unknown model: 'nowhere'" in stream.receive().error_message
            stream.send(request("m", 2, "good"))
            good = stream.receive()
            assert not good.error_message and good.infer_response.id == "good", good
            controls.gate("m", "execute").fail_next(ModelErrorInvalidArgument("told to fail"))
            stream.send(request("m", 3, "fails"))
            assert stream.end() == ("INVALID_ARGUMENT", "told to fail", [])  # the error's own code and message
        eventually(lambda: running.server.calls.active == 0, "the stream's handler returned")
        assert running.client.infer("m", {"INPUT0": np.full(4, 5, np.float32)})["OUTPUT0"].tolist() == [5.0] * 4


def test_the_requests_in_flight_are_cancelled_when_a_failed_run_ends_the_stream(tmp_path, controls):
    """A streaming model's request held after its first response (its answers are written as they come, so it
    does not hold up the others'); then a request of another model fails: the stream ends with INTERNAL and the
    held request is cancelled, its slot given back."""
    _models(tmp_path)
    with serve(tmp_path, backends={"fixture": FixtureBackend(controls)}) as running:
        held = controls.gate("s", "stream").hold_from(2)
        with Stream(running.address, GRPC_ERROR) as stream:
            stream.send(request("s", 1, "held"))
            assert stream.receive().infer_response.id == "held"
            held.wait_blocked(1, timeout=WAIT)
            controls.gate("m", "execute").fail_next(ModelError("the model failed"))
            stream.send(request("m", 2, "fails"))
            assert stream.end() == ("INTERNAL", "the model failed", [])
        eventually(lambda: held.blocked == 0, "the held request cancelled at its gate")
        eventually(lambda: running.management.get("s").active_slots == 0, "its slot given back")
        eventually(lambda: running.server.calls.active == 0, "the stream's handler returned")
        (statistics,) = running.client.statistics("s")
        assert statistics.inference_stats.success.count == 0  # it never finished


def test_without_the_header_or_with_another_value_a_failed_run_is_answered_on_the_stream(tmp_path, controls):
    _models(tmp_path)
    with serve(tmp_path, backends={"fixture": FixtureBackend(controls)}) as running:
        for metadata in ((), (("triton_grpc_error", "True"),), (("triton_grpc_error", "1"),)):
            with Stream(running.address, metadata) as stream:
                controls.gate("m", "execute").fail_next(ModelErrorInvalidArgument("told to fail"))
                stream.send(request("m", 1, "fails"))
                assert stream.receive().error_message == "told to fail", metadata
                stream.send(request("m", 2, "good"))
                assert not stream.receive().error_message, metadata
                assert stream.end() == ("OK", "", []), metadata
