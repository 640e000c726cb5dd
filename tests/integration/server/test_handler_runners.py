"""The server's runner threads (service/handler_threads.py) on a real server and a real channel: calls waiting on
their engine or on a stream's next message do not hold the runners, so every slot of a model gets a call at once
and an open stream leaves the runners to other calls; calls waiting in a full model's queue step aside after a
millisecond, so a probe behind them does not wait for the handler pool's watchdog."""

from __future__ import annotations

import queue
import threading

import grpc
import numpy as np

from engine.testing.fixture import FixtureBackend
from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from service.testing import serve

from .._support import CALL_TIMEOUT, write_fixture_model

WAIT = 60.0  # "eventually" on a loaded machine


def _model(root, slots: int) -> None:
    write_fixture_model(
        root,
        "m",
        inputs=[("INPUT0", "FP32", [4])],
        outputs=[("OUTPUT0", "FP32", [4])],
        extra=f"instance_group [ {{ count: {slots} }} ]\n",
    )


def _server(root, controls, **options):
    return serve(root, backends={"fixture": FixtureBackend(controls)}, parallel_jobs=4, **options)


def _calls(running, count: int) -> list[threading.Thread]:
    def call() -> None:
        running.client.infer("m", {"INPUT0": np.ones(4, "f")}, timeout=WAIT)

    threads = [threading.Thread(target=call, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def _joined(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(timeout=WAIT)
        assert not thread.is_alive()


def test_every_slot_of_a_model_gets_a_call_at_once_with_one_runner(tmp_path, controls):
    _model(tmp_path, 4)
    with _server(tmp_path, controls, handler_runners=1) as running:
        engine = controls.gate("m", "execute").hold()
        calls = _calls(running, 4)
        engine.wait_blocked(4, timeout=WAIT)  # four calls inside the engine at once, on one runner
        statistics = running.server.handler_threads.statistics()
        assert statistics.aside == 4  # each stepped aside while its engine ran (not let past by the watchdog)
        engine.release()
        _joined(calls)


def test_an_open_stream_waiting_for_its_next_request_leaves_the_runner_to_other_calls(tmp_path, controls):
    _model(tmp_path, 1)
    with _server(tmp_path, controls, handler_runners=1) as running:
        messages: queue.SimpleQueue = queue.SimpleQueue()
        channel = grpc.insecure_channel(running.address)
        stream = pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(messages.get, None))
        try:
            first = pb.ModelInferRequest(model_name="m")
            first.inputs.add(name="INPUT0", datatype="FP32", shape=[4])
            first.raw_input_contents.append(np.ones(4, "f").tobytes())
            messages.put(first)
            assert not next(stream).error_message  # the stream is open and served; now it waits for more
            threads = running.server.handler_threads
            assert _eventually(lambda: threads.statistics().aside == 1)  # its handler waits for the next message
            np.testing.assert_array_equal(
                running.client.infer("m", {"INPUT0": np.ones(4, "f")}, timeout=CALL_TIMEOUT)["OUTPUT0"], np.ones(4)
            )
        finally:
            messages.put(None)
            channel.close()


def test_calls_waiting_for_a_slot_of_a_full_model_give_their_runners_to_other_calls(tmp_path, controls):
    """A wait in a model's queue keeps its runner for a millisecond (the next slot of a busy model of small
    requests comes about that soon), then steps aside: a slow model's queue does not hold the runners, so a
    probe or a call to another model does not wait for the handler pool's watchdog."""
    _model(tmp_path, 1)
    with _server(tmp_path, controls, handler_runners=2) as running:
        engine = controls.gate("m", "execute").hold()
        busy = _calls(running, 1)
        engine.wait_blocked(1, timeout=WAIT)
        queued = _calls(running, 2)  # both runners' calls wait in the model's queue for its one slot
        entry = running.server.registry.get("m")
        threads = running.server.handler_threads
        try:
            assert _eventually(lambda: entry.status().queued_requests == 2)
            assert _eventually(lambda: threads.statistics().aside == 2)  # each stepped aside in its queue
            assert running.client.live(timeout=CALL_TIMEOUT)
        finally:
            engine.release()
        _joined(busy + queued)
        assert _eventually(lambda: threads.statistics().aside == 0)


def _eventually(predicate, timeout: float = WAIT) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)  # ordering-free: re-checks an observable state until a deadline
    return True
