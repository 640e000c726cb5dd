"""What an engine takes and returns: its I/O tensors read through the name-based API, checked against what
slotserve can serve, and the model metadata built from them and config.pbtxt.

Refused at load, each by name: TensorRT types without a KServe datatype (FP8, INT4, FP4, E8M0); shape tensors
(TensorRT reads them in host memory: location HOST / is_shape_inference_io), which would need their values at
shape-inference time; I/O in a vectorized format (e.g. a plan built with `--inputIOFormats=fp16:chw16`), whose
buffers are padded and laid out per vector. Channel-last formats (HWC), which are not vectorized, are caught by
their strides when a slot is made (slot.py). Outputs whose shape only the data decides (-1 left after every input
is set) are served through an output allocator (slot.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import datatypes
from ..config.specs import ModelSpec, TensorSpec
from ..errors import ModelConfigError
from ..interface import ModelMetadata
from .protocols import CudaEngine, TensorRTRuntimeModule

# TensorRT DataType member name -> KServe datatype. Types without a KServe name (FP8, INT4, FP4, E8M0) are
# refused at load.
KSERVE_TYPE = {
    "FLOAT": "FP32",
    "HALF": "FP16",
    "BF16": "BF16",
    "INT8": "INT8",
    "INT32": "INT32",
    "INT64": "INT64",
    "BOOL": "BOOL",
    "UINT8": "UINT8",
}

LINEAR_ONLY = (
    "slotserve serves linear (row-major) I/O only: build the plan without --inputIOFormats / "
    "--outputIOFormats (or with :chw), or from the ONNX model"
)

# (min, opt, max) shapes of one input in one optimization profile, batch dimension included.
ProfileRange = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def origin(spec_or_name: ModelSpec | str) -> str:
    name = spec_or_name if isinstance(spec_or_name, str) else spec_or_name.name
    return f"model '{name}'"


def volume(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def dims(shape: Sequence[int]) -> tuple[int, ...]:
    """A TensorRT Dims (or any sequence) as a tuple of ints. An invalid Dims (nbDims -1) iterates as empty."""
    return tuple(int(d) for d in shape)


def row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class IoTensor:
    """One engine I/O tensor. `shape` is the engine's, batch dimension included, -1 where dynamic."""

    name: str
    is_input: bool
    datatype: str  # KServe name
    dtype: np.dtype
    shape: tuple[int, ...]


def _check_location(trt: TensorRTRuntimeModule, engine: CudaEngine, name: str, kind: str, where: str) -> None:
    if engine.get_tensor_location(name) != trt.TensorLocation.DEVICE or engine.is_shape_inference_io(name):
        raise ModelConfigError(
            f"{where}: {kind} '{name}' is a shape tensor (TensorRT reads it in host memory while it infers shapes); "
            "slotserve serves engines whose inputs and outputs are all device tensors. Fold that shape into the "
            "model (constant folding, e.g. with onnxsim or polygraphy surgeon), or serve it with ONNX Runtime"
        )


def _check_format(engine: CudaEngine, name: str, kind: str, where: str) -> None:
    vectorized = engine.get_tensor_vectorized_dim(name)
    components = engine.get_tensor_components_per_element(name)
    if vectorized != -1 or components != 1:
        raise ModelConfigError(
            f"{where}: {kind} '{name}' uses the I/O format {engine.get_tensor_format_desc(name)!r} (vectorized "
            f"along dimension {vectorized}, {components} components per element); {LINEAR_ONLY}"
        )


def io_tensors(trt: TensorRTRuntimeModule, engine: CudaEngine, where: str) -> list[IoTensor]:
    """The engine's I/O tensors in engine order, from the name-based API, each checked (see the module docstring).
    Raises ModelConfigError naming the tensor."""
    tensors = []
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        mode = engine.get_tensor_mode(name)
        if mode not in (trt.TensorIOMode.INPUT, trt.TensorIOMode.OUTPUT):
            continue
        kind = "input" if mode == trt.TensorIOMode.INPUT else "output"
        _check_location(trt, engine, name, kind, where)
        type_name = engine.get_tensor_dtype(name).name
        datatype = KSERVE_TYPE.get(type_name)
        if datatype is None:
            raise ModelConfigError(
                f"{where}: {kind} '{name}' has TensorRT type {type_name}, which has no KServe "
                f"datatype; supported: {', '.join(sorted(KSERVE_TYPE))}"
            )
        _check_format(engine, name, kind, where)
        tensors.append(
            IoTensor(
                name, kind == "input", datatype, datatypes.numpy_dtype(datatype), dims(engine.get_tensor_shape(name))
            )
        )
    if not any(t.is_input for t in tensors) or not any(not t.is_input for t in tensors):
        raise ModelConfigError(f"{where}: the engine has no inputs or no outputs")
    return tensors


def profile_ranges(engine: CudaEngine, io: list[IoTensor], profiles: Sequence[int]) -> dict[str, list[ProfileRange]]:
    """{input name: [(min, opt, max) per profile in `profiles`]}."""
    return {
        t.name: [profile_range(engine.get_tensor_profile_shape(t.name, p)) for p in profiles] for t in io if t.is_input
    }


def profile_range(shapes: Sequence[Sequence[int]]) -> ProfileRange:
    low, opt, high = (dims(shape) for shape in shapes)
    return low, opt, high


def _served(tensor: IoTensor, max_batch_size: int, where: str) -> TensorSpec:
    """The tensor as the protocol serves it: without the engine's batch dimension for a batching model."""
    if max_batch_size == 0:
        return TensorSpec(tensor.name, tensor.datatype, tensor.shape)
    if not tensor.shape or tensor.shape[0] not in (-1, 1) or (tensor.shape[0] == 1 and max_batch_size != 1):
        raise ModelConfigError(
            f"{where}: max_batch_size is {max_batch_size}, but the engine's '{tensor.name}' has shape "
            f"{list(tensor.shape)}, without a dynamic first (batch) dimension"
        )
    return TensorSpec(tensor.name, tensor.datatype, tensor.shape[1:])


def check_batch_ranges(ranges: dict[str, list[ProfileRange]], max_batch_size: int, where: str) -> None:
    """Every profile must allow batch sizes 1..max_batch_size (the server stacks up to that many requests)."""
    if max_batch_size == 0:
        return
    for name, per_profile in ranges.items():
        for index, (low, _, high) in enumerate(per_profile):
            if low[0] > 1 or high[0] < max_batch_size:
                raise ModelConfigError(
                    f"{where}: the engine's profile {index} allows batch sizes {low[0]}..{high[0]} for '{name}', "
                    f"but max_batch_size {max_batch_size} needs 1..{max_batch_size}"
                )


def _reconcile(
    declared: tuple[TensorSpec, ...],
    actual: list[TensorSpec],
    kind: str,
    where: str,
    ranges: dict[str, list[ProfileRange]],
    batching: bool,
) -> tuple[TensorSpec, ...]:
    """The tensors as served: the config's, checked against the engine, or the engine's when the config
    declares none. A fixed config dimension over a dynamic engine one must lie inside every profile used."""
    by_name = {t.name: t for t in actual}
    if not declared:
        return tuple(actual)
    for spec in declared:
        model = by_name.get(spec.name)
        if model is None:
            raise ModelConfigError(f"{where}: {kind} '{spec.name}' is not in the engine; it has {sorted(by_name)}")
        if model.datatype != spec.datatype:
            raise ModelConfigError(
                f"{where}: {kind} '{spec.name}' is {model.datatype} in the engine, {spec.datatype} in the config"
            )
        if len(model.shape) != len(spec.shape) or any(
            m != -1 and d != -1 and m != d for m, d in zip(model.shape, spec.shape, strict=True)
        ):
            raise ModelConfigError(
                f"{where}: {kind} '{spec.name}' has dims {list(model.shape)} in the engine "
                f"({'after the batch dimension' if batching else 'no batching'}), {list(spec.shape)} in the config"
            )
        skip = 1 if batching else 0
        for low, _, high in ranges.get(spec.name, ()):
            for index, dim in enumerate(spec.shape):
                if dim != -1 and not low[index + skip] <= dim <= high[index + skip]:
                    raise ModelConfigError(
                        f"{where}: {kind} '{spec.name}' dimension {index} is {dim} in the config, outside the "
                        f"engine's profile range {low[index + skip]}..{high[index + skip]}"
                    )
    if kind == "input":
        missing = sorted(set(by_name) - {s.name for s in declared})
        if missing:
            raise ModelConfigError(f"{where}: the engine's inputs {missing} are not in the config")
    return declared


def metadata(spec: ModelSpec, io: list[IoTensor], ranges: dict[str, list[ProfileRange]]) -> ModelMetadata:
    where = origin(spec)
    batching = spec.max_batch_size > 0
    inputs = [_served(t, spec.max_batch_size, where) for t in io if t.is_input]
    outputs = [_served(t, spec.max_batch_size, where) for t in io if not t.is_input]
    return ModelMetadata(
        inputs=_reconcile(spec.inputs, inputs, "input", where, ranges, batching),
        outputs=_reconcile(spec.outputs, outputs, "output", where, ranges, batching),
        max_batch_size=spec.max_batch_size,
        platform="tensorrt_plan",
    )
