"""Ensembles on a real server (in-process, slotserve's own client): ONNX and python steps checked against
numpy, independent steps running at the same time (the fixture's gates show it), a failing step named in the
error, cancellation reaching the steps, a step model unloaded and loaded again, statistics of the ensemble and
of its steps. service/ensemble.py is the implementation; tests/unit/engine/config/test_ensemble_graph.py checks
the graph."""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from client import ClientError
from demo.build_repository import BuiltModel, Tensor, _graph, _serialize
from demo.build_repository import write_model as write_onnx_model
from engine.errors import ExecutionError
from engine.testing.fixture import FixtureBackend
from service.testing import serve

from .._support import write_fixture_model


def ensemble_config(name: str, inputs, outputs, steps, max_batch_size: int = 0) -> str:
    """config.pbtxt of an ensemble: tensors are (name, TYPE_*, dims); steps (model, input_map, output_map)."""
    text = f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
    for kind, tensors in (("input", inputs), ("output", outputs)):
        for tensor, config_type, dims in tensors:
            text += f'{kind} {{ name: "{tensor}" data_type: {config_type} dims: {list(dims)} }}\n'
    blocks = []
    for model, input_map, output_map in steps:
        maps = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in input_map.items())
        maps += " " + " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in output_map.items())
        blocks.append(f'{{ model_name: "{model}" model_version: -1 {maps} }}')
    return text + "ensemble_scheduling { step [ " + ", ".join(blocks) + " ] }\n"


def write_ensemble(root: Path, name: str, *args, **kwargs) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(ensemble_config(name, *args, **kwargs))


def onnx_unary(name: str, op: str, constant: float) -> BuiltModel:
    """Y = X <op> constant, FP32 [-1], no batch dimension."""
    inputs, outputs = (Tensor("X", TensorProto.FLOAT, (-1,)),), (Tensor("Y", TensorProto.FLOAT, (-1,)),)
    weight = helper.make_tensor("c", TensorProto.FLOAT, [1], [constant])
    graph = _graph(name, [helper.make_node(op, ["X", "c"], ["Y"])], inputs, outputs, 0, [weight])
    return BuiltModel(name, 0, inputs, outputs, _serialize(graph))


PYTHON_SQUARE = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x * x).astype(np.float32))]))
        return out
"""

FLOAT_IO = """
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

F = "TYPE_FP32"


def write_python_model(root: Path, name: str, body: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n' + FLOAT_IO)
    (root / name / "1" / "model.py").write_text(textwrap.dedent(body))


def test_an_ensemble_of_onnx_and_python_steps_matches_numpy(tmp_path):
    write_onnx_model(tmp_path, onnx_unary("add3", "Add", 3.0))
    write_onnx_model(tmp_path, onnx_unary("mul2", "Mul", 2.0))
    write_python_model(tmp_path, "square", PYTHON_SQUARE)
    # X -> add3 -> a -> square -> b -> mul2 -> Y, and a is also an output
    write_ensemble(
        tmp_path,
        "pipeline",
        [("X", F, [-1])],
        [("Y", F, [-1]), ("A", F, [-1])],
        [
            ("add3", {"X": "X"}, {"Y": "A"}),
            ("square", {"X": "A"}, {"Y": "b"}),
            ("mul2", {"X": "b"}, {"Y": "Y"}),
        ],
    )
    with serve(tmp_path) as running:
        x = np.arange(-3, 5, dtype=np.float32)
        outputs = running.client.infer("pipeline", {"X": x})
        np.testing.assert_allclose(outputs["Y"], ((x + 3) ** 2) * 2)
        np.testing.assert_allclose(outputs["A"], x + 3)
        only = running.client.infer("pipeline", {"X": x}, outputs=["Y"])
        assert list(only) == ["Y"]
        metadata = running.client.model_metadata("pipeline")
        assert metadata.platform == "ensemble"
        assert [t.name for t in metadata.inputs] == ["X"] and [t.name for t in metadata.outputs] == ["Y", "A"]
        # every step went through its own model's path: each counted two successes, as did the ensemble
        stats = {s.name: s for s in running.client.statistics()}
        for name in ("pipeline", "add3", "square", "mul2"):
            assert stats[name].inference_stats.success.count == 2, name
        index = {m.name: m.state for m in running.client.repository_index()}
        assert index == {"pipeline": "READY", "add3": "READY", "square": "READY", "mul2": "READY"}


def fixture_repository(root: Path, *names: str, parameters: str = "") -> None:
    for name in names:
        write_fixture_model(
            root, name, inputs=[("INPUT0", "FP32", [-1])], outputs=[("OUTPUT0", "FP32", [-1])], extra=parameters
        )


DIAMOND = [
    ("left", {"INPUT0": "X"}, {"OUTPUT0": "l"}),
    ("right", {"INPUT0": "X"}, {"OUTPUT0": "r"}),
    ("join_l", {"INPUT0": "l"}, {"OUTPUT0": "L"}),
    ("join_r", {"INPUT0": "r"}, {"OUTPUT0": "R"}),
]


def write_diamond(root: Path) -> None:
    fixture_repository(root, "left", "right", "join_l", "join_r")
    write_ensemble(root, "diamond", [("X", F, [-1])], [("L", F, [-1]), ("R", F, [-1])], DIAMOND)


def start_fixture_server(root: Path, controls, **options):
    return serve(root, backends={"fixture": FixtureBackend(controls)}, **options)


def test_independent_steps_run_at_the_same_time(tmp_path, controls):
    write_diamond(tmp_path)
    with start_fixture_server(tmp_path, controls) as running:
        left, right = controls.gate("left", "execute").hold(), controls.gate("right", "execute").hold()
        result: dict = {}
        call = threading.Thread(target=lambda: result.update(running.client.infer("diamond", {"X": np.ones(3, "f")})))
        call.start()
        # both independent steps are inside their runs at once: neither waited for the other
        left.wait_arrivals(1, timeout=30)
        right.wait_arrivals(1, timeout=30)
        # nothing downstream started before its input existed
        assert controls.gate("join_l", "prepare").arrivals == 0 and controls.gate("join_r", "prepare").arrivals == 0
        left.release()
        right.release()
        call.join(timeout=30)
        assert not call.is_alive()
        np.testing.assert_array_equal(result["L"], np.ones(3, "f"))
        np.testing.assert_array_equal(result["R"], np.ones(3, "f"))


def test_a_failing_step_is_named_with_its_model_and_the_others_are_cancelled(tmp_path, controls):
    write_diamond(tmp_path)
    with start_fixture_server(tmp_path, controls) as running:
        right = controls.gate("right", "execute").hold()
        controls.gate("left", "execute").fail_next(ExecutionError("left broke"))
        with pytest.raises(ClientError) as failed:
            running.client.infer("diamond", {"X": np.ones(3, "f")}, timeout=60)
        assert failed.value.code == "INTERNAL"  # the step's own message stays in the log, as for a direct call
        assert "ensemble 'diamond': step 0 (model 'left') failed" in failed.value.message
        right.release()
        # the ensemble and its other steps keep serving
        outputs = running.client.infer("diamond", {"X": np.full(2, 5, "f")})
        np.testing.assert_array_equal(outputs["L"], np.full(2, 5, "f"))
        stats = {s.name: s for s in running.client.statistics()}
        assert stats["diamond"].inference_stats.fail.count == 1
        assert stats["left"].inference_stats.fail.count == 1


def test_bad_input_to_the_ensemble_is_refused_by_name_before_any_step(tmp_path, controls):
    write_diamond(tmp_path)
    with start_fixture_server(tmp_path, controls) as running:
        with pytest.raises(ClientError) as refused:
            running.client.infer("diamond", {"X": np.ones(3, np.int32)})
        assert refused.value.code == "INVALID_ARGUMENT" and "expects FP32" in refused.value.message
        assert controls.gate("left", "prepare").arrivals == 0
        np.testing.assert_array_equal(running.client.infer("diamond", {"X": np.ones(1, "f")})["R"], [1])


def test_the_clients_deadline_cancels_the_running_and_queued_steps(tmp_path, controls):
    write_diamond(tmp_path)
    with start_fixture_server(tmp_path, controls) as running:
        left = controls.gate("left", "execute").hold()
        with pytest.raises(ClientError) as late:
            running.client.infer("diamond", {"X": np.ones(3, "f")}, timeout=1.0)
        assert late.value.code == "DEADLINE_EXCEEDED"
        left.wait_arrivals(1, timeout=30)

        def step_failed() -> bool:
            stats = {s.name: s for s in running.client.statistics()}
            return stats["left"].inference_stats.fail.count == 1 and stats["diamond"].inference_stats.fail.count == 1

        # the held step was cancelled with the ensemble's call (the fixture stops waiting at a held execute)
        wait_until(step_failed)
        left.release()
        np.testing.assert_array_equal(running.client.infer("diamond", {"X": np.ones(1, "f")})["L"], [1])


def wait_until(condition, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)  # ordering-free: polls the condition until a deadline


def test_a_step_model_unloaded_makes_the_ensemble_unavailable_and_a_reload_brings_it_back(tmp_path, controls):
    write_diamond(tmp_path)
    options = {"model_control_mode": "explicit", "load_models": ("*",), "allow_management": True}
    with start_fixture_server(tmp_path, controls, **options) as running:
        np.testing.assert_array_equal(running.client.infer("diamond", {"X": np.ones(1, "f")})["L"], [1])
        running.client.unload("join_r")
        # Triton's rule: the ensemble is unloaded with its step
        index = {m.name: m for m in running.client.repository_index()}
        assert (index["diamond"].state, index["join_r"].state, index["left"].state) == ("UNAVAILABLE",) * 2 + ("READY",)
        assert not running.client.model_ready("diamond")
        with pytest.raises(ClientError) as unavailable:
            running.client.infer("diamond", {"X": np.ones(1, "f")})
        assert unavailable.value.code == "UNAVAILABLE" and "model 'diamond' is not loaded" in unavailable.value.message
        running.client.load("join_r")  # loads the ensemble again
        assert running.client.model_ready("diamond")
        np.testing.assert_array_equal(running.client.infer("diamond", {"X": np.ones(1, "f")})["R"], [1])


def test_a_step_model_unloaded_in_lazy_mode_loads_again_with_the_ensembles_next_request(tmp_path, controls):
    write_diamond(tmp_path)
    with start_fixture_server(tmp_path, controls, allow_management=True) as running:
        running.client.unload("join_r")
        assert not running.client.model_ready("diamond")
        np.testing.assert_array_equal(running.client.infer("diamond", {"X": np.ones(1, "f")})["R"], [1])
        assert running.client.model_ready("diamond") and running.client.model_ready("join_r")


def test_an_ensemble_naming_an_unknown_model_is_listed_with_that_reason(tmp_path, controls):
    fixture_repository(tmp_path, "left")
    write_ensemble(
        tmp_path,
        "broken",
        [("X", F, [-1])],
        [("Y", F, [-1])],
        [("left", {"INPUT0": "X"}, {"OUTPUT0": "t"}), ("missing", {"INPUT0": "t"}, {"OUTPUT0": "Y"})],
    )
    with start_fixture_server(tmp_path, controls) as running:
        with pytest.raises(ClientError) as failed:
            running.client.infer("broken", {"X": np.ones(1, "f")})
        assert "step 1 (model 'missing') names a model that is not registered" in failed.value.message
        index = {m.name: m for m in running.client.repository_index()}
        assert index["left"].state == "READY"
        assert "step 1 (model 'missing') names a model that is not registered" in index["broken"].reason


def test_the_ensembles_own_slots_do_not_throttle_its_steps_do(tmp_path, controls):
    # The step model has 4 slots; with --parallel-jobs 2 an ordinary model would have 2. Three ensemble requests
    # at once all reach the step's run: the ensemble's own admission let them all through.
    fixture_repository(tmp_path, "wide", parameters="instance_group [ { count: 4 } ]\n")
    write_ensemble(
        tmp_path, "through", [("X", F, [-1])], [("Y", F, [-1])], [("wide", {"INPUT0": "X"}, {"OUTPUT0": "Y"})]
    )
    with start_fixture_server(tmp_path, controls, parallel_jobs=2) as running:
        gate = controls.gate("wide", "execute").hold()
        results: list = []
        calls = [
            threading.Thread(target=lambda: results.append(running.client.infer("through", {"X": np.ones(2, "f")})))
            for _ in range(3)
        ]
        for call in calls:
            call.start()
        gate.wait_arrivals(3, timeout=30)
        assert running.management.get("through").slots == 1024
        gate.release()
        for call in calls:
            call.join(timeout=30)
        assert len(results) == 3


def test_a_step_refusing_its_input_keeps_its_status_and_names_the_step(tmp_path, controls):
    write_fixture_model(tmp_path, "three", inputs=[("INPUT0", "FP32", [3])], outputs=[("OUTPUT0", "FP32", [3])])
    write_ensemble(
        tmp_path, "loose", [("X", F, [-1])], [("Y", F, [-1])], [("three", {"INPUT0": "X"}, {"OUTPUT0": "Y"})]
    )
    with start_fixture_server(tmp_path, controls) as running:
        with pytest.raises(ClientError) as refused:
            running.client.infer("loose", {"X": np.ones(2, "f")})
        assert refused.value.code == "INVALID_ARGUMENT"
        assert refused.value.message.startswith(
            "ensemble 'loose': step 0 (model 'three'): input 'INPUT0' has shape [2]"
        )
        np.testing.assert_array_equal(running.client.infer("loose", {"X": np.ones(3, "f")})["Y"], [1, 1, 1])
