"""L0_model_update (instance_update_test.py), rewritten for CPU instances: in explicit mode, config.pbtxt's
instance count is changed and the model loaded again; the model counts its `initialize` and `finalize` calls in
files, so the test sees exactly which instances were created and which removed, while other requests keep running.
A changed model.py or a change outside `instance_group` re-creates every instance; an invalid config is refused
and the old instances serve on; the configuration ModelConfig returns is accepted back by a load; an update does
not wait for running inference, and inference does not wait for an update's new instance to initialize. The QA's
timed waits are gates here (files the model waits for). Its GPU and rate-limiter cases are left out.
"""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import concurrent.futures
import json
import threading
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import json_format

from .harness import Model, python_model, wait_for

NAME = "model_init_del"

# Counts initialize/finalize in counts/ beside the repository (a file changed inside the model's folder would make
# Triton re-create every instance); with a "hold_infer" (or "hold_initialize") file there, an execute (an
# initialize) writes "infer_waiting" ("initialize_waiting") and waits for "release" (60 s at most).
MODEL = """
    import fcntl
    import os
    import time

    import triton_python_backend_utils as pb_utils


    def _bump(folder, kind):
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, kind)
        with open(path, "a+") as handle:
            fcntl.lockf(handle, fcntl.LOCK_EX)
            handle.seek(0)
            count = int(handle.read() or 0) + 1
            handle.seek(0)
            handle.truncate()
            handle.write(str(count))


    def _hold(folder, kind):
        if os.path.exists(os.path.join(folder, "hold_" + kind)):
            open(os.path.join(folder, kind + "_waiting"), "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(folder, "release")) and time.monotonic() < deadline:
                time.sleep(0.02)  # ordering-free: polls the test's release file until a deadline


    class TritonPythonModel:
        def initialize(self, args):
            self.folder = os.path.join(os.path.dirname(os.path.dirname(args["model_repository"])), "counts")
            _bump(self.folder, "initialize")
            _hold(self.folder, "initialize")

        def execute(self, requests):
            responses = [
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests
            ]
            _hold(self.folder, "infer")
            return responses

        def finalize(self):
            _bump(self.folder, "finalize")
"""


def config(instances: str, batching: bool = False, sequence: str = "") -> str:
    batch = 2 if batching else 0
    sequence_batching = f"sequence_batching {{ {sequence} }}" if sequence else ""
    return f"""backend: "python"
max_batch_size: {batch}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {instances} ]
{sequence_batching}
"""


def cpu(count: int) -> str:
    return f"{{ count: {count} kind: KIND_CPU }}"


MODELS: dict[str, Model] = {}  # each case writes its own model (launch)
EXPLICIT = {"triton_args": ("--model-control-mode=explicit",), "model_control_mode": "explicit", "parallel_jobs": 1}


class Updates:
    """The model's folder on one server, and the QA's helpers over it."""

    def __init__(self, server) -> None:
        self.server = server
        self.folder = Path(server.repository) / NAME
        self.counts = Path(server.repository).parent / "counts"
        self.batching = False

    def count(self, kind: str) -> int:
        path = self.counts / kind
        return int(path.read_text() or 0) if path.exists() else 0

    def write(self, instances: str, batching: bool | None = None, sequence: str = "") -> None:
        if batching is not None:
            self.batching = batching
        (self.folder / "config.pbtxt").write_text(config(instances, self.batching, sequence))

    def infer(self, timeout: float = 60) -> None:
        shape = [2, 4] if self.batching else [4]
        answer = self.server.infer(NAME, {"INPUT0": np.ones(shape, np.float32)}, timeout=timeout)
        assert answer.ok, answer

    def load(self, instances: str, initialized: int, finalized: int, *, poll_finalize: bool = False, **kw) -> None:
        """Write the instance group, load, and check the counts (finalize may lag: `poll_finalize`)."""
        self.write(instances, **kw)
        assert self.server.load(NAME) == ("OK", "")
        assert self.count("initialize") == initialized
        if poll_finalize:
            wait_for(lambda: self.count("finalize") >= finalized, f"{finalized} finalize calls", seconds=30)
        assert self.count("finalize") == finalized
        self.infer()

    def unload(self) -> None:
        created = self.count("initialize")
        assert self.server.unload(NAME) == ("OK", "")
        wait_for(lambda: self.count("finalize") >= created, "every instance finalized", seconds=30)
        assert self.count("initialize") == created and self.count("finalize") == created
        assert not self.server.infer(NAME, {"INPUT0": np.ones([2, 4] if self.batching else [4], np.float32)}).ok

    def background(self, threads: int = 4):
        """Inference that keeps running until the returned stop() is called; stop() raises what a request got."""
        stop = threading.Event()
        pool = concurrent.futures.ThreadPoolExecutor(threads)

        def repeat() -> None:
            while not stop.is_set():
                self.infer()

        futures = [pool.submit(repeat) for _ in range(threads)]

        def stopper() -> None:
            stop.set()
            for future in futures:
                future.result(120)
            pool.shutdown()

        return stopper


@pytest.fixture
def updates(launch) -> Updates:
    # (harness.write_repository compiles model.py first: a __pycache__ appearing after the first load would be a
    # changed model to Triton, which then re-creates every instance.)
    return Updates(launch({NAME: python_model(config(cpu(1)), MODEL)}, **EXPLICIT))


def _add_rm_add(updates, start: int, steps, batching: bool) -> None:
    updates.load(cpu(start), start, 0, batching=batching)
    stop = updates.background()
    try:
        live, created, removed = start, start, 0
        for change in steps:
            live += change
            created += max(change, 0)
            removed += max(-change, 0)
            updates.load(cpu(live), created, removed, poll_finalize=True)
    finally:
        stop()
    updates.unload()


def test_add_rm_add_instance_no_batching(updates):
    _add_rm_add(updates, 3, [1, -1, 1], batching=False)


def test_add_rm_add_instance_with_batching(updates):
    _add_rm_add(updates, 4, [1, -1, 1], batching=True)


def test_rm_add_rm_instance_no_batching(updates):
    _add_rm_add(updates, 2, [-1, 1, -1], batching=False)


def test_rm_add_rm_instance_with_batching(updates):
    _add_rm_add(updates, 3, [-1, 1, -1], batching=True)


def test_rm_instance_to_zero(updates):
    """count 0 means 1: nothing is created or removed."""
    updates.load(cpu(1), 1, 0)
    updates.load(cpu(0), 1, 0)
    updates.unload()


def test_cpu_instance_update(updates):
    updates.load(cpu(8), 8, 0)
    updates.load(cpu(4), 8, 4, poll_finalize=True)
    updates.load(cpu(1), 8, 7, poll_finalize=True)
    updates.load(cpu(1), 8, 7)
    updates.load(cpu(3), 10, 7)
    updates.load(cpu(8), 15, 7)
    updates.unload()


def test_invalid_config(updates):
    """An unreadable instance group: the load fails, the model serves on with its old instances."""
    updates.load(cpu(8), 8, 0)
    updates.write("--- invalid config ---")
    assert updates.server.load(NAME)[0] != "OK"
    updates.infer()
    updates.load(cpu(4), 8, 4, poll_finalize=True)
    updates.unload()


def test_model_file_update(updates):
    """model.py changed: every instance is created again (6 new, the 5 old finalized)."""
    updates.load(cpu(5), 5, 0)
    with (updates.folder / "1" / "model.py").open("a") as handle:
        handle.write("\n# changed\n")
    updates.load(cpu(6), 11, 5, poll_finalize=True)
    updates.unload()


def test_non_instance_config_update(updates):
    """max_batch_size changed: every instance is created again."""
    updates.load(cpu(4), 4, 0, batching=False)
    updates.load(cpu(2), 6, 4, poll_finalize=True, batching=True)
    updates.unload()


def test_load_api_with_config(updates):
    """The configuration ModelConfig returns, with one more instance, given back to a load."""
    updates.load(cpu(1), 1, 0)
    given = json_format.MessageToDict(updates.server.config(NAME), preserving_proto_field_name=True)
    assert len(given["instance_group"]) == 1 and int(given["instance_group"][0]["count"]) == 1
    given["instance_group"][0]["count"] = 2
    assert updates.server.load(NAME, config=json.dumps(given)) == ("OK", "")
    assert (updates.count("initialize"), updates.count("finalize")) == (2, 0)
    updates.infer()
    updates.unload()


def _release(updates) -> None:
    (updates.counts / "release").write_text("go")


def test_update_while_inferencing(updates):
    """Adding an instance does not wait for a request running on the old one."""
    updates.load(cpu(1), 1, 0)
    counts = updates.counts
    (counts / "hold_infer").write_text("hold")
    updates.write(cpu(2))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        running = pool.submit(updates.infer)
        try:
            wait_for((counts / "infer_waiting").exists, "the request is running")
            update = pool.submit(updates.server.load, NAME)
            assert update.result(20) == ("OK", ""), "the update waited for the running request"
            assert not running.done()
        finally:
            _release(updates)
        running.result(60)
    (counts / "hold_infer").unlink()
    (counts / "release").unlink()
    assert (updates.count("initialize"), updates.count("finalize")) == (2, 0)
    updates.infer()
    updates.unload()


def test_infer_while_updating(updates):
    """A request is served by the old instance while the new one initializes."""
    updates.load(cpu(1), 1, 0)
    counts = updates.counts
    (counts / "hold_initialize").write_text("hold")
    updates.write(cpu(2))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        update = pool.submit(updates.server.load, NAME)
        try:
            wait_for((counts / "initialize_waiting").exists, "the new instance is initializing")
            request = pool.submit(updates.infer, 60)
            request.result(20)
            assert not update.done()
        finally:
            _release(updates)
        assert update.result(60) == ("OK", "")
    (counts / "hold_initialize").unlink()
    assert (updates.count("initialize"), updates.count("finalize")) == (2, 0)
    updates.infer()
    updates.unload()


def _sequence(updates, steps) -> None:
    for flags in steps:
        parameters = {"sequence_id": 1, "sequence_start": "start" in flags, "sequence_end": "end" in flags}
        answer = updates.server.infer(NAME, {"INPUT0": np.ones([4], np.float32)}, parameters=parameters)
        assert answer.ok, answer


@pytest.mark.parametrize(
    "scheduler",
    [
        pytest.param("direct { } max_sequence_idle_microseconds: 8000000", id="direct"),
        pytest.param("oldest { max_candidate_sequences: 4 } max_sequence_idle_microseconds: 8000000", id="oldest"),
    ],
)
def test_scheduler_update_no_ongoing_sequences(updates, scheduler):
    """A sequence model's instances added and removed between sequences."""
    updates.write(cpu(2), sequence=scheduler)
    assert updates.server.load(NAME) == ("OK", "")
    assert (updates.count("initialize"), updates.count("finalize")) == (2, 0)
    _sequence(updates, ["start", "", "end"])
    updates.write(cpu(4), sequence=scheduler)
    assert updates.server.load(NAME) == ("OK", "")
    assert (updates.count("initialize"), updates.count("finalize")) == (4, 0)
    _sequence(updates, ["start", "end"])
    updates.write(cpu(3), sequence=scheduler)
    assert updates.server.load(NAME) == ("OK", "")
    wait_for(lambda: updates.count("finalize") >= 1, "one instance finalized", seconds=30)
    assert (updates.count("initialize"), updates.count("finalize")) == (4, 1)
    _sequence(updates, ["start", "end"])
