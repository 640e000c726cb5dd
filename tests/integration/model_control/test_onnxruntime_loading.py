"""The ONNX Runtime backend at load time, through a real server: config.pbtxt is checked against the ONNX model,
and a model's slots share one InferenceSession.

The models are built here with `onnx.helper` into tmp_path (Y = A + B, FP32, batch dimension plus [4]) and
served with `service.testing.serve`. A load that fails must name the tensor and the disagreement, reach the
request that needed the model as FAILED_PRECONDITION `load_failed`, and leave the server serving the other models.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

from client import ClientError
from engine.onnxruntime_backend import OnnxRuntimeBackend
from service.testing import serve

from .._support import client_error

WAIT = 30.0  # seconds: bounds every wait, so a broken server fails the test instead of hanging it
WIDTH = 4
GOOD_INPUTS = [("A", "TYPE_FP32", [WIDTH]), ("B", "TYPE_FP32", [WIDTH])]


def write_add_model(repository: Path, name: str, config_inputs: list[tuple[str, str, list[int]]]) -> Path:
    """`<repository>/<name>/1/model.onnx` computing Y = A + B (FP32 [batch, 4] each) and a config.pbtxt
    (max_batch_size 8) declaring `config_inputs` as (name, config type, dims after the batch dimension) and Y."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["Y"])],
        name,
        [
            helper.make_tensor_value_info("A", TensorProto.FLOAT, ["batch", WIDTH]),
            helper.make_tensor_value_info("B", TensorProto.FLOAT, ["batch", WIDTH]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", WIDTH])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    directory = repository / name
    (directory / "1").mkdir(parents=True)
    (directory / "1" / "model.onnx").write_bytes(model.SerializeToString())
    text = f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
    for tensor, config_type, dims in config_inputs:
        text += f'input {{ name: "{tensor}" data_type: {config_type}{"".join(f" dims: {d}" for d in dims)} }}\n'
    text += f'output {{ name: "Y" data_type: TYPE_FP32 dims: {WIDTH} }}\n'
    (directory / "config.pbtxt").write_text(text)
    return directory


def add_inputs(rows: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "A": rng.standard_normal((rows, WIDTH)).astype(np.float32),
        "B": rng.standard_normal((rows, WIDTH)).astype(np.float32),
    }


# (model name, config inputs, what the message must say) -- each disagrees with the ONNX model in one way.
MISMATCHES = [
    (
        "wrong_datatype",
        [("A", "TYPE_INT32", [WIDTH]), ("B", "TYPE_FP32", [WIDTH])],
        "input 'A' is FP32 in the model, INT32 in the config",
    ),
    (
        "wrong_dims",
        [("A", "TYPE_FP32", [WIDTH]), ("B", "TYPE_FP32", [WIDTH + 1])],
        "input 'B' has dims [4] in the model (after the batch dimension), [5] in the config",
    ),
    ("omits_an_input", [("A", "TYPE_FP32", [WIDTH])], "the model's inputs ['B'] are not in the config"),
    (
        "names_an_absent_input",
        [*GOOD_INPUTS, ("C", "TYPE_FP32", [WIDTH])],
        "input 'C' is not in the model; it has ['A', 'B']",
    ),
]


@pytest.fixture
def mismatched_repository(tmp_path) -> Path:
    root = tmp_path / "repository"
    write_add_model(root, "good", GOOD_INPUTS)
    for name, config_inputs, _ in MISMATCHES:
        write_add_model(root, name, config_inputs)
    return root


@pytest.mark.parametrize("name, _config_inputs, problem", MISMATCHES, ids=[m[0] for m in MISMATCHES])
def test_a_config_that_disagrees_with_the_onnx_model_fails_its_load_by_name_and_others_keep_serving(
    mismatched_repository, name, _config_inputs, problem
):
    with serve(mismatched_repository, load_at_startup=False) as running:
        inputs = add_inputs()
        error = client_error(running.client.infer, name, inputs)
        assert (error.code, error.reason) == ("FAILED_PRECONDITION", "load_failed"), error
        assert error.message == f"model '{name}' failed to load: model '{name}': {problem}"
        # The failure stays visible: the model is not ready and the index gives the reason.
        assert running.client.model_ready(name) is False
        entry = {model.name: model for model in running.client.repository_index()}[name]
        assert (entry.state, entry.reason) == ("UNAVAILABLE", f"model '{name}': {problem}")
        # A second request tries again and gets the same answer (nothing half-loaded was published).
        again = client_error(running.client.infer, name, inputs)
        assert (again.code, again.reason, again.message) == (error.code, error.reason, error.message)
        # The server goes on serving a correct model.
        outputs = running.client.infer("good", inputs)
        np.testing.assert_array_equal(outputs["Y"], inputs["A"] + inputs["B"])
        assert running.client.ready()


def test_mismatched_models_do_not_stop_startup_loading_of_the_good_one(mismatched_repository):
    """With load_at_startup (the default) every broken model fails on its own; the server still starts and the
    good model is ready without a first request."""
    with serve(mismatched_repository) as running:
        assert running.client.ready()
        assert running.client.model_ready("good") is True
        for name, _, problem in MISMATCHES:
            assert running.client.model_ready(name) is False
            error = client_error(running.client.infer, name, add_inputs())
            assert (error.code, error.reason) == ("FAILED_PRECONDITION", "load_failed")
            assert problem in error.message
        inputs = add_inputs(rows=3, seed=1)
        np.testing.assert_array_equal(running.client.infer("good", inputs)["Y"], inputs["A"] + inputs["B"])


class RecordingBackend(OnnxRuntimeBackend):
    """The real onnxruntime backend, keeping every model it loads so the test can look at its session."""

    def __init__(self) -> None:
        self.loaded: list = []

    def load(self, spec):
        model = super().load(spec)
        self.loaded.append(model)
        return model


def test_four_slots_share_one_inference_session_and_run_on_it_concurrently(tmp_path, monkeypatch):
    root = tmp_path / "repository"
    write_add_model(root, "add", GOOD_INPUTS)
    sessions = []

    class CountingSession(onnxruntime.InferenceSession):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            sessions.append(self)

    # The backend looks InferenceSession up on the onnxruntime module at each load.
    monkeypatch.setattr(onnxruntime, "InferenceSession", CountingSession)
    backend = RecordingBackend()
    with serve(
        root, backends={"onnxruntime": backend}, parallel_jobs=4, load_at_startup=False, allow_management=True
    ) as running:
        status = running.management.register("add", slots=4)
        assert (status.loaded, status.slots) == (True, 4)
        assert len(sessions) == 1, "one InferenceSession per model, whatever its slot count"
        assert len(backend.loaded) == 1
        model = backend.loaded[0]
        assert model.session is sessions[0]

        # Every run goes through the model's shared `run`; wrap it so that each run waits at a barrier until
        # all four are inside it. Four runs can only meet there if four slots run on the one session at once
        # (a single slot, or runs serialized on the session, would break the barrier and fail the requests).
        barrier = threading.Barrier(4, timeout=WAIT)
        original_run = model.run
        run_options = []
        guard = threading.Lock()

        def meeting_run(names, feed, options):
            with guard:
                run_options.append(options)
            barrier.wait()
            return original_run(names, feed, options)

        model.run = meeting_run
        results: dict[int, dict] = {}
        errors: list[BaseException] = []

        def call(index: int) -> None:
            try:
                results[index] = running.client.infer("add", add_inputs(seed=index), timeout=WAIT)
            except ClientError as error:
                errors.append(error)

        workers = [threading.Thread(target=call, args=(index,)) for index in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(WAIT)
        assert errors == [] and sorted(results) == [0, 1, 2, 3]
        for index, outputs in results.items():
            inputs = add_inputs(seed=index)
            np.testing.assert_array_equal(outputs["Y"], inputs["A"] + inputs["B"])
        # Four slots: four distinct RunOptions (one per slot), over the same single session.
        assert len({id(options) for options in run_options}) == 4
        assert len(sessions) == 1 and model.session is sessions[0]
        assert running.management.get("add").slots == 4
