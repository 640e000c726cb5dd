"""A python model whose `initialize` hangs holds only its own model (issue 33, item 6): not the management
threads, not other models' cold loads, not the server's listening socket; unloading it cancels its load.

Every hung model here is tests/lifecycle_models.py's gated model with its `initialize` gate held: it waits for a
file the test writes, so nothing is ordered by sleeping. Every test releases its gates at the end (a failing test
leaves no worker waiting)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from client import ClientError, InferenceClient
from service.core import residency
from service.options import ServerOptions
from service.server import Server
from tests.lifecycle_models import WAIT, Gates, is_alive, wait_until, write_gated_model

X = {"X": np.arange(3, dtype=np.float32)}


def gated_repository(tmp_path, names, hold=()) -> dict[str, Gates]:
    """Write a gated model per name under tmp_path/models; hold `initialize` of those in `hold`."""
    gates = {}
    for name in names:
        gates[name] = Gates(tmp_path / "gates" / name)
        write_gated_model(tmp_path / "models", name, gates[name].folder)
    for name in hold:
        gates[name].hold("initialize")
    return gates


def deadline_exceeded(call, *args, **kwargs) -> ClientError:
    with pytest.raises(ClientError) as failed:
        call(*args, **kwargs)
    assert failed.value.code == "DEADLINE_EXCEEDED", failed.value
    return failed.value


def test_hung_loads_whose_clients_gave_up_hold_no_management_thread(slotserve, tmp_path, monkeypatch):
    monkeypatch.setattr(residency, "COLD_LOAD_TURN_SECONDS", 0.5, raising=False)  # each load starts soon
    hung = ["h1", "h2", "h3", "h4"]  # as many as the management handlers (4 by default)
    gates = gated_repository(tmp_path, [*hung, "good"], hold=hung)
    try:
        running = slotserve(tmp_path / "models", model_control_mode="explicit", allow_management=True)
        for name in hung:
            deadline_exceeded(running.client.load, name, timeout=1.0)
        for name in hung:
            gates[name].wait_arrivals("initialize", 1)  # every load goes on: its worker is in initialize
        # Each handler returned when its client's deadline passed; the loads go on without them.
        wait_until(lambda: running.server.calls.management_active == 0, "the management handlers returned")
        started = time.monotonic()
        running.client.load("good", timeout=WAIT)  # a later load is not refused as server_busy
        assert running.client.model_ready("good") and time.monotonic() - started < WAIT
        assert running.management.get("good").loaded
        states = {model.name: model.state for model in running.client.repository_index()}
        assert {name: states[name] for name in hung} == dict.fromkeys(hung, "LOADING")  # the outcome shows here
        assert not any(running.client.model_ready(name) for name in hung)
        gates["h2"].release("initialize")  # a load whose client left still completes, and is published
        wait_until(lambda: running.client.model_ready("h2"), "h2's load, left by its client, completes")
        assert running.client.infer("h2", X, timeout=WAIT)["Y"].tolist() == [0.0, 1.0, 2.0]
    finally:
        for gate in gates.values():
            gate.release_all()


def test_unloading_a_model_whose_initialize_hangs_cancels_its_load_and_kills_its_worker(slotserve, tmp_path):
    gates = gated_repository(tmp_path, ["hung"], hold=["hung"])
    try:
        running = slotserve(tmp_path / "models", model_control_mode="explicit", allow_management=True)
        deadline_exceeded(running.client.load, "hung", timeout=1.0)
        (worker,) = gates["hung"].wait_arrivals("initialize", 1)
        started = time.monotonic()
        running.client.unload("hung", timeout=WAIT)  # not queued behind the load it cancels
        unload_seconds = time.monotonic() - started
        assert not is_alive(worker), "the unload left the hung worker running"
        (model,) = running.client.repository_index()
        assert (model.name, model.state) == ("hung", "UNAVAILABLE") and "unloaded" in model.reason, model
        assert not running.client.model_ready("hung")
        status = running.management.get("hung")
        assert (status.loaded, status.state) == (False, "UNLOADED") and "unloaded" in status.last_error, status
        print(f"\nunload of a model hung in initialize: {unload_seconds:.2f} s")
        # Nothing is stuck: once its initialize no longer hangs, it loads again, with a new worker.
        gates["hung"].release("initialize")
        running.client.load("hung", timeout=WAIT)
        assert running.client.infer("hung", X, timeout=WAIT)["Y"].tolist() == [0.0, 1.0, 2.0]
    finally:
        gates["hung"].release_all()


def test_unloading_a_model_a_request_is_loading_stops_the_load_and_the_request_is_told(slotserve, tmp_path):
    gates = gated_repository(tmp_path, ["hung"], hold=["hung"])
    try:
        running = slotserve(tmp_path / "models", load_at_startup=False, allow_management=True)  # lazy mode
        request = _InThread(lambda: running.client.infer("hung", X, timeout=WAIT))
        (worker,) = gates["hung"].wait_arrivals("initialize", 1)  # the request's load is in initialize
        running.client.unload("hung", timeout=WAIT)
        error = request.error()
        assert isinstance(error, ClientError) and "unloaded while it loaded" in error.message, error
        assert error.code != "DEADLINE_EXCEEDED" and not is_alive(worker)
        assert not running.client.model_ready("hung")
    finally:
        gates["hung"].release_all()


def test_a_registration_whose_load_hangs_returns_at_its_clients_deadline(slotserve, tmp_path):
    gates = gated_repository(tmp_path, ["hung"], hold=["hung"])
    try:
        running = slotserve(tmp_path / "models", load_at_startup=False, allow_management=True)
        deadline_exceeded(running.management.register, "hung", timeout=1.0)
        gates["hung"].wait_arrivals("initialize", 1)
        wait_until(lambda: running.server.calls.management_active == 0, "RegisterModel's handler returned")
        assert running.management.get("hung").state == "LOADING"
    finally:
        gates["hung"].release_all()


def test_the_shutdown_stops_a_hung_load_and_kills_its_worker(tmp_path):
    from service.testing import serve

    gates = gated_repository(tmp_path, ["hung"], hold=["hung"])
    try:
        with serve(tmp_path / "models", model_control_mode="explicit", allow_management=True, stop_grace=1.0) as run:
            deadline_exceeded(run.client.load, "hung", timeout=1.0)
            (worker,) = gates["hung"].wait_arrivals("initialize", 1)
            server = run.server
        assert server.report is not None and server.report.abandoned_calls == 0, server.report
        assert not is_alive(worker), "the shutdown left a worker hung in initialize"
    finally:
        gates["hung"].release_all()


class _InThread:
    def __init__(self, call) -> None:
        self._outcome: list = []
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call) -> None:
        try:
            self._outcome.append(call())
        except BaseException as error:  # the test inspects it
            self._outcome.append(error)

    def error(self, timeout: float = WAIT) -> BaseException:
        self._thread.join(timeout)
        assert self._outcome and isinstance(self._outcome[0], BaseException), self._outcome
        return self._outcome[0]


def test_a_request_to_a_hung_model_does_not_hold_other_models_cold_loads(slotserve, tmp_path, monkeypatch):
    # A cold load keeps its turn of the guard (--max-concurrent-loads 1 here) for COLD_LOAD_TURN_SECONDS at most.
    monkeypatch.setattr(residency, "COLD_LOAD_TURN_SECONDS", 0.5, raising=False)
    gates = gated_repository(tmp_path, ["hung", "good"], hold=["hung"])
    try:
        running = slotserve(tmp_path / "models", load_at_startup=False)  # lazy mode: requests load models
        deadline_exceeded(running.client.infer, "hung", X, timeout=1.0)
        gates["hung"].wait_arrivals("initialize", 1)  # its load holds (held) the guard's one place
        started = time.monotonic()
        assert running.client.infer("good", X, timeout=20.0)["Y"].tolist() == [0.0, 1.0, 2.0]
        print(f"\ncold load beside a hung one: {time.monotonic() - started:.2f} s")
        assert not running.client.model_ready("hung") and running.client.model_ready("good")
    finally:
        for gate in gates.values():
            gate.release_all()


def test_the_server_listens_while_a_startup_load_hangs_and_is_ready_once_it_ends(tmp_path):
    gates = gated_repository(tmp_path, ["a_good", "b_hung"], hold=["b_hung"])
    server = Server(ServerOptions(model_repository=tmp_path / "models", host="127.0.0.1", port=0))  # lazy mode
    outcome: list = []
    starter = threading.Thread(target=lambda: outcome.append(server.start()), name="starter", daemon=True)
    starter.start()
    client = None
    try:
        gates["b_hung"].wait_arrivals("initialize", 1)
        wait_until(lambda: server.port is not None, "the server listens during its startup loads")
        client = InferenceClient(f"127.0.0.1:{server.port}")
        wait_until(lambda: _answers(client), "ServerLive answers")
        assert client.live() and not client.ready() and client.health() == "NOT_SERVING"
        states = {model.name: model.state for model in client.repository_index()}
        assert states == {"a_good": "READY", "b_hung": "LOADING"}
        assert client.model_ready("a_good") and not client.model_ready("b_hung")
        assert client.infer("a_good", X, timeout=WAIT)["Y"].tolist() == [0.0, 1.0, 2.0]
        gates["b_hung"].release("initialize")
        starter.join(WAIT)
        assert outcome == [server.port] and client.ready() and client.health() == "SERVING"
        assert client.model_ready("b_hung")
    finally:
        gates["b_hung"].release_all()
        starter.join(WAIT)
        if client is not None:
            client.close()
        server.stop(grace=5.0)


def _answers(client: InferenceClient) -> bool:
    try:
        return client.live(timeout=2.0)
    except ClientError:
        return False
