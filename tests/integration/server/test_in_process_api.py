"""The public in-process server API of service/testing.py does what its documentation says.

`serve(repository, **options)` starts a real server on a free port of 127.0.0.1, yields a RunningServer whose
clients are ready, and stops the server (engines closed) when the block ends, also when the block raises. The
`slotserve` pytest fixture is a factory whose servers all stop at the end of the test. Engines are fixture-backend
models with the test's own FixtureControls, so "stopped cleanly" is checked by counting live engines and
contexts, not by timing.
"""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from client import ClientError
from engine.testing.fixture import FixtureBackend, FixtureControls
from service.server import Server
from service.testing import RunningServer, serve
from tests.shutdown.harness import refuses_new_connections

from .._support import demo_subset, write_fixture_model

MODEL = "echo"


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "repository"
    write_fixture_model(root, MODEL, inputs=[("INPUT0", "FP32", [-1])], outputs=[("OUTPUT0", "FP32", [-1])])
    return root


@pytest.fixture
def controls():
    return FixtureControls()


def engines_closed(controls: FixtureControls, model: str = MODEL) -> bool:
    return (
        controls.count(model, "load") >= 1 and controls.live_engines(model) == 0 and controls.live_contexts(model) == 0
    )


def test_serve_yields_a_ready_server_with_clients(repository, controls):
    with serve(repository, backends={"fixture": FixtureBackend(controls)}) as running:
        assert isinstance(running, RunningServer)
        assert isinstance(running.server, Server)
        assert running.port > 0 and running.server.port == running.port
        assert running.address == f"127.0.0.1:{running.port}"
        # Ready at once: no waiting or retrying on the caller's side.
        assert running.client.ready() is True
        assert running.client.model_ready(MODEL) is True
        assert running.management.get(MODEL).loaded is True
        values = np.linspace(-1, 1, 5, dtype=np.float32)
        np.testing.assert_array_equal(running.client.infer(MODEL, {"INPUT0": values})["OUTPUT0"], values)
        assert controls.live_engines(MODEL) == 1
        address = running.address
    assert refuses_new_connections(address)
    assert engines_closed(controls)


def test_serve_stops_the_server_when_the_block_raises(repository, controls):
    class Failure(Exception):
        pass

    with pytest.raises(Failure):
        with serve(repository, backends={"fixture": FixtureBackend(controls)}) as running:
            address = running.address
            assert running.client.live()
            raise Failure("the test failed")
    assert refuses_new_connections(address)
    assert engines_closed(controls)


def test_serve_passes_options_and_backends(repository, controls):
    with serve(
        repository,
        backends={"fixture": FixtureBackend(controls)},
        parallel_jobs=3,
        allow_management=True,
        load_at_startup=False,
    ) as running:
        status = running.management.get(MODEL)
        assert (status.loaded, status.slots) == (False, 3)  # registered, not loaded; --parallel-jobs default
        assert controls.count(MODEL, "load") == 0
        values = np.arange(4, dtype=np.float32)
        np.testing.assert_array_equal(running.client.infer(MODEL, {"INPUT0": values})["OUTPUT0"], values)
        assert controls.count(MODEL, "load") == 1  # the test's backend did the loading
        assert running.management.register(MODEL, slots=2).slots == 2  # management is allowed
    assert engines_closed(controls)


def test_serve_refuses_invalid_options(repository):
    with pytest.raises(ValueError, match="--parallel-jobs must be 1..16"):
        with serve(repository, parallel_jobs=99):
            pytest.fail("a server started with invalid options")


def _server_threads() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name in ("stream-write-timeouts", "idle-reaper"))


def test_serve_on_a_busy_port_fails_and_leaves_nothing_running(repository, controls):
    threads_before = _server_threads()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{port}"):
            with serve(repository, port=port, backends={"fixture": FixtureBackend(controls)}):
                pytest.fail("a second server bound a port in use")
    # Nothing may stay loaded, or running, for a server that never started serving: the port is bound before the
    # startup loads (the server listens while they run), so none began.
    assert controls.count(MODEL, "load") == 0
    assert controls.live_engines(MODEL) == 0 and controls.live_contexts(MODEL) == 0
    assert _server_threads() == threads_before


# ---- the pytest fixture ---------------------------------------------------------------------------------------


@pytest.fixture
def started_servers():
    """Servers a test started through `slotserve`, checked after the fixture's own teardown (fixtures are torn
    down in the reverse order of their setup, and this one is requested first)."""
    started: list[tuple[str, FixtureControls]] = []
    yield started
    assert started, "the test recorded no server"
    for address, controls in started:
        assert refuses_new_connections(address), f"{address} still serves after the test"
        assert engines_closed(controls)


def test_slotserve_fixture_is_a_factory_whose_servers_stop_after_the_test(started_servers, slotserve, repository):
    first_controls, second_controls = FixtureControls(), FixtureControls()
    first = slotserve(repository, backends={"fixture": FixtureBackend(first_controls)})
    second = slotserve(
        repository, backends={"fixture": FixtureBackend(second_controls)}, allow_management=True, parallel_jobs=2
    )
    assert isinstance(first, RunningServer) and isinstance(second, RunningServer)
    assert first.port != second.port
    assert first.client.ready() and second.client.ready()
    assert first.management.get(MODEL).slots == 1
    assert second.management.get(MODEL).slots == 2
    error = None
    try:
        first.management.unload(MODEL)
    except ClientError as refused:
        error = refused
    assert error is not None and error.code == "PERMISSION_DENIED"  # options differ per server
    second.management.unload(MODEL)
    started_servers.extend([(first.address, first_controls), (second.address, second_controls)])


def test_slotserve_fixture_serves_the_demo_repository(slotserve, tmp_path):
    running = slotserve(demo_subset(tmp_path / "repo", "simple"))
    inputs = {"INPUT0": np.ones((2, 16), np.int32), "INPUT1": np.full((2, 16), 3, np.int32)}
    outputs = running.client.infer("simple", inputs)
    np.testing.assert_array_equal(outputs["OUTPUT0"], inputs["INPUT0"] + inputs["INPUT1"])
    np.testing.assert_array_equal(outputs["OUTPUT1"], inputs["INPUT0"] - inputs["INPUT1"])
