"""Shutdown of a real `python -m service` process on SIGTERM / SIGINT (issue 5, item 4).

Each test shows what the clients receive and that the process exits with code 0 within the bound

    drain + grace + 2 x 2 s (the handlers' margin, service.process.server.SHUTDOWN_MARGIN, twice at most) + 3 s slack
    (process start/stop: the signal reaching the main thread, closing engines, interpreter teardown)

measured from the signal to the exit (tests/shutdown/harness.py: exit_bound). Where the work ends within the
grace, the tests also check that the process did not sit out the grace. Events are ordered with the fixture's
file gates (`gate_dir`), the server's status (GetModel through the client) and its shutdown log lines; every
wait is bounded; every process is killed in teardown.

The contract marks most of these cells "U GAP" (no bounded shutdown, no cancellation of queued, initializing or
hung work). slotserve closes those gaps and these tests check the stronger behaviour it implements.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from client import InferenceClient

from .harness import (
    ROOT,
    VALUES,
    FileGates,
    assert_ok,
    assert_shutting_down,
    exit_bound,
    outcome,
    record_exit,
    slow_rows,
    wait_stopped_accepting,
    wait_until,
    write_fixture_model,
    write_slow_onnx_model,
)

cell = pytest.mark.cell


def fixture_repository(tmp_path, models: dict[str, dict]):
    """A repository of fixture models, each with `gate_dir` set to tmp_path/gates; returns (repository, gates)."""
    repository, gate_dir = tmp_path / "repository", tmp_path / "gates"
    for name, parameters in models.items():
        write_fixture_model(repository, name, {"gate_dir": gate_dir, **parameters})
    return repository, gate_dir


def assert_clean_exit(server, request, drain: float, grace: float) -> None:
    """Exit code 0 within drain + grace + 2 x margin + slack, and recorded for the summary."""
    code = server.wait_exit()
    bound = exit_bound(drain, grace)
    record_exit(request.node.name, server, bound)
    assert code == 0, server.log
    assert server.exit_seconds < bound, f"exited {server.exit_seconds:.2f} s after the signal (bound {bound} s)"


@cell("TIME.08", "OPS.ready.shutdown", "OPS.shutting-down.infer", "OPS.shutting-down.status")
def test_sigterm_turns_health_not_serving_first_serves_through_the_drain_and_lets_running_work_finish(
    tmp_path, start_server, request
):
    """Order: health NOT_SERVING -> still serving (new connection, inference, status) for --drain-seconds ->
    listener closed (no new connection) -> the request executing since before the signal finishes within the
    grace and its client gets OK -> exit 0 soon after, without waiting out the grace."""
    repository, gate_dir = fixture_repository(tmp_path, {"m": {}, "n": {}})
    drain, grace = 1.5, 20.0
    server = start_server(
        repository, "--parallel-jobs", "2", "--drain-seconds", str(drain), "--shutdown-grace", str(grace)
    )
    gates = FileGates(gate_dir, "m")
    assert server.client.health() == "SERVING" and server.client.ready()
    gates.hold("execute")
    running = server.infer_async("m", VALUES)
    gates.wait_arrived("execute")
    server.wait_status("m", lambda s: s.active_slots == 1, "the request executing on m")

    server.signal(signal.SIGTERM)
    wait_until(lambda: server.client.health() == "NOT_SERVING", "health NOT_SERVING", timeout=drain)
    assert server.client.ready() is False
    # Draining: a new connection is accepted and served (inference and status) after health turned.
    with InferenceClient(server.address, timeout=5) as fresh:
        np.testing.assert_array_equal(fresh.infer("n", {"INPUT0": VALUES})["OUTPUT0"], VALUES)
    assert server.status("m").active_slots == 1 and [s.model_id for s in server.management.list()] == ["m", "n"]
    assert not running.done()

    server.wait_log("shutdown: no longer accepting calls")
    # gRPC closes the listener from its own threads once stop() is called: on a loaded machine a probe made right
    # after the log line can still be answered, so wait for the refusal (it must come while `m` still runs).
    wait_stopped_accepting(server.address)
    assert not running.done()
    gates.release("execute")
    assert_ok(running)
    finished = time.monotonic()
    assert_clean_exit(server, request, drain, grace)
    assert server.exited_at - finished < 3.0  # it did not sit out the 20 s grace
    assert "abandoning" not in server.log and "(2 engine(s) closed)" in server.log


@cell("TIME.08", "OPS.shutting-down.infer")
def test_onnx_run_still_executing_at_the_grace_is_terminated_and_its_client_gets_unavailable_shutting_down(
    tmp_path, start_server, request
):
    """A real ONNX Runtime run that would take about ten seconds is terminated at the 1 s grace (RunOptions
    .terminate): its client gets UNAVAILABLE shutting_down, the slot comes back, the engine is closed (nothing
    abandoned) and the process exits long before the run could have finished."""
    repository = tmp_path / "repository"
    write_slow_onnx_model(repository, "slow")
    grace = 1.0
    server = start_server(repository, "--parallel-jobs", "1", "--shutdown-grace", str(grace))
    started = time.monotonic()
    server.client.infer("slow", {"INPUT0": slow_rows(64)})
    per_row = (time.monotonic() - started) / 64
    rows = min(40_000, max(256, math.ceil(10.0 / per_row)))  # a run of about 10 s (or more)
    running = server.infer_async("slow", slow_rows(rows), timeout=120)
    server.wait_status("slow", lambda s: s.active_slots == 1, "the long run admitted")

    server.signal(signal.SIGTERM)
    assert_shutting_down(running)
    assert_clean_exit(server, request, 0.0, grace)
    assert server.exit_seconds < rows * per_row / 2  # the run was cut short, not waited for
    assert "abandoning" not in server.log and "(1 engine(s) closed)" in server.log


@cell("TIME.09", "OPS.shutting-down.infer")
def test_sigint_queued_request_that_gets_its_turn_within_the_grace_is_answered_ok(tmp_path, start_server, request):
    """SIGINT behaves as SIGTERM. A request queued behind a running one when the signal arrives is still
    served once the running one finishes within the grace."""
    repository, gate_dir = fixture_repository(tmp_path, {"m": {}})
    grace = 20.0
    server = start_server(repository, "--parallel-jobs", "1", "--shutdown-grace", str(grace))
    gates = FileGates(gate_dir, "m")
    gates.hold("execute")
    running = server.infer_async("m", VALUES)
    gates.wait_arrived("execute")
    queued = server.infer_async("m", VALUES * 2)
    server.wait_status("m", lambda s: s.active_slots == 1 and s.queued_requests == 1, "one running, one queued")

    server.signal(signal.SIGINT)
    server.wait_log("shutdown: no longer accepting calls")
    assert not queued.done()
    gates.release("execute")
    assert_ok(running)
    assert_ok(queued, VALUES * 2)
    finished = time.monotonic()
    assert_clean_exit(server, request, 0.0, grace)
    assert server.exited_at - finished < 3.0
    assert "received SIGINT: shutting down" in server.log


@cell("TIME.09")
def test_queued_request_still_queued_at_the_grace_is_refused_unavailable_shutting_down(tmp_path, start_server, request):
    """At the grace the queue is closed (the queued request gets UNAVAILABLE shutting_down) and the request
    still executing is cancelled (shutting_down too); exit 0 within the bound."""
    repository, gate_dir = fixture_repository(tmp_path, {"m": {}})
    grace = 1.0
    server = start_server(repository, "--parallel-jobs", "1", "--shutdown-grace", str(grace))
    gates = FileGates(gate_dir, "m")
    gates.hold("execute")
    running = server.infer_async("m", VALUES)
    gates.wait_arrived("execute")
    queued = server.infer_async("m", VALUES)
    server.wait_status("m", lambda s: s.queued_requests == 1, "one queued")

    server.signal(signal.SIGTERM)
    assert_shutting_down(queued)
    assert_shutting_down(running)
    assert "shutdown: grace over; refusing queued work" in server.log
    assert_clean_exit(server, request, 0.0, grace)
    assert "abandoning" not in server.log and "(1 engine(s) closed)" in server.log


@cell("OPS.loading.shutdown", "TIME.09")
def test_cold_load_in_progress_that_finishes_within_the_grace_serves_its_requests(tmp_path, start_server, request):
    """A cold load (the initializer) and a request waiting for it when the signal arrives: the load finishes
    within the grace, both requests get OK, then the engine is closed and the process exits."""
    repository, gate_dir = fixture_repository(tmp_path, {"m": {}})
    gates = FileGates(gate_dir, "m")
    gates.hold("load")
    grace = 20.0
    server = start_server(repository, "--parallel-jobs", "2", "--no-load-at-startup", "--shutdown-grace", str(grace))
    initializer = server.infer_async("m", VALUES)
    gates.wait_arrived("load")
    waiter = server.infer_async("m", VALUES * 3)
    server.wait_status("m", lambda s: s.state == "LOADING" and s.active_slots == 2, "two admitted, loading")

    server.signal(signal.SIGTERM)
    server.wait_log("shutdown: no longer accepting calls")
    gates.release("load")
    assert_ok(initializer)
    assert_ok(waiter, VALUES * 3)
    assert_clean_exit(server, request, 0.0, grace)
    assert "(1 engine(s) closed)" in server.log


@cell("OPS.loading.shutdown", "TIME.09")
def test_cold_load_still_running_at_the_grace_cancels_its_waiter_and_skips_the_initializers_run(
    tmp_path, start_server, request
):
    """At the grace a request waiting for another's initialization gets UNAVAILABLE shutting_down at once; the
    load itself (not interruptible) is let finish, the initializer's run is skipped (shutting_down too), the
    new engine is closed, and the process exits 0 within the bound."""
    repository, gate_dir = fixture_repository(tmp_path, {"m": {}})
    gates = FileGates(gate_dir, "m")
    gates.hold("load")
    grace = 1.0
    server = start_server(repository, "--parallel-jobs", "2", "--no-load-at-startup", "--shutdown-grace", str(grace))
    initializer = server.infer_async("m", VALUES)
    gates.wait_arrived("load")
    waiter = server.infer_async("m", VALUES)
    server.wait_status("m", lambda s: s.state == "LOADING" and s.active_slots == 2, "two admitted, loading")

    server.signal(signal.SIGTERM)
    assert_shutting_down(waiter)
    assert not initializer.done()  # still in the backend's load
    gates.release("load")
    assert_shutting_down(initializer)
    assert_clean_exit(server, request, 0.0, grace)
    assert "abandoning" not in server.log and "(1 engine(s) closed)" in server.log


@cell("OPS.reconfiguring.shutdown", "OPS.shutting-down.register", "TIME.09")
def test_management_operation_in_progress_finishes_within_the_grace_and_its_client_gets_the_result(
    tmp_path, start_server, request
):
    """A reconfiguration (RegisterModel of an existing id) loading its replacement when the signal arrives
    completes within the grace; its client gets the new status (READY, new capacity); then exit 0."""
    repository, gate_dir = fixture_repository(tmp_path, {"m": {}})
    grace = 20.0
    server = start_server(repository, "--parallel-jobs", "2", "--allow-management", "--shutdown-grace", str(grace))
    gates = FileGates(gate_dir, "m")
    gates.hold("load")  # after the startup load: it stops the replacement's load
    manager = server.call_async(server.management.register, "m", options={"capacity": "4"})
    gates.wait_arrived("load")
    server.wait_status("m", lambda s: s.state == "RECONFIGURING", "m reconfiguring")

    server.signal(signal.SIGTERM)
    server.wait_log("shutdown: no longer accepting calls")
    assert not manager.done()
    gates.release("load")
    code, status = outcome(manager)
    assert code == "OK", status
    assert (status.state, status.loaded, status.max_parallel_slots) == ("READY", True, 4)
    assert_clean_exit(server, request, 0.0, grace)
    assert "(1 engine(s) closed)" in server.log


@cell("OPS.unloading.shutdown", "OPS.shutting-down.unload")
def test_unload_tearing_down_when_the_signal_arrives_finishes_and_its_client_gets_the_result(
    tmp_path, start_server, request
):
    repository, gate_dir = fixture_repository(tmp_path, {"m": {}})
    grace = 20.0
    server = start_server(repository, "--allow-management", "--shutdown-grace", str(grace))
    gates = FileGates(gate_dir, "m")
    gates.hold("teardown")
    manager = server.call_async(server.management.unload, "m")
    gates.wait_arrived("teardown")
    server.wait_status("m", lambda s: s.state == "UNLOADING" and not s.loaded, "m unloading")

    server.signal(signal.SIGTERM)
    server.wait_log("shutdown: no longer accepting calls")
    gates.release("teardown")
    code, status = outcome(manager)
    assert code == "OK", status
    assert (status.state, status.loaded) == ("UNLOADED", False)
    assert_clean_exit(server, request, 0.0, grace)
    assert "(0 engine(s) closed)" in server.log and "abandoning" not in server.log


@cell("TIME.09")
def test_hung_backend_call_is_abandoned_and_logged_and_the_process_still_exits_0_within_the_bound(
    tmp_path, start_server, request
):
    """A backend call that never returns and ignores cancellation (`hang: execute`): at the grace it is
    cancelled (ignored), after the margin it is abandoned and logged, its model's engine is left open, and
    the process exits 0 (os._exit) within grace + 2 x margin + slack. The hung call's client gets UNAVAILABLE
    (the call is cancelled when the gRPC server's own stop grace, grace + 2 x margin, runs out) instead of
    waiting forever."""
    repository, _ = fixture_repository(tmp_path, {"h": {"hang": "execute"}, "ok": {}})
    grace = 1.0
    server = start_server(repository, "--parallel-jobs", "1", "--shutdown-grace", str(grace))
    hung = server.infer_async("h", VALUES)
    server.wait_status("h", lambda s: s.active_slots == 1, "the hung call admitted")

    server.signal(signal.SIGTERM)
    assert_clean_exit(server, request, 0.0, grace)
    code, error = outcome(hung)
    assert code == "UNAVAILABLE", error  # "Cancelling all calls": gRPC's own stop grace ran out (no reason set)
    assert "shutdown: abandoning 1 call(s) hung in a backend" in server.log
    assert "shutdown: engines of h left open: still held by hung calls" in server.log
    assert "(1 engine(s) closed)" in server.log  # the idle model's engine was closed


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGQUIT], ids=["SIGINT", "SIGQUIT"])
@cell("OPS.shutting-down.shutdown")
def test_sigint_again_or_sigquit_during_the_shutdown_exits_at_once_with_128_plus_its_number(
    tmp_path, start_server, second
):
    """While the first signal's shutdown waits (a 60 s grace, a hung call), Ctrl-C again (SIGINT) or SIGQUIT
    ends the process at once with 128 + signum: the operator's way out of a drain they do not want to wait for."""
    repository, _ = fixture_repository(tmp_path, {"h": {"hang": "execute"}})
    server = start_server(repository, "--shutdown-grace", "60")
    hung = server.infer_async("h", VALUES)  # (kept: a dropped future cancels its call)
    server.wait_status("h", lambda s: s.active_slots == 1, "the hung call admitted")
    server.signal(signal.SIGINT)
    server.wait_log("shutdown: no longer accepting calls")
    again = time.monotonic()
    server.process.send_signal(second)
    code = server.wait_exit(timeout=10)
    assert code == 128 + second
    assert server.exited_at - again < 2.0
    assert f"received {second.name}: exiting at once, without draining" in server.log
    assert outcome(hung)[0] == "UNAVAILABLE"  # the connection went with the process


@cell("OPS.shutting-down.shutdown")
def test_sigterm_again_during_the_shutdown_changes_nothing(tmp_path, start_server, request):
    """Process supervisors send SIGTERM twice (`timeout(1)` signals its child, then its whole group): the
    second changes nothing. The drain is served, the running request finishes within the grace and gets OK,
    and the process exits 0, not 128 + 15. (Two SIGTERMs sent before the first is delivered are merged by the
    kernel into one; the test sends the second once the first was handled, the case that used to exit.)"""
    repository, gate_dir = fixture_repository(tmp_path, {"m": {}})
    drain, grace = 1.0, 20.0
    server = start_server(repository, "--drain-seconds", str(drain), "--shutdown-grace", str(grace))
    gates = FileGates(gate_dir, "m")
    gates.hold("execute")
    running = server.infer_async("m", VALUES)
    gates.wait_arrived("execute")

    server.signal(signal.SIGTERM)
    server.wait_log("received SIGTERM: shutting down")
    server.process.send_signal(signal.SIGTERM)
    server.wait_log("received SIGTERM again: already shutting down, the shutdown goes on")
    server.wait_log("shutdown: no longer accepting calls")
    assert server.process.poll() is None and not running.done()
    gates.release("execute")
    assert_ok(running)
    assert_clean_exit(server, request, drain, grace)
    assert server.exit_seconds >= drain  # the drain was not skipped
    assert server.log.count("received SIGTERM: shutting down") == 1


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@cell("TIME.08")
def test_a_stop_signal_delivered_to_a_non_main_thread_starts_the_shutdown_within_a_second(
    tmp_path, start_server, request, signum
):
    """The kernel may deliver a process-directed signal to any thread that does not block it (gRPC's and ONNX
    Runtime's threads do not). Sent with tgkill to one such thread, it still starts the shutdown at once: the
    main thread wakes on the signal's byte in its wakeup pipe, not when it happens to run Python code."""
    repository, _ = fixture_repository(tmp_path, {"m": {}})
    server = start_server(repository, "--shutdown-grace", "5")
    assert_ok(server.infer_async("m", VALUES))  # the engine's and gRPC's threads exist
    server.signal_other_thread(signum)
    seconds = wait_until(
        lambda: f"received {signum.name}: shutting down" in server.log, "the shutdown to start", timeout=5
    )
    assert seconds < 1.0, f"the shutdown started {seconds:.2f} s after the signal"
    assert_clean_exit(server, request, 0.0, 5.0)


@cell("TIME.07")
def test_stream_whose_client_stopped_reading_does_not_hold_up_the_exit(tmp_path, start_server, request):
    """A streaming response blocked on a client that stopped reading (several-MiB messages, write timeout
    30 s): at the grace the stream's socket I/O is cancelled, its handler returns and is joined (nothing
    abandoned), the engine is closed and the process exits 0 long before the write timeout."""
    import grpc

    from generated import grpc_service_pb2_grpc as pb_grpc

    from .harness import infer_request

    repository, _ = fixture_repository(tmp_path, {"s": {"stream_responses": 200}})
    grace = 1.0
    server = start_server(
        repository, "--parallel-jobs", "1", "--shutdown-grace", str(grace), "--stream-write-timeout", "30"
    )
    stub = pb_grpc.GRPCInferenceServiceStub(server.channel())
    call = stub.ModelStreamInfer(iter([infer_request("s", np.ones(1 << 20, np.float32))]), timeout=60)
    assert len(next(call).infer_response.raw_output_contents[0]) == 4 << 20  # then it never reads again
    server.wait_status("s", lambda s: s.active_slots == 1, "the stream holding its slot")

    server.signal(signal.SIGTERM)
    assert_clean_exit(server, request, 0.0, grace)
    assert server.exit_seconds < grace + 2 * 2.0  # not the 30 s write timeout; no handler abandoned
    assert "abandoning" not in server.log and "(1 engine(s) closed)" in server.log
    with pytest.raises(grpc.RpcError):
        for _ in call:
            pass


# ---- SIGHUP and a closed stdout (issue 19, item 9) ----------------------------------------------------------------


def test_sighup_is_a_stop_signal_with_the_drain_like_sigterm(tmp_path, start_server, request):
    """A hang-up of the terminal that started the server used to kill it at once (exit 129, no drain, no log),
    dropping the request in flight. Now SIGHUP starts the documented shutdown: logged, health NOT_SERVING, the
    drain served, the running request finishes with OK, exit 0; a second SIGHUP changes nothing."""
    repository, gate_dir = fixture_repository(tmp_path, {"m": {}})
    drain, grace = 1.0, 20.0
    server = start_server(repository, "--drain-seconds", str(drain), "--shutdown-grace", str(grace))
    gates = FileGates(gate_dir, "m")
    gates.hold("execute")
    running = server.infer_async("m", VALUES)
    gates.wait_arrived("execute")

    server.signal(signal.SIGHUP)
    server.wait_log("received SIGHUP: shutting down")
    wait_until(lambda: server.client.health() == "NOT_SERVING", "health NOT_SERVING", timeout=drain + 5)
    server.process.send_signal(signal.SIGHUP)
    server.wait_log("received SIGHUP again: already shutting down, the shutdown goes on")
    server.wait_log("shutdown: no longer accepting calls")
    assert server.process.poll() is None and not running.done()
    gates.release("execute")
    assert_ok(running)
    assert_clean_exit(server, request, drain, grace)
    assert server.exit_seconds >= drain


class _BareProcess:
    """`python -m service` started with the stdout and the command prefix a test chooses; its address is read
    from the `serving` line of its log (stderr), since its stdout may be unreadable."""

    _SERVING = re.compile(r" serving \S+ on (\S+)")

    def __init__(self, repository, *, prefix: tuple[str, ...] = (), stdout=subprocess.DEVNULL) -> None:
        command = [
            *prefix,
            sys.executable,
            "-m",
            "service",
            "--model-repository",
            str(repository),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--shutdown-grace",
            "5",
            "--enable-test-backends",
        ]
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._lines: list[str] = []
        self._lock = threading.Lock()  # guards: _lines
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        wait_until(lambda: bool(self._SERVING.search(self.log)) or self.process.poll() is not None, "the serving line")
        match = self._SERVING.search(self.log)
        assert match, f"exited {self.process.poll()} before serving:\n{self.log}"
        self.address = match.group(1)

    def _read(self) -> None:
        assert self.process.stderr is not None  # stderr=PIPE
        for line in self.process.stderr:
            with self._lock:
                self._lines.append(line.rstrip("\n"))

    @property
    def log(self) -> str:
        with self._lock:
            return "\n".join(self._lines)

    def wait_exit(self) -> int:
        code = self.process.wait(timeout=30)
        self._reader.join(timeout=10)
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process.stderr.close()  # type: ignore[union-attr]  # stderr=PIPE


@pytest.fixture
def bare_processes():
    started: list[_BareProcess] = []
    yield lambda *args, **kwargs: started.append(_BareProcess(*args, **kwargs)) or started[-1]
    for process in started:
        process.close()
        print(f"---- log of {process.address} ----\n{process.log}")


def test_a_server_started_under_nohup_keeps_ignoring_sighup(tmp_path, bare_processes):
    """`nohup` starts the server with SIGHUP ignored: the operator asked for hang-ups to pass it by, so the server
    does not install its own handler for it. (An ignored signal is discarded when it is sent, so the server has
    already not seen it when os.kill returns.) SIGTERM still stops it, with exit 0."""
    if shutil.which("nohup") is None:
        pytest.skip("nohup is not installed")
    repository, _ = fixture_repository(tmp_path, {"m": {}})
    server = bare_processes(repository, prefix=("nohup",))
    os.kill(server.process.pid, signal.SIGHUP)
    with InferenceClient(server.address, timeout=10) as client:
        assert client.live()
        np.testing.assert_array_equal(client.infer("m", {"INPUT0": VALUES})["OUTPUT0"], VALUES)
    assert server.process.poll() is None and "SIGHUP" not in server.log
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit() == 0, server.log


def test_a_closed_stdout_does_not_stop_the_server(tmp_path, bare_processes):
    """The server's stdout is a pipe whose reader is gone before the "listening" line: that print used to raise
    BrokenPipeError and end the process with exit 1 after it had logged "serving". Now the line is dropped with
    a warning: the server answers ServerLive and inference, then stops cleanly on SIGTERM (exit 0, no
    traceback)."""
    repository, _ = fixture_repository(tmp_path, {"m": {}})
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read the server's stdout
    try:
        server = bare_processes(repository, stdout=write_end)
    finally:
        os.close(write_end)
    wait_until(
        lambda: "not printed; serving on" in server.log or server.process.poll() is not None,
        "the server to get past its listening line",
    )
    with InferenceClient(server.address, timeout=10) as client:
        assert client.live()
        np.testing.assert_array_equal(client.infer("m", {"INPUT0": VALUES})["OUTPUT0"], VALUES)
    assert server.process.poll() is None, server.log
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit() == 0, server.log
    assert "Traceback" not in server.log and "BrokenPipeError" not in server.log, server.log
    assert "shutdown: done" in server.log
