"""Hostile input: thousands of generated ModelInfer requests, valid and corrupt, against a real server.

A real in-process server (service.testing.serve, port 0, the parallel runtime with one slot and a queue of one per
model) serves the demo models `simple`, `simple_identity` and `identity_fp32`, plus `gated`, a fixture model
(output = input) whose execute gate the concurrent test holds to make requests queue and be refused. Hypothesis
builds requests as a valid request for one of them (raw or typed contents, any batch and width, messages small
and over 64 KiB, requested outputs, parameters) followed by zero or more mutations: unknown or odd model names
and versions, input names, datatypes (every KServe datatype with contents that fit it, and invalid strings),
shapes (negative, zero, huge, wrong rank), raw contents (wrong lengths, random bytes, truncated BYTES prefixes,
wrong entry counts), typed contents of every kind (wrong kind, wrong count, out of range, raw and typed together),
parameters (`timeout` of every InferParameter kind and value, unknown keys of every kind), requested outputs
(unknown, duplicated, with parameters) and tensor parameters. The requests go through the raw generated
stub, since the client library refuses to build most of them.

What every test asserts:
* every call ends, each with a per-call bound (a call that does not end is reported as a hang), with a status in
  {OK, INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE}: never INTERNAL or UNKNOWN;
* an unknown model is NOT_FOUND; an unmutated valid request succeeds (where nothing else competes for slots);
* an OK response is well-formed (one raw_output_contents entry per output, the outputs asked for, lengths that
  fit the shape and datatype, id and model echoed) and correct: the outputs are recomputed from the request's
  own bytes with numpy, independently of the server's codec;
* afterwards the server answers a valid request correctly, no model has a leased slot or a queued request, and
  its statistics count every OK response as exactly one success (and each refusal of a known model at most once).

The fuzzer's findings are kept as explicit tests below: status messages that echo long request strings
(test_a_long_string_in_a_request_keeps_its_status, fixed in service/status_codes.py) and large messages with a group field
(test_a_large_message_with_a_group_field_is_read_as_protobuf_reads_it, fixed in service/wire.py).

Undecodable bytes (random bytes, corrupted serialized requests, unknown fields of every wire type) are sent
through a generic method with identity serializers: bytes that protobuf decodes must be treated like any request
(allowed statuses only); bytes protobuf cannot decode may get gRPC's own INTERNAL "Exception deserializing
request!" (the deserializer runs in grpc before any handler; see test_undecodable_bytes) and the server must
keep serving. Oversize messages are refused by the configured --max-message-bytes with RESOURCE_EXHAUSTED, and
the next small request succeeds.

`SLOTSERVE_FUZZ_SCALE=10 pytest tests/fuzz` multiplies every example count for a longer run.
"""

from __future__ import annotations

import math
import os
import struct
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest
from google.protobuf import text_format
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from client import ClientError
from engine.fixture import FixtureBackend, FixtureControls
from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from service.testing import serve
from tests.integration._support import demo_subset, write_fixture_model

ALLOWED = frozenset({"OK", "INVALID_ARGUMENT", "NOT_FOUND", "UNAVAILABLE"})
CALL_TIMEOUT = 20.0  # seconds: the gRPC deadline of a call; a call still running then counts as a hang
NO_DEADLINE = 400 * 24 * 3600.0  # a deadline beyond a year: the server treats the call as having none
SCALE = float(os.environ.get("SLOTSERVE_FUZZ_SCALE", "1"))
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
# gRPC's own status when a request deserializer raises (before any handler of slotserve runs).
GRPC_DESERIALIZE_FAILURE = "Exception deserializing request!"
# Messages slotserve gives for INTERNAL errors (service/status_codes.py); never acceptable on a stream either.
INTERNAL_MESSAGES = ("internal error (reference", "the model failed to execute this request")


def examples(count: int) -> int:
    return max(1, int(count * SCALE))


FUZZ = settings(deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.large_base_example, HealthCheck.filter_too_much])


# ---- the models under test -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Model:
    inputs: tuple[tuple[str, str], ...]  # (name, datatype)
    outputs: tuple[tuple[str, str], ...]
    width: int | None  # the fixed dimension after the batch dimension; None: variable (-1)


MODELS = {
    "simple": Model((("INPUT0", "INT32"), ("INPUT1", "INT32")), (("OUTPUT0", "INT32"), ("OUTPUT1", "INT32")), 16),
    "simple_identity": Model((("INPUT0", "BYTES"),), (("OUTPUT0", "BYTES"),), None),
    "identity_fp32": Model((("INPUT0", "FP32"),), (("OUTPUT0", "FP32"),), None),
    # A fixture model (output = input) whose execute gate the concurrent test holds to fill its queue.
    "gated": Model((("INPUT0", "FP32"),), (("OUTPUT0", "FP32"),), None),
}
DEMO_MODELS = ("simple", "simple_identity", "identity_fp32")
MAX_BATCH = 8
# Widths that make a request larger than 64 KiB, so service/wire.py's own parser (not protobuf's) reads it.
LARGE_WIDTH = {"simple_identity": 6_000, "identity_fp32": 20_000, "gated": 20_000}

DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BF16", "BYTES")
ITEMSIZE = {"BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8, "INT8": 1, "INT16": 2, "INT32": 4,
            "INT64": 8, "FP16": 2, "FP32": 4, "FP64": 8, "BF16": 2}
TYPED_FIELD = {"BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
               "UINT32": "uint_contents", "UINT64": "uint64_contents", "INT8": "int_contents",
               "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
               "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}
CONTENT_FIELDS = ("bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents",
                  "fp32_contents", "fp64_contents", "bytes_contents")
PARAMETER_KINDS = ("bool_param", "int64_param", "string_param", "double_param", "uint64_param")


@dataclass
class Lab:
    running: object  # service.testing.RunningServer
    controls: FixtureControls


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    repository = demo_subset(tmp_path_factory.mktemp("fuzz") / "repository", *DEMO_MODELS)
    write_fixture_model(repository, "gated", inputs=[("INPUT0", "FP32", [-1])], outputs=[("OUTPUT0", "FP32", [-1])],
                        max_batch_size=MAX_BATCH)
    controls = FixtureControls()
    # One slot and a queue of one per model: concurrent examples meet waits and queue-full refusals.
    with serve(repository, backends={"fixture": FixtureBackend(controls)}, parallel_jobs=1, max_queue=1) as server:
        try:
            yield Lab(server, controls)
        finally:
            controls.release_all()


@pytest.fixture(scope="module")
def running(lab):
    return lab.running


@pytest.fixture(scope="module")
def stub(running) -> pb_grpc.GRPCInferenceServiceStub:
    return pb_grpc.GRPCInferenceServiceStub(running.client.channel)


# ---- generated requests ----------------------------------------------------------------------------------------

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
        flat = rng.integers(-2**31, 2**31, count, dtype=np.int64).astype(np.int32)
        flat[:min(count, 2)] = [-2**31, 2**31 - 1][:min(count, 2)]
    elif datatype == "FP32":
        flat = (rng.standard_normal(count) * 1000).astype(np.float32)
        extremes = [np.inf, -np.inf, -0.0, np.finfo(np.float32).max] + ([np.nan] if specials else [])
        flat[:min(count, len(extremes))] = extremes[:min(count, len(extremes))]
    else:  # BYTES: ONNX string tensors hold text, so valid elements are UTF-8 (any other bytes are refused)
        flat = np.empty(count, dtype=object)
        flat[:] = ["".join(TEXT_POOL[int(i)] for i in rng.integers(0, len(TEXT_POOL), int(n))).encode()
                   for n in rng.integers(0, 12, count)]
    return flat.reshape(shape)


def raw_of(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(e)) + e for e in array.reshape(-1))
    return np.ascontiguousarray(array, dtype=f"<{'i4' if datatype == 'INT32' else 'f4'}").tobytes()


def set_typed(tensor: pb.InferInputTensor, array: np.ndarray, datatype: str) -> None:
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
    request = pb.ModelInferRequest(model_name=name, model_version=draw(st.sampled_from(("", "1"))),
                                   id=draw(st.text(max_size=12)))
    for input_name, datatype in model.inputs:
        array = _values(datatype, (batch, width), rng, specials=not typed)
        tensor = request.inputs.add(name=input_name, datatype=datatype, shape=[batch, width])
        if typed:
            set_typed(tensor, array, datatype)
        else:
            request.raw_input_contents.append(raw_of(array, datatype))
    requested = draw(st.one_of(st.none(), st.lists(st.sampled_from([o for o, _ in model.outputs]), min_size=1,
                                                   unique=True)))
    for output in requested or ():
        tensor = request.outputs.add(name=output)
        if draw(st.booleans()):
            tensor.parameters["binary_data"].bool_param = True  # what tritonclient sends
    timeout = draw(st.sampled_from((None, ("int64_param", 0), ("int64_param", 30_000_000),
                                    ("uint64_param", 60_000_000))))
    if timeout is not None:
        setattr(request.parameters["timeout"], *timeout)
    return Case(request)


# Strategies for the pieces mutations put in.
ODD_NAMES = st.one_of(
    st.sampled_from(("", "SIMPLE", "simple ", " simple", "simple\x00", "simple/1", "../simple", "simple_identity2",
                     "matmul_chain", "silero_vad", "identity_fp32\n", "x" * 1000, "\u00e9\u6a21\u578b", "*"))
    , st.text(max_size=40))
VERSIONS = st.one_of(st.sampled_from(("0", "2", "01", "1 ", " 1", "abc", "-1", "1.0", "99999999999999999999999",
                                      "\u0661", "\u00b2", "1\x00")), st.text(max_size=12))
INPUT_NAMES = st.one_of(st.sampled_from(("INPUT0", "INPUT1", "INPUT2", "OUTPUT0", "input0", "", "INPUT0 ")),
                        st.text(max_size=20))
DATATYPE_STRINGS = st.one_of(st.sampled_from(DATATYPES),
                             st.sampled_from(("", "int32", "INT33", "FLOAT", "TYPE_INT32", "STRING", "FP8", "INT",
                                              "BYTES\x00", "FP 32")),
                             st.text(max_size=10))
DIMENSIONS = st.one_of(st.sampled_from((-1, 0, 1, 8, 9, 16, 17, 2**31, 2**34, 2**40, 2**40 + 1, 2**62, 2**63 - 1,
                                        -2**63)),
                       st.integers(-2**63, 2**63 - 1), st.integers(-3, 40))
FIELD_VALUES = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-2**31, 2**31 - 1),
    "int64_contents": st.integers(-2**63, 2**63 - 1),
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=16),
}


@st.composite
def parameter_values(draw, parameter: pb.InferParameter) -> str:
    """Set `parameter` to any kind with any value; returns a description."""
    kind = draw(st.sampled_from(PARAMETER_KINDS))
    value = draw({
        "bool_param": st.booleans(),
        "int64_param": st.one_of(st.sampled_from((-1, 0, 1, 1000, 2**63 - 1, -2**63, 10**12)),
                                 st.integers(-2**63, 2**63 - 1)),
        "string_param": st.one_of(st.sampled_from(("5", "1000", "", "-1", "inf")), st.text(max_size=10)),
        "double_param": st.floats(),
        "uint64_param": st.one_of(st.sampled_from((0, 1, 2**63, 2**64 - 1)), st.integers(0, 2**64 - 1)),
    }[kind])
    setattr(parameter, kind, value)
    return f"{kind}={value!r}"


def _pick(draw, sequence) -> int:
    return draw(st.integers(0, len(sequence) - 1))


def _uses_raw(request: pb.ModelInferRequest) -> bool:
    return len(request.raw_input_contents) > 0


def mutate_model_name(draw, request):
    request.model_name = draw(ODD_NAMES)
    return f"model_name={request.model_name[:60]!r}"


def mutate_version(draw, request):
    request.model_version = draw(VERSIONS)
    return f"model_version={request.model_version!r}"


def mutate_id(draw, request):
    request.id = draw(st.one_of(st.text(max_size=30), st.just("i" * 5000)))
    return "id"


def mutate_input_name(draw, request):
    if not request.inputs:
        return None
    index = _pick(draw, request.inputs)
    request.inputs[index].name = draw(INPUT_NAMES)
    return f"inputs[{index}].name={request.inputs[index].name!r}"


def mutate_drop_input(draw, request):
    if not request.inputs:
        return None
    index = _pick(draw, request.inputs)
    del request.inputs[index]
    if len(request.raw_input_contents) > index and draw(st.booleans()):
        del request.raw_input_contents[index]
    return f"drop inputs[{index}]"


def mutate_duplicate_input(draw, request):
    if not request.inputs:
        return None
    index = _pick(draw, request.inputs)
    request.inputs.add().CopyFrom(request.inputs[index])
    if len(request.raw_input_contents) > index:
        request.raw_input_contents.append(request.raw_input_contents[index])
    return f"duplicate inputs[{index}]"


def mutate_extra_input(draw, request):
    datatype = draw(DATATYPE_STRINGS)
    shape = draw(st.lists(DIMENSIONS, max_size=4))
    tensor = request.inputs.add(name=draw(INPUT_NAMES), datatype=datatype, shape=shape)
    if _uses_raw(request) or draw(st.booleans()):
        request.raw_input_contents.append(draw(st.binary(max_size=80)))
    else:
        kind = draw(st.sampled_from(CONTENT_FIELDS))
        getattr(tensor.contents, kind).extend(draw(st.lists(FIELD_VALUES[kind], max_size=20)))
    return f"extra input {tensor.name!r} {datatype!r} {shape}"


def mutate_datatype(draw, request):
    if not request.inputs:
        return None
    index = _pick(draw, request.inputs)
    request.inputs[index].datatype = draw(DATATYPE_STRINGS)
    return f"inputs[{index}].datatype={request.inputs[index].datatype!r}"


def mutate_shape(draw, request):
    if not request.inputs:
        return None
    index = _pick(draw, request.inputs)
    shape = list(request.inputs[index].shape)
    how = draw(st.sampled_from(("set", "append", "remove", "clear", "replace")))
    if how == "set" and shape:
        shape[_pick(draw, shape)] = draw(DIMENSIONS)
    elif how == "append":
        shape.append(draw(DIMENSIONS))
    elif how == "remove" and shape:
        shape.pop(_pick(draw, shape))
    elif how == "clear":
        shape = []
    else:
        shape = draw(st.lists(DIMENSIONS, max_size=6))
    del request.inputs[index].shape[:]
    request.inputs[index].shape.extend(shape)
    return f"inputs[{index}].shape={shape}"


def mutate_raw_length(draw, request):
    if not _uses_raw(request):
        return None
    index = _pick(draw, request.raw_input_contents)
    entry = request.raw_input_contents[index]
    how = draw(st.sampled_from(("truncate", "extend", "random", "empty")))
    if how == "truncate":
        entry = entry[:draw(st.integers(0, max(0, len(entry) - 1)))]
    elif how == "extend":
        entry = entry + draw(st.binary(min_size=1, max_size=9))
    elif how == "random":
        entry = draw(st.binary(max_size=200))
    else:
        entry = b""
    request.raw_input_contents[index] = entry
    return f"raw[{index}] {how} -> {len(entry)} bytes"


def mutate_raw_count(draw, request):
    how = draw(st.sampled_from(("add", "drop", "only_one")))
    if how == "add":
        request.raw_input_contents.append(draw(st.binary(max_size=64)))
    elif how == "drop" and _uses_raw(request):
        del request.raw_input_contents[_pick(draw, request.raw_input_contents)]
    elif how == "only_one" and request.inputs:
        # Typed contents everywhere else, raw bytes for one input: a mix the protocol does not allow.
        request.raw_input_contents.append(draw(st.binary(max_size=64)))
    else:
        return None
    return f"raw_input_contents {how} -> {len(request.raw_input_contents)} entries"


def mutate_bytes_prefix(draw, request):
    """Corrupt length-prefixed BYTES contents: a truncated prefix, a prefix longer than what remains, extra or
    missing elements."""
    if not _uses_raw(request):
        return None
    index = _pick(draw, request.raw_input_contents)
    entry = request.raw_input_contents[index]
    how = draw(st.sampled_from(("truncated_prefix", "long_prefix", "huge_prefix", "extra_element", "cut")))
    if how == "truncated_prefix":
        entry = entry + draw(st.binary(min_size=1, max_size=3))
    elif how == "long_prefix":
        declared = draw(st.integers(1, 100))
        entry = entry + struct.pack("<I", declared) + draw(st.binary(max_size=declared - 1))
    elif how == "huge_prefix":
        entry = struct.pack("<I", 0xFFFFFFFF) + entry
    elif how == "extra_element":
        element = draw(st.binary(max_size=8))
        entry = entry + struct.pack("<I", len(element)) + element
    else:
        entry = entry[:draw(st.integers(0, max(0, len(entry) - 1)))]
    request.raw_input_contents[index] = entry
    return f"raw[{index}] BYTES {how}"


def mutate_typed_kind(draw, request):
    """Typed contents of any kind (possibly several kinds at once, possibly next to raw contents)."""
    if not request.inputs:
        return None
    index = _pick(draw, request.inputs)
    contents = request.inputs[index].contents
    if draw(st.booleans()):
        request.inputs[index].ClearField("contents")
    kinds = draw(st.lists(st.sampled_from(CONTENT_FIELDS), min_size=1, max_size=3, unique=True))
    for kind in kinds:
        getattr(contents, kind).extend(draw(st.lists(FIELD_VALUES[kind], max_size=40)))
    return f"inputs[{index}].contents kinds {kinds}"


def mutate_typed_count(draw, request):
    if not request.inputs:
        return None
    index = _pick(draw, request.inputs)
    contents = request.inputs[index].contents
    present = [kind for kind in CONTENT_FIELDS if len(getattr(contents, kind))]
    if not present:
        return None
    kind = draw(st.sampled_from(present))
    values = getattr(contents, kind)
    if draw(st.booleans()):
        del values[draw(st.integers(0, len(values) - 1)):]
    else:
        values.extend(draw(st.lists(FIELD_VALUES[kind], min_size=1, max_size=5)))
    return f"inputs[{index}].{kind} count -> {len(values)}"


def mutate_both(draw, request):
    """Raw and typed contents in one request."""
    if not request.inputs:
        return None
    if _uses_raw(request):
        index = _pick(draw, request.inputs)
        kind = draw(st.sampled_from(CONTENT_FIELDS))
        getattr(request.inputs[index].contents, kind).extend(draw(st.lists(FIELD_VALUES[kind], max_size=20)))
        return f"typed {kind} next to raw on inputs[{index}]"
    request.raw_input_contents.extend(draw(st.binary(max_size=64)) for _ in request.inputs)
    return "raw next to typed on every input"


def mutate_retype(draw, request):
    """Another valid datatype with contents that fit it (same element count): decodes, then meets the model."""
    if not request.inputs:
        return None
    index = _pick(draw, request.inputs)
    tensor = request.inputs[index]
    datatype = draw(st.sampled_from(DATATYPES))
    tensor.datatype = datatype
    count = math.prod(tensor.shape) if all(0 <= d <= 64 for d in tensor.shape) else draw(st.integers(0, 8))
    count = min(count, 256)
    if _uses_raw(request) and index < len(request.raw_input_contents):
        if datatype == "BYTES":
            elements = draw(st.lists(st.binary(max_size=6), min_size=count, max_size=count))
            request.raw_input_contents[index] = b"".join(struct.pack("<I", len(e)) + e for e in elements)
        else:
            request.raw_input_contents[index] = draw(st.binary(min_size=count * ITEMSIZE[datatype],
                                                               max_size=count * ITEMSIZE[datatype]))
    else:
        tensor.ClearField("contents")
        kind = TYPED_FIELD.get(datatype) or draw(st.sampled_from(CONTENT_FIELDS))
        getattr(tensor.contents, kind).extend(draw(st.lists(FIELD_VALUES[kind], min_size=count, max_size=count)))
    return f"inputs[{index}] retyped {datatype}"


def mutate_clear_contents(draw, request):
    if _uses_raw(request) and draw(st.booleans()):
        del request.raw_input_contents[:]
        return "no raw contents"
    if not request.inputs:
        return None
    index = _pick(draw, request.inputs)
    request.inputs[index].ClearField("contents")
    return f"inputs[{index}] without typed contents"


def mutate_timeout(draw, request):
    return "timeout " + draw(parameter_values(request.parameters["timeout"]))


def mutate_parameters(draw, request):
    key = draw(st.one_of(st.sampled_from(("priority", "sequence_id", "binary_data_output", "Timeout", "timeout ",
                                          "headers", "")), st.text(max_size=12)))
    return f"parameter {key!r} " + draw(parameter_values(request.parameters[key]))


def mutate_tensor_parameters(draw, request):
    if not request.inputs:
        return None
    index = _pick(draw, request.inputs)
    key = draw(st.one_of(st.sampled_from(("shared_memory_region", "shared_memory_byte_size",
                                          "shared_memory_offset", "binary_data_size", "")), st.text(max_size=12)))
    return f"inputs[{index}] parameter {key!r} " + draw(parameter_values(request.inputs[index].parameters[key]))


def mutate_output_unknown(draw, request):
    name = draw(st.one_of(st.sampled_from(("OUTPUT2", "OUTPUT7", "INPUT0", "", "output0")), st.text(max_size=12)))
    request.outputs.add(name=name)
    return f"requested output {name!r}"


def mutate_output_duplicate(draw, request):
    name = draw(st.sampled_from(("OUTPUT0", "OUTPUT1")))
    request.outputs.add(name=name)
    request.outputs.add(name=name)
    return f"output {name!r} requested twice"


def mutate_output_parameters(draw, request):
    if not request.outputs:
        request.outputs.add(name=draw(st.sampled_from(("OUTPUT0", "OUTPUT1"))))
    index = _pick(draw, request.outputs)
    key = draw(st.one_of(st.sampled_from(("classification", "binary_data", "shared_memory_region",
                                          "shared_memory_byte_size", "")), st.text(max_size=12)))
    return (f"outputs[{index}] parameter {key!r} "
            + draw(parameter_values(request.outputs[index].parameters[key])))


MUTATIONS: tuple[Callable, ...] = (
    mutate_model_name, mutate_version, mutate_id, mutate_input_name, mutate_drop_input, mutate_duplicate_input,
    mutate_extra_input, mutate_datatype, mutate_shape, mutate_raw_length, mutate_raw_count, mutate_bytes_prefix,
    mutate_typed_kind, mutate_typed_count, mutate_both, mutate_retype, mutate_clear_contents, mutate_timeout,
    mutate_parameters, mutate_tensor_parameters, mutate_output_unknown, mutate_output_duplicate,
    mutate_output_parameters,
)


@st.composite
def cases(draw) -> Case:
    """A valid request (about one in six) or one with one to four mutations."""
    case = draw(valid_requests())
    mutations = [] if draw(st.integers(0, 5)) == 0 else draw(st.lists(st.sampled_from(MUTATIONS), min_size=1,
                                                                       max_size=4))
    for mutation in mutations:
        what = mutation(draw, case.request)
        if what is not None:
            case.mutations.append(what)
    return case


@st.composite
def gated_requests(draw) -> Case:
    """A valid request to `gated`, half of them with a short `timeout` parameter (1..5000 us)."""
    case = draw(valid_requests(("gated",)))
    if draw(st.booleans()):
        case.request.parameters["timeout"].int64_param = draw(st.integers(1, 5_000))
        case.mutations.append("short timeout")  # may be refused as server_busy: not held to "valid must pass"
    return case


# ---- checking outcomes -----------------------------------------------------------------------------------------

def parse_bytes(buffer: bytes) -> list[bytes]:
    elements, offset = [], 0
    while offset < len(buffer):
        assert offset + 4 <= len(buffer), "BYTES output with a truncated length prefix"
        (length,) = struct.unpack_from("<I", buffer, offset)
        offset += 4
        assert offset + length <= len(buffer), "BYTES output element longer than the contents"
        elements.append(bytes(buffer[offset:offset + length]))
        offset += length
    return elements


def request_input(request: pb.ModelInferRequest, name: str) -> tuple[str, list[int], object]:
    """(datatype, shape, flat values) of an input of an accepted request, decoded here with numpy/struct."""
    for index, tensor in enumerate(request.inputs):
        if tensor.name == name:
            if request.raw_input_contents:
                raw = request.raw_input_contents[index]
                if tensor.datatype == "BYTES":
                    return tensor.datatype, list(tensor.shape), parse_bytes(raw)
                return tensor.datatype, list(tensor.shape), np.frombuffer(raw, dtype=_dtype(tensor.datatype))
            values = getattr(tensor.contents, TYPED_FIELD[tensor.datatype])
            if tensor.datatype == "BYTES":
                return tensor.datatype, list(tensor.shape), list(values)
            return tensor.datatype, list(tensor.shape), np.array(values, dtype=_dtype(tensor.datatype))
    raise AssertionError(f"accepted request has no input {name!r}")


def _dtype(datatype: str) -> np.dtype:
    return np.dtype({"INT32": "<i4", "FP32": "<f4"}[datatype])


def expected_outputs(request: pb.ModelInferRequest) -> dict[str, tuple[str, list[int], object]]:
    """What the model must return for an accepted request, computed from the request's own contents."""
    if request.model_name == "simple":
        datatype, shape, first = request_input(request, "INPUT0")
        _, _, second = request_input(request, "INPUT1")
        with np.errstate(over="ignore"):
            return {"OUTPUT0": (datatype, shape, first + second), "OUTPUT1": (datatype, shape, first - second)}
    return {"OUTPUT0": request_input(request, "INPUT0")}


def check_response(request: pb.ModelInferRequest, response: pb.ModelInferResponse) -> None:
    """An OK response is well-formed and correct for the request that produced it."""
    assert request.model_name in MODELS, f"OK for unknown model {request.model_name!r}"
    model = MODELS[request.model_name]
    produced = dict(model.outputs)
    names = [tensor.name for tensor in response.outputs]
    assert len(response.raw_output_contents) == len(response.outputs), \
        f"{len(response.raw_output_contents)} raw_output_contents for {len(response.outputs)} outputs"
    assert len(set(names)) == len(names), f"duplicate outputs {names}"
    wanted = {output.name for output in request.outputs} or set(produced)
    assert set(names) == wanted, f"outputs {names}, asked for {sorted(wanted)}"
    assert response.model_name == request.model_name
    assert response.model_version == "1"
    assert response.id == request.id
    expected = expected_outputs(request)
    for tensor, raw in zip(response.outputs, response.raw_output_contents):
        datatype, shape, values = expected[tensor.name]
        assert tensor.datatype == produced[tensor.name] == datatype
        assert list(tensor.shape) == shape, f"{tensor.name} shape {list(tensor.shape)}, input shape {shape}"
        if datatype == "BYTES":
            assert parse_bytes(raw) == list(values), f"{tensor.name} differs from the input"
        else:
            assert len(raw) == math.prod(shape) * 4, f"{tensor.name}: {len(raw)} bytes for shape {shape}"
            got = np.frombuffer(raw, dtype=_dtype(datatype))
            assert got.tobytes() == np.asarray(values, dtype=_dtype(datatype)).tobytes(), \
                f"{tensor.name} values differ"


def known_version(request: pb.ModelInferRequest) -> bool:
    return request.model_version in ("", "1")


@dataclass
class Ledger:
    """What the test saw, per model, to compare with the server's statistics afterwards."""

    ok: Counter = field(default_factory=Counter)  # OK responses
    reached: Counter = field(default_factory=Counter)  # non-OK answers to a known model and version
    known_model: Counter = field(default_factory=Counter)  # non-OK answers to a known model, any version
    statuses: Counter = field(default_factory=Counter)

    def record(self, request: pb.ModelInferRequest, code: str) -> None:
        self.statuses[code] += 1
        name = request.model_name
        if name not in MODELS:
            return
        if code == "OK":
            self.ok[name] += 1
        else:
            self.known_model[name] += 1
            if known_version(request):
                self.reached[name] += 1


def check_status(case: Case, code: str, error: ClientError | None, *, alone: bool) -> None:
    """The status rules of every answer. `alone`: nothing else competed for the model's slots."""
    assert code in ALLOWED, f"status {code} ({error}) for {case!r}"
    if case.request.model_name not in MODELS:
        assert code == "NOT_FOUND", f"unknown model answered {code} ({error})"
    if not case.mutations:
        allowed = {"OK"} if alone else {"OK", "UNAVAILABLE"}
        assert code in allowed, f"valid request answered {code} ({error})"
    if code == "UNAVAILABLE":
        assert error is not None and error.reason == "server_busy", f"UNAVAILABLE for {error}"
    if error is not None:
        assert error.domain == "slotserve", f"{code} without slotserve's ErrorInfo: {error!r}"


def statistics(running) -> dict[str, tuple[int, int]]:
    """(success count, fail count) per model from ModelStatistics."""
    return {s.name: (s.inference_stats.success.count, s.inference_stats.fail.count)
            for s in running.client.statistics(timeout=10)}


def wait_idle(running, timeout: float = 10.0) -> list:
    """ListModels until no model has a leased slot or a queued request (bounded); the last statuses."""
    deadline = time.monotonic() + timeout
    while True:
        models = running.management.list(timeout=10)
        busy = [m for m in models if m.active_slots or m.queued_requests]
        if not busy or time.monotonic() > deadline:
            return models
        time.sleep(0.01)  # ordering-free: re-checks a state predicate


def assert_server_clean(running, stub, ledger: Ledger, before: dict[str, tuple[int, int]]) -> None:
    """After a fuzz run: no leased slot or queued request, statistics that match what the test saw, and a valid
    request answered correctly."""
    models = wait_idle(running)
    for status in models:
        assert status.state == "READY" and status.loaded, status
        assert status.active_slots == 0, f"{status.model_id}: {status.active_slots} slot(s) still leased"
        assert status.queued_requests == 0, f"{status.model_id}: {status.queued_requests} request(s) still queued"
    after = statistics(running)
    for name in MODELS:
        success = after[name][0] - before[name][0]
        fail = after[name][1] - before[name][1]
        assert success == ledger.ok[name], f"{name}: {success} successes counted, {ledger.ok[name]} OK seen"
        assert ledger.reached[name] <= fail <= ledger.known_model[name], \
            f"{name}: {fail} failures counted, {ledger.reached[name]}..{ledger.known_model[name]} expected"
    first = np.arange(32, dtype=np.int32).reshape(2, 16)
    second = np.full((2, 16), 7, dtype=np.int32)
    outputs = running.client.infer("simple", {"INPUT0": first, "INPUT1": second}, timeout=CALL_TIMEOUT)
    np.testing.assert_array_equal(outputs["OUTPUT0"], first + second)
    np.testing.assert_array_equal(outputs["OUTPUT1"], first - second)
    request = pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 3]).contents.fp32_contents.extend([1.5, -2, 0])
    response = stub.ModelInfer(request, timeout=CALL_TIMEOUT)
    assert np.frombuffer(response.raw_output_contents[0], "<f4").tolist() == [1.5, -2.0, 0.0]


def summary(ledger: Ledger) -> str:
    return ", ".join(f"{code} {count}" for code, count in sorted(ledger.statuses.items()))


# ---- the tests -------------------------------------------------------------------------------------------------

def test_infer_fuzz_sequential(running, stub):
    """One request at a time: every status allowed, valid requests succeed, OK responses correct."""
    ledger = Ledger()
    before = statistics(running)

    @settings(FUZZ, max_examples=examples(2200))
    @given(case=cases())
    def one(case: Case) -> None:
        note(repr(case))
        try:
            response = stub.ModelInfer(case.request, timeout=CALL_TIMEOUT)
            code, error = "OK", None
        except grpc.RpcError as rpc_error:
            error = ClientError.from_rpc_error(rpc_error)
            code = error.code
        ledger.record(case.request, code)
        assert code != "DEADLINE_EXCEEDED", f"the call did not end within {CALL_TIMEOUT} s (a hang)"
        check_status(case, code, error, alone=True)
        if code == "OK":
            check_response(case.request, response)

    one()
    print(f"\nsequential fuzz: {sum(ledger.statuses.values())} requests: {summary(ledger)}")
    assert_server_clean(running, stub, ledger, before)


def test_infer_fuzz_concurrent(lab, running, stub):
    """Batches of generated requests sent at once (one slot and a queue of one per model), some with a deadline
    and some without one (as the server sees it). In half the batches the fixture model `gated` holds its slot
    at its execute gate until every other answer is in, so its requests queue, time out on their `timeout`
    parameter or find the queue full: admission refusals meet corrupt input."""
    ledger = Ledger()
    before = statistics(running)

    @settings(FUZZ, max_examples=examples(130))
    @given(batch=st.lists(st.tuples(st.one_of(cases(), gated_requests()), st.booleans()), min_size=2, max_size=12),
           hold=st.booleans())
    def burst(batch: list[tuple[Case, bool]], hold: bool) -> None:
        gate = lab.controls.gate("gated", "execute")
        if hold:
            gate.hold()  # the request that takes gated's one slot stays there; the next queues, later ones are refused
        futures = [stub.ModelInfer.future(case.request, timeout=CALL_TIMEOUT if bounded else NO_DEADLINE)
                   for case, bounded in batch]
        held = [i for i, (case, _) in enumerate(batch) if case.request.model_name == "gated"]
        order = [i for i in range(len(batch)) if i not in held] + held  # gated's answers last, after the release
        try:
            for position, index in enumerate(order):
                if position == len(order) - len(held):
                    gate.release()
                case, future = batch[index][0], futures[index]
                try:
                    response = future.result(timeout=CALL_TIMEOUT)
                    code, error = "OK", None
                except grpc.FutureTimeoutError:
                    raise AssertionError(f"the call did not end within {CALL_TIMEOUT} s (a hang): {case!r}") from None
                except grpc.RpcError as rpc_error:
                    error = ClientError.from_rpc_error(rpc_error)
                    code = error.code
                ledger.record(case.request, code)
                assert code != "DEADLINE_EXCEEDED", f"the call did not end within {CALL_TIMEOUT} s: {case!r}"
                check_status(case, code, error, alone=False)
                if code == "OK":
                    check_response(case.request, response)
        finally:
            gate.release()
            for future in futures:
                future.cancel()  # no-op for finished calls; a hung one must not outlive the example

    burst()
    print(f"\nconcurrent fuzz: {sum(ledger.statuses.values())} requests: {summary(ledger)}")
    assert_server_clean(running, stub, ledger, before)


def test_stream_fuzz(running, stub):
    """The same requests on ModelStreamInfer: one answer per request, in order; an error is an error_message
    that is never an internal error; the stream itself ends OK."""
    ledger = Ledger()
    before = statistics(running)

    @settings(FUZZ, max_examples=examples(150))
    @given(batch=st.lists(cases(), min_size=1, max_size=6))
    def stream(batch: list[Case]) -> None:
        call = stub.ModelStreamInfer(iter([case.request for case in batch]), timeout=CALL_TIMEOUT)
        try:
            answers = list(call)
        except grpc.RpcError as rpc_error:
            raise AssertionError(f"the stream failed: {ClientError.from_rpc_error(rpc_error)}") from None
        assert len(answers) == len(batch), f"{len(answers)} answers for {len(batch)} requests"
        for case, answer in zip(batch, answers):
            code = "OK" if not answer.error_message else "ERROR"
            ledger.record(case.request, code)
            if answer.error_message:
                assert not answer.error_message.startswith(INTERNAL_MESSAGES), \
                    f"internal error {answer.error_message!r} for {case!r}"
                assert answer.infer_response.id == case.request.id
                assert case.mutations, f"valid request failed on a stream: {answer.error_message!r}"
            else:
                assert case.request.model_name in MODELS, f"answered unknown model: {case!r}"
                check_response(case.request, answer.infer_response)

    stream()
    print(f"\nstream fuzz: {sum(ledger.statuses.values())} requests: {summary(ledger)}")
    assert_server_clean(running, stub, ledger, before)


# ---- long strings echoed in error messages ---------------------------------------------------------------------

def _long(field: str, text: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16]).contents.int_contents.extend(range(16))
    if field == "model_name":
        request.model_name = text
    elif field == "input_name":
        request.inputs[1].name = text
    elif field == "datatype":
        request.inputs[1].datatype = text
    else:
        request.outputs.add(name=text)
    return request


@pytest.mark.parametrize("field, text, code", [
    ("model_name", "x" * 10_000, "NOT_FOUND"),
    ("model_name", "\u00e9" * 3_000, "NOT_FOUND"),
    ("input_name", "I" * 10_000, "INVALID_ARGUMENT"),
    ("datatype", "D" * 10_000, "INVALID_ARGUMENT"),
    ("output_name", "O" * 10_000, "INVALID_ARGUMENT"),
])
def test_a_long_string_in_a_request_keeps_its_status(stub, field, text, code):
    """Found by the fuzzer (a 10,000-character model name came back RESOURCE_EXHAUSTED, not NOT_FOUND)."""
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(_long(field, text), timeout=CALL_TIMEOUT)
    assert info.value.code().name == code, info.value.details()[:300]
    assert f"({len(text)} characters)" in info.value.details()  # the string is shortened, its length named


# ---- bytes that may not be a message at all --------------------------------------------------------------------

def _varint(value: int) -> bytes:
    # Written again on purpose rather than imported from service/wire.py: the fuzzer must not share the code
    # it tests.
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@st.composite
def unknown_fields(draw) -> bytes:
    """One field of any wire type (groups included), field numbers known and unknown; well-formed or not."""
    number = draw(st.one_of(st.sampled_from((0, 1, 2, 3, 4, 5, 6, 7, 99, 2**29 - 1)), st.integers(1, 2**29 - 1)))
    wire_type = draw(st.sampled_from((0, 1, 2, 3, 3, 4, 5, 6, 7)))
    well_formed = draw(st.integers(0, 3)) > 0
    key = _varint((number << 3) | wire_type)
    if not well_formed:
        return key + draw(st.binary(max_size=12))
    if wire_type == 0:
        body = _varint(draw(st.integers(0, 2**64 - 1)))
    elif wire_type == 1:
        body = draw(st.binary(min_size=8, max_size=8))
    elif wire_type == 2:
        payload = draw(st.binary(max_size=40))
        body = _varint(len(payload)) + payload
    elif wire_type == 3:  # a group: fields of its own, then the end-group tag of the same number
        inner = b"".join(draw(st.lists(st.builds(lambda n, v: _varint(n << 3) + _varint(v), st.integers(1, 50),
                                                 st.integers(0, 2**32)), max_size=3)))
        body = inner + _varint((number << 3) | 4)
    elif wire_type == 5:
        body = draw(st.binary(min_size=4, max_size=4))
    else:  # 4 (a stray end-group), 6 and 7 (no such wire type)
        body = b""
    return key + body


class Wire(bytes):
    """Bytes whose repr stays short (a falsifying example may be a 100 KB message): length, head and tail."""

    def __repr__(self) -> str:
        return f"Wire({len(self)} bytes, head={bytes(self[:48])!r}, tail={bytes(self[-48:])!r})"


@st.composite
def hostile_bytes(draw) -> Wire:
    return Wire(draw(_hostile_bytes()))


@st.composite
def _hostile_bytes(draw) -> bytes:
    how = draw(st.sampled_from(("random", "truncated", "flipped", "inserted", "appended", "large_appended")))
    if how == "random":
        return draw(st.binary(max_size=400))
    if how == "large_appended":  # > 64 KiB: parsed by service/wire.py, not protobuf
        base = draw(st.builds(_large_request, st.integers(0, 2**31)))
    else:
        base = draw(valid_requests())
    data = bytearray(base.request.SerializeToString())
    if how == "truncated":
        return bytes(data[:draw(st.integers(0, max(0, len(data) - 1)))])
    if how == "flipped":
        for _ in range(draw(st.integers(1, 6))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    if how == "inserted":
        at = draw(st.integers(0, len(data)))
        return bytes(data[:at] + draw(st.binary(min_size=1, max_size=20)) + data[at:])
    fields = draw(st.lists(unknown_fields(), min_size=1, max_size=3))
    at = draw(st.sampled_from(("end", "start")))
    return bytes(data + b"".join(fields)) if at == "end" else bytes(b"".join(fields) + data)


def _large_request(seed: int) -> Case:
    rng = np.random.default_rng(seed)
    request = pb.ModelInferRequest(model_name="identity_fp32", id="large")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, LARGE_WIDTH["identity_fp32"]])
    request.raw_input_contents.append(rng.standard_normal(LARGE_WIDTH["identity_fp32"]).astype("<f4").tobytes())
    return Case(request)


def test_undecodable_bytes(running, stub):
    """Arbitrary bytes as a ModelInfer message, through a generic method with identity serializers.

    What is asserted, and why: if protobuf can decode the bytes, they are a ModelInferRequest like any other and
    the answer must be an allowed status (so slotserve's own large-message parser, service/wire.py, may never
    refuse what protobuf accepts, nor crash on it). If protobuf cannot decode them, the request deserializer
    raises inside grpc before any slotserve code runs, and grpc answers INTERNAL "Exception deserializing
    request!" by itself (grpc's Python server gives a handler no way to change that status); slotserve's own
    INTERNAL ("internal error (reference ...)") is never acceptable. Either way the server must go on serving.
    """
    method = running.client.channel.unary_unary(INFER_METHOD)  # no serializers: bytes in, bytes out
    ledger = Ledger()

    @settings(FUZZ, max_examples=examples(600))
    @given(data=hostile_bytes())
    def send(data: bytes) -> None:
        try:
            decoded = pb.ModelInferRequest.FromString(data)
        except DecodeError:
            decoded = None
        note(f"{len(data)} bytes, protobuf decodes them: {decoded is not None}; head {data[:80]!r}")
        try:
            answer = method(bytes(data), timeout=CALL_TIMEOUT)
            code, error = "OK", None
        except grpc.RpcError as rpc_error:
            error = ClientError.from_rpc_error(rpc_error)
            code = error.code
        ledger.statuses[code] += 1
        assert code != "DEADLINE_EXCEEDED", f"the call did not end within {CALL_TIMEOUT} s (a hang)"
        if decoded is None:
            assert code in {"INTERNAL", "INVALID_ARGUMENT"}, f"undecodable bytes answered {code} ({error})"
            if code == "INTERNAL":
                assert error.message == GRPC_DESERIALIZE_FAILURE, f"slotserve's own INTERNAL: {error}"
        else:
            assert code in ALLOWED, f"decodable bytes answered {code} ({error}) for {decoded!r:.2000}"
            if decoded.model_name not in MODELS:
                assert code == "NOT_FOUND", f"unknown model answered {code} ({error})"
            if code == "OK":
                check_response(decoded, pb.ModelInferResponse.FromString(answer))

    send()
    print(f"\nundecodable-bytes fuzz: {sum(ledger.statuses.values())} messages: {summary(ledger)}")
    assert_server_clean(running, stub, Ledger(), statistics(running))


def test_a_large_message_with_a_group_field_is_read_as_protobuf_reads_it(running, stub):
    """Found by test_undecodable_bytes: a valid 80,048-byte request (identity_fp32, [1, 20000] raw FP32) with an
    empty group of field 1 appended (b"\\x0b\\x0c") decodes with protobuf (an unknown field), but service/wire.py's
    large-message scanner refused wire type 3 and grpc answered INTERNAL. Groups now get protobuf's verdict."""
    method = running.client.channel.unary_unary(INFER_METHOD)
    case = _large_request(7)
    data = case.request.SerializeToString()
    assert len(data) >= 64 * 1024
    for suffix in (b"\x0b\x0c", b"\x9b\x06\x08\x01\x9c\x06"):  # empty group 1; group 99 holding a varint field
        message = data + suffix
        pb.ModelInferRequest.FromString(message)  # protobuf accepts it
        check_response(case.request, pb.ModelInferResponse.FromString(method(message, timeout=CALL_TIMEOUT)))
    with pytest.raises(grpc.RpcError) as info:  # an unterminated group is malformed for protobuf too
        method(data + b"\x0b", timeout=CALL_TIMEOUT)
    assert (info.value.code().name, info.value.details()) == ("INTERNAL", GRPC_DESERIALIZE_FAILURE)
    small_request_succeeds(stub)


# ---- the message size limit ------------------------------------------------------------------------------------

LIMIT = 1 << 20  # --max-message-bytes for the size tests


def fp32_request(elements: int, *, typed: bool = False) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="identity_fp32")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, elements])
    values = np.linspace(-1, 1, elements, dtype=np.float32)
    if typed:
        tensor.contents.fp32_contents.extend(values.tolist())
    else:
        request.raw_input_contents.append(values.tobytes())
    return request


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    repository = demo_subset(tmp_path_factory.mktemp("limited") / "repository", "identity_fp32", "simple")
    with serve(repository, max_message_bytes=LIMIT) as server:
        yield server


def _code(call: Callable[[], object]) -> tuple[str, str]:
    try:
        call()
    except grpc.RpcError as error:
        return error.code().name, error.details() or ""
    return "OK", ""


def small_request_succeeds(stub) -> None:
    response = stub.ModelInfer(fp32_request(4), timeout=CALL_TIMEOUT)
    assert np.frombuffer(response.raw_output_contents[0], "<f4").tolist() == np.linspace(
        -1, 1, 4, dtype=np.float32).tolist()


@pytest.mark.parametrize("elements, typed", [(LIMIT // 4 + 1000, False), (4 * LIMIT, False),
                                             (LIMIT // 4 + 1000, True)],
                         ids=["just_over_raw", "four_times_raw", "just_over_typed"])
def test_oversize_request_is_refused_by_the_configured_limit(limited, elements, typed):
    stub = pb_grpc.GRPCInferenceServiceStub(limited.client.channel)
    request = fp32_request(elements, typed=typed)
    assert request.ByteSize() > LIMIT
    code, details = _code(lambda: stub.ModelInfer(request, timeout=CALL_TIMEOUT))
    assert code == "RESOURCE_EXHAUSTED", (code, details)
    assert "larger than max" in details and str(LIMIT) in details, details
    small_request_succeeds(stub)  # the same channel, the next request


def test_request_at_the_limit_is_accepted(limited):
    stub = pb_grpc.GRPCInferenceServiceStub(limited.client.channel)
    elements = LIMIT // 4 - 100
    overhead = fp32_request(elements).ByteSize() - 4 * elements
    request = fp32_request((LIMIT - overhead) // 4 - 8)  # near the limit, with room for the response's extra bytes
    assert LIMIT - 64 < request.ByteSize() <= LIMIT
    response = stub.ModelInfer(request, timeout=CALL_TIMEOUT)
    assert len(response.raw_output_contents[0]) == 4 * request.inputs[0].shape[1]


def test_oversize_response_is_refused_and_the_server_goes_on(limited):
    """A request that fits whose response does not (the response carries a few more bytes: model name and
    version): gRPC refuses to send it with RESOURCE_EXHAUSTED; the slot is released and the next call works."""
    stub = pb_grpc.GRPCInferenceServiceStub(limited.client.channel)
    elements = LIMIT // 4 - 100
    overhead = fp32_request(elements).ByteSize() - 4 * elements
    request = fp32_request((LIMIT - overhead) // 4)
    assert LIMIT - 4 < request.ByteSize() <= LIMIT
    code, details = _code(lambda: stub.ModelInfer(request, timeout=CALL_TIMEOUT))
    assert code == "RESOURCE_EXHAUSTED", (code, details)
    small_request_succeeds(stub)
    status = wait_idle(limited)
    assert all(m.active_slots == 0 and m.queued_requests == 0 for m in status), status


def test_oversize_stream_message_ends_the_stream_with_resource_exhausted(limited):
    stub = pb_grpc.GRPCInferenceServiceStub(limited.client.channel)
    requests = [fp32_request(4), fp32_request(LIMIT // 4 + 1000)]
    answers = []

    def consume() -> None:
        for answer in stub.ModelStreamInfer(iter(requests), timeout=CALL_TIMEOUT):
            answers.append(answer)
    code, details = _code(consume)
    assert code == "RESOURCE_EXHAUSTED", (code, details)
    assert len(answers) <= 1 and all(not a.error_message for a in answers)
    small_request_succeeds(stub)
    status = wait_idle(limited)
    assert all(m.active_slots == 0 and m.queued_requests == 0 for m in status), status
