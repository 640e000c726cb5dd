"""What an ONNX model's pool reports it holds (issue 35, item 5): a stable figure for the same model file. It was
the process's resident-memory growth while the session was built, so the allocator's reuse of freed pages made
a reloaded model report about 1000 bytes (9.5 MiB the first time), and --memory-budget counted almost nothing
for it. Now: the C heap's growth while the session is built (glibc's mallinfo2, which freed-and-reused memory
does not fool), at least the file's size, measured on the first load of a file in the process and remembered
(engine/onnxruntime_backend.py, docs/residency.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from engine.config.specs import ModelSpec
from engine.onnxruntime_backend import OnnxRuntimeBackend, session_memory_bytes
from service.testing import serve

WEIGHT_ROWS = 1024  # a 1024 x 1024 FP32 weight: 4 MiB in the file, held once by the session
WEIGHT_BYTES = WEIGHT_ROWS * WEIGHT_ROWS * 4


def write_matmul_model(repository: Path, name: str, seed: int = 0) -> Path:
    """Y = X @ W with W a 4 MiB initializer (random, so no optimization folds it away)."""
    weight = np.random.default_rng(seed).standard_normal((WEIGHT_ROWS, WEIGHT_ROWS)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        name,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", WEIGHT_ROWS])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", WEIGHT_ROWS])],
        [helper.make_tensor("W", TensorProto.FLOAT, weight.shape, weight.tobytes(), raw=True)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    directory = repository / name
    (directory / "1").mkdir(parents=True)
    onnx.save(model, directory / "1" / "model.onnx")
    (directory / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 0\n')
    return directory


def _spec(directory: Path) -> ModelSpec:
    return ModelSpec(directory.name, "onnxruntime", model_file=directory / "1" / "model.onnx")


def test_load_unload_load_reports_the_same_figure_of_the_right_size(tmp_path):
    backend = OnnxRuntimeBackend()
    spec = _spec(write_matmul_model(tmp_path, "matmul"))
    figures = []
    for _ in range(3):
        model = backend.load(spec)
        figures.append(model.memory_bytes(4))  # slots share the session: the figure does not grow with them
        assert model.memory_bytes(1) == figures[-1]
        model.close()
    assert figures[0] == figures[1] == figures[2], figures
    # the weight once, plus what the session keeps beside it; never less than the file
    assert WEIGHT_BYTES <= figures[0] < 3 * WEIGHT_BYTES, figures


def test_a_tiny_model_reports_at_least_its_file_and_far_less_than_a_big_one(tmp_path):
    backend = OnnxRuntimeBackend()
    tiny = tmp_path / "tiny" / "1"
    tiny.mkdir(parents=True)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"])],
        "tiny",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tiny / "model.onnx")
    spec = ModelSpec("tiny", "onnxruntime", model_file=tiny / "model.onnx")
    first = backend.load(spec)
    size = first.memory_bytes(1)
    first.close()
    again = backend.load(spec)
    assert again.memory_bytes(1) == size
    again.close()
    assert (tiny / "model.onnx").stat().st_size <= size < WEIGHT_BYTES, size


def test_a_changed_file_is_measured_again(tmp_path):
    directory = write_matmul_model(tmp_path, "m")
    spec = _spec(directory)
    before = session_memory_bytes(spec)
    assert before is None  # never loaded in this process: nothing remembered
    model = OnnxRuntimeBackend().load(spec)
    remembered = session_memory_bytes(spec)
    assert remembered == model.memory_bytes(1)
    model.close()
    # the same path with new content (another weight: a new inode and size) is not the same file
    model_file = directory / "1" / "model.onnx"
    model_file.unlink()
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"])],
        "m",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), model_file)
    assert session_memory_bytes(spec) is None
    smaller = OnnxRuntimeBackend().load(spec)
    assert smaller.memory_bytes(1) < WEIGHT_BYTES
    smaller.close()


def test_a_server_reports_the_same_memory_after_an_unload_and_a_reload(tmp_path):
    write_matmul_model(tmp_path, "matmul", seed=1)
    with serve(tmp_path, allow_management=True, model_control_mode="explicit", memory_budget=1 << 30) as running:
        running.client.load("matmul")
        first = running.management.get("matmul").memory_bytes
        running.client.unload("matmul")
        running.client.load("matmul")
        second = running.management.get("matmul").memory_bytes
        assert first == second and first is not None and first >= WEIGHT_BYTES, (first, second)
        assert running.server.residency.memory_in_use() == second
