"""Stream write timers do not pile up (issue 12, item 7): a cancelled timer lets go of its callback and leaves
the heap; a stream closed at its yield cancels its armed timer."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np

from engine.testing.fixture import FixtureBackend, FixtureControls
from generated import grpc_service_pb2_grpc as pb_grpc
from service.testing import serve
from service.timers import TimerQueue
from tests.contract.harness import write_fixture_model
from tests.shutdown.harness import infer_request, wait_until


def test_a_hundred_thousand_armed_and_cancelled_timers_leave_a_small_heap():
    """What a stream does per message: arm a 30 s write timeout, send, cancel."""
    queue = TimerQueue("test")
    try:
        for _ in range(100_000):
            queue.arm(30.0, lambda: None).cancel()
        statistics = queue.statistics()
        assert statistics.armed == 0
        assert statistics.cancelled_in_heap <= 128, statistics
        assert len(queue._heap) <= 128
    finally:
        queue.close()


def test_a_cancelled_timer_lets_go_of_its_callback_at_once():
    class Context:  # stands in for a stream's gRPC context, which the callback holds
        def cancel(self) -> None:
            pass

    queue = TimerQueue("test")
    try:
        context = Context()
        timer = queue.arm(30.0, context.cancel)
        alive = weakref.ref(context)
        timer.cancel()
        del context
        gc.collect()
        assert alive() is None
    finally:
        queue.close()


def test_due_timers_run_and_cancelled_ones_do_not():
    queue = TimerQueue("test")
    try:
        ran = threading.Event()
        cancelled_ran = threading.Event()
        queue.arm(0.0, cancelled_ran.set).cancel()
        queue.arm(0.0, ran.set)
        assert ran.wait(10)
        assert not cancelled_ran.is_set()
        assert queue.statistics().armed == 0
    finally:
        queue.close()


def test_a_stream_cancelled_while_a_message_waits_to_be_sent_leaves_no_armed_timer(tmp_path):
    """The client takes one 4 MiB message of a streaming model, stops reading, then cancels. The handler is
    suspended at its yield (the next message cannot be sent) and is closed there: the write timer armed for that
    message must be cancelled then, not left for its 30 s."""
    write_fixture_model(tmp_path, "s", {"stream_responses": 50})
    with serve(tmp_path, backends={"fixture": FixtureBackend(FixtureControls())}) as running:
        timers = running.server.timers
        stub = pb_grpc.GRPCInferenceServiceStub(running.client.channel)
        call = stub.ModelStreamInfer(iter([infer_request("s", np.ones(1 << 20, np.float32))]), timeout=20)
        assert len(next(call).infer_response.raw_output_contents[0]) == 4 << 20  # then it stops reading
        wait_until(lambda: timers.statistics().armed == 1, "a message waiting to be sent", timeout=10)
        call.cancel()
        wait_until(lambda: timers.statistics().armed == 0, "the armed write timer to be cancelled", timeout=10)
        entry = running.server.registry.get("s")
        wait_until(lambda: entry.status().active_slots == 0, "the stream's slot to be released", timeout=10)
