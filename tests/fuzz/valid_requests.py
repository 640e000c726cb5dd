"""Requests the server must accept (for each model under test, any batch and width, raw or typed contents), and
the Case that carries one through a test with the mutations applied to it."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

import numpy as np
from google.protobuf import text_format
from hypothesis import strategies as st

from generated import grpc_service_pb2 as pb

from .lab import LARGE_WIDTH, MAX_BATCH, MODELS

DATATYPES = (
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
    "BYTES",
)
ITEMSIZE = {
    "BOOL": 1,
    "UINT8": 1,
    "UINT16": 2,
    "UINT32": 4,
    "UINT64": 8,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "FP16": 2,
    "FP32": 4,
    "FP64": 8,
    "BF16": 2,
}
TYPED_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
CONTENT_FIELDS = (
    "bool_contents",
    "int_contents",
    "int64_contents",
    "uint_contents",
    "uint64_contents",
    "fp32_contents",
    "fp64_contents",
    "bytes_contents",
)
PARAMETER_KINDS = ("bool_param", "int64_param", "string_param", "double_param", "uint64_param")


@dataclass
class Case:
    """One generated request and how it was made."""

    request: pb.ModelInferRequest
    mutations: list[str] = field(default_factory=list)  # empty: a valid request, which must succeed

    def __repr__(self) -> str:
        shown = pb.ModelInferRequest()
        shown.CopyFrom(self.request)
        del shown.raw_input_contents[:]
        raw = [len(entry) for entry in self.request.raw_input_contents]
        text = text_format.MessageToString(shown, as_one_line=True)
        if len(text) > 3000:
            text = text[:3000] + " ..."
        head = [entry[:48] for entry in self.request.raw_input_contents]
        return f"Case(mutations={self.mutations}, raw_lengths={raw}, raw_heads={head}, request={{{text}}})"


TEXT_POOL = ("a", "Z", "0", " ", "\x00", "\n", "\u00e9", "\u6a21", "\U0001f600", "\u200b", "%", "'")


def _values(datatype: str, shape: tuple[int, ...], rng: np.random.Generator, *, specials: bool) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "INT32":
        flat = rng.integers(-(2**31), 2**31, count, dtype=np.int64).astype(np.int32)
        flat[: min(count, 2)] = [-(2**31), 2**31 - 1][: min(count, 2)]
    elif datatype == "FP32":
        flat = (rng.standard_normal(count) * 1000).astype(np.float32)
        extremes: list[float] = [np.inf, -np.inf, -0.0, float(np.finfo(np.float32).max)] + (
            [np.nan] if specials else []
        )
        flat[: min(count, len(extremes))] = extremes[: min(count, len(extremes))]
    else:  # BYTES: ONNX string tensors hold text, so valid elements are UTF-8 (any other bytes are refused)
        flat = np.empty(count, dtype=object)
        flat[:] = [
            "".join(TEXT_POOL[int(i)] for i in rng.integers(0, len(TEXT_POOL), int(n))).encode()
            for n in rng.integers(0, 12, count)
        ]
    return flat.reshape(shape)


def raw_of(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(e)) + e for e in array.reshape(-1))
    return np.ascontiguousarray(array, dtype=f"<{'i4' if datatype == 'INT32' else 'f4'}").tobytes()


def set_typed(tensor: pb.ModelInferRequest.InferInputTensor, array: np.ndarray, datatype: str) -> None:
    values = array.reshape(-1).tolist()
    getattr(tensor.contents, TYPED_FIELD[datatype]).extend(values)


@st.composite
def valid_requests(draw, models: tuple[str, ...] = tuple(sorted(MODELS))) -> Case:
    """A request the server must accept: one of `models`, any batch and width, raw or typed contents."""
    name = draw(st.sampled_from(models))
    model = MODELS[name]
    batch = draw(st.integers(1, MAX_BATCH))
    if model.width is not None:
        width = model.width
    else:
        width = draw(st.sampled_from((0, 1, 2, 3, 7, 16, 33, "large")))
        if width == "large":
            batch, width = 1, LARGE_WIDTH[name]
    typed = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    request = pb.ModelInferRequest(
        model_name=name, model_version=draw(st.sampled_from(("", "1"))), id=draw(st.text(max_size=12))
    )
    for input_name, datatype in model.inputs:
        array = _values(datatype, (batch, width), rng, specials=not typed)
        tensor = request.inputs.add(name=input_name, datatype=datatype, shape=[batch, width])
        if typed:
            set_typed(tensor, array, datatype)
        else:
            request.raw_input_contents.append(raw_of(array, datatype))
    requested = draw(
        st.one_of(st.none(), st.lists(st.sampled_from([o for o, _ in model.outputs]), min_size=1, unique=True))
    )
    for output in requested or ():
        asked = request.outputs.add(name=output)
        if draw(st.booleans()):
            asked.parameters["binary_data"].bool_param = True  # what tritonclient sends
    timeout = draw(
        st.sampled_from((None, ("int64_param", 0), ("int64_param", 30_000_000), ("uint64_param", 60_000_000)))
    )
    if timeout is not None:
        setattr(request.parameters["timeout"], *timeout)
    return Case(request)


@st.composite
def gated_requests(draw) -> Case:
    """A valid request to `gated`, half of them with a short `timeout` parameter (1..5000 us)."""
    case = draw(valid_requests(("gated",)))
    if draw(st.booleans()):
        case.request.parameters["timeout"].int64_param = draw(st.integers(1, 5_000))
        case.mutations.append("short timeout")  # may be refused as server_busy: not held to "valid must pass"
    return case
