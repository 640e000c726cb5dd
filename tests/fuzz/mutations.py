"""What breaks a valid request: each mutation changes one thing (a name, a datatype, a shape, contents, a
parameter, a requested output) and says what it did; `cases` applies up to four to a valid request."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

from hypothesis import strategies as st

from generated import grpc_service_pb2 as pb

from .lab import REGIONS
from .valid_requests import CONTENT_FIELDS, DATATYPES, ITEMSIZE, PARAMETER_KINDS, TYPED_FIELD, Case, valid_requests

# Strategies for the pieces mutations put in.
ODD_NAMES = st.one_of(
    st.sampled_from(
        (
            "",
            "SIMPLE",
            "simple ",
            " simple",
            "simple\x00",
            "simple/1",
            "../simple",
            "simple_identity2",
            "matmul_chain",
            "silero_vad",
            "identity_fp32\n",
            "x" * 1000,
            "\u00e9\u6a21\u578b",
            "*",
        )
    ),
    st.text(max_size=40),
)
VERSIONS = st.one_of(
    st.sampled_from(
        ("0", "2", "01", "1 ", " 1", "abc", "-1", "1.0", "99999999999999999999999", "\u0661", "\u00b2", "1\x00")
    ),
    st.text(max_size=12),
)
INPUT_NAMES = st.one_of(
    st.sampled_from(("INPUT0", "INPUT1", "INPUT2", "OUTPUT0", "input0", "", "INPUT0 ")), st.text(max_size=20)
)
DATATYPE_STRINGS = st.one_of(
    st.sampled_from(DATATYPES),
    st.sampled_from(("", "int32", "INT33", "FLOAT", "TYPE_INT32", "STRING", "FP8", "INT", "BYTES\x00", "FP 32")),
    st.text(max_size=10),
)
DIMENSIONS = st.one_of(
    st.sampled_from((-1, 0, 1, 8, 9, 16, 17, 2**31, 2**34, 2**40, 2**40 + 1, 2**62, 2**63 - 1, -(2**63))),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-3, 40),
)
FIELD_VALUES = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1),
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
    value = draw(
        {
            "bool_param": st.booleans(),
            "int64_param": st.one_of(
                st.sampled_from((-1, 0, 1, 1000, 2**63 - 1, -(2**63), 10**12)), st.integers(-(2**63), 2**63 - 1)
            ),
            "string_param": st.one_of(st.sampled_from(("5", "1000", "", "-1", "inf")), st.text(max_size=10)),
            "double_param": st.floats(),
            "uint64_param": st.one_of(st.sampled_from((0, 1, 2**63, 2**64 - 1)), st.integers(0, 2**64 - 1)),
        }[kind]
    )
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


def mutate_rank(draw, request):
    """A rank around and far past numpy's 64 dimensions: the input's own shape padded with ones (so the element
    count, and the contents, still fit) or replaced by one of any dimensions."""
    if not request.inputs:
        return None
    index = _pick(draw, request.inputs)
    shape = list(request.inputs[index].shape)
    rank = draw(st.one_of(st.sampled_from((63, 64, 65, 66, 100, 1000)), st.integers(60, 200)))
    if draw(st.integers(0, 3)):
        shape = shape + [1] * max(0, rank - len(shape))
    else:
        shape = draw(st.lists(DIMENSIONS, min_size=rank, max_size=rank))
    del request.inputs[index].shape[:]
    request.inputs[index].shape.extend(shape)
    return f"inputs[{index}] rank {len(shape)}"


def mutate_raw_length(draw, request):
    if not _uses_raw(request):
        return None
    index = _pick(draw, request.raw_input_contents)
    entry = request.raw_input_contents[index]
    how = draw(st.sampled_from(("truncate", "extend", "random", "empty")))
    if how == "truncate":
        entry = entry[: draw(st.integers(0, max(0, len(entry) - 1)))]
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
        entry = entry[: draw(st.integers(0, max(0, len(entry) - 1)))]
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
        del values[draw(st.integers(0, len(values) - 1)) :]
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
            request.raw_input_contents[index] = draw(
                st.binary(min_size=count * ITEMSIZE[datatype], max_size=count * ITEMSIZE[datatype])
            )
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
    key = draw(
        st.one_of(
            st.sampled_from(("priority", "sequence_id", "binary_data_output", "Timeout", "timeout ", "headers", "")),
            st.text(max_size=12),
        )
    )
    return f"parameter {key!r} " + draw(parameter_values(request.parameters[key]))


def mutate_tensor_parameters(draw, request):
    if not request.inputs:
        return None
    index = _pick(draw, request.inputs)
    key = draw(
        st.one_of(
            st.sampled_from(
                ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset", "binary_data_size", "")
            ),
            st.text(max_size=12),
        )
    )
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
    key = draw(
        st.one_of(
            st.sampled_from(("classification", "binary_data", "shared_memory_region", "shared_memory_byte_size", "")),
            st.text(max_size=12),
        )
    )
    return f"outputs[{index}] parameter {key!r} " + draw(parameter_values(request.outputs[index].parameters[key]))


# Inputs name fuzz_in and outputs fuzz_out, never the other way round: fuzz_in must keep its bytes, so that an
# answer can be checked against them while other requests write fuzz_out.
UNKNOWN_REGIONS = st.one_of(
    st.sampled_from(("missing", "", "FUZZ_IN", "fuzz_in ", "fuzz_out\x00", "seq")),
    st.text(max_size=12).filter(lambda name: name not in REGIONS),
)
SHM_NUMBERS = st.one_of(
    st.sampled_from((-1, 0, 1, 3, 4, 16, 64, 65535, 65536, 65537, 2**31, 2**63 - 1, -(2**63))),
    st.integers(-(2**63), 2**63 - 1),
)


def _tensor_bytes(request: pb.ModelInferRequest, index: int) -> int | None:
    """The byte size the protocol gives input `index` as it stands (None when it cannot be told)."""
    tensor = request.inputs[index]
    if tensor.datatype == "BYTES":
        if len(request.raw_input_contents) == len(request.inputs):
            return len(request.raw_input_contents[index])
        return sum(4 + len(v) for v in tensor.contents.bytes_contents)
    if tensor.datatype in ITEMSIZE and all(0 <= d < 2**20 for d in tensor.shape):
        return math.prod(tensor.shape) * ITEMSIZE[tensor.datatype]
    return None


def _number(draw, parameter: pb.InferParameter, exact: int | None) -> str:
    """An offset or byte size: the exact one, an edge, any integer, 2**64-1 as uint64_param, or another kind."""
    how = draw(st.sampled_from(("exact", "int64", "int64", "uint64", "other")))
    if how == "exact" and exact is not None:
        parameter.int64_param = exact
        return f"int64 {exact}"
    if how == "uint64":
        parameter.uint64_param = draw(st.sampled_from((0, 64, 2**63, 2**64 - 1)))
        return f"uint64 {parameter.uint64_param}"
    if how == "other":
        return draw(parameter_values(parameter))
    parameter.int64_param = draw(SHM_NUMBERS)
    return f"int64 {parameter.int64_param}"


def mutate_shared_memory(draw, request):
    """Put an input or a requested output in a shared-memory region, with parameters of every kind and value:
    registered regions (fuzz_in holds fixed random bytes) and unknown names; offsets and sizes exact, at the edges
    (negative, past the end, 2**63-1, 2**64-1) or of another kind; each parameter possibly missing; the input's
    own contents dropped or (a conflict) kept."""
    if request.inputs and draw(st.booleans()):
        index = _pick(draw, request.inputs)
        tensor, what, exact = request.inputs[index], f"inputs[{index}]", _tensor_bytes(request, index)
        if draw(st.integers(0, 3)):  # usually the region replaces the contents, as a client does
            tensor.ClearField("contents")
            if len(request.raw_input_contents) == len(request.inputs):
                del request.raw_input_contents[index]
    else:
        if not request.outputs:
            request.outputs.add(name=draw(st.sampled_from(("OUTPUT0", "OUTPUT1"))))
        index = _pick(draw, request.outputs)
        tensor, what = request.outputs[index], f"outputs[{index}]"
        exact = _tensor_bytes(request, 0) if request.inputs else None
    parameters = tensor.parameters
    parts = []
    if draw(st.integers(0, 7)):
        known = "fuzz_in" if what.startswith("inputs") else "fuzz_out"
        parameters["shared_memory_region"].string_param = draw(st.one_of(st.just(known), UNKNOWN_REGIONS))
        parts.append(f"region {parameters['shared_memory_region'].string_param!r}")
    else:
        parts.append("region " + draw(parameter_values(parameters["shared_memory_region"])))
    if draw(st.integers(0, 7)):
        parts.append("size " + _number(draw, parameters["shared_memory_byte_size"], exact))
    if draw(st.booleans()):
        room = REGIONS["fuzz_in"] - (exact or 0)
        parts.append(
            "offset "
            + _number(draw, parameters["shared_memory_offset"], draw(st.integers(0, room)) if room >= 0 else None)
        )
    return f"{what} in shared memory: {', '.join(parts)}"


MUTATIONS: tuple[Callable, ...] = (
    mutate_model_name,
    mutate_version,
    mutate_id,
    mutate_input_name,
    mutate_drop_input,
    mutate_duplicate_input,
    mutate_extra_input,
    mutate_datatype,
    mutate_shape,
    mutate_rank,
    mutate_raw_length,
    mutate_raw_count,
    mutate_bytes_prefix,
    mutate_typed_kind,
    mutate_typed_count,
    mutate_both,
    mutate_retype,
    mutate_clear_contents,
    mutate_timeout,
    mutate_parameters,
    mutate_tensor_parameters,
    mutate_output_unknown,
    mutate_output_duplicate,
    mutate_output_parameters,
    mutate_shared_memory,
)


@st.composite
def cases(draw) -> Case:
    """A valid request (about one in six) or one with one to four mutations."""
    case = draw(valid_requests())
    mutations = (
        [] if draw(st.integers(0, 5)) == 0 else draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=4))
    )
    for mutation in mutations:
        what = mutation(draw, case.request)
        if what is not None:
            case.mutations.append(what)
    return case
