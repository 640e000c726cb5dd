"""Contract: a caller that gives up (TIME.04-06) and shutdown of stalled or running I/O (TIME.07-08).

The contract marks TIME.04 "U GAP" (no scheduler cancellation token: a disconnected waiter may wait on, then run)
and TIME.05 "P" (the backend cannot be preempted). slotserve closes those gaps (issue 5): every RPC has a cancel
token fired when the RPC ends (client cancel, deadline, disconnect), a queued waiter leaves at once, a wait for
another request's initialization ends at once, a run not yet started is skipped, and a running ONNX Runtime run
is terminated through RunOptions.terminate. These tests check that stronger behaviour.

Servers run in this process (service.testing.serve) with fixture-backend models whose gates the tests hold, or a
real ONNX model built here; clients go through gRPC and read the model's status with GetModel. Events are
ordered by gates and status, never by sleeps; every wait is bounded.
"""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest

from engine.config.specs import TensorSpec
from engine.errors import ExecutionCancelled
from engine.interface import Backend, Context, LoadedModel, ModelMetadata
from engine.onnxruntime_backend import OnnxRuntimeBackend
from generated import grpc_service_pb2_grpc as pb_grpc
from tests.shutdown.harness import (
    ROOT,
    VALUES,
    WAIT,
    InProcess,
    assert_ok,
    frontend_options,
    infer_request,
    outcome,
    slow_rows,
    wait_until,
    write_slow_onnx_model,
)

cell = pytest.mark.cell

PROMPT = 1.0  # seconds: "at once" for a waiter leaving or a slot coming back, with room for a loaded machine


def assert_clean(lab: InProcess, model: str) -> None:
    """Nothing leaked: no slot held, nobody queued, no handler still tracked."""
    status = lab.status(model)
    assert (status.active_slots, status.queued_requests) == (0, 0), status
    wait_until(lambda: lab.server.calls.active == 0, "every handler returned", timeout=5)


# ---- TIME.04: a caller that gives up while queued or while waiting for initialization ---------------------------


@cell("TIME.04")
def test_queued_request_cancelled_by_its_client_leaves_the_queue_at_once_and_the_next_waiter_moves_up(inproc):
    """Closes the contract's gap: the cancelled waiter leaves the FIFO at once (queued_requests drops while the
    slot is still busy), it never runs, the waiter behind it takes the next slot, and nothing leaks."""
    lab = inproc({"m": {}}, parallel_jobs=1)
    execute = lab.gate("m", "execute").hold()
    holder = lab.infer("m", VALUES)
    execute.wait_blocked(1)
    first = lab.infer("m", VALUES * 2)
    lab.wait_status("m", lambda s: s.queued_requests == 1, "first waiter queued")
    second = lab.infer("m", VALUES * 3)
    lab.wait_status("m", lambda s: s.queued_requests == 2, "second waiter queued")

    first.cancel()
    took = lab.wait_status("m", lambda s: s.queued_requests == 1, "the cancelled waiter gone", timeout=5)
    assert took < PROMPT
    assert outcome(first)[0] == "CANCELLED"
    status = lab.status("m")
    assert status.active_slots == 1 and not holder.done()  # the slot is still busy: it left, it was not served
    admission = lab.server.registry.get("m").admission.statistics()
    assert admission.cancelled_total == 1 and admission.queued_requests == 1

    execute.release()
    assert_ok(holder)
    assert_ok(second, VALUES * 3)  # the next waiter moved up and got the slot
    assert lab.controls.count("m", "execute") == 2  # the cancelled request never ran
    assert_clean(lab, "m")


@cell("TIME.04")
def test_client_deadline_shorter_than_the_admission_wait_ends_the_wait_at_the_clients_deadline(inproc):
    """The model allows 30 s of admission wait; the client's 0.5 s deadline wins: the client gets
    DEADLINE_EXCEEDED at its deadline and the server's queue place is gone by then too."""
    lab = inproc({"m": {}}, parallel_jobs=1, admission_timeout=30.0)
    granted_at_start = lab.server.registry.get("m").admission.statistics().granted_total  # the startup's leases
    execute = lab.gate("m", "execute").hold()
    holder = lab.infer("m", VALUES)
    execute.wait_blocked(1)
    deadline = 0.5
    started = time.monotonic()
    waiter = lab.infer("m", VALUES, timeout=deadline)
    lab.wait_status("m", lambda s: s.queued_requests == 1, "the waiter queued")
    code, error = outcome(waiter)
    # Whichever side notices the deadline first answers: the client's DEADLINE_EXCEEDED, or the server's
    # server_busy (the admission deadline is the client's deadline).
    assert code == "DEADLINE_EXCEEDED" or (code, error.reason) == ("UNAVAILABLE", "server_busy"), error
    lab.wait_status("m", lambda s: s.queued_requests == 0, "the waiter gone", timeout=5)
    assert time.monotonic() - started < deadline + PROMPT  # the wait did not outlast the client's deadline
    assert lab.status("m").active_slots == 1 and not holder.done()
    admission = lab.server.registry.get("m").admission.statistics()
    assert admission.expired_total + admission.cancelled_total == 1
    assert admission.granted_total == granted_at_start + 1  # the holder only

    execute.release()
    assert_ok(holder)
    assert lab.controls.count("m", "execute") == 1
    assert_clean(lab, "m")


_QUEUED_CLIENT = """
import sys
import numpy as np
from client import InferenceClient
InferenceClient(sys.argv[1]).infer("m", {"INPUT0": np.ones(3, np.float32)})
"""


@cell("TIME.04")
def test_client_process_killed_while_queued_its_waiter_leaves_at_once(inproc):
    """A true disconnect: the client process is killed (SIGKILL) while its request waits in the queue. The
    connection drop cancels the call and its waiter leaves at once, while the slot it waited for is still busy."""
    lab = inproc({"m": {}}, parallel_jobs=1)
    execute = lab.gate("m", "execute").hold()
    holder = lab.infer("m", VALUES)
    execute.wait_blocked(1)
    process = subprocess.Popen(
        [sys.executable, "-c", _QUEUED_CLIENT, lab.address],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        lab.wait_status("m", lambda s: s.queued_requests == 1, "the other process's request queued")
        process.kill()
        process.wait(timeout=10)
        took = lab.wait_status("m", lambda s: s.queued_requests == 0, "the dropped waiter gone", timeout=5)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert took < PROMPT
    assert lab.status("m").active_slots == 1 and not holder.done()
    execute.release()
    assert_ok(holder)
    assert lab.controls.count("m", "execute") == 1  # the dropped request never ran
    assert_clean(lab, "m")


@cell("TIME.04")
def test_request_waiting_for_another_requests_initialization_can_be_cancelled(inproc):
    """Two admitted requests on a cold model: the first loads it, the second waits for that load. Cancelling
    the second returns its slot at once, while the load goes on; the first is then served."""
    lab = inproc({"m": {}}, parallel_jobs=2, load_at_startup=False)
    load = lab.gate("m", "load").hold()
    initializer = lab.infer("m", VALUES)
    load.wait_blocked(1)
    waiter = lab.infer("m", VALUES)
    lab.wait_status("m", lambda s: s.active_slots == 2 and s.state == "LOADING", "both admitted, loading")

    waiter.cancel()
    took = lab.wait_status("m", lambda s: s.active_slots == 1, "the waiter's slot back", timeout=5)
    assert took < PROMPT
    assert outcome(waiter)[0] == "CANCELLED"
    assert lab.status("m").state == "LOADING" and load.blocked == 1  # the load goes on

    load.release()
    assert_ok(initializer)
    assert lab.controls.count("m", "load") == 1 and lab.controls.count("m", "execute") == 1
    assert_clean(lab, "m")


# ---- TIME.05: a caller that gives up while its request executes --------------------------------------------------


class _RunWatch:
    """Records each real ONNX Runtime run: rows, when it started, how long it took, whether it raised."""

    def __init__(self) -> None:
        self._cond = threading.Condition()  # guards: started, ended
        self.started: list[int] = []
        self.ended: list[tuple[int, float, BaseException | None]] = []

    def start(self, rows: int) -> None:
        with self._cond:
            self.started.append(rows)
            self._cond.notify_all()

    def end(self, rows: int, seconds: float, error: BaseException | None) -> None:
        with self._cond:
            self.ended.append((rows, seconds, error))
            self._cond.notify_all()

    def wait_started(self, rows: int, timeout: float = WAIT) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: rows in self.started, timeout), "the run did not start"

    def wait_ended(self, rows: int, timeout: float = WAIT) -> tuple[float, BaseException | None]:
        with self._cond:
            assert self._cond.wait_for(lambda: any(r == rows for r, _, _ in self.ended), timeout), "no end"
            return next((seconds, error) for r, seconds, error in self.ended if r == rows)


class _WatchedSession:
    """The real InferenceSession, with each `run` reported to a _RunWatch (nothing else changes)."""

    def __init__(self, session, watch: _RunWatch) -> None:
        self._session = session
        self._watch = watch

    def run(self, names, feed, options):
        rows = next(iter(feed.values())).shape[0]
        self._watch.start(rows)
        started = time.monotonic()
        try:
            results = self._session.run(names, feed, options)
        except BaseException as error:
            self._watch.end(rows, time.monotonic() - started, error)
            raise
        self._watch.end(rows, time.monotonic() - started, None)
        return results

    def __getattr__(self, name):
        return getattr(self._session, name)


class _WatchedOnnxRuntime(OnnxRuntimeBackend):
    def __init__(self, watch: _RunWatch) -> None:
        self.watch = watch

    def load(self, spec):
        model = super().load(spec)
        model.session = _WatchedSession(model.session, self.watch)
        model.run = model.session.run  # the context calls the model's `run`
        return model


@pytest.mark.parametrize("how", ["cancel", "deadline"])
@cell("TIME.05")
def test_onnx_run_given_up_by_its_client_is_terminated_and_the_slot_comes_back_at_once(tmp_path, how, frontends):
    """A real ONNX Runtime run of several seconds (a 1000-node MatMul+Tanh chain, one thread). The client
    cancels it, or its deadline passes, while ONNX Runtime is running it: the run is terminated through
    RunOptions.terminate, the slot comes back (active_slots 0, through GetModel) long before the run could
    have finished, and the model keeps serving with the same results. The contract only promises release
    after the finite work; this is the stronger behaviour."""
    from service.testing import serve

    repository = tmp_path / "repository"
    write_slow_onnx_model(repository, "slow")
    watch = _RunWatch()
    backends = {"onnxruntime": _WatchedOnnxRuntime(watch)}
    with serve(repository, backends=backends, parallel_jobs=1, **frontend_options(frontends)) as running:
        small = slow_rows(64)
        reference = running.client.infer("slow", {"INPUT0": small})["OUTPUT0"]
        small_seconds, _ = watch.wait_ended(64)
        per_row = small_seconds / 64
        rows = min(40_000, max(512, math.ceil(8.0 / per_row)))  # a run of about 8 s (or more)
        expected_seconds = rows * per_row

        stub = pb_grpc.GRPCInferenceServiceStub(running.client.channel)
        client_deadline = 1.0 if how == "deadline" else 120.0
        call = stub.ModelInfer.future(infer_request("slow", slow_rows(rows)), timeout=client_deadline)
        watch.wait_started(rows)  # ONNX Runtime is running it now
        if how == "cancel":
            call.cancel()
        gave_up = time.monotonic()
        code, _ = outcome(call)
        assert code == ("CANCELLED" if how == "cancel" else "DEADLINE_EXCEEDED")
        wait_until(lambda: running.management.get("slow").active_slots == 0, "the slot back", timeout=10)
        slot_back = time.monotonic() - gave_up
        run_seconds, error = watch.wait_ended(rows)

        assert error is not None  # terminated: session.run raised instead of returning a result
        assert slot_back < PROMPT + (client_deadline if how == "deadline" else 0.0)
        assert run_seconds < expected_seconds / 3, (run_seconds, expected_seconds)
        status = running.management.get("slow")
        assert (status.state, status.active_slots, status.queued_requests) == ("READY", 0, 0)
        again = running.client.infer("slow", {"INPUT0": small})["OUTPUT0"]  # the model keeps serving
        np.testing.assert_array_equal(again, reference)


@cell("TIME.05")
def test_request_cancelled_before_its_run_starts_is_skipped(inproc):
    """Cancelled while its slot prepares (before the run): the run never happens and the slot comes back."""
    lab = inproc({"m": {}}, parallel_jobs=1)
    prepare = lab.gate("m", "prepare").hold()
    call = lab.infer("m", VALUES)
    prepare.wait_blocked(1)
    lab.wait_status("m", lambda s: s.active_slots == 1, "the request holding its slot")
    call.cancel()
    assert lab.wait_status("m", lambda s: s.active_slots == 0, "the slot back", timeout=5) < PROMPT
    assert outcome(call)[0] == "CANCELLED"
    assert lab.controls.count("m", "execute") == 0  # skipped
    prepare.release()
    assert_ok(lab.infer("m", VALUES))
    assert_clean(lab, "m")


class _UninterruptibleContext(Context):
    """Like TensorRT after enqueue: the work, once started, cannot be interrupted; it runs until `finish`."""

    def __init__(self, backend: _Uninterruptible) -> None:
        self._backend = backend

    def execute(self, inputs, outputs, cancel):
        self._backend.running.set()
        self._backend.finish.wait(WAIT)
        if cancel.cancelled:
            raise ExecutionCancelled("the caller gave up; the finished work's result is dropped")
        return {"OUTPUT0": np.asarray(inputs["INPUT0"], dtype=np.float32)}


class _UninterruptibleModel(LoadedModel):
    max_parallel_slots = 1
    interruptible = False

    def __init__(self, backend: _Uninterruptible) -> None:
        self._backend = backend
        self.metadata = ModelMetadata((TensorSpec("INPUT0", "FP32", (-1,)),), (TensorSpec("OUTPUT0", "FP32", (-1,)),))

    def create_context(self) -> Context:
        return _UninterruptibleContext(self._backend)


class _Uninterruptible(Backend):
    name = "fixture"

    def __init__(self) -> None:
        self.running = threading.Event()
        self.finish = threading.Event()

    def load(self, spec) -> LoadedModel:
        return _UninterruptibleModel(self)


@cell("TIME.05")
def test_engine_that_cannot_be_interrupted_drops_the_result_and_returns_the_slot_once_the_work_drains(
    tmp_path, frontends
):
    """For engines that cannot stop a started run (TensorRT after enqueue): the client gets CANCELLED at once,
    the slot stays held while the work drains, then comes back and the model serves again."""
    from service.testing import serve
    from tests.shutdown.harness import write_fixture_model

    write_fixture_model(tmp_path, "u")
    backend = _Uninterruptible()
    with serve(tmp_path, backends={"fixture": backend}, parallel_jobs=1, **frontend_options(frontends)) as running:
        stub = pb_grpc.GRPCInferenceServiceStub(running.client.channel)
        call = stub.ModelInfer.future(infer_request("u", VALUES), timeout=WAIT)
        assert backend.running.wait(WAIT)
        call.cancel()
        assert outcome(call)[0] == "CANCELLED"
        assert running.management.get("u").active_slots == 1  # the work still runs and owns the slot
        backend.finish.set()
        wait_until(lambda: running.management.get("u").active_slots == 0, "the slot back", timeout=5)
        stats = running.client.statistics("u")[0].inference_stats
        assert stats.fail.count == 1 and stats.success.count == 0  # the result was dropped
        np.testing.assert_array_equal(running.client.infer("u", {"INPUT0": VALUES})["OUTPUT0"], VALUES)


# ---- TIME.06: streams --------------------------------------------------------------------------------------------


@cell("TIME.06")
def test_stream_abandoned_midway_releases_its_lease(inproc):
    """A streaming model (5 responses per request): the client takes the first response, then cancels while
    the second is being produced. The stream's lease is released at once and the model streams again."""
    lab = inproc({"s": {"stream_responses": 5}}, parallel_jobs=1)
    stream = lab.gate("s", "stream").hold_from(2)  # the first response goes out, the second is held
    responses = lab.client.stream_infer("s", [{"INPUT0": VALUES}], timeout=WAIT)
    first = next(responses)
    np.testing.assert_array_equal(first["OUTPUT0"], VALUES)
    stream.wait_blocked(1)
    assert lab.status("s").active_slots == 1  # the lease is held between responses

    responses.close()  # the client leaves the loop: the call is cancelled
    assert lab.wait_status("s", lambda s: s.active_slots == 0, "the lease released", timeout=5) < PROMPT
    wait_until(lambda: stream.blocked == 0, "the producer left the gate", timeout=5)
    assert_clean(lab, "s")
    stream.release()
    assert len(list(lab.client.stream_infer("s", [{"INPUT0": VALUES}], timeout=WAIT))) == 5


@cell("TIME.06")
def test_stream_request_abandoned_before_its_response_started_leaves_the_queue(inproc):
    lab = inproc({"s": {"stream_responses": 2}}, parallel_jobs=1)
    stream = lab.gate("s", "stream").hold()
    holder = lab.client.stream_infer("s", [{"INPUT0": VALUES}], timeout=WAIT)
    holder_items = lab.call(list, holder)
    stream.wait_blocked(1)
    stub = pb_grpc.GRPCInferenceServiceStub(lab.client.channel)
    waiting = stub.ModelStreamInfer(iter([infer_request("s", VALUES)]), timeout=WAIT)
    lab.wait_status("s", lambda s: s.queued_requests == 1, "the second stream's request queued")
    waiting.cancel()
    assert lab.wait_status("s", lambda s: s.queued_requests == 0, "it left the queue", timeout=5) < PROMPT
    stream.release()
    assert len(holder_items.result(timeout=WAIT)) == 2
    assert lab.controls.count("s", "execute") == 1  # the abandoned request never started
    assert_clean(lab, "s")


@cell("TIME.06")
def test_stream_whose_client_stops_reading_is_ended_by_the_write_timeout(inproc):
    """A streaming model with 200 responses of 4 MiB each; the client reads the first and then never reads
    again (it does not cancel either). Once the transport's buffers are full a send blocks; the write timeout
    (1 s here) cancels the call and the slot is freed within the timeout plus a margin."""
    write_timeout = 1.0
    lab = inproc({"s": {"stream_responses": 200}}, parallel_jobs=1, stream_write_timeout=write_timeout)
    channel = grpc.insecure_channel(
        lab.address, options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    )
    try:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelStreamInfer(iter([infer_request("s", np.ones(1 << 20, np.float32))]), timeout=60)
        assert len(next(call).infer_response.raw_output_contents[0]) == 4 << 20
        stopped_reading = time.monotonic()
        lab.wait_status("s", lambda s: s.active_slots == 0, "the slot freed", timeout=write_timeout + 10)
        assert time.monotonic() - stopped_reading < write_timeout + 2.0
        with pytest.raises(grpc.RpcError) as ended:
            for _ in call:
                pass
        assert ended.value.code() == grpc.StatusCode.CANCELLED
        assert lab.controls.count("s", "execute") == 1
        assert_clean(lab, "s")
        assert len(list(lab.client.stream_infer("s", [{"INPUT0": VALUES}], timeout=WAIT))) == 200
    finally:
        channel.close()


# ---- TIME.07 / TIME.08: shutdown of stalled I/O and of running handlers (in-process; signals: tests/shutdown) ----


@cell("TIME.07")
def test_shutdown_cancels_the_socket_io_of_stalled_streams_then_joins_their_handlers(inproc):
    """At shutdown, a stream whose client stopped reading (non-reading response; write timeout 30 s) and a
    stream whose client keeps its sending side open after its request (live body, the handler waiting for
    the next request). Neither holds up the shutdown: at the grace their socket I/O is cancelled (1 s after
    the grace), every handler returns and is joined (nothing abandoned) and the engines are closed."""
    lab = inproc(
        {"s": {"stream_responses": 200}, "t": {"stream_responses": 1}}, parallel_jobs=2, stream_write_timeout=30.0
    )
    channel = grpc.insecure_channel(lab.address, options=[("grpc.max_receive_message_length", -1)])
    keep_open = threading.Event()

    def open_requests():
        yield infer_request("t", VALUES)
        keep_open.wait(WAIT)  # the client's sending side stays open

    try:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        non_reading = stub.ModelStreamInfer(iter([infer_request("s", np.ones(1 << 20, np.float32))]), timeout=60)
        next(non_reading)
        live = stub.ModelStreamInfer(open_requests(), timeout=60)
        next(live)  # its one response arrived; the handler now waits for the next request
        lab.wait_status("s", lambda s: s.active_slots == 1, "the non-reading stream holding its slot")
        assert lab.server.calls.active == 2

        grace = 0.5
        report = lab.shutdown(grace=grace).result()
        assert report.abandoned_calls == 0
        assert sorted(report.closed_models) == ["s", "t"]
        assert report.seconds < grace + 1.0 + 1.0  # grace, the streams' 1 s to finish, slack; not 30 s
        assert lab.server.calls.active == 0
        assert lab.controls.live_engines("s") == 0 and lab.controls.live_engines("t") == 0
        for call in (non_reading, live):
            with pytest.raises(grpc.RpcError):
                for _ in call:
                    pass
    finally:
        keep_open.set()
        channel.close()


@cell("TIME.07")
def test_shutdown_is_not_held_up_by_a_connection_that_never_sent_its_headers(inproc):
    """A client connected but never sent the HTTP/2 preface (stalled header). The shutdown still returns
    within grace + 2 x margin, and the server closes that connection."""
    from tests.shutdown.harness import MARGIN

    lab = inproc({"m": {}}, parallel_jobs=1)
    host, port = lab.address.rsplit(":", 1)
    stalled = socket.create_connection((host, int(port)), timeout=10)
    try:
        grace = 0.5
        report = lab.shutdown(grace=grace).result()
        assert report.seconds < grace + 2 * MARGIN + 0.5
        assert report.abandoned_calls == 0 and report.closed_models == ["m"]
        # The server may have written its own preface (SETTINGS) and a GOAWAY; then it closes the connection.
        stalled.settimeout(grace + 2 * MARGIN + 5)
        received = b""
        try:
            while chunk := stalled.recv(4096):
                received += chunk
                assert len(received) < 1 << 16
        except ConnectionResetError:
            pass  # closed with a reset instead of an orderly close: closed all the same
    finally:
        stalled.close()


@cell("TIME.08")
def test_shutdown_waits_for_an_active_handler_and_an_active_stream_then_destroys_the_runtime(inproc):
    """A unary request executing and a stream between its responses (a deferred callback holding its lease)
    when shutdown starts: both finish within the grace and their clients get every response; the engines
    are closed only after, and the shutdown returns as soon as they are done (not at the end of the grace)."""
    lab = inproc({"m": {}, "s": {"stream_responses": 3}}, parallel_jobs=2)
    execute = lab.gate("m", "execute").hold()
    stream = lab.gate("s", "stream").hold_from(2)
    unary = lab.infer("m", VALUES)
    execute.wait_blocked(1)
    items = lab.client.stream_infer("s", [{"INPUT0": VALUES}], timeout=WAIT)
    first = next(items)
    stream.wait_blocked(1)
    rest = lab.call(list, items)

    shutdown = lab.shutdown(grace=20.0)
    wait_until(lambda: not lab.server.state.ready, "shutdown started (ServerReady false)", timeout=5)
    from tests.shutdown.harness import wait_stopped_accepting

    wait_stopped_accepting(lab.address)
    assert not shutdown.done()
    assert lab.controls.live_engines("m") == 1 and lab.controls.live_engines("s") == 1  # runtime outlives work
    execute.release()
    stream.release()
    assert_ok(unary)
    assert len([first, *rest.result(timeout=WAIT)]) == 3
    report = shutdown.result()
    assert report.abandoned_calls == 0 and sorted(report.closed_models) == ["m", "s"]
    assert report.seconds < 10.0
    events = lab.controls.events
    for model in ("m", "s"):
        mine = [event for name, event in events if name == model]
        assert mine.index("close_engine") > mine.index("execute")  # destroyed after the work


@cell("TIME.08")
def test_stream_still_producing_at_the_grace_ends_with_a_shutting_down_error_its_client_receives(inproc):
    """A stream between its responses when the grace runs out: its producer is cancelled, the client still
    receives the responses sent so far and then the request's `shutting_down` error on the stream, and the
    handler returns (nothing abandoned)."""
    from client import ClientError

    lab = inproc({"s": {"stream_responses": 3}}, parallel_jobs=1)
    stream = lab.gate("s", "stream").hold_from(2)
    items = lab.client.stream_infer("s", [{"INPUT0": VALUES}], timeout=WAIT)
    first = next(items)
    stream.wait_blocked(1)
    rest = lab.call(list, items)
    report = lab.shutdown(grace=0.3).result()
    received = [first, *rest.result(timeout=WAIT)]
    assert len(received) == 2 and isinstance(received[0], dict)
    assert isinstance(received[1], ClientError) and "shutting_down" in received[1].message
    assert report.abandoned_calls == 0 and report.closed_models == ["s"]
    assert report.seconds < 0.3 + 1.0
