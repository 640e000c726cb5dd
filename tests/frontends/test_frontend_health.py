"""Health and probes from every front end (issue 39): grpc.health.v1, ServerLive and ServerReady answer through
each front end, and say NOT_SERVING / not ready while the admission process is not ready: during the startup
loads (a model's load held at its gate) and during the shutdown's drain."""

from __future__ import annotations

import pytest

from engine.testing.fixture import FixtureBackend, FixtureControls
from service.process.options import ServerOptions
from service.process.server import INFERENCE_SERVICE, MANAGEMENT_SERVICE, Server
from tests.shutdown.harness import Background, frontend_options, frontend_pids, wait_until, write_fixture_model

from ._support import NOT_SERVING, SERVING, FrontEnds, health, live_call, ready

cell = pytest.mark.cell


def _probes(channel) -> tuple[int, bool, bool]:
    return health(channel), live_call(channel), ready(channel)


def test_every_front_end_answers_health_live_and_ready(served, frontends):
    server = served({"m": {}})
    channels = server.ends.every()
    assert len(channels) == frontends
    for channel in channels:
        assert _probes(channel) == (SERVING, True, True)
        for service in (INFERENCE_SERVICE, MANAGEMENT_SERVICE):
            assert health(channel, service) == SERVING


@cell("OPS.shutting-down.status")
def test_every_front_end_says_not_serving_during_the_shutdowns_drain(served, frontends):
    """The drain keeps the listeners open while the admission process is no longer ready: each front end still
    answers, NOT_SERVING and not ready, but live."""
    server = served({"m": {}})
    channels = server.ends.every()
    drain = 5.0  # the probes below must answer inside it (they are a few calls on open connections)
    shutdown = server.lab.shutdown(drain=drain, grace=5.0, margin=0.5)
    wait_until(lambda: not server.lab.server.state.ready, "the shutdown under way")
    for channel in channels:
        assert _probes(channel) == (NOT_SERVING, True, False)
    assert not shutdown.done()  # they answered during the drain
    report = shutdown.result()
    assert report.abandoned_calls == 0


def test_every_front_end_says_not_serving_until_the_startup_loads_end(tmp_path, frontends):
    """The server listens before its startup loads (docs/lifecycle.md, "Startup"); with the load of `m` held at
    its gate, every front end answers live but NOT_SERVING and not ready; once the load ends, SERVING."""
    write_fixture_model(tmp_path, "m")
    controls = FixtureControls()
    options = ServerOptions(
        model_repository=tmp_path,
        host="127.0.0.1",
        port=0,
        enable_test_backends=True,
        extra_backends={"fixture": FixtureBackend(controls)},
        **frontend_options(frontends),
    )
    server = Server(options)
    load = controls.gate("m", "load").hold()
    start = Background(server.start)
    ends = None
    try:
        load.wait_blocked(1, timeout=30)
        wait_until(lambda: server.port is not None, "the server listening")

        def pids() -> list[int]:
            return frontend_pids(server)

        wait_until(lambda: len(pids()) == (frontends if frontends > 1 else 0), "every front end started")
        ends = FrontEnds(f"127.0.0.1:{server.port}", pids)
        channels = ends.every()
        for channel in channels:
            assert _probes(channel) == (NOT_SERVING, True, False)
        assert not start.done()
        load.release()
        assert start.result(timeout=30) == server.port
        for channel in channels:
            assert _probes(channel) == (SERVING, True, True)
    finally:
        controls.release_all()
        if ends is not None:
            ends.close()
        start.thread.join(timeout=30)  # start() returns once the released load ends
        server.shutdown(drain_seconds=0.0, grace=5.0)
