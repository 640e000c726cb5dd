"""The shared-memory registry and the tensor codec's use of it, without a server (service/shared_memory.py,
service/tensors.py): key and name rules, the options, holder counts, inputs copied out when decoded (never a view
of the client's memory), outputs written whole or not at all, and what the registry keeps after unregistering."""

from __future__ import annotations

import resource
import tracemalloc

import numpy as np
import pytest

from engine.config.specs import TensorSpec
from engine.interface import ModelMetadata
from generated import grpc_service_pb2 as pb
from service import shared_memory
from service.cli import build_parser, option_fields
from service.core.errors import InvalidRequest
from service.options import ServerOptions
from service.shared_memory import (
    DEFAULT_MAX_BYTES,
    MAX_REGIONS,
    NAME_MAX,
    RegionNotFound,
    SharedMemoryLimit,
    SharedMemoryRegistry,
    default_max_regions,
    key_problem,
    name_problem,
    prefix_problem,
)
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


@pytest.mark.parametrize(
    "key, problem",
    [
        ("/a", None),
        ("/slotserve_input-0.data", None),
        ("/" + "x" * 255, None),
        ("a", "must start with '/'"),
        ("", "must start with '/'"),
        ("/", "must name an object"),
        ("/.", "must name an object"),
        ("/..", "must name an object"),
        ("/dev/shm/a", "no '/' after the first"),
        ("//a", "no '/' after the first"),
        ("/a\x00b", "NUL"),
        ("/" + "x" * 256, "at most 255 bytes"),
        ("/" + "\u00e9" * 128, "at most 255 bytes"),
    ],
)
def test_keys_are_posix_shared_memory_names(key, problem):
    found = key_problem(key)
    assert (found is None) if problem is None else (problem in found), found


@pytest.mark.parametrize(
    "name, problem",
    [
        ("r", None),
        ("n" * 255, None),
        ("\u00e9" * 127 + "n", None),
        ("", "needs a name"),
        ("n" * 256, "at most 255 bytes (UTF-8); this one has 256"),
        ("\u00e9" * 128, "this one has 256"),
    ],
)
def test_region_names_are_bounded_like_keys(name, problem):
    found = name_problem(name)
    assert (found is None) if problem is None else (problem in found), found
    assert NAME_MAX == 255


@pytest.mark.parametrize(
    "soft, expected", [(64, 16), (1024, 256), (20000, MAX_REGIONS), (resource.RLIM_INFINITY, MAX_REGIONS), (2, 1)]
)
def test_the_region_bound_leaves_most_descriptors_to_the_rest_of_the_server(monkeypatch, soft, expected):
    """Each open region holds a descriptor: under a low open-file limit the bound is a quarter of it, so regions
    can never take the descriptors that connections need."""
    monkeypatch.setattr(shared_memory.resource, "getrlimit", lambda which: (soft, resource.RLIM_INFINITY))
    assert default_max_regions() == expected
    assert SharedMemoryRegistry().max_regions == expected


def test_the_registry_keeps_nothing_of_a_region_after_it_is_unregistered(shm):
    """Names, keys and regions are freed at unregister (what 300 regions of 1 MiB names once kept: 250 MiB).
    Counted with tracemalloc, by where the memory was allocated: this file and service/shared_memory.py only, so
    other threads of the test process cannot disturb the figures."""
    source = shm(4096)
    registry = SharedMemoryRegistry()
    sites = [tracemalloc.Filter(True, __file__), tracemalloc.Filter(True, shared_memory.__file__)]

    def held() -> int:
        return sum(stat.size for stat in tracemalloc.take_snapshot().filter_traces(sites).statistics("filename"))

    tracemalloc.start()
    try:
        before = held()
        names = [f"{index:03d}" + "n" * (NAME_MAX - 3) for index in range(300)]
        for name in names:
            registry.register(name, source.key, 0, 4096)
        del names
        registered = held() - before
        assert descriptors(source.key) == 300
        for index in range(300):
            registry.unregister(f"{index:03d}" + "n" * (NAME_MAX - 3))
        left = held() - before
    finally:
        tracemalloc.stop()
    assert registered > 300 * NAME_MAX, registered  # the names and regions were counted while registered
    # What stays is the emptied table's own slots (a dict does not shrink on removal), not the regions.
    assert left < 32 * 1024, (registered, left)
    statistics = registry.statistics()
    assert (statistics.regions, statistics.open_regions, statistics.open_bytes) == (0, 0, 0)
    assert descriptors(source.key) == 0


def test_options_refuse_what_cannot_work():
    for fields, says in (
        ({"shared_memory": "cuda"}, "CUDA shared memory is not supported"),
        ({"shared_memory": "yes"}, "--shared-memory must be none or system"),
        ({"shared_memory_prefix": "slot"}, "--shared-memory-prefix must be '/'"),
        ({"shared_memory_prefix": "/a/b"}, "--shared-memory-prefix must be '/'"),
        ({"shared_memory_max_bytes": 0}, "--shared-memory-max-bytes must be > 0, got 0"),
    ):
        with pytest.raises(ValueError) as info:
            ServerOptions(**fields)
        assert says in str(info.value), info.value
    assert prefix_problem("/") is None and prefix_problem("/slotserve_") is None


def test_the_command_line_is_off_by_default_and_passes_the_three_flags():
    defaults = ServerOptions(**option_fields(build_parser().parse_args([])))
    assert (defaults.shared_memory, defaults.shared_memory_prefix, defaults.shared_memory_max_bytes) == (
        "none",
        "/",
        DEFAULT_MAX_BYTES,
    )
    options = ServerOptions(
        **option_fields(
            build_parser().parse_args(
                ["--shared-memory", "system", "--shared-memory-prefix", "/side_", "--shared-memory-max-bytes", "4096"]
            )
        )
    )
    assert (options.shared_memory, options.shared_memory_prefix, options.shared_memory_max_bytes) == (
        "system",
        "/side_",
        4096,
    )


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
    with pytest.raises(InvalidRequest, match="Expected 16, got 15 .*shared_memory_byte_size is 15"):
        decode_request(request, shared_memory=registry)
    assert registry.statistics().holds == 0


METADATA = ModelMetadata(
    inputs=(TensorSpec("INPUT0", "FP32", (-1,)),),
    outputs=(TensorSpec("OUT_A", "FP32", (-1,)), TensorSpec("OUT_B", "INT64", (-1,))),
)


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
    assert [(t.name, t.datatype, list(t.shape)) for t in response.outputs] == [
        ("OUT_A", "FP32", [4]),
        ("OUT_B", "INT64", [8]),
    ]
    assert list(response.raw_output_contents) == [b"", b""]
    np.testing.assert_array_equal(target.array(0, "<f4", (4,)), np.arange(4))
    np.testing.assert_array_equal(target.array(256, "<i8", (8,)), np.arange(8))
