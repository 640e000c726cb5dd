"""Shared helpers for the TensorRT tests: plans, ONNX models and specs for the double."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from engine.config.specs import BatchingSpec, ModelSpec, TensorSpec
from engine.testing.tensorrt_double import FakeDevice

BATCH = 8
WIDTH = 16

ADD_SUB_INPUTS = [("INPUT0", "INT32", (-1, WIDTH)), ("INPUT1", "INT32", (-1, WIDTH))]
ADD_SUB_OUTPUTS = [("OUTPUT0", "INT32", (-1, WIDTH)), ("OUTPUT1", "INT32", (-1, WIDTH))]
BATCH_RANGE = ((1, WIDTH), (BATCH, WIDTH), (BATCH, WIDTH))


def add_sub_profiles(count: int = 1) -> list[dict]:
    return [{"INPUT0": BATCH_RANGE, "INPUT1": BATCH_RANGE} for _ in range(count)]


def write_add_sub_plan(device: FakeDevice, root: Path, name: str = "add_sub", profiles: int = 1, **kwargs) -> Path:
    """`root/<name>/1/model.plan`: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, INT32 [-1, 16]."""
    return device.write_plan(
        root / name / "1" / "model.plan",
        inputs=ADD_SUB_INPUTS,
        outputs=ADD_SUB_OUTPUTS,
        function="add_sub",
        profiles=add_sub_profiles(profiles),
        **kwargs,
    )


def add_sub_io_bytes() -> int:
    """Device bytes of one add_sub slot's I/O buffers (four INT32 [8, 16] tensors)."""
    return 4 * BATCH * WIDTH * 4


def spec(
    model_file: Path,
    *,
    name: str | None = None,
    max_batch_size: int = BATCH,
    instance_count: int | None = None,
    inputs: tuple[TensorSpec, ...] = (),
    outputs: tuple[TensorSpec, ...] = (),
    batching: BatchingSpec | None = None,
    **parameters: str,
) -> ModelSpec:
    """A tensorrt ModelSpec. The capacity reserve defaults to 0 here so that simulated memory sizes are exact."""
    parameters.setdefault("trt_memory_reserve_bytes", "0")
    return ModelSpec(
        name=name or model_file.parent.parent.name,
        backend="tensorrt",
        directory=model_file.parent.parent,
        model_file=model_file,
        platform="tensorrt_plan",
        max_batch_size=max_batch_size,
        inputs=inputs,
        outputs=outputs,
        instance_count=instance_count,
        parameters=parameters,
        batching=batching,
    )


def _save(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString(deterministic=True))
    return path


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def write_add_sub_onnx(root: Path, name: str = "add_sub") -> Path:
    """`root/<name>/1/model.onnx`: the add_sub function as ONNX, INT32 ["batch", 16]."""
    dims: list[str | int] = ["batch", WIDTH]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        name,
        [helper.make_tensor_value_info(n, TensorProto.INT32, dims) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, TensorProto.INT32, dims) for n in ("OUTPUT0", "OUTPUT1")],
    )
    return _save(_model(graph), root / name / "1" / "model.onnx")


def write_identity_onnx(root: Path, name: str = "identity", elem_type: int = TensorProto.FLOAT) -> Path:
    """`root/<name>/1/model.onnx`: OUTPUT0 = INPUT0, shape ["batch", "n"] (a variable non-batch dimension)."""
    dims = ["batch", "n"]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        name,
        [helper.make_tensor_value_info("INPUT0", elem_type, dims)],
        [helper.make_tensor_value_info("OUTPUT0", elem_type, dims)],
    )
    return _save(_model(graph), root / name / "1" / "model.onnx")


def add_sub_inputs(seed: int, batch: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.integers(-1000, 1000, (batch, WIDTH), dtype=np.int32) for n in ("INPUT0", "INPUT1")}


def write_nonzero_onnx(root: Path, name: str = "nonzero") -> Path:
    """`root/<name>/1/model.onnx`: OUTPUT0 = NonZero(INPUT0), FP32 [4, 4] -> INT64 [2, -1] (the -1 is decided by
    the data: how many elements are non-zero)."""
    graph = helper.make_graph(
        [helper.make_node("NonZero", ["INPUT0"], ["OUTPUT0"])],
        name,
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.INT64, [2, "count"])],
    )
    return _save(_model(graph), root / name / "1" / "model.onnx")


def write_scaled_onnx_with_external_weights(root: Path, scale: float, name: str = "scaled") -> Path:
    """`root/<name>/1/model.onnx` + `weights.bin`: OUTPUT0 = INPUT0 * W, FP32 [4], W (all `scale`) stored in the
    external data file beside the model, as large models are."""
    weight = onnx.numpy_helper.from_array(np.full(4, scale, np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["INPUT0", "W"], ["OUTPUT0"])],
        name,
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [4])],
        [weight],
    )
    model = _model(graph)
    path = root / name / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    return path
