"""Every KServe datatype round-trips through a fixture identity model, raw and typed, in several shapes.

One fixture model per datatype, written to a temporary repository: inputs S (a scalar, dims []), V (dims [-1]) and
M (dims [-1, -1, -1]) and outputs OS, OV, OM of the same datatype (the fixture returns input i as output i). Raw
requests are encoded, and responses decoded, with numpy and struct here rather than the server's codec. Typed
contents go in through the raw stubs for every datatype the protocol gives a typed field (not FP16 or BF16).
Outputs must always come back as raw_output_contents.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.tensor_codec import decode_raw
from generated import grpc_service_pb2 as pb
from service.tensors import decode_request
from service.testing import serve

from .._support import CALL_TIMEOUT, from_raw, numpy_dtype, raw_bytes, rpc_error, same_values, stub, write_fixture_model

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
}  # FP16 and BF16 have no typed field: raw only
SHAPES = {  # (S, V, M) shapes of one request: ordinary, zero-size, and one-element
    "ordinary": ((), (7,), (2, 3, 4)),
    "zero_size": ((), (0,), (2, 0, 3)),
    "single": ((), (1,), (1, 1, 1)),
}


def model_name(datatype: str) -> str:
    return f"identity_{datatype.lower()}"


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    repository = tmp_path_factory.mktemp("datatypes")
    for datatype in DATATYPES:
        dims = {"S": [], "V": [-1], "M": [-1, -1, -1]}
        write_fixture_model(
            repository,
            model_name(datatype),
            inputs=[(name, datatype, dims[name]) for name in "SVM"],
            outputs=[("O" + name, datatype, dims[name]) for name in "SVM"],
        )
    write_fixture_model(
        repository, "cast_int16_to_fp64", inputs=[("INPUT0", "INT16", [-1])], outputs=[("OUTPUT0", "FP64", [-1])]
    )
    with serve(repository) as server:
        yield server


def values(datatype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Test values of `datatype`, including each type's extremes and special values where they fit."""
    count = int(np.prod(shape, dtype=np.int64))
    rng = np.random.default_rng(seed)
    if datatype == "BYTES":
        pool = [b"", b"\x00", b"a", "h\u00e9llo w\u00f6rld".encode(), bytes(range(256)), b"\xff" * 3]
        flat = np.empty(count, dtype=object)
        flat[:] = [pool[int(i) % len(pool)] + bytes([int(i) % 256]) * int(i % 3) for i in rng.integers(0, 600, count)]
        return flat.reshape(shape)
    dtype = numpy_dtype(datatype)
    if datatype == "BOOL":
        flat = rng.integers(0, 2, count).astype(np.bool_)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        flat = rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
        flat[: min(count, 3)] = [info.min, info.max, 0][: min(count, 3)]
    else:
        flat = (rng.standard_normal(count) * 1000).astype(np.float32).astype(dtype)
        special = np.array([np.inf, -np.inf, -0.0, np.nan, 1.5], dtype=np.float32).astype(dtype)
        flat[: min(count, special.size)] = special[: min(count, special.size)]
    return flat.reshape(shape)


def request_for(datatype: str, arrays: dict[str, np.ndarray], *, typed: bool) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model_name(datatype), id=f"{datatype}-{typed}")
    for name, array in arrays.items():
        tensor = request.inputs.add(name=name, datatype=datatype, shape=array.shape)
        if typed:
            tensor.contents.SetInParent()  # present even when the tensor has no elements
            field = getattr(tensor.contents, TYPED_FIELD[datatype])
            field.extend(array.reshape(-1).tolist())
        else:
            request.raw_input_contents.append(raw_bytes(array, datatype))
    return request


def check_outputs(response: pb.ModelInferResponse, datatype: str, arrays: dict[str, np.ndarray]) -> None:
    """Outputs OS/OV/OM equal the inputs (the fixture casts to the output datatype, which is the same), all raw."""
    assert len(response.raw_output_contents) == len(response.outputs) == len(arrays)
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        assert not tensor.HasField("contents"), f"output {tensor.name} came back typed"
        assert tensor.datatype == datatype
        expected = arrays[tensor.name[1:]].astype(numpy_dtype(datatype))
        assert list(tensor.shape) == list(expected.shape)
        actual = from_raw(raw, datatype, tensor.shape)
        assert same_values(actual, expected), f"{tensor.name}: {actual!r} != {expected!r}"


@pytest.mark.parametrize("shapes", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("datatype", DATATYPES)
def test_raw_round_trip(running, datatype, shapes):
    arrays = {name: values(datatype, shape, seed) for seed, (name, shape) in enumerate(zip("SVM", shapes, strict=True))}
    response = stub(running).ModelInfer(request_for(datatype, arrays, typed=False), timeout=CALL_TIMEOUT)
    assert response.id == f"{datatype}-False"
    check_outputs(response, datatype, arrays)


@pytest.mark.parametrize("shapes", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("datatype", sorted(TYPED_FIELD, key=DATATYPES.index))
def test_typed_round_trip(running, datatype, shapes):
    arrays = {name: values(datatype, shape, seed) for seed, (name, shape) in enumerate(zip("SVM", shapes, strict=True))}
    response = stub(running).ModelInfer(request_for(datatype, arrays, typed=True), timeout=CALL_TIMEOUT)
    check_outputs(response, datatype, arrays)


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_no_typed_contents_for_half_precision(running, datatype):
    arrays = {name: values("FP32", shape, 0) for name, shape in zip("SVM", SHAPES["ordinary"], strict=True)}
    request = pb.ModelInferRequest(model_name=model_name(datatype))
    for name, array in arrays.items():
        request.inputs.add(name=name, datatype=datatype, shape=array.shape).contents.fp32_contents.extend(
            array.reshape(-1).tolist()
        )
    error = rpc_error(stub(running).ModelInfer, request)
    assert (error.code, error.reason) == ("INVALID_ARGUMENT", "invalid_request_error")
    assert (
        f"of type 'FP32', expected datatype '{datatype}' ({datatype} can only be sent in raw_input_contents"
        in error.message
    )


@pytest.mark.parametrize("datatype", DATATYPES)
def test_client_library_round_trip(running, datatype):
    """The same through slotserve's own InferenceClient (raw in, raw out, decoded to numpy)."""
    arrays = {
        name: values(datatype, shape, seed)
        for seed, (name, shape) in enumerate(zip("SVM", SHAPES["ordinary"], strict=True))
    }
    outputs = running.client.infer(model_name(datatype), arrays)
    assert sorted(outputs) == ["OM", "OS", "OV"]
    for name, array in arrays.items():
        assert same_values(np.asarray(outputs["O" + name]), array.astype(numpy_dtype(datatype)))


@pytest.mark.parametrize("typed", [False, True], ids=["raw", "typed"])
def test_output_takes_the_output_datatype(running, typed):
    source = np.array([-32768, -1, 0, 7, 32767], dtype=np.int16)
    request = pb.ModelInferRequest(model_name="cast_int16_to_fp64")
    tensor = request.inputs.add(name="INPUT0", datatype="INT16", shape=source.shape)
    if typed:
        tensor.contents.int_contents.extend(source.tolist())
    else:
        request.raw_input_contents.append(source.astype("<i2").tobytes())
    response = stub(running).ModelInfer(request, timeout=CALL_TIMEOUT)
    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("OUTPUT0", "FP64", [5])
    assert same_values(from_raw(response.raw_output_contents[0], "FP64", [5]), source.astype(np.float64))


@pytest.mark.parametrize("datatype,value", [("UINT8", 256), ("INT8", -129), ("UINT16", 70000), ("INT16", 40000)])
def test_typed_value_out_of_range(running, datatype, value):
    arrays = {"S": np.array(1), "V": np.array([value]), "M": np.zeros((1, 1, 1), dtype=np.int64)}
    error = rpc_error(stub(running).ModelInfer, request_for(datatype, arrays, typed=True))
    assert (error.code, error.reason) == ("INVALID_ARGUMENT", "invalid_request_error")
    assert f"input 'V': a value in {TYPED_FIELD[datatype]} does not fit {datatype}" == error.message


# ---- zero-copy decode (in process) ----------------------------------------------------------------------------


def _owner(array: np.ndarray):
    base: object = array
    while isinstance(base, np.ndarray):
        base = base.base
    return base


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "BYTES"])
def test_raw_decode_is_zero_copy(datatype):
    """decode_request returns read-only views over the request's bytes, not copies.

    upb-backed protobuf hands out a fresh `bytes` object for each access to a bytes field, so the view is checked
    against the object it wraps: it must be a `bytes` holding exactly the input's raw contents, and the array must
    share its memory.
    """
    arrays = {
        name: values(datatype, shape, seed)
        for seed, (name, shape) in enumerate(zip("SVM", SHAPES["ordinary"], strict=True))
    }
    request = request_for(datatype, arrays, typed=False)
    decoded = decode_request(request)
    for index, (name, expected) in enumerate(arrays.items()):
        array = decoded.inputs[name]
        owner = _owner(array)
        assert isinstance(owner, bytes), f"{name}: decoded array owns a copy ({type(owner).__name__})"
        assert owner == request.raw_input_contents[index]
        assert np.shares_memory(array, np.frombuffer(owner, dtype=np.uint8))
        assert not array.flags.writeable
        assert same_values(array, expected.astype(numpy_dtype(datatype)))


def test_decode_raw_views_the_given_buffer():
    buffer = np.arange(24, dtype="<f4").tobytes()
    array = decode_raw(buffer, "FP32", (2, 3, 4), "INPUT0")
    assert np.shares_memory(array, np.frombuffer(buffer, dtype=np.uint8))
    assert _owner(array) is buffer
    np.testing.assert_array_equal(array, np.arange(24, dtype=np.float32).reshape(2, 3, 4))
