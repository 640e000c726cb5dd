"""An ensemble request's `priority` reaches its steps (as Triton 2.51's ensemble passes it on: asked of Triton in
tests/differential/test_priorities.py): a step on a model with priority levels queues at the ensemble request's
level, ahead of that model's older requests at the default level (docs/ensembles.md, "Priorities"). A real server in
this process; the step model is a python model held by a file gate, the queue watched through the model's status."""

from __future__ import annotations

import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from client import ClientError

# Appends its request's KEY to <gates>/log, then holds while <gates>/hold-<KEY> exists.
ORDERED = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.gates = json.loads(args["model_config"])["parameters"]["gates"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            key = int(pb_utils.get_input_tensor_by_name(request, "KEY").as_numpy().reshape(-1)[0])
            with open(os.path.join(self.gates, "log"), "a") as log:
                log.write(f"{key}\\n")
            deadline = time.monotonic() + 120
            while os.path.exists(os.path.join(self.gates, f"hold-{key}")) and time.monotonic() < deadline:
                time.sleep(0.005)  # ordering-free: polls the test's file gate until a deadline
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([key], np.int32))]))
        return responses
"""

TENSORS = (
    'input [ { name: "KEY" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
)


def write_repository(root: Path, gates: Path) -> Path:
    """`ordered` (one instance, levels 1 and 2, default 2) and `ens`, whose one step calls it."""
    (root / "ordered" / "1").mkdir(parents=True)
    (root / "ordered" / "1" / "model.py").write_text(textwrap.dedent(ORDERED))
    (root / "ordered" / "config.pbtxt").write_text(
        'name: "ordered"\nbackend: "python"\nmax_batch_size: 1\n'
        + TENSORS
        + "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        "dynamic_batching { priority_levels: 2 default_priority_level: 2 }\n"
        f'parameters {{ key: "gates" value {{ string_value: "{gates}" }} }}\n'
    )
    (root / "ens" / "1").mkdir(parents=True)
    (root / "ens" / "config.pbtxt").write_text(
        'name: "ens"\nplatform: "ensemble"\nmax_batch_size: 1\n'
        + TENSORS
        + 'ensemble_scheduling { step [ { model_name: "ordered" model_version: -1 '
        'input_map { key: "KEY" value: "KEY" } output_map { key: "OUT" value: "OUT" } } ] }\n'
    )
    return root


def wait_until(condition, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.02)  # ordering-free: polls an observable state until a deadline


def key(value: int) -> dict[str, np.ndarray]:
    return {"KEY": np.array([[value]], np.int32)}


@pytest.fixture
def gates(tmp_path) -> Path:
    folder = tmp_path / "gates"
    folder.mkdir()
    return folder


def executed(gates: Path) -> list[int]:
    log = gates / "log"
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def test_an_ensemble_requests_priority_orders_its_step_in_the_models_queue(slotserve, tmp_path, gates):
    running = slotserve(write_repository(tmp_path / "repository", gates))

    def queued() -> int:
        return running.server.registry.get("ordered").status().queued_requests

    def call(model: str, value: int, **parameters: object) -> int:
        outputs = running.client.infer(model, key(value), parameters=parameters or None, timeout=120)
        return int(outputs["OUT"].reshape(-1)[0])

    hold = gates / "hold-1"
    hold.touch()
    with ThreadPoolExecutor(3) as pool:
        try:
            first = pool.submit(call, "ordered", 1)
            wait_until(lambda: executed(gates) == [1], "key 1 in execute")
            default = pool.submit(call, "ordered", 10)  # the default level (2)
            wait_until(lambda: queued() == 1, "key 10 queued")
            through_ensemble = pool.submit(call, "ens", 11, priority=1)  # level 1, through the ensemble's step
            wait_until(lambda: queued() == 2, "key 11 queued behind it")
        finally:
            hold.unlink(missing_ok=True)
        assert (first.result(), default.result(), through_ensemble.result()) == (1, 10, 11)
    assert executed(gates) == [1, 11, 10]  # the step ran at the ensemble request's level, before the older call


def test_an_ensemble_request_with_a_bad_priority_is_refused_by_name_and_runs_no_step(slotserve, tmp_path, gates):
    running = slotserve(write_repository(tmp_path / "repository", gates))
    with pytest.raises(ClientError) as refused:
        running.client.infer("ens", key(5), parameters={"priority": -1}, timeout=120)
    assert refused.value.code == "INVALID_ARGUMENT"
    assert "invalid value for 'priority', expected value >= 0." in refused.value.message
    assert executed(gates) == []
    assert int(running.client.infer("ens", key(6), timeout=120)["OUT"].reshape(-1)[0]) == 6
