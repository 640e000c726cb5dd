"""--memory-budget on a real server sees models grow after their load (issue 33, item 12): the memory watch
re-reads every resident model after a lease ends and retires least recently used idle models while the total is
over the budget. Before, each model counted with what it held when it loaded: a 143 MiB budget held python
models that had grown to 616-922 MiB, and nothing was evicted.

The fixture model reports what the test sets (deterministic); the python model grows for real and is measured
by the python backend (`PythonModel.memory_bytes`), so its test needs that backend to report its workers'
current memory (helper pyhard's change: marked below until it lands)."""

from __future__ import annotations

import time

import numpy as np

from engine.testing.fixture import FixtureBackend
from service.testing import serve

from .._support import write_fixture_model
from ..python_models.test_python_models import write_model

WAIT = 20.0


def _wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT} s waiting for {what}")
        time.sleep(0.01)  # ordering-free: re-checks the server's own counters until a deadline


def _fixture(root, name: str, memory: int) -> None:
    write_fixture_model(
        root,
        name,
        inputs=[("INPUT0", "FP32", [-1])],
        outputs=[("OUTPUT0", "FP32", [-1])],
        extra=f'parameters {{ key: "memory_bytes" value {{ string_value: "{memory}" }} }}\n',
    )


def test_a_model_that_grows_past_the_budget_evicts_the_idle_one(tmp_path, controls):
    _fixture(tmp_path, "idle", 40 << 20)
    _fixture(tmp_path, "growing", 40 << 20)
    with serve(tmp_path, backends={"fixture": FixtureBackend(controls)}, memory_budget=143 << 20) as running:
        residency = running.server.residency
        assert residency.resident_names() == ["growing", "idle"] and residency.memory_in_use() == 80 << 20
        running.client.infer("idle", {"INPUT0": np.ones(1, np.float32)})  # idle is used first: the older one
        controls.set_memory("growing", 120 << 20)  # what the next run keeps (a python model's segments, caches)
        running.client.infer("growing", {"INPUT0": np.ones(1, np.float32)})
        _wait_until(lambda: residency.evictions == 1, "the idle model's eviction")
        assert residency.resident_names() == ["growing"] and residency.memory_in_use() == 120 << 20
        assert running.management.get("idle").memory_bytes is None  # shown unloaded
        counts = running.server.runtime.events.counts()
        assert counts.get(("evicted", "idle")) == 1 and ("evicted", "growing") not in counts
        # the evicted model's next request loads it again, and the budget makes room for it the usual way
        again = running.client.infer("idle", {"INPUT0": np.full(1, 3, np.float32)})
        np.testing.assert_array_equal(again["OUTPUT0"], [3])
        assert residency.resident_names() == ["idle"] and residency.evictions == 2


KEEPER = """
class TritonPythonModel:
    def initialize(self, args):
        self.kept = []

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            self.kept.append(np.ones(64 << 20, np.uint8))  # 64 MiB kept for the worker's life, every call
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return out
"""

FLOAT_IO = """
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def test_a_python_model_that_keeps_memory_evicts_the_idle_one(tmp_path):
    write_model(tmp_path, "keeper", KEEPER, FLOAT_IO)
    write_model(tmp_path, "other", KEEPER, FLOAT_IO)
    with serve(tmp_path, memory_budget=300 << 20) as running:
        residency = running.server.residency
        loaded = residency.memory_in_use()
        assert residency.resident_names() == ["keeper", "other"] and loaded < 300 << 20, loaded
        running.client.infer("other", {"X": np.ones(1, np.float32)})
        for _ in range(4):  # 256 MiB kept by keeper's worker
            running.client.infer("keeper", {"X": np.ones(1, np.float32)})
        _wait_until(lambda: residency.evictions >= 1, "an eviction once keeper grew")
        assert residency.resident_names() == ["keeper"]
        assert running.server.runtime.events.counts().get(("evicted", "other")) == 1
