"""A reload sees changed files (issue 33, item 3; issue 34, item 7): the decision to keep a model's engine and
resize its pool in place compares the files the engine reads (engine.config.files.files_stamp), not only their path.
Each backend's model file is edited, then the model is loaded again (RepositoryModelLoad in explicit mode, or a
scan in poll mode): the next answer is the new file's, and the reconfiguration was not in place (every slot is new).
A reload with nothing changed still keeps the engine (in place).

The TensorRT double's case is in tests/tensorrt/test_repository_reload.py.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from engine.testing.fixture import FixtureBackend
from generated import grpc_service_pb2 as pb
from service.testing import serve

from ...tensorrt.support import write_scaled_onnx_with_external_weights
from .._support import CALL_TIMEOUT, stub, write_fixture_model

HOUR = 3600.0
VALUES = np.arange(1, 5, dtype=np.float32)

PYTHON_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
"""

# OUTPUT0 = INPUT0 * FACTOR * the number in its neighbour file scale.txt (read at initialize, as models read their
# weights): editing either file changes the answer.
PYTHON_MODEL = """import os

import triton_python_backend_utils as pb_utils

FACTOR = {factor}


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(os.path.dirname(__file__), "scale.txt")) as handle:
            self.scale = float(handle.read())

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value * FACTOR * self.scale)]))
        return responses
"""


class Reconfigurations:
    """The `reconfigured` events of the server (its `in_place` field), in order."""

    def __init__(self, running) -> None:
        self._lock = threading.Lock()
        self.seen: list[tuple[str, bool]] = []
        running.server.registry.runtime.events.subscribe(self._note)

    def _note(self, event: str, model: str, fields) -> None:
        if event == "reconfigured":
            with self._lock:
                self.seen.append((model, bool(fields["in_place"])))

    def last(self, model: str) -> bool:
        with self._lock:
            return [in_place for name, in_place in self.seen if name == model][-1]


def answer(running, name: str) -> np.ndarray:
    return running.client.infer(name, {"INPUT0": VALUES})["OUTPUT0"]


def reload(running, name: str, mode: str) -> None:
    if mode == "poll":
        assert running.server.control.poll_once()["loaded"] == [name]
    else:
        stub(running).RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=name), timeout=CALL_TIMEOUT)


def serve_mode(repository: Path, mode: str, **options):
    return serve(
        repository,
        model_control_mode=mode,
        load_models=("*",) if mode == "explicit" else (),
        repository_poll_seconds=HOUR,
        allow_management=True,
        **options,
    )


def write_python(repository: Path, name: str, factor: int, scale: str = "1") -> None:
    folder = repository / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(PYTHON_CONFIG.format(name=name))
    (folder / "1" / "model.py").write_text(PYTHON_MODEL.format(factor=factor))
    (folder / "1" / "scale.txt").write_text(scale)


@pytest.mark.parametrize("mode", ["explicit", "poll"])
def test_an_edited_model_py_or_its_neighbour_is_served_after_a_reload(tmp_path, mode):
    write_python(tmp_path, "py", factor=1)
    with serve_mode(tmp_path, mode) as running:
        reconfigurations = Reconfigurations(running)
        assert answer(running, "py").tolist() == VALUES.tolist()
        write_python(tmp_path, "py", factor=1000)  # model.py says 1000 now (the old code kept answering 1)
        reload(running, "py", mode)
        assert answer(running, "py").tolist() == (VALUES * 1000).tolist()
        assert reconfigurations.last("py") is False
        (tmp_path / "py" / "1" / "scale.txt").write_text("2")  # only the neighbour changes
        reload(running, "py", mode)
        assert answer(running, "py").tolist() == (VALUES * 2000).tolist()
        assert reconfigurations.last("py") is False
        if mode == "explicit":  # nothing changed: the engine (every worker) stays
            reload(running, "py", mode)
            assert reconfigurations.last("py") is True
            assert answer(running, "py").tolist() == (VALUES * 2000).tolist()
        else:  # nothing changed, not even __pycache__ of the worker's import: nothing to do
            assert running.server.control.poll_once() == {"loaded": [], "failed": [], "unloaded": []}


@pytest.mark.parametrize("mode", ["explicit", "poll"])
def test_an_edited_onnx_model_or_its_external_data_is_served_after_a_reload(tmp_path, mode):
    model = write_scaled_onnx_with_external_weights(tmp_path, scale=1.0, name="scaled")
    (tmp_path / "scaled" / "config.pbtxt").write_text('name: "scaled"\nbackend: "onnxruntime"\n')
    with serve_mode(tmp_path, mode) as running:
        reconfigurations = Reconfigurations(running)
        assert answer(running, "scaled").tolist() == VALUES.tolist()
        # Only the external data file changes: model.onnx is byte for byte the same.
        before = model.read_bytes()
        other = write_scaled_onnx_with_external_weights(tmp_path / "other", scale=1000.0, name="scaled")
        os.replace(other.parent / "weights.bin", model.parent / "weights.bin")
        assert model.read_bytes() == before
        reload(running, "scaled", mode)
        assert answer(running, "scaled").tolist() == (VALUES * 1000).tolist()
        assert reconfigurations.last("scaled") is False
        # The model file itself rewritten in place (the same inode), with its weights.
        write_scaled_onnx_with_external_weights(tmp_path, scale=3.0, name="scaled")
        reload(running, "scaled", mode)
        assert answer(running, "scaled").tolist() == (VALUES * 3).tolist()
        assert reconfigurations.last("scaled") is False


@pytest.mark.parametrize("mode", ["explicit", "poll"])
def test_a_fixture_models_changed_version_folder_gets_a_new_engine(tmp_path, controls, mode):
    """The fixture backend reads no file, so its engine is seen by its load count: a file of its version folder
    changed is a new engine; nothing changed keeps it."""
    write_fixture_model(tmp_path, "fx", inputs=[("INPUT0", "FP32", [4])], outputs=[("OUTPUT0", "FP32", [4])])
    (tmp_path / "fx" / "1").mkdir()
    (tmp_path / "fx" / "1" / "weights").write_bytes(b"1")
    with serve_mode(tmp_path, mode, backends={"fixture": FixtureBackend(controls)}) as running:
        reconfigurations = Reconfigurations(running)
        assert answer(running, "fx").tolist() == VALUES.tolist()
        loads = controls.count("fx", "load")
        if mode == "explicit":
            reload(running, "fx", mode)
            assert controls.count("fx", "load") == loads and reconfigurations.last("fx") is True
        (tmp_path / "fx" / "1" / "weights").write_bytes(b"2")  # the same size
        reload(running, "fx", mode)
        assert controls.count("fx", "load") == loads + 1
        assert reconfigurations.last("fx") is False
        assert answer(running, "fx").tolist() == VALUES.tolist()
