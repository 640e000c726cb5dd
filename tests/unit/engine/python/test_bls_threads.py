"""The threads a python model's BLS calls run on (engine/python/backend.py CallThreads) belong to the model: made
with it, handed to its workers, stopped when it is closed (unloaded), so no thread of an unloaded model is left
behind; a call that comes after the stop is answered with an error, not run."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from engine.config.repository import ModelRepository
from engine.interface import CancelToken, ModelCalls
from engine.python.backend import CallThreads, PythonBackend
from service.request_path.model_calls import DataplaneModelCalls

WAIT = 30.0
MODELS = Path(__file__).resolve().parents[3] / "python_models" / "repository"


def alive_named(name: str) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == name]


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)  # ordering-free: polls an observable state until a deadline


def test_stop_ends_idle_threads_at_once_and_a_busy_one_when_its_call_returns():
    threads = CallThreads("python-bls-stop-test")
    threads.IDLE_SECONDS = 3600.0  # only the stop can end them
    go, release, busy_started = threading.Event(), threading.Event(), threading.Event()
    assert threads.submit(lambda: go.wait(WAIT))  # busy until the second call has its own thread
    assert threads.submit(lambda: (busy_started.set(), release.wait(WAIT)))
    assert busy_started.wait(WAIT)
    go.set()
    wait_until(lambda: len(threads._idle) == 1, "the first thread did not go idle")
    assert len(threads.alive()) == 2

    threads.stop()
    ran = []
    assert not threads.submit(lambda: ran.append(1))  # refused: nothing runs after the stop
    wait_until(lambda: len(threads.alive()) == 1, "the idle thread did not end at the stop")
    release.set()
    wait_until(lambda: threads.alive() == [], "the busy thread did not end after its call")
    assert alive_named("python-bls-stop-test") == [] and ran == []


class _AddSub(ModelCalls):
    """The server's side of BLS calls, for a model alone: add_sub answered here."""

    def infer(self, model, inputs, *, version, outputs, cancel, request=None):
        return {"OUTPUT0": inputs["INPUT0"] + inputs["INPUT1"], "OUTPUT1": inputs["INPUT0"] - inputs["INPUT1"]}

    def infer_stream(self, model, inputs, *, version, outputs, cancel, request=None):
        raise NotImplementedError

    describe = staticmethod(DataplaneModelCalls.describe)


@pytest.fixture
def bls_model(tmp_path):
    shutil.copytree(MODELS / "bls", tmp_path / "bls")
    spec = ModelRepository(tmp_path).read("bls")
    backend = PythonBackend()
    backend.bind_model_calls(_AddSub())
    model = backend.load(spec)
    yield model
    model.close()


def test_an_unloaded_model_leaves_no_bls_thread(bls_model):
    name = "python-bls-bls"
    assert alive_named(name) == []  # none before the first call
    context = bls_model.create_context()
    text = np.array([b"add_sub"], dtype=np.object_)
    arg = np.array([json.dumps({"a": [1], "b": [2]}).encode()], dtype=np.object_)
    outputs = context.execute({"MODE": text, "ARG": arg}, ["TEXT"], CancelToken())
    assert json.loads(outputs["TEXT"][0]) == {"OUTPUT0": [3], "OUTPUT1": [-1]}
    assert len(alive_named(name)) == 1  # the call's thread, idle now, kept for the next call
    context.close()
    bls_model.close()  # the model is unloaded: its contexts closed, then the model
    wait_until(lambda: alive_named(name) == [], "a BLS thread of the unloaded model is still alive")
    assert bls_model.bls_threads.alive() == []
