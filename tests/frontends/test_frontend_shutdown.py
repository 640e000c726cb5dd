"""Shutdown with front ends (issue 39; docs/shutdown.md): every front end's listener stops first (a new call on
any front end is refused), the call in flight drains and is answered, the documented bound is kept, and no front
end is left behind: in-process (Server.shutdown) and as a process (SIGTERM)."""

from __future__ import annotations

import signal

import pytest

from tests.shutdown.harness import (
    VALUES,
    WAIT,
    FileGates,
    ServerProcess,
    assert_ok,
    exit_bound,
    outcome,
    record_exit,
    wait_stopped_accepting,
    wait_until,
    write_fixture_model,
)

from ._support import children, exists, stub
from .conftest import request, values

cell = pytest.mark.cell

REAPED = 2.0  # seconds for init to reap a front end that exited as its parent did (an orphan lives on past it)


@cell("TIME.08")
def test_shutdown_stops_every_listener_first_drains_the_call_in_flight_and_leaves_no_front_end(served, frontends):
    server = served({"m": {}}, parallel_jobs=1)
    channels = server.ends.every()
    pids = server.ends.pids()
    assert len(pids) == (frontends if frontends > 1 else 0)
    execute = server.lab.gate("m", "execute").hold()
    running = stub(channels[-1]).ModelInfer.future(request("m", 100.0), timeout=WAIT)
    execute.wait_blocked(1)
    grace, margin = 10.0, 0.5
    shutdown = server.lab.shutdown(drain=0.0, grace=grace, margin=margin)

    wait_stopped_accepting(server.lab.address)  # a new connection is refused
    for channel in channels:  # and each front end refuses a new call on a connection it already had
        code, error = outcome(stub(channel).ModelInfer.future(request("m", 5.0), timeout=WAIT))
        assert code == "UNAVAILABLE", error
    assert not shutdown.done() and not running.done()  # the call in flight drains: it is not cut

    execute.release()
    assert_ok(running, values(100.0))
    report = shutdown.result()
    assert report.abandoned_calls == 0, report
    assert report.seconds < grace + 2 * margin, report
    assert server.runs("m") == [100.0]  # the refused calls never reached admission
    for pid in pids:  # every front end exited and was reaped before shutdown() returned
        assert not exists(pid), f"front end {pid} outlived Server.shutdown"


@cell("TIME.08")
def test_sigterm_stops_the_front_ends_drains_and_the_process_exits_in_its_bound_leaving_no_child(tmp_path, frontends):
    repository = tmp_path / "repository"
    gates = FileGates(tmp_path / "gates", "m")
    write_fixture_model(repository, "m", {"gate_dir": str(gates.directory)})
    grace = 5.0
    server = ServerProcess(repository, "--parallel-jobs", "1", "--shutdown-grace", str(grace), frontends=frontends)
    try:
        front_ends = children(server.process.pid)
        assert len(front_ends) >= (frontends if frontends > 1 else 0), front_ends
        gates.hold("execute")
        call = server.infer_async("m", VALUES)
        gates.wait_arrived("execute")
        server.signal(signal.SIGTERM)
        wait_stopped_accepting(server.address)
        assert not call.done()  # still running: the drain waits for it
        gates.release("execute")
        assert_ok(call)
        assert server.wait_exit() == 0, server.log
        bound = exit_bound(0.0, grace)
        record_exit("frontends: SIGTERM with a call in flight", server, bound)
        assert server.exit_seconds < bound, (server.exit_seconds, bound)
        for pid in front_ends:
            wait_until(lambda pid=pid: not exists(pid), f"front end {pid} gone", timeout=REAPED)
    finally:
        server.close()


@cell("TIME.09")
def test_every_call_ended_at_the_grace_gets_shutting_down_through_its_own_front_end(served, frontends):
    """A call running on m's one slot and eight queued behind it, spread over the front ends; the grace runs out:
    each client gets UNAVAILABLE `shutting_down` (the admission process's answer, carried back by the front end
    that took the call), never a front end's own error for a link that closed before the answer crossed it."""
    server = served({"m": {}}, parallel_jobs=1)
    channels = server.ends.every()
    execute = server.lab.gate("m", "execute").hold()
    running = stub(channels[0]).ModelInfer.future(request("m", 100.0), timeout=WAIT)
    execute.wait_blocked(1)
    queued = []
    for number in range(8):
        channel = channels[number % len(channels)]
        queued.append(stub(channel).ModelInfer.future(request("m", float(number)), timeout=WAIT))
        server.lab.wait_core("m", lambda s, n=number + 1: s.queued_requests == n, f"{number + 1} queued")
    report = server.lab.shutdown(drain=0.0, grace=0.3, margin=0.5).result()
    assert report.abandoned_calls == 0, report
    for call in (running, *queued):
        code, error = outcome(call)
        assert (code, error.reason) == ("UNAVAILABLE", "shutting_down"), error
    assert server.runs("m") == [100.0]
