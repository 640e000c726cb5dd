"""The double's serialized engines: what a plan holds, the I/O layouts (formats) it may use, and the functions a
fake engine computes.

A plan is PLAN_MAGIC, one line of JSON, then filler bytes standing for the weights (a real plan is about as big
as its weights). The JSON names the TensorRT version, GPU name and compute capability that built it, the compute
function, every I/O tensor (name, TensorRT type name, shape with -1 for dynamic dimensions, format, whether it is
a host-side shape tensor, which dimensions only the data decides) and the optimization profiles.

Functions: "identity" (output i = input i), "add_sub" (OUTPUT0 = a + b, OUTPUT1 = a - b, broadcasting), "nonzero"
(int64 indices of the non-zero elements of input 0: shape [rank, -1], the -1 decided by the data), "onnx" (the
model's own bytes, run by ONNX Runtime).

Formats (TensorRT's TensorFormat, as the double supports them; all but LINEAR need rank >= 3, the channel being
dimension rank-3): LINEAR (row major), HWC (channel last), CHW4 / CHW16 / CHW32 (channels padded to a multiple of
4/16/32 and vectorized), HWC8 (channel last, padded to a multiple of 8 and vectorized). Buffers are laid out
accordingly: a vectorized tensor needs more bytes than volume x itemsize, and a channel-last one holds its values
in another order, so code that ignores the format reads garbage or writes past its buffer, as on a GPU.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

PLAN_MAGIC = b"SLOTSERVE-TRT-DOUBLE-PLAN\n"
FUNCTIONS = ("identity", "add_sub", "nonzero", "onnx")
VECTOR_WIDTH = {"CHW4": 4, "CHW16": 16, "CHW32": 32, "HWC8": 8}
FORMATS = ("LINEAR", "HWC") + tuple(VECTOR_WIDTH)


def numpy_dtype(type_name: str) -> np.dtype:
    """numpy dtype of a TensorRT DataType name; TypeError for the types numpy lacks (FP8, INT4, FP4, E8M0)."""
    table = {
        "FLOAT": np.float32,
        "HALF": np.float16,
        "INT8": np.int8,
        "INT32": np.int32,
        "INT64": np.int64,
        "BOOL": np.bool_,
        "UINT8": np.uint8,
    }
    if type_name == "BF16":
        from engine.datatypes import bfloat16

        return np.dtype(bfloat16())
    if type_name not in table:
        raise TypeError(f"Could not resolve TensorRT datatype to an equivalent numpy datatype: DataType.{type_name}")
    return np.dtype(table[type_name])


class ShapeMismatch(Exception):
    """The input shapes do not fit each other (shape inference fails)."""


@dataclass(frozen=True)
class Tensor:
    name: str
    type_name: str
    shape: tuple[int, ...]
    is_input: bool
    format: str = "LINEAR"
    host: bool = False  # a shape tensor: TensorRT reads (or writes) it in host memory
    data_dependent: tuple[int, ...] = ()  # output dimensions only the data decides

    def itemsize(self) -> int:
        return numpy_dtype(self.type_name).itemsize


def _tensor_entry(
    name: str,
    type_name: str,
    shape: Sequence[int],
    is_input: bool,
    formats: Mapping[str, str],
    host_tensors: Sequence[str],
    data_dependent: Mapping[str, Sequence[int]],
) -> dict[str, Any]:
    tensor_format = formats.get(name, "LINEAR")
    if tensor_format not in FORMATS:
        raise ValueError(f"format {tensor_format!r} is not one of {FORMATS}")
    if tensor_format != "LINEAR" and len(shape) < 3:
        raise ValueError(f"{name}: format {tensor_format} needs at least 3 dimensions")
    dims = [int(d) for d in data_dependent.get(name, ())]
    if dims and (is_input or any(shape[d] != -1 for d in dims)):
        raise ValueError(f"{name}: only -1 dimensions of outputs can be data-dependent")
    return {
        "name": name,
        "type": type_name,
        "shape": [int(d) for d in shape],
        "input": is_input,
        "format": tensor_format,
        "host": name in host_tensors,
        "data_dependent": dims,
    }


def make_plan(
    *,
    inputs: Sequence[tuple[str, str, Sequence[int]]],
    outputs: Sequence[tuple[str, str, Sequence[int]]],
    function: str,
    profiles: Sequence[Mapping[str, Sequence[Sequence[int]]]],
    weights_bytes: int,
    activation_bytes: int,
    onnx: bytes | None,
    trt_version: str,
    device_name: str,
    compute_capability: Sequence[int],
    formats: Mapping[str, str],
    host_tensors: Sequence[str],
    data_dependent: Mapping[str, Sequence[int]],
) -> bytes:
    """Tensors are (name, DataType name, shape with -1); `profiles` give {input: (min, opt, max)} for each
    profile (default: one profile of the static input shapes); `formats` {name: format} (default LINEAR);
    `host_tensors` names shape tensors; `data_dependent` {output: [dimension, ...]}."""
    if function not in FUNCTIONS:
        raise ValueError(f"function must be one of {FUNCTIONS}")
    if not profiles:
        if any(d < 0 for _, _, shape in inputs for d in shape):
            raise ValueError("dynamic inputs need profiles")
        profiles = [{name: (shape, shape, shape) for name, _, shape in inputs}]
    tensors = [_tensor_entry(n, t, s, True, formats, host_tensors, data_dependent) for n, t, s in inputs]
    tensors += [_tensor_entry(n, t, s, False, formats, host_tensors, data_dependent) for n, t, s in outputs]
    description = {
        "trt_version": trt_version,
        "device_name": device_name,
        "compute_capability": list(compute_capability),
        "function": function,
        "onnx": base64.b64encode(onnx).decode() if onnx else None,
        "tensors": tensors,
        "profiles": [{name: [list(s) for s in shapes] for name, shapes in p.items()} for p in profiles],
        "weights_bytes": weights_bytes,
        "activation_bytes": activation_bytes,
    }
    # A real plan carries the weights, so its size is about the weights' size; the filler stands for them.
    return PLAN_MAGIC + json.dumps(description, sort_keys=True).encode() + b"\n" + bytes(weights_bytes)


class Plan:
    """A parsed plan."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        self.trt_version: str = raw["trt_version"]
        self.device_name: str = raw["device_name"]
        self.compute_capability = tuple(raw["compute_capability"])
        self.tensors = {
            t["name"]: Tensor(
                t["name"], t["type"], tuple(t["shape"]), t["input"], t["format"], t["host"], tuple(t["data_dependent"])
            )
            for t in raw["tensors"]
        }
        self.order: list[str] = [t["name"] for t in raw["tensors"]]
        self.inputs = [self.tensors[n] for n in self.order if self.tensors[n].is_input]
        self.outputs = [self.tensors[n] for n in self.order if not self.tensors[n].is_input]
        self.profiles = [{name: tuple(tuple(s) for s in shapes) for name, shapes in p.items()} for p in raw["profiles"]]
        self.function: str = raw["function"]
        self.onnx = base64.b64decode(raw["onnx"]) if raw.get("onnx") else None
        self.weights_bytes = int(raw["weights_bytes"])
        self.activation_bytes = int(raw["activation_bytes"])

    @staticmethod
    def parse(data: bytes) -> Plan | None:
        if not data.startswith(PLAN_MAGIC):
            return None
        return Plan(json.loads(data[len(PLAN_MAGIC) :].split(b"\n", 1)[0]))

    @property
    def data_dependent(self) -> bool:
        return any(t.data_dependent for t in self.outputs)


# ------------------------------------------------------------------------------------------------- layouts


def vectorized_dim(tensor: Tensor) -> int:
    return len(tensor.shape) - 3 if tensor.format in VECTOR_WIDTH else -1


def components(tensor: Tensor) -> int:
    return VECTOR_WIDTH.get(tensor.format, 1)


def format_description(tensor: Tensor) -> str:
    kind = {"FLOAT": "FP32", "HALF": "FP16"}.get(tensor.type_name, tensor.type_name)
    if tensor.format == "LINEAR":
        return f"Row major linear {kind} format (kLINEAR)"
    if tensor.format == "HWC":
        return f"Channel major {kind} format (kHWC)"
    width = VECTOR_WIDTH[tensor.format]
    if tensor.format == "HWC8":
        return f"Channel major {kind} format where channel % {width} == 0 (kHWC8)"
    return f"{width} wide channel vectorized row major {kind} format (k{tensor.format})"


def _padded_channels(tensor: Tensor, channels: int) -> int:
    width = components(tensor)
    return -(-channels // width) * width


def strides(tensor: Tensor, shape: Sequence[int]) -> tuple[int, ...]:
    """IExecutionContext.get_tensor_strides: in elements, where a vectorized format's element is one vector."""
    shape = tuple(shape)
    rank = len(shape)
    if tensor.format == "LINEAR":
        result, step = [], 1
        for dim in reversed(shape):
            result.append(step)
            step *= max(dim, 1)
        return tuple(reversed(result))
    *outer, channels, height, width = shape
    if tensor.format in ("CHW4", "CHW16", "CHW32"):
        vectors = _padded_channels(tensor, channels) // components(tensor)
        inner = {rank - 1: 1, rank - 2: width, rank - 3: height * width}
        step = vectors * height * width
    else:  # channel last: HWC (scalars) or HWC8 (vectors of 8)
        per_pixel = channels if tensor.format == "HWC" else _padded_channels(tensor, channels) // 8
        inner = {rank - 3: 1, rank - 1: per_pixel, rank - 2: width * per_pixel}
        step = height * width * per_pixel
    result = [0] * rank
    for index in range(rank - 4, -1, -1):
        result[index] = step
        step *= max(outer[index], 1)
    for index, value in inner.items():
        result[index] = value
    return tuple(result)


def storage_bytes(tensor: Tensor, shape: Sequence[int]) -> int:
    """Bytes a buffer for `shape` in the tensor's format needs."""
    shape = tuple(shape)
    if tensor.format == "LINEAR" or tensor.format == "HWC":
        return math.prod(shape) * tensor.itemsize()
    *outer, channels, height, width = shape
    return math.prod(outer) * _padded_channels(tensor, channels) * height * width * tensor.itemsize()


def to_storage(tensor: Tensor, array: np.ndarray) -> bytes:
    """The bytes TensorRT writes for `array` in the tensor's format."""
    if tensor.format == "LINEAR":
        return np.ascontiguousarray(array).tobytes()
    if tensor.format == "HWC":
        return np.ascontiguousarray(np.moveaxis(array, -3, -1)).tobytes()
    padded = _pad_channels(tensor, array)
    if tensor.format == "HWC8":
        return np.ascontiguousarray(np.moveaxis(padded, -3, -1)).tobytes()
    *outer, channels, height, width = padded.shape
    width_k = components(tensor)
    blocked = padded.reshape(*outer, channels // width_k, width_k, height, width)
    return np.ascontiguousarray(np.moveaxis(blocked, -3, -1)).tobytes()


def from_storage(tensor: Tensor, data: bytes, shape: Sequence[int]) -> np.ndarray:
    """The values TensorRT reads from `data` (a buffer in the tensor's format) for `shape`."""
    dtype = numpy_dtype(tensor.type_name)
    shape = tuple(shape)
    if tensor.format == "LINEAR":
        return np.frombuffer(data, dtype, math.prod(shape)).reshape(shape)
    *outer, channels, height, width = shape
    if tensor.format == "HWC":
        stored = np.frombuffer(data, dtype, math.prod(shape)).reshape(*outer, height, width, channels)
        return np.moveaxis(stored, -1, -3)
    padded = _padded_channels(tensor, channels)
    count = math.prod(outer) * padded * height * width
    if tensor.format == "HWC8":
        stored = np.frombuffer(data, dtype, count).reshape(*outer, height, width, padded)
        return np.moveaxis(stored, -1, -3)[..., :channels, :, :]
    width_k = components(tensor)
    stored = np.frombuffer(data, dtype, count).reshape(*outer, padded // width_k, height, width, width_k)
    return np.moveaxis(stored, -1, -3).reshape(*outer, padded, height, width)[..., :channels, :, :]


def _pad_channels(tensor: Tensor, array: np.ndarray) -> np.ndarray:
    channels = array.shape[-3]
    extra = _padded_channels(tensor, channels) - channels
    if not extra:
        return array
    pad = [(0, 0)] * array.ndim
    pad[-3] = (0, extra)
    return np.pad(array, pad)


# ----------------------------------------------------------------------------------------------- functions


def output_shapes(
    plan: Plan,
    shapes: Mapping[str, tuple[int, ...]],
    run_onnx: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
    probe_values: Mapping[str, Any] | None = None,
) -> dict[str, tuple[int, ...]]:
    """Every output's shape for these input shapes, -1 in the dimensions only the data decides. Raises
    ShapeMismatch when the inputs do not fit each other. An ONNX model runs on zeros for it, except for the
    inputs `probe_values` gives a value."""
    function, inputs, outputs = plan.function, plan.inputs, plan.outputs
    if function == "identity":
        # strict=False: extra inputs (a shape tensor) have no output of their own
        found = {out.name: shapes[inp.name] for inp, out in zip(inputs, outputs, strict=False)}
    elif function == "add_sub":
        try:
            shape = tuple(np.broadcast_shapes(*(shapes[t.name] for t in inputs[:2])))
        except ValueError as error:
            raise ShapeMismatch(str(error)) from None
        found = {out.name: shape for out in outputs}
    elif function == "nonzero":
        found = {outputs[0].name: (len(shapes[inputs[0].name]), -1)}
    else:
        probe_values = probe_values or {}
        zeros = {t.name: np.full(shapes[t.name], probe_values.get(t.name, 0), numpy_dtype(t.type_name)) for t in inputs}
        try:
            found = {name: tuple(array.shape) for name, array in run_onnx(zeros).items()}
        except Exception as error:  # ONNX Runtime refuses shapes that do not fit: as TensorRT's inference would
            raise ShapeMismatch(str(error)) from None
    for out in outputs:
        if out.data_dependent:
            found[out.name] = tuple(-1 if i in out.data_dependent else d for i, d in enumerate(found[out.name]))
    return found


def compute(
    plan: Plan, arrays: dict[str, np.ndarray], run_onnx: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    function, inputs, outputs = plan.function, plan.inputs, plan.outputs
    if function == "identity":
        return {out.name: arrays[inp.name] for inp, out in zip(inputs, outputs, strict=False)}  # as output_shapes
    if function == "add_sub":
        first, second = (arrays[t.name] for t in inputs[:2])
        return {outputs[0].name: first + second, outputs[1].name: first - second}
    if function == "nonzero":
        return {outputs[0].name: np.array(np.nonzero(arrays[inputs[0].name]), dtype=np.int64)}
    return run_onnx(arrays)
