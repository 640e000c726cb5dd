"""The shared-memory registry and the tensor codec's use of it, without a server (service/shared_memory.py,
service/tensors.py): key and name rules, the options, holder counts, inputs copied out when decoded (never a view
of the client's memory), outputs written whole or not at all, and what the registry keeps after unregistering."""

from __future__ import annotations

import numpy as np
import pytest

from engine.interface import ModelMetadata, TensorSpec
from generated import grpc_service_pb2 as pb
from service.cli import build_parser, option_fields
from service.core.errors import InvalidRequest
from service.options import ServerOptions
from service.shared_memory import (DEFAULT_MAX_BYTES, RegionNotFound, SharedMemoryLimit, SharedMemoryRegistry,
                                   key_problem, prefix_problem)
from service.tensors import decode_request, encode_response
from tests.integration._shm import ShmObject, descriptors, in_region, mappings


@pytest.fixture
def shm():
    objects = []

    def make(size: int) -> ShmObject:
        objects.append(ShmObject(size))
        return objects[-1]
    yield make
    for item in objects:
        item.close()


@pytest.mark.parametrize("key, problem", [
    ("/a", None), ("/slotserve_input-0.data", None), ("/" + "x" * 255, None),
    ("a", "must start with '/'"), ("", "must start with '/'"), ("/", "must name an object"),
    ("/.", "must name an object"), ("/..", "must name an object"), ("/dev/shm/a", "no '/' after the first"),
    ("//a", "no '/' after the first"), ("/a\x00b", "NUL"), ("/" + "x" * 256, "at most 255 bytes"),
    ("/" + "\u00e9" * 128, "at most 255 bytes"),
])
def test_keys_are_posix_shared_memory_names(key, problem):
    found = key_problem(key)
    assert (found is None) if problem is None else (problem in found), found


def test_options_refuse_what_cannot_work():
    for fields, says in (({"shared_memory": "cuda"}, "CUDA shared memory is not supported"),
                         ({"shared_memory": "yes"}, "--shared-memory must be none or system"),
                         ({"shared_memory_prefix": "slot"}, "--shared-memory-prefix must be '/'"),
                         ({"shared_memory_prefix": "/a/b"}, "--shared-memory-prefix must be '/'"),
                         ({"shared_memory_max_bytes": 0}, "--shared-memory-max-bytes must be > 0, got 0")):
        with pytest.raises(ValueError) as info:
            ServerOptions(**fields)
        assert says in str(info.value), info.value
    assert prefix_problem("/") is None and prefix_problem("/slotserve_") is None


def test_the_command_line_is_off_by_default_and_passes_the_three_flags():
    defaults = ServerOptions(**option_fields(build_parser().parse_args([])))
    assert (defaults.shared_memory, defaults.shared_memory_prefix, defaults.shared_memory_max_bytes) == (
        "none", "/", DEFAULT_MAX_BYTES)
    options = ServerOptions(**option_fields(build_parser().parse_args(
        ["--shared-memory", "system", "--shared-memory-prefix", "/side_", "--shared-memory-max-bytes", "4096"])))
    assert (options.shared_memory, options.shared_memory_prefix, options.shared_memory_max_bytes) == (
        "system", "/side_", 4096)


def test_a_region_is_closed_when_its_last_holder_lets_go(shm):
    registry = SharedMemoryRegistry()
    source = shm(4096)
    registry.register("r", source.key, 0, 4096)
    first, second = registry.hold("r", "input 'A'"), registry.hold("r", "input 'B'")
    assert first is second and registry.statistics().holds == 2
    registry.unregister("r")
    with pytest.raises(RegionNotFound, match="Unable to find shared memory region: 'r'"):
        registry.hold("r", "input 'C'")
    first.release()
    assert descriptors(source.key) == 1
    second.release()
    assert descriptors(source.key) == 0
    statistics = registry.statistics()
    assert (statistics.open_regions, statistics.open_bytes, statistics.holds) == (0, 0, 0)


def test_the_byte_bound_counts_regions_that_requests_still_hold(shm):
    registry = SharedMemoryRegistry(max_bytes=8192, max_regions=2)
    one, two, three = shm(8192), shm(4096), shm(4096)
    registry.register("one", one.key, 0, 8192)
    held = registry.hold("one", "input 'A'")
    registry.unregister("one")
    with pytest.raises(SharedMemoryLimit, match="it takes 4096 bytes and 8192 are registered already"):
        registry.register("two", two.key, 0, 4096)
    held.release()
    registry.register("two", two.key, 0, 4096)
    registry.register("three", three.key, 0, 4096)
    with pytest.raises(SharedMemoryLimit, match=r"2 regions are open .* at once \(2\)"):
        registry.register("four", one.key, 0, 1)


def identity_request(region: str, count: int, offset: int = 0) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    in_region(request.inputs.add(name="INPUT0", datatype="FP32", shape=[count]), region, 4 * count, offset)
    return request


def test_an_input_in_a_region_is_read_into_an_array_of_its_own_when_decoded(shm):
    registry = SharedMemoryRegistry()
    source = shm(4096)
    source.write(64, np.arange(8, dtype="<f4"))
    registry.register("r", source.key, 0, 4096)
    decoded = decode_request(identity_request("r", 8, 64), shared_memory=registry)
    array = decoded.inputs["INPUT0"]
    np.testing.assert_array_equal(array, np.arange(8))
    assert not array.flags.writeable and array.flags.aligned
    assert mappings(source.key) == 0  # nothing of the client's memory is mapped, so nothing can vanish under it
    source.write(64, np.full(8, 7, dtype="<f4"))  # the client changes its memory afterwards: the copy stays
    np.testing.assert_array_equal(array, np.arange(8))
    decoded.release()
    decoded.release()  # idempotent
    registry.unregister("r")
    np.testing.assert_array_equal(array, np.arange(8))  # outlives the region: it is the server's memory
    assert registry.statistics().holds == 0 and descriptors(source.key) == 0


def test_an_input_at_an_offset_off_its_item_size_is_aligned(shm):
    registry = SharedMemoryRegistry()
    source = shm(4096)
    source.write(3, np.arange(5, dtype="<f8"))
    registry.register("r", source.key, 1, 4000)
    request = pb.ModelInferRequest(model_name="m")
    in_region(request.inputs.add(name="INPUT0", datatype="FP64", shape=[5]), "r", 40, 2)
    decoded = decode_request(request, shared_memory=registry)
    assert decoded.inputs["INPUT0"].flags.aligned
    np.testing.assert_array_equal(decoded.inputs["INPUT0"], np.arange(5))
    decoded.release()


def test_a_failed_decode_holds_nothing(shm):
    registry = SharedMemoryRegistry()
    source = shm(4096)
    registry.register("r", source.key, 0, 4096)
    request = identity_request("r", 4)
    in_region(request.inputs.add(name="INPUT1", datatype="FP32", shape=[4]), "r", 15)  # wrong size, after INPUT0
    with pytest.raises(InvalidRequest, match="needs 16 bytes, shared_memory_byte_size is 15"):
        decode_request(request, shared_memory=registry)
    assert registry.statistics().holds == 0


METADATA = ModelMetadata(inputs=(TensorSpec("INPUT0", "FP32", (-1,)),),
                         outputs=(TensorSpec("OUT_A", "FP32", (-1,)), TensorSpec("OUT_B", "INT64", (-1,))))


def outputs_request(size_a: int, size_b: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    in_region(request.outputs.add(name="OUT_A"), "out", size_a)
    in_region(request.outputs.add(name="OUT_B"), "out", size_b, 256)
    return request


def test_outputs_are_written_only_when_every_one_fits(shm):
    registry = SharedMemoryRegistry()
    target = shm(4096)
    target.write(0, b"\xee" * 4096)
    registry.register("out", target.key, 0, 4096)
    outputs = {"OUT_A": np.arange(4, dtype=np.float64), "OUT_B": np.arange(8, dtype=np.int64)}  # A is cast to FP32
    decoded = decode_request(outputs_request(16, 63), shared_memory=registry)
    with pytest.raises(InvalidRequest, match="output 'OUT_B' needs 64 bytes .* gives it 63.* at least 64"):
        encode_response(pb.ModelInferResponse(), outputs, METADATA, decoded.output_regions)
    assert target.read(0, 4096) == b"\xee" * 4096
    decoded.release()
    decoded = decode_request(outputs_request(16, 64), shared_memory=registry)
    response = encode_response(pb.ModelInferResponse(), outputs, METADATA, decoded.output_regions)
    decoded.release()
    assert [(t.name, t.datatype, list(t.shape)) for t in response.outputs] == [("OUT_A", "FP32", [4]),
                                                                             ("OUT_B", "INT64", [8])]
    assert list(response.raw_output_contents) == [b"", b""]
    np.testing.assert_array_equal(target.array(0, "<f4", (4,)), np.arange(4))
    np.testing.assert_array_equal(target.array(256, "<i8", (8,)), np.arange(8))
