"""Drives tests/python_models/overlap (the models async_gate, async_gate_default, async_gate_bls, batch_stream) on any
server that speaks the protocol: slotserve, or real Triton 2.51 in tests/differential. Each request runs on a stream
of its own (a `StreamedRequest`, its answers collected by a thread), so that the order in which answers arrive shows
what the server ran at once. Gates are files in a folder the test owns: a model creates `entered-KEY` when a request
enters execute and waits for `open-KEY`.
"""

from __future__ import annotations

import queue
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc

REPOSITORY = Path(__file__).resolve().parents[1] / "python_models" / "overlap"
FINAL = "triton_final_response"
ENABLE = "triton_enable_empty_final_response"
WAIT_SECONDS = 60.0  # how long a test waits for something that must happen (a loaded 2-core machine is slow)


def request(model: str, key: int, gates: Path | None = None, rows: bool = False, **parameters) -> pb.ModelInferRequest:
    """A request of `model` with KEY = [key] ([[key]] with `rows`: a batching model's one row), its gate folder as
    the parameter "gates", asking for the empty final answer (so every request's end shows on the stream)."""
    message = pb.ModelInferRequest(model_name=model, id=f"key-{key}")
    shape = [1, 1] if rows else [1]
    tensor = message.inputs.add(name="KEY", datatype="INT32", shape=shape)
    tensor.contents.int_contents.append(key)
    message.parameters[ENABLE].bool_param = True
    if gates is not None:
        message.parameters["gates"].string_param = str(gates)
    for name, value in parameters.items():
        message.parameters[name].string_param = str(value)
    return message


@dataclass
class Answer:
    error: str
    outputs: dict[str, list[int]]
    final: bool
    arrived: float = field(default_factory=time.monotonic)


class StreamedRequest:
    """One request on a ModelStreamInfer stream of its own. `answers` fills as the server answers; `ended` is set at
    the request's final answer (or an error), or when the stream ends. `cancel()` cancels the stream."""

    def __init__(self, address: str, message: pb.ModelInferRequest) -> None:
        self.answers: queue.SimpleQueue[Answer] = queue.SimpleQueue()
        self.seen: list[Answer] = []
        self.ended = threading.Event()
        self.failure = ""  # the stream's own end: its gRPC status when it ended with one
        self._close = threading.Event()
        self._channel = grpc.insecure_channel(address)
        self._call = pb_grpc.GRPCInferenceServiceStub(self._channel).ModelStreamInfer(
            self._requests(message), timeout=300
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _requests(self, message: pb.ModelInferRequest):
        yield message
        self._close.wait(300)  # the stream stays open until the request ended (or the test ends it)

    def _read(self) -> None:
        try:
            for reply in self._call:
                answer = _answer(reply)
                self.answers.put(answer)
                if answer.final or answer.error:
                    self._close.set()
        except grpc.RpcError as error:
            self.failure = error.code().name  # type: ignore[attr-defined]  # a call's error is a grpc.Call
        finally:
            self.ended.set()
            self._close.set()

    def next_answer(self, seconds: float = WAIT_SECONDS) -> Answer:
        answer = self.answers.get(timeout=seconds)
        self.seen.append(answer)
        return answer

    def all_answers(self, seconds: float = WAIT_SECONDS) -> list[Answer]:
        """Every answer, once the request ended (fails the test if it does not end within `seconds`)."""
        assert self.ended.wait(seconds), "the request did not end"
        while not self.answers.empty():
            self.seen.append(self.answers.get())
        return self.seen

    def cancel(self) -> None:
        self._call.cancel()

    def close(self) -> None:
        self._close.set()
        self._call.cancel()
        self._thread.join(10)
        self._channel.close()


class SharedStream:
    """Several requests on one ModelStreamInfer stream (`send` them as you go): each request's answers are collected
    by its id ("key-KEY", as `request` names it)."""

    def __init__(self, address: str) -> None:
        self.answers: dict[str, queue.SimpleQueue[Answer]] = {}
        self._outgoing: queue.SimpleQueue[pb.ModelInferRequest | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards: answers (the reader adds a request's queue when it first answers)
        self._channel = grpc.insecure_channel(address)
        self._call = pb_grpc.GRPCInferenceServiceStub(self._channel).ModelStreamInfer(self._requests(), timeout=300)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def send(self, message: pb.ModelInferRequest) -> None:
        self._queue_of(message.id)
        self._outgoing.put(message)

    def next_answer(self, key: int, seconds: float = WAIT_SECONDS) -> Answer:
        return self._queue_of(f"key-{key}").get(timeout=seconds)

    def waiting(self, key: int) -> bool:
        return self._queue_of(f"key-{key}").empty()

    def _queue_of(self, request_id: str) -> queue.SimpleQueue[Answer]:
        with self._lock:
            return self.answers.setdefault(request_id, queue.SimpleQueue())

    def _requests(self):
        while (message := self._outgoing.get()) is not None:
            yield message

    def _read(self) -> None:
        try:
            for reply in self._call:
                self._queue_of(reply.infer_response.id).put(_answer(reply))
        except grpc.RpcError:
            pass  # cancelled by `close`

    def close(self) -> None:
        self._outgoing.put(None)
        self._call.cancel()
        self._thread.join(10)
        self._channel.close()


def _answer(reply: pb.ModelStreamInferResponse) -> Answer:
    response = reply.infer_response
    final = response.parameters[FINAL].bool_param if FINAL in response.parameters else False
    outputs = {}
    for index, tensor in enumerate(response.outputs):
        if index < len(response.raw_output_contents):
            values = np.frombuffer(response.raw_output_contents[index], dtype=np.int32)
        else:
            values = np.array(tensor.contents.int_contents, dtype=np.int32)
        outputs[tensor.name] = [int(v) for v in values.reshape(-1)]
    return Answer(reply.error_message, outputs, final)


def wait_until(condition: Callable[[], bool], what: str, seconds: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds:g} s: {what}"
        time.sleep(0.01)  # ordering-free: polls an observable state until a deadline


def entered(gates: Path, key: int) -> bool:
    return (gates / f"entered-{key}").exists()


def open_gate(gates: Path, key: int) -> None:
    (gates / f"open-{key}").touch()


def pending_requests(metrics_url: str, model: str) -> int:
    """nv_inference_pending_request_count of `model` (Triton's metric; slotserve serves it under the same name)."""
    with urllib.request.urlopen(metrics_url, timeout=30) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        if line.startswith("nv_inference_pending_request_count{") and f'model="{model}"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0
