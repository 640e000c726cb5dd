"""`--frontends 2` through real front-end processes on a real port: every kind of call is forwarded and answered
as by one process (infer, stream, management, health, errors with their details), a front end killed mid-call
fails only its own call (its CancelToken fires in the admission process, the slot goes back) and is replaced, a
client's deadline crosses the link (a queued request that timed out never takes the slot), and the shutdown ends
every front end. The contract suite runs every cell against N > 1 (tests/frontends/, tests/contract/)."""

from __future__ import annotations

import os
import signal
import threading
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client import ClientError, InferenceClient
from engine.testing.fixture import FixtureBackend, FixtureControls
from service.testing import serve
from tests.contract.harness import write_fixture_model
from tests.integration._support import in_background, wait_for

INPUT = {"INPUT0": np.ones(4, np.float32)}
WAIT = 20.0


def _wait(predicate, what: str, timeout: float = WAIT) -> None:
    wait_for(predicate, what, timeout, poll=0.005)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is gone too
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _own_connection(address: str) -> InferenceClient:
    """A client on a TCP connection of its own (gRPC shares one between channels to the same address by default),
    so the kernel picks a front end for it."""
    channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
    return InferenceClient(address, channel=channel, token="")


def _calls_per_frontend(server) -> dict[int, int]:
    """How many forwarded calls each front end has running in the admission process now."""
    supervisor = server._frontends
    with supervisor._lock:
        running = dict(supervisor._running)
    return {index: len(each._calls) for index, each in running.items()}


@pytest.fixture
def repository(tmp_path):
    write_fixture_model(tmp_path, "busy", {"capacity": 2})
    write_fixture_model(tmp_path, "one", {"capacity": 1})
    return tmp_path


def test_every_kind_of_call_is_answered_through_two_front_ends(repository):
    controls = FixtureControls()
    with serve(
        repository, backends={"fixture": FixtureBackend(controls)}, frontends=2, allow_management=True
    ) as running:
        pids = running.server.frontend_pids()
        assert len(pids) == 2 and os.getpid() not in pids and all(_alive(pid) for pid in pids)
        client = running.client
        assert client.live() and client.ready()
        assert client.health() == "SERVING"
        outputs = client.infer("busy", INPUT)
        assert outputs["OUTPUT0"].tolist() == [1.0] * 4
        answers = list(client.stream_infer("busy", [INPUT, INPUT, INPUT]))
        assert len(answers) == 3 and all(isinstance(answer, dict) for answer in answers)
        assert [status.model_id for status in running.management.list()] == ["busy", "one"]
        assert running.management.unload("one").loaded is False
        with pytest.raises(ClientError) as missing:  # the status, its message and its ErrorInfo cross the link
            client.infer("nope", INPUT)
        assert missing.value.code == "NOT_FOUND" and missing.value.reason == "model_not_found"
        assert "nope" in missing.value.message
        # Many connections (the kernel spreads them over both front ends): every one answers health and infers.
        for _ in range(6):
            other = _own_connection(running.address)
            try:
                assert other.health() == "SERVING" and other.ready()
                assert other.infer("busy", INPUT)["OUTPUT0"].tolist() == [1.0] * 4
            finally:
                other.close()
    assert not any(_alive(pid) for pid in pids), "a front end outlived the server"


def test_a_killed_front_end_fails_only_its_own_call_and_is_replaced(repository, caplog):
    controls = FixtureControls()
    execute = controls.gate("busy", "execute").hold()
    with serve(repository, backends={"fixture": FixtureBackend(controls)}, frontends=2, parallel_jobs=2) as running:
        server = running.server
        calls = []  # (client, thread, box): one held call per new connection until both front ends hold one
        deadline = time.monotonic() + WAIT
        while sum(1 for count in _calls_per_frontend(server).values() if count) < 2:
            assert time.monotonic() < deadline, "the kernel never spread the connections over both front ends"
            client = _own_connection(running.address)
            before = sum(_calls_per_frontend(server).values())
            thread, box = in_background(lambda client=client: client.infer("busy", INPUT, timeout=60))
            calls.append((client, thread, box))
            _wait(lambda before=before: sum(_calls_per_frontend(server).values()) > before, "the call to arrive")
            if len(calls) == 2 and sum(1 for count in _calls_per_frontend(server).values() if count) < 2:
                # both on one front end (a full model would queue more): release them and try new connections
                execute.release()
                for _, started, _ in calls:
                    started.join(WAIT)
                calls.clear()
                execute.hold()
        execute.wait_blocked(2)
        per_frontend = _calls_per_frontend(server)
        assert per_frontend == {0: 1, 1: 1}
        old_pids = server.frontend_pids()
        victim = old_pids[0]
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: execute.blocked == 1, "the killed front end's call to be cancelled in the admission process")
        _wait(lambda: len(server.frontend_pids()) == 2 and victim not in server.frontend_pids(), "a replacement")
        assert server.frontend_pids()[1] == old_pids[1]  # the other front end was not touched
        execute.release()
        outcomes = []
        for client, thread, box in calls:
            thread.join(WAIT)
            outcomes.append(box[0])
            client.close()
        failed = [outcome for outcome in outcomes if isinstance(outcome, ClientError)]
        succeeded = [outcome for outcome in outcomes if isinstance(outcome, dict)]
        assert len(failed) == 1 and failed[0].code in ("UNAVAILABLE", "CANCELLED", "INTERNAL")
        assert len(succeeded) == 1
        # The slot of the cancelled call went back: both slots serve again, through the new front end too.
        for _ in range(4):
            assert running.client.infer("busy", INPUT, timeout=10)["OUTPUT0"].tolist() == [1.0] * 4
        _wait(lambda: server.calls.active == 0, "no call left")
    assert any("frontend_replaced" == getattr(record, "event", None) for record in caplog.records)


def test_a_queued_request_whose_deadline_passed_in_the_front_end_never_takes_the_slot(repository):
    controls = FixtureControls()
    execute = controls.gate("one", "execute").hold()
    with serve(repository, backends={"fixture": FixtureBackend(controls)}, frontends=2, parallel_jobs=1) as running:
        holder, box = in_background(lambda: running.client.infer("one", INPUT, timeout=60))
        execute.wait_blocked(1)
        with pytest.raises(ClientError) as late:
            running.client.infer("one", INPUT, timeout=0.5)
        # The client's deadline and the admission's (the same instant, carried across the link) race: either
        # ends it, and neither lets it run.
        assert late.value.code == "DEADLINE_EXCEEDED" or late.value.reason == "server_busy"
        _wait(lambda: running.management.get("one").queued_requests == 0, "the timed-out request to leave the queue")
        execute.release()
        holder.join(WAIT)
        assert isinstance(box[0], dict)
        assert execute.arrivals == 1  # the request that timed out never ran


def test_health_says_not_serving_from_the_front_ends_once_the_shutdown_begins(repository):
    controls = FixtureControls()
    execute = controls.gate("busy", "execute").hold()
    with serve(repository, backends={"fixture": FixtureBackend(controls)}, frontends=2, drain_seconds=0.0) as running:
        channel = grpc.insecure_channel(running.address)
        stub = health_pb2_grpc.HealthStub(channel)
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        in_flight, box = in_background(lambda: running.client.infer("busy", INPUT, timeout=60))
        execute.wait_blocked(1)
        pids = running.server.frontend_pids()
        stopping = threading.Thread(target=running.server.stop, kwargs={"grace": 30.0}, daemon=True)
        stopping.start()
        _wait(lambda: not running.server.state.ready, "the shutdown to begin")
        execute.release()  # the call in flight drains and is answered through its front end
        in_flight.join(WAIT)
        assert isinstance(box[0], dict)
        stopping.join(WAIT)
        assert not stopping.is_alive()
        channel.close()
    _wait(lambda: not any(_alive(pid) for pid in pids), "the front ends to exit")


def test_tokens_and_mutual_tls_hold_through_the_front_ends(repository, tmp_path):
    from tests.integration._certs import make_pki

    pki = make_pki(tmp_path / "pki")
    with serve(
        repository,
        backends={"fixture": FixtureBackend(FixtureControls())},
        frontends=2,
        inference_token="inference-secret",
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        tls_client_ca=pki.ca.cert,
        tls_ca=pki.ca.cert,
        tls_client_cert=pki.client.cert,
        tls_client_key=pki.client.key,
    ) as running:
        assert running.client.infer("busy", INPUT)["OUTPUT0"].tolist() == [1.0] * 4
        options = dict(running.client_options, token="wrong")
        with InferenceClient(running.address, **options) as wrong:
            with pytest.raises(ClientError) as refused:
                wrong.infer("busy", INPUT)
            assert refused.value.code == "UNAUTHENTICATED"
            assert wrong.live()  # the probes stay open
        plaintext = InferenceClient(running.address, token="inference-secret")
        try:
            with pytest.raises(ClientError) as no_tls:
                plaintext.infer("busy", INPUT, timeout=5)
            assert no_tls.value.code == "UNAVAILABLE"
        finally:
            plaintext.close()


def _frontend_pids_of(pid: int) -> list[int]:
    """The front-end processes a `python -m service` process started (its children running service.frontends)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        if parent == pid and b"service.frontends" in command:
            found.append(int(entry))
    return found


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_no_front_end_outlives_the_server_process(repository, stop):
    from tests.shutdown.harness import ServerProcess

    server = ServerProcess(repository, "--frontends", "2", "--shutdown-grace", "2")
    try:
        assert server.client.infer("busy", INPUT)["OUTPUT0"].tolist() == [1.0] * 4
        pids = _frontend_pids_of(server.process.pid)
        assert len(pids) == 2
        server.signal(stop)
        code = server.wait_exit()
        assert code == (0 if stop == signal.SIGTERM else -signal.SIGKILL)
        # SIGKILL: nobody told them; each sees its link end (or its parent change) and exits.
        _wait(lambda: not any(_alive(pid) for pid in pids), "the front ends to exit")
    finally:
        server.close()


def test_every_front_end_says_not_serving_until_the_startup_loads_end(repository):
    """The front ends listen before the startup loads (ServerLive answers), and answer health NOT_SERVING and
    ServerReady false from the admission process's readiness until the loads have ended."""
    from service.process.options import ServerOptions
    from service.process.server import Server

    controls = FixtureControls()
    load = controls.gate("busy", "load").hold()
    server = Server(
        ServerOptions(
            model_repository=repository,
            port=0,
            frontends=2,
            enable_test_backends=True,
            extra_backends={"fixture": FixtureBackend(controls)},
        )
    )
    starting = threading.Thread(target=server.start, daemon=True)
    starting.start()
    try:
        load.wait_blocked(1, timeout=WAIT)  # the front ends listen by now (they start before the loads)
        assert server.port is not None and len(server.frontend_pids()) == 2
        for _ in range(4):  # connections of their own: both front ends are asked
            client = _own_connection(f"127.0.0.1:{server.port}")
            try:
                assert client.live()
                assert client.health() == "NOT_SERVING" and not client.ready()
            finally:
                client.close()
        load.release()
        starting.join(WAIT)
        assert not starting.is_alive()
        for _ in range(4):
            client = _own_connection(f"127.0.0.1:{server.port}")
            try:
                _wait(lambda client=client: client.health() == "SERVING", "health SERVING from this front end")
                assert client.ready()
            finally:
                client.close()
    finally:
        load.release()
        starting.join(WAIT)
        server.stop(grace=5.0)
