"""Contract: the "Shutdown" column and the "Shutting down" row of the OPS matrix, shutdown of queued, initializing,
management and hung work (TIME.09, a deliberate improvement on the contract) and an embedding program's own
shutdown (TIME.08).

Most of these cells are "U GAP" in the contract: no delivered response is promised, hung or queued work may delay
the exit without bound, nothing is cancelled. slotserve closes those gaps (issue 5) and these tests check what it
does instead: the shutdown order (health NOT_SERVING, drain, stop accepting, work in progress may finish until the
grace, then queued work is refused with UNAVAILABLE `shutting_down` and running work cancelled, a margin for
handlers, hung ones abandoned, engines of idle models closed), bounded by drain + grace + 2 x margin.

The server runs in this process (service.testing.serve, or Server itself for the embedding program) and
`Server.shutdown` is called on a thread, as the signal handler of `python -m service` does; tests/shutdown/ runs
the same scenarios in real processes with SIGTERM/SIGINT. Order comes from fixture gates, the server's status and
its listener state; every wait is bounded.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from engine.testing.fixture import FixtureBackend, FixtureControls
from service.core.lifecycle import ModelState
from service.process.options import ServerOptions
from service.process.server import Server
from tests.shutdown.harness import (
    VALUES,
    WAIT,
    Background,
    InProcess,
    assert_ok,
    assert_shutting_down,
    frontend_options,
    outcome,
    refuses_new_connections,
    wait_stopped_accepting,
    wait_until,
    write_fixture_model,
)

cell = pytest.mark.cell

MARGIN = 0.3  # handler margin for the in-process tests that wait it out (the server's default is 2 s)


def assert_refused_by_transport(function, *args, **kwargs) -> None:
    """A call made after the server stopped accepting fails with UNAVAILABLE, promptly."""
    from client import ClientError

    started = time.monotonic()
    with pytest.raises(ClientError) as refused:
        function(*args, **kwargs)
    assert refused.value.code == "UNAVAILABLE"
    assert time.monotonic() - started < 5.0


def events_of(lab: InProcess, model: str) -> list[str]:
    return [event for name, event in list(lab.controls.events) if name == model]


# ---- the Shutdown column: shutdown while M is in each state -----------------------------------------------------


@cell("OPS.unloaded.shutdown")
def test_shutdown_with_an_unloaded_model_never_loads_it_and_refuses_new_calls_to_it(inproc):
    """U stays unloaded: nothing loads it during the shutdown; once the listener is closed a request for it is
    refused (UNAVAILABLE) rather than starting a load; the admitted work on another model drains first."""
    lab = inproc({"u": {}, "r": {}}, parallel_jobs=1, load_at_startup=False)
    execute = lab.gate("r", "execute").hold()
    busy = lab.infer("r", VALUES)  # loads r, then holds its run
    execute.wait_blocked(1)
    shutdown = lab.shutdown(grace=20.0)
    wait_stopped_accepting(lab.address)
    assert_refused_by_transport(lab.client.infer, "u", {"INPUT0": VALUES}, timeout=5)
    assert lab.core_status("u").state is ModelState.UNLOADED
    execute.release()
    assert_ok(busy)
    report = shutdown.result()
    assert report.closed_models == ["r"] and report.abandoned_calls == 0
    assert lab.controls.count("u", "load") == 0
    assert lab.core_status("u").state is ModelState.UNLOADED


@cell("OPS.loading.shutdown")
def test_shutdown_during_a_cold_load_lets_the_load_and_its_requests_finish_then_destroys_the_pool(inproc):
    """The initializer and a request waiting for it are in progress when the shutdown starts: the load
    completes within the grace, both get their results, and only then is the new pool destroyed."""
    lab = inproc({"m": {}}, parallel_jobs=2, load_at_startup=False)
    load = lab.gate("m", "load").hold()
    initializer = lab.infer("m", VALUES)
    load.wait_blocked(1)
    waiter = lab.infer("m", VALUES * 2)
    lab.wait_status("m", lambda s: s.state == "LOADING" and s.active_slots == 2, "both admitted, loading")

    shutdown = lab.shutdown(grace=20.0)
    wait_stopped_accepting(lab.address)
    assert lab.core_status("m").state is ModelState.LOADING and not shutdown.done()
    load.release()
    assert_ok(initializer)
    assert_ok(waiter, VALUES * 2)
    report = shutdown.result()
    assert report.closed_models == ["m"] and report.abandoned_calls == 0
    events = events_of(lab, "m")
    assert events.count("execute") == 2 and events[-1] == "close_engine"
    assert max(i for i, e in enumerate(events) if e == "execute") < events.index("close_context")
    assert lab.controls.live_engines("m") == 0 and lab.controls.live_contexts("m") == 0


@cell("OPS.ready.shutdown")
def test_shutdown_of_a_ready_model_joins_its_running_work_then_closes_contexts_then_the_engine(inproc):
    lab = inproc({"m": {}}, parallel_jobs=2)
    execute = lab.gate("m", "execute").hold()
    running = lab.infer("m", VALUES)
    execute.wait_blocked(1)
    shutdown = lab.shutdown(grace=20.0)
    wait_stopped_accepting(lab.address)
    assert lab.controls.live_engines("m") == 1 and not shutdown.done()  # not destroyed while in use
    execute.release()
    assert_ok(running)
    report = shutdown.result()
    assert report.closed_models == ["m"] and report.abandoned_calls == 0
    assert events_of(lab, "m") == [
        "load",
        "clone",
        "clone",
        "execute",
        "close_context",
        "close_context",
        "close_engine",
    ]


@cell("OPS.reconfiguring.shutdown")
def test_reconfiguration_in_progress_at_shutdown_finishes_and_its_client_gets_the_new_status(inproc):
    """Stronger than the contract ("no guaranteed delivered response"): the manager that was loading the
    replacement when the shutdown started finishes within the grace and its client gets the READY status."""
    lab = inproc({"m": {}}, parallel_jobs=2, allow_management=True)
    load = lab.gate("m", "load").hold()  # after the startup load: it holds the replacement's load
    manager = lab.call(lab.management.register, "m", options={"capacity": "4"}, timeout=WAIT)
    load.wait_blocked(1)
    lab.wait_status("m", lambda s: s.state == "RECONFIGURING", "m reconfiguring")

    shutdown = lab.shutdown(grace=20.0)
    wait_stopped_accepting(lab.address)
    assert not manager.done()
    load.release()
    status = manager.result(timeout=WAIT)
    assert (status.state, status.loaded, status.max_parallel_slots) == ("READY", True, 4)
    report = shutdown.result()
    assert report.closed_models == ["m"] and report.abandoned_calls == 0
    assert lab.controls.live_engines("m") == 0  # the old engine at the commit, the new one at shutdown


@cell("OPS.reconfiguring.shutdown", "TIME.09")
def test_reconfiguration_hung_past_the_grace_is_abandoned_and_the_shutdown_still_returns_in_bound(inproc):
    """ "Hung work can block exit" in the contract; here it cannot: a replacement load that does not return is
    abandoned after grace + margin, reported, and its model's engine left alone (it is held). Its call's handler
    does not hang with it: it returns when the shutdown cancels the call (the load goes on detached, issue 33)."""
    lab = inproc({"m": {}}, parallel_jobs=2, allow_management=True)
    load = lab.gate("m", "load").hold()
    manager = lab.call(lab.management.register, "m", options={"capacity": "4"}, timeout=WAIT)
    load.wait_blocked(1)
    grace = 0.3
    report = lab.shutdown(grace=grace, margin=MARGIN).result()
    assert report.abandoned_calls == 0 and report.abandoned_models == ["m"] and report.closed_models == []
    assert report.seconds < grace + 2 * MARGIN + 1.0
    load.release()  # the abandoned thread may now finish
    code, _ = outcome(manager)
    assert code != "OK"  # its call was ended by the stopped server


@cell("OPS.unloading.shutdown")
def test_unload_tearing_down_at_shutdown_finishes_and_its_client_gets_the_result(inproc):
    lab = inproc({"m": {}}, parallel_jobs=1, allow_management=True)
    teardown = lab.gate("m", "teardown").hold()
    manager = lab.call(lab.management.unload, "m", timeout=WAIT)
    teardown.wait_blocked(1)
    lab.wait_status("m", lambda s: s.state == "UNLOADING" and not s.loaded, "m unloading")
    shutdown = lab.shutdown(grace=20.0)
    wait_stopped_accepting(lab.address)
    assert not manager.done()
    teardown.release()
    status = manager.result(timeout=WAIT)
    assert (status.state, status.loaded) == ("UNLOADED", False)
    report = shutdown.result()
    assert report.closed_models == [] and report.abandoned_calls == 0
    assert lab.controls.live_engines("m") == 0 and lab.controls.count("m", "close_engine") == 1


# ---- the Shutting down row: each operation while the server shuts down ------------------------------------------


@cell("OPS.shutting-down.infer")
def test_inference_while_shutting_down_served_during_drain_refused_after_and_queued_work_still_runs(inproc):
    """During the drain (health NOT_SERVING) new calls and connections are served; once the listener closes a
    new call is refused at once; a request queued before that still gets its turn within the grace."""
    lab = inproc({"m": {}, "n": {}}, parallel_jobs=1)
    execute = lab.gate("m", "execute").hold()
    running = lab.infer("m", VALUES)
    execute.wait_blocked(1)
    queued = lab.infer("m", VALUES * 2)
    lab.wait_status("m", lambda s: s.queued_requests == 1, "one queued")

    shutdown = lab.shutdown(drain=1.0, grace=20.0)
    wait_until(lambda: lab.client.health() == "NOT_SERVING", "health NOT_SERVING", timeout=5)
    assert lab.client.ready() is False
    from client import InferenceClient

    with InferenceClient(lab.address, timeout=5) as fresh:  # a new connection during the drain
        np.testing.assert_array_equal(fresh.infer("n", {"INPUT0": VALUES})["OUTPUT0"], VALUES)
    wait_stopped_accepting(lab.address)
    assert_refused_by_transport(lab.client.infer, "n", {"INPUT0": VALUES}, timeout=5)
    assert not queued.done()
    execute.release()
    assert_ok(running)
    assert_ok(queued, VALUES * 2)
    report = shutdown.result()
    assert report.abandoned_calls == 0 and sorted(report.closed_models) == ["m", "n"]


@cell("OPS.shutting-down.register")
def test_registration_in_progress_at_shutdown_finishes_and_a_later_one_is_refused(inproc, tmp_path):
    write_fixture_model(tmp_path / "extra", "x")
    lab = inproc({"m": {}}, parallel_jobs=1, allow_management=True, allowed_model_roots=[tmp_path / "extra"])
    load = lab.gate("x", "load").hold()
    registration = lab.call(lab.management.register, "x", source=str(tmp_path / "extra" / "x"), timeout=WAIT)
    load.wait_blocked(1)
    shutdown = lab.shutdown(grace=20.0)
    wait_stopped_accepting(lab.address)
    assert_refused_by_transport(lab.management.register, "m", options={"capacity": "2"}, timeout=5)
    load.release()
    status = registration.result(timeout=WAIT)
    assert (status.model_id, status.state, status.loaded) == ("x", "READY", True)
    report = shutdown.result()
    assert sorted(report.closed_models) == ["m", "x"] and report.abandoned_calls == 0
    assert lab.controls.count("m", "load") == 1  # the refused reconfiguration never started


@cell("OPS.shutting-down.register", "TIME.09")
def test_reconfiguration_still_queued_at_the_grace_is_refused_unavailable_shutting_down(inproc):
    lab = inproc({"m": {}}, parallel_jobs=1, allow_management=True)
    execute = lab.gate("m", "execute").hold()
    running = lab.infer("m", VALUES)
    execute.wait_blocked(1)
    manager = lab.call(lab.management.register, "m", options={"capacity": "4"}, timeout=WAIT)
    lab.wait_core("m", lambda s: s.queued_managers == 1, "the reconfiguration queued")
    report = lab.shutdown(grace=0.3, margin=MARGIN).result()
    from client import ClientError

    with pytest.raises(ClientError) as refused:
        manager.result(timeout=WAIT)
    assert (refused.value.code, refused.value.reason) == ("UNAVAILABLE", "shutting_down")
    assert_shutting_down(running)
    assert report.abandoned_calls == 0 and report.closed_models == ["m"]
    assert lab.controls.count("m", "load") == 1  # the replacement never loaded


@pytest.mark.parametrize("when", ["within the grace", "at the grace"])
@cell("OPS.shutting-down.unload", "TIME.09")
def test_unload_queued_when_the_shutdown_starts(inproc, when):
    """Queued behind a running request: it runs once that request finishes within the grace (OK, unloaded),
    or, still queued at the grace, is refused with UNAVAILABLE shutting_down."""
    from client import ClientError

    lab = inproc({"m": {}}, parallel_jobs=1, allow_management=True)
    execute = lab.gate("m", "execute").hold()
    running = lab.infer("m", VALUES)
    execute.wait_blocked(1)
    manager = lab.call(lab.management.unload, "m", timeout=WAIT)
    lab.wait_core("m", lambda s: s.queued_managers == 1, "the unload queued")
    if when == "within the grace":
        shutdown = lab.shutdown(grace=20.0)
        wait_stopped_accepting(lab.address)
        execute.release()
        assert_ok(running)
        assert manager.result(timeout=WAIT).loaded is False
        report = shutdown.result()
        assert report.closed_models == []  # the unload itself closed it
    else:
        report = lab.shutdown(grace=0.3, margin=MARGIN).result()
        with pytest.raises(ClientError) as refused:
            manager.result(timeout=WAIT)
        assert (refused.value.code, refused.value.reason) == ("UNAVAILABLE", "shutting_down")
        assert_shutting_down(running)
        assert report.closed_models == ["m"]  # closed by the shutdown once its work was cancelled
    assert report.abandoned_calls == 0
    assert lab.controls.live_engines("m") == 0 and lab.controls.count("m", "close_engine") == 1


def _bulk_unload_waiting_on_busy_a(inproc):
    """A bulk unload of a (running a held request) and b (idle): b is freed at once, the barrier on a queues.
    Returns (lab, a's execute gate, a's running request, the bulk unload call)."""
    lab = inproc({"a": {}, "b": {}}, parallel_jobs=1, allow_management=True)
    execute = lab.gate("a", "execute").hold()
    running = lab.infer("a", VALUES)
    execute.wait_blocked(1)
    bulk = lab.call(lab.management.unload_many, ["a", "b"], timeout=WAIT)
    lab.wait_core("b", lambda s: s.state is ModelState.UNLOADED, "idle b freed first")
    lab.wait_core("a", lambda s: s.queued_managers == 1, "the barrier on a queued")
    return lab, execute, running, bulk


@cell("OPS.shutting-down.bulk-unload")
def test_bulk_unload_in_progress_at_shutdown_drains_through_its_barriers_within_the_grace(inproc):
    lab, execute, running, bulk = _bulk_unload_waiting_on_busy_a(inproc)
    shutdown = lab.shutdown(grace=20.0)
    wait_stopped_accepting(lab.address)
    execute.release()
    assert_ok(running)
    assert bulk.result(timeout=WAIT) == (["a", "b"], [])
    report = shutdown.result()
    assert report.closed_models == [] and report.abandoned_calls == 0
    assert lab.controls.live_engines("a") == 0 and lab.controls.live_engines("b") == 0


@cell("OPS.shutting-down.bulk-unload", "TIME.09")
def test_bulk_unload_whose_barrier_is_still_queued_at_the_grace_is_refused_not_reported_as_done(inproc):
    """A bulk unload of a (busy) and b (idle): b is unloaded at once, the barrier on a waits. At the grace the
    queue of a is closed. The bulk did not unload a, which is registered (so not in not_found either): its
    client must learn that the operation was cut short (UNAVAILABLE shutting_down), as a single unload's does,
    not get OK with a silently missing from the list."""
    from client import ClientError

    lab, execute, running, bulk = _bulk_unload_waiting_on_busy_a(inproc)
    report = lab.shutdown(grace=0.3, margin=MARGIN).result()
    assert_shutting_down(running)
    assert report.abandoned_calls == 0 and report.closed_models == ["a"]
    try:
        answer = bulk.result(timeout=WAIT)
    except ClientError as error:
        assert (error.code, error.reason) == ("UNAVAILABLE", "shutting_down")
    else:
        pytest.fail(f"the bulk unload answered OK {answer} although a was registered and not unloaded by it")


@cell("OPS.shutting-down.evict")
def test_eviction_and_idle_retirement_while_shutting_down(inproc):
    """During the drain a cold load may still retire an idle model (try-acquire eviction, --max-resident-models
    1); at the stop the idle reaper thread stops and is joined; the remaining engine is destroyed only after
    its last request, by the shutdown itself."""
    lab = inproc({"a": {}, "b": {}}, parallel_jobs=1, load_at_startup=False, max_resident_models=1, idle_unload=3600.0)
    assert_ok(lab.infer("a", VALUES))  # a resident and idle
    execute = lab.gate("b", "execute").hold()
    shutdown = lab.shutdown(drain=1.0, grace=20.0)
    wait_until(lambda: lab.client.health() == "NOT_SERVING", "health NOT_SERVING", timeout=5)
    loading_b = lab.infer("b", VALUES)  # during the drain: loading b evicts idle a
    execute.wait_blocked(1)
    assert lab.core_status("a").state is ModelState.UNLOADED and lab.controls.live_engines("a") == 0
    wait_stopped_accepting(lab.address)
    reaper = lab.server.residency.reaper
    wait_until(lambda: not reaper._thread.is_alive(), "the idle reaper joined", timeout=5)
    assert reaper.retired == 0
    assert lab.controls.live_engines("b") == 1  # b is busy: not retired, not destroyed
    execute.release()
    assert_ok(loading_b)
    report = shutdown.result()
    assert report.closed_models == ["b"] and report.abandoned_calls == 0
    events = events_of(lab, "b")
    assert events.index("close_engine") > events.index("execute")


@cell("OPS.shutting-down.status")
def test_status_while_shutting_down_answers_during_drain_is_refused_at_once_after_and_stays_readable_in_process(inproc):
    """Stronger than "no guaranteed response": during the drain GetModel/ListModels answer with live counters;
    after the stop a status call is refused at once (UNAVAILABLE, never a hang); the registry's own status
    stays readable by an embedding program during and after the shutdown and ends unloaded."""
    lab = inproc({"m": {}}, parallel_jobs=1)
    execute = lab.gate("m", "execute").hold()
    running = lab.infer("m", VALUES)
    execute.wait_blocked(1)
    shutdown = lab.shutdown(drain=1.0, grace=20.0)
    wait_until(lambda: lab.client.health() == "NOT_SERVING", "health NOT_SERVING", timeout=5)
    status = lab.status("m")
    assert (status.state, status.active_slots) == ("READY", 1)
    assert [s.model_id for s in lab.management.list(timeout=5)] == ["m"]
    wait_stopped_accepting(lab.address)
    assert_refused_by_transport(lab.management.get, "m", timeout=5)
    assert_refused_by_transport(lab.management.list, timeout=5)
    core = lab.core_status("m")
    assert core.state is ModelState.READY and core.active_slots == 1
    execute.release()
    assert_ok(running)
    shutdown.result()
    core = lab.core_status("m")
    assert (core.state, core.loaded, core.active_slots, core.queued_requests) == (ModelState.UNLOADED, False, 0, 0)


@cell("OPS.shutting-down.shutdown")
def test_a_second_shutdown_waits_for_the_first_and_changes_no_ownership(inproc):
    """Calling shutdown again while one runs (a repeated stop) waits for that one and returns its report;
    the work in progress keeps its slot and finishes; every engine is closed exactly once. (A second signal
    to `python -m service` exits at once instead: tests/shutdown.)"""
    lab = inproc({"m": {}}, parallel_jobs=1)
    execute = lab.gate("m", "execute").hold()
    running = lab.infer("m", VALUES)
    execute.wait_blocked(1)
    first = lab.shutdown(grace=20.0)
    wait_stopped_accepting(lab.address)
    second = Background(lab.server.shutdown)
    assert lab.core_status("m").active_slots == 1
    assert not second.done() and not first.done()
    execute.release()
    assert_ok(running)
    report = first.result()
    assert second.result() is report
    assert report.closed_models == ["m"] and lab.controls.count("m", "close_engine") == 1
    assert lab.server.stop() is report  # and later calls too


# ---- TIME.09: queued work, a cold load, a manager, a hung backend at the grace ----------------------------------


@cell("TIME.09")
def test_at_the_grace_queued_requests_are_refused_and_running_ones_cancelled(inproc):
    lab = inproc({"m": {}}, parallel_jobs=1)
    execute = lab.gate("m", "execute").hold()
    running = lab.infer("m", VALUES)
    execute.wait_blocked(1)
    queued = [lab.infer("m", VALUES) for _ in range(3)]
    lab.wait_status("m", lambda s: s.queued_requests == 3, "three queued")
    grace = 0.3
    report = lab.shutdown(grace=grace, margin=MARGIN).result()
    for call in [running, *queued]:
        assert_shutting_down(call)
    assert report.abandoned_calls == 0 and report.closed_models == ["m"]
    assert report.seconds < grace + MARGIN + 1.0
    assert lab.controls.count("m", "execute") == 1  # the queued ones never ran
    stats = lab.server.registry.get("m").admission.statistics()
    assert stats.queued == 0 and stats.active_slots == 0 and stats.closed


@cell("TIME.09")
def test_at_the_grace_a_request_waiting_for_a_cold_load_is_refused_and_a_hung_load_is_abandoned(inproc):
    """The initializer is stuck in a load that ignores cancellation; the request waiting for that load leaves
    at the grace (shutting_down); after the margin the initializer is abandoned and reported, and shutdown
    returns within grace + 2 x margin. When the load finally returns, the abandoned request's run is skipped."""
    lab = inproc({"m": {}}, parallel_jobs=2, load_at_startup=False)
    load = lab.gate("m", "load").hold()
    initializer = lab.infer("m", VALUES)
    load.wait_blocked(1)
    waiter = lab.infer("m", VALUES)
    lab.wait_status("m", lambda s: s.active_slots == 2, "both admitted")
    grace = 0.3
    shutdown = lab.shutdown(grace=grace, margin=MARGIN)
    assert_shutting_down(waiter)
    report = shutdown.result()
    assert report.abandoned_calls == 1
    assert report.seconds < grace + 2 * MARGIN + 1.0
    load.release()
    code, _ = outcome(initializer)
    assert code != "OK"
    wait_until(lambda: lab.core_status("m").active_slots == 0, "the abandoned request's slot back", timeout=5)
    assert lab.controls.count("m", "execute") == 0  # its run was skipped


# ---- TIME.08: a program that embeds the server -------------------------------------------------------------------


@cell("TIME.08")
def test_embedding_program_shutdown_stops_its_callers_and_joins_its_workers_before_returning(tmp_path, frontends):
    """A program that builds `Server` itself (as service.testing and the CLI do): its `shutdown()` stops the
    callers (in-flight ones get UNAVAILABLE shutting_down at the grace, new connections are refused) and returns
    only after every handler returned, the timer and reaper threads stopped and every engine closed; it reports
    what it did. (Once the stand-in for TIME.10, a custom frontend listener, which slotserve does not have: see
    cells.tsv.)"""
    from client import InferenceClient
    from generated import grpc_service_pb2_grpc as pb_grpc
    from tests.shutdown.harness import infer_request

    write_fixture_model(tmp_path, "m")
    controls = FixtureControls()
    options = ServerOptions(
        model_repository=tmp_path,
        host="127.0.0.1",
        port=0,
        parallel_jobs=1,
        idle_unload=3600.0,
        extra_backends={"fixture": FixtureBackend(controls)},
        **frontend_options(frontends),
    )
    server = Server(options)
    server.start()
    address = f"127.0.0.1:{server.port}"
    client = InferenceClient(address, timeout=WAIT)
    try:
        execute = controls.gate("m", "execute").hold()
        stub = pb_grpc.GRPCInferenceServiceStub(client.channel)
        running = stub.ModelInfer.future(infer_request("m", VALUES), timeout=WAIT)
        execute.wait_blocked(1)
        queued = stub.ModelInfer.future(infer_request("m", VALUES), timeout=WAIT)
        wait_until(lambda: server.registry.get("m").status().queued_requests == 1, "one queued", timeout=5)
        grace = 0.3
        report = server.shutdown(drain_seconds=0.0, grace=grace, margin=MARGIN)
        assert report.abandoned_calls == 0 and report.closed_models == ["m"]
        assert server.calls.active == 0  # every handler returned before shutdown() did
        assert not server.timers._thread.is_alive() and not server.residency.reaper._thread.is_alive()
        assert controls.live_engines("m") == 0 and controls.live_contexts("m") == 0
        assert refuses_new_connections(address)
        for call in (running, queued):
            assert_shutting_down(call)
    finally:
        controls.release_all()
        client.close()
        server.shutdown()
