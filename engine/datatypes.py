"""Tensor datatypes: KServe v2 names, numpy dtypes and model-configuration enum names.

One table holds the facts; the functions below only look them up. BYTES tensors are numpy object arrays whose
elements are `bytes`. BF16 uses `ml_dtypes.bfloat16` (a dependency of onnx), imported on first use.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np


@dataclass(frozen=True)
class DataType:
    """One KServe datatype."""

    name: str  # wire name, e.g. "FP32"
    config_name: str  # inference.DataType enum name in config.pbtxt, e.g. "TYPE_FP32"
    itemsize: int  # bytes per element in raw contents; 0 for BYTES (length-prefixed)
    contents_field: str | None  # InferTensorContents field for typed contents; None: raw only


_TABLE = (
    DataType("BOOL", "TYPE_BOOL", 1, "bool_contents"),
    DataType("UINT8", "TYPE_UINT8", 1, "uint_contents"),
    DataType("UINT16", "TYPE_UINT16", 2, "uint_contents"),
    DataType("UINT32", "TYPE_UINT32", 4, "uint_contents"),
    DataType("UINT64", "TYPE_UINT64", 8, "uint64_contents"),
    DataType("INT8", "TYPE_INT8", 1, "int_contents"),
    DataType("INT16", "TYPE_INT16", 2, "int_contents"),
    DataType("INT32", "TYPE_INT32", 4, "int_contents"),
    DataType("INT64", "TYPE_INT64", 8, "int64_contents"),
    DataType("FP16", "TYPE_FP16", 2, None),
    DataType("FP32", "TYPE_FP32", 4, "fp32_contents"),
    DataType("FP64", "TYPE_FP64", 8, "fp64_contents"),
    DataType("BF16", "TYPE_BF16", 2, None),
    DataType("BYTES", "TYPE_STRING", 0, "bytes_contents"),
)

BY_NAME: dict[str, DataType] = {t.name: t for t in _TABLE}
BY_CONFIG_NAME: dict[str, DataType] = {t.config_name: t for t in _TABLE}
NAMES: tuple[str, ...] = tuple(t.name for t in _TABLE)

_PLAIN_NUMPY = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}


@cache
def bfloat16() -> np.dtype:
    """The numpy dtype for BF16 (from ml_dtypes)."""
    import ml_dtypes

    dtype: np.dtype = np.dtype(ml_dtypes.bfloat16)  # ml_dtypes has no type hints: say what numpy returns
    return dtype


def numpy_dtype(name: str) -> np.dtype:
    """numpy dtype (little-endian) of a KServe datatype name. Raises KeyError for an unknown name."""
    if name == "BF16":
        return bfloat16()
    return _PLAIN_NUMPY[name]


def from_numpy(dtype: np.dtype) -> str:
    """KServe datatype name of a numpy dtype. Strings and bytes map to BYTES. Raises KeyError if none fits."""
    try:
        return _FROM_NUMPY[dtype]
    except (KeyError, TypeError):  # not seen yet, or not a dtype (a type such as np.float32, or a string)
        pass
    name = _from_numpy(np.dtype(dtype))
    if isinstance(dtype, np.dtype):
        _FROM_NUMPY[dtype] = name  # a few dtypes ever, asked for every tensor of every call: remember the answer
    return name


_FROM_NUMPY: dict[np.dtype, str] = {}


def _from_numpy(dtype: np.dtype) -> str:
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    if dtype == bfloat16():
        return "BF16"
    for name, candidate in _PLAIN_NUMPY.items():
        if candidate.kind == dtype.kind and candidate.itemsize == dtype.itemsize and name != "BYTES":
            return name
    raise KeyError(f"no KServe datatype for numpy dtype {dtype}")


# ONNX tensor element types (onnx.TensorProto values) by KServe name; the ONNX Runtime type strings follow.
ONNX_ELEMENT_TYPE = {
    "FP32": 1,
    "UINT8": 2,
    "INT8": 3,
    "UINT16": 4,
    "INT16": 5,
    "INT32": 6,
    "INT64": 7,
    "BYTES": 8,
    "BOOL": 9,
    "FP16": 10,
    "FP64": 11,
    "UINT32": 12,
    "UINT64": 13,
    "BF16": 16,
}

ORT_TYPE_STRING = {
    "tensor(float)": "FP32",
    "tensor(uint8)": "UINT8",
    "tensor(int8)": "INT8",
    "tensor(uint16)": "UINT16",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(string)": "BYTES",
    "tensor(bool)": "BOOL",
    "tensor(float16)": "FP16",
    "tensor(double)": "FP64",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(bfloat16)": "BF16",
}
