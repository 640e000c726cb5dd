"""System shared memory through a real server (`--shared-memory system`): the three calls as Triton defines them,
tensors in regions (inputs read from the object, outputs written into it), mixed with raw and typed contents,
streams, which descriptors are open when (counted in /proc/self/fd), and every bad input refused with a message
that names the region and the numbers, changing nothing.

Expected values are computed here with numpy from what the test wrote into the regions.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import grpc
import numpy as np
import pytest

from client import ClientError
from engine.testing.fixture import FixtureBackend, FixtureControls
from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from service.testing import serve

from .._shm import ShmObject, descriptors, in_region, mappings, register, wait_until
from .._support import CALL_TIMEOUT, demo_subset, rpc_error, write_fixture_model

PREFIX = "/slotserve_test_"
MAX_BYTES = 8 << 20  # --shared-memory-max-bytes of the module's server
ROW = 16 * 4  # bytes of one [1, 16] INT32 row of `simple`


@dataclass
class Lab:
    running: object
    controls: FixtureControls
    stub: pb_grpc.GRPCInferenceServiceStub

    @property
    def registry(self):
        return self.running.server.shared_memory


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    repository = demo_subset(
        tmp_path_factory.mktemp("shm") / "repository", "simple", "simple_identity", "identity_fp32"
    )
    # Output = input; its execute gate holds a request while the test unregisters what it uses.
    write_fixture_model(repository, "gated", inputs=[("INPUT0", "FP32", [-1])], outputs=[("OUTPUT0", "FP32", [-1])])
    # A streaming model: three responses per request.
    write_fixture_model(
        repository,
        "streamer",
        inputs=[("INPUT0", "FP32", [-1])],
        outputs=[("OUTPUT0", "FP32", [-1])],
        extra='parameters { key: "stream_responses" value { string_value: "3" } }\n',
    )
    controls = FixtureControls()
    with serve(
        repository,
        backends={"fixture": FixtureBackend(controls)},
        shared_memory="system",
        shared_memory_prefix=PREFIX,
        shared_memory_max_bytes=MAX_BYTES,
    ) as running:
        try:
            yield Lab(running, controls, pb_grpc.GRPCInferenceServiceStub(running.client.channel))
        finally:
            controls.release_all()


@pytest.fixture
def server(lab):
    """The module's server, left as found: after each test every region is unregistered, no request holds one and
    nothing stays open."""
    yield lab
    lab.controls.release_all()
    lab.stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(), timeout=CALL_TIMEOUT)
    wait_until(lambda: lab.registry.statistics().open_regions == 0, "every region closed")
    assert lab.registry.statistics().holds == 0


@pytest.fixture
def shm():
    """`shm(size) -> ShmObject`; every object is unlinked after the test."""
    objects = []

    def make(size: int, key: str | None = None) -> ShmObject:
        objects.append(ShmObject(size, key))
        return objects[-1]

    yield make
    for item in objects:
        item.close()


def status(stub, name: str = "") -> dict[str, tuple[str, int, int]]:
    response = stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(name=name), timeout=CALL_TIMEOUT)
    return {name: (region.key, region.offset, region.byte_size) for name, region in response.regions.items()}


def unregister(stub, name: str = "") -> None:
    stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name=name), timeout=CALL_TIMEOUT)


def simple_values(batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (
        rng.integers(-1000, 1000, (batch, 16), dtype=np.int32),
        rng.integers(-1000, 1000, (batch, 16), dtype=np.int32),
    )


def simple_in_regions(batch: int, inputs: str, outputs: str | None) -> pb.ModelInferRequest:
    """`simple` with INPUT0 and INPUT1 back to back in region `inputs`, OUTPUT0 and OUTPUT1 back to back in region
    `outputs` (None: outputs come back raw)."""
    size = batch * ROW
    request = pb.ModelInferRequest(model_name="simple", id="shm")
    for index, name in enumerate(("INPUT0", "INPUT1")):
        in_region(request.inputs.add(name=name, datatype="INT32", shape=[batch, 16]), inputs, size, index * size)
    if outputs is not None:
        for index, name in enumerate(("OUTPUT0", "OUTPUT1")):
            in_region(request.outputs.add(name=name), outputs, size, index * size)
    return request


def simple_regions(server, shm, batch: int = 2, seed: int = 0):
    """Regions "in" (the inputs, written) and "out" (for the outputs, filled with 0xEE): (in, out, a, b)."""
    a, b = simple_values(batch, seed)
    source, target = shm(2 * batch * ROW), shm(2 * batch * ROW)
    source.write(0, a.astype("<i4"))
    source.write(batch * ROW, b.astype("<i4"))
    target.write(0, b"\xee" * target.size)
    register(server.stub, "in", source.key, source.size, timeout=CALL_TIMEOUT)
    register(server.stub, "out", target.key, target.size, timeout=CALL_TIMEOUT)
    return source, target, a, b


# ---- the calls ----------------------------------------------------------------------------------------------------


def test_register_status_unregister_as_triton_defines_them(server, shm):
    first, second = shm(4096), shm(10_000)
    register(server.stub, "first", first.key, 4096, timeout=CALL_TIMEOUT)
    register(server.stub, "second", second.key, 1000, offset=8000, timeout=CALL_TIMEOUT)
    assert status(server.stub) == {"first": (first.key, 0, 4096), "second": (second.key, 8000, 1000)}
    assert status(server.stub, "second") == {"second": (second.key, 8000, 1000)}
    assert descriptors(first.key) == descriptors(second.key) == 1
    assert mappings(first.key) == mappings(second.key) == 0  # never mapped: read and written through the descriptor
    unregister(server.stub, "first")
    assert status(server.stub) == {"second": (second.key, 8000, 1000)}
    assert descriptors(first.key) == 0  # nothing held it: closed at unregister
    unregister(server.stub, "never-registered")  # OK, as in Triton
    unregister(server.stub)  # every region
    assert status(server.stub) == {} and descriptors(second.key) == 0


def test_status_of_an_unknown_region_is_not_found_in_tritons_words(server):
    error = rpc_error(server.stub.SystemSharedMemoryStatus, pb.SystemSharedMemoryStatusRequest(name="nope"))
    assert (error.code, error.reason) == ("NOT_FOUND", "region_not_found")
    assert error.message == "Unable to find system shared memory region: 'nope'"


def test_server_metadata_lists_the_extension(server):
    metadata = server.stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=CALL_TIMEOUT)
    assert "system_shared_memory" in metadata.extensions and "cuda_shared_memory" not in metadata.extensions


def test_one_region_under_two_names_is_opened_twice_and_each_reads_its_own_range(server, shm):
    source = shm(8192)
    source.write(4096, np.arange(4, dtype="<f4"))
    register(server.stub, "whole", source.key, 8192, timeout=CALL_TIMEOUT)
    register(server.stub, "tail", source.key, 4096, offset=4096, timeout=CALL_TIMEOUT)
    assert descriptors(source.key) == 2
    for region, offset in (("whole", 4096), ("tail", 0)):
        request = pb.ModelInferRequest(model_name="identity_fp32")
        in_region(request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4]), region, 16, offset)
        response = server.stub.ModelInfer(request, timeout=CALL_TIMEOUT)
        np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], "<f4"), np.arange(4))


# ---- tensors in regions -----------------------------------------------------------------------------------------


def test_inputs_and_outputs_in_regions(server, shm):
    source, target, a, b = simple_regions(server, shm, batch=3)
    response = server.stub.ModelInfer(simple_in_regions(3, "in", "out"), timeout=CALL_TIMEOUT)
    assert [(t.name, t.datatype, list(t.shape)) for t in response.outputs] == [
        ("OUTPUT0", "INT32", [3, 16]),
        ("OUTPUT1", "INT32", [3, 16]),
    ]
    assert list(response.raw_output_contents) == [b"", b""]  # no bytes: they are in the region
    assert response.id == "shm"
    np.testing.assert_array_equal(target.array(0, "<i4", (3, 16)), a + b)
    np.testing.assert_array_equal(target.array(3 * ROW, "<i4", (3, 16)), a - b)


def test_regions_raw_and_typed_contents_mix_across_tensors(server, shm):
    source, target, a, b = simple_regions(server, shm, batch=1)
    other = shm(ROW)
    other.write(0, b.astype("<i4"))
    register(server.stub, "other", other.key, ROW, timeout=CALL_TIMEOUT)

    # INPUT0 from a region, INPUT1 raw; OUTPUT0 into a region, OUTPUT1 raw.
    request = pb.ModelInferRequest(model_name="simple")
    in_region(request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16]), "in", ROW)
    request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    request.raw_input_contents.append(b.astype("<i4").tobytes())
    in_region(request.outputs.add(name="OUTPUT0"), "out", ROW, ROW)
    request.outputs.add(name="OUTPUT1")
    response = server.stub.ModelInfer(request, timeout=CALL_TIMEOUT)
    assert [t.name for t in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert response.raw_output_contents[0] == b""
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[1], "<i4").reshape(1, 16), a - b)
    np.testing.assert_array_equal(target.array(ROW, "<i4", (1, 16)), a + b)

    # INPUT0 typed, INPUT1 from another region; every output raw.
    request = pb.ModelInferRequest(model_name="simple")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16]).contents.int_contents.extend(a.ravel().tolist())
    in_region(request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16]), "other", ROW)
    response = server.stub.ModelInfer(request, timeout=CALL_TIMEOUT)
    outputs = {
        t.name: np.frombuffer(raw, "<i4").reshape(1, 16)
        for t, raw in zip(response.outputs, response.raw_output_contents, strict=True)
    }
    np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(outputs["OUTPUT1"], a - b)


def serialized(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def test_bytes_tensors_use_the_serialized_form_in_regions(server, shm):
    elements = [b"alpha", b"", "\u00e9t\u00e9".encode(), b"z" * 300]
    data = serialized(elements)
    source, target = shm(len(data) + 10), shm(1024)
    source.write(10, data)
    register(server.stub, "strings", source.key, source.size, timeout=CALL_TIMEOUT)
    register(server.stub, "strings_out", target.key, target.size, timeout=CALL_TIMEOUT)
    request = pb.ModelInferRequest(model_name="simple_identity")
    in_region(request.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 4]), "strings", len(data), 10)
    in_region(request.outputs.add(name="OUTPUT0"), "strings_out", 1024)
    response = server.stub.ModelInfer(request, timeout=CALL_TIMEOUT)
    assert [(t.name, t.datatype, list(t.shape)) for t in response.outputs] == [("OUTPUT0", "BYTES", [1, 4])]
    assert list(response.raw_output_contents) == [b""]
    assert target.read(0, len(data)) == data


def test_offsets_off_page_and_off_item_boundaries(server, shm):
    """A region registered at an offset that is not a page boundary, and a tensor at an offset that is not a
    multiple of its item size (read through a copy, since engines want aligned data)."""
    values = np.linspace(-3, 3, 50, dtype=np.float32)
    source, target = shm(10_000), shm(10_000)
    source.write(5000 + 6, values.astype("<f4"))
    register(server.stub, "odd", source.key, 4000, offset=5000, timeout=CALL_TIMEOUT)
    register(server.stub, "odd_out", target.key, 3000, offset=4097, timeout=CALL_TIMEOUT)
    request = pb.ModelInferRequest(model_name="identity_fp32")
    in_region(request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 50]), "odd", 200, 6)
    in_region(request.outputs.add(name="OUTPUT0"), "odd_out", 200, 3)
    server.stub.ModelInfer(request, timeout=CALL_TIMEOUT)
    np.testing.assert_array_equal(np.frombuffer(target.read(4097 + 3, 200), "<f4"), values)


def test_a_large_tensor_travels_in_regions_and_not_in_messages(server, shm):
    values = np.random.default_rng(3).standard_normal(1 << 20).astype(np.float32)  # 4 MiB
    source, target = shm(values.nbytes), shm(values.nbytes)
    source.write(0, values)
    register(server.stub, "big", source.key, values.nbytes, timeout=CALL_TIMEOUT)
    register(server.stub, "big_out", target.key, values.nbytes, timeout=CALL_TIMEOUT)
    request = pb.ModelInferRequest(model_name="identity_fp32")
    in_region(request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, values.size]), "big", values.nbytes)
    in_region(request.outputs.add(name="OUTPUT0"), "big_out", values.nbytes)
    assert request.ByteSize() < 200
    response = server.stub.ModelInfer(request, timeout=CALL_TIMEOUT)
    assert response.ByteSize() < 200
    assert target.read(0, values.nbytes) == values.tobytes()


def test_streams_use_regions_and_a_bad_request_does_not_end_the_stream(server, shm):
    source, target, a, b = simple_regions(server, shm, batch=2)
    second = shm(2 * 2 * ROW)
    c, d = simple_values(2, seed=9)
    second.write(0, c.astype("<i4"))
    second.write(2 * ROW, d.astype("<i4"))
    register(server.stub, "in2", second.key, second.size, timeout=CALL_TIMEOUT)
    results = shm(2 * 2 * ROW)
    register(server.stub, "out2", results.key, results.size, timeout=CALL_TIMEOUT)
    requests = [
        simple_in_regions(2, "in", "out"),
        simple_in_regions(2, "missing", None),
        simple_in_regions(2, "in2", "out2"),
    ]
    answers = list(server.stub.ModelStreamInfer(iter(requests), timeout=CALL_TIMEOUT))
    assert [bool(answer.error_message) for answer in answers] == [False, True, False]
    assert "Unable to find shared memory region: 'missing'" in answers[1].error_message
    for answer in (answers[0], answers[2]):
        assert list(answer.infer_response.raw_output_contents) == [b"", b""]
        assert [list(t.shape) for t in answer.infer_response.outputs] == [[2, 16], [2, 16]]
    np.testing.assert_array_equal(target.array(0, "<i4", (2, 16)), a + b)
    np.testing.assert_array_equal(target.array(2 * ROW, "<i4", (2, 16)), a - b)
    np.testing.assert_array_equal(results.array(0, "<i4", (2, 16)), c + d)
    np.testing.assert_array_equal(results.array(2 * ROW, "<i4", (2, 16)), c - d)


def test_a_streaming_model_writes_each_response_into_the_region(server, shm):
    values = np.linspace(0, 1, 10, dtype=np.float32)
    source, target = shm(values.nbytes), shm(values.nbytes)
    source.write(0, values)
    register(server.stub, "stream_in", source.key, values.nbytes, timeout=CALL_TIMEOUT)
    register(server.stub, "stream_out", target.key, values.nbytes, timeout=CALL_TIMEOUT)
    request = pb.ModelInferRequest(model_name="streamer", id="s")
    in_region(request.inputs.add(name="INPUT0", datatype="FP32", shape=[10]), "stream_in", values.nbytes)
    in_region(request.outputs.add(name="OUTPUT0"), "stream_out", values.nbytes)
    answers = list(server.stub.ModelStreamInfer(iter([request]), timeout=CALL_TIMEOUT))
    assert len(answers) == 3 and not any(answer.error_message for answer in answers)
    for answer in answers:
        assert list(answer.infer_response.raw_output_contents) == [b""]
        assert [list(t.shape) for t in answer.infer_response.outputs] == [[10]]
    np.testing.assert_array_equal(target.array(0, "<f4", (10,)), values)
    assert server.registry.statistics().holds == 0


# ---- what is open, and when -------------------------------------------------------------------------------------


def gated_request(region: str | None, values: np.ndarray, output_region: str | None = None) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="gated")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[values.size])
    if region is None:
        request.raw_input_contents.append(values.astype("<f4").tobytes())
    else:
        in_region(tensor, region, values.nbytes)
    if output_region is not None:
        in_region(request.outputs.add(name="OUTPUT0"), output_region, values.nbytes)
    return request


def test_unregistering_a_region_a_running_request_uses_unmaps_it_when_the_request_ends(server, shm):
    values = np.arange(8, dtype=np.float32) * 1.5
    source = shm(values.nbytes)
    source.write(0, values)
    register(server.stub, "live", source.key, values.nbytes, timeout=CALL_TIMEOUT)
    assert descriptors(source.key) == 1
    gate = server.controls.gate("gated", "execute").hold()
    running = server.stub.ModelInfer.future(gated_request("live", values), timeout=CALL_TIMEOUT)
    gate.wait_blocked(1)
    unregister(server.stub, "live")
    # At once for new requests; the running one keeps its descriptor.
    assert status(server.stub) == {}
    error = rpc_error(server.stub.ModelInfer, gated_request("live", values))
    assert (error.code, error.reason) == ("NOT_FOUND", "region_not_found")
    assert descriptors(source.key) == 1
    statistics = server.registry.statistics()
    assert (statistics.regions, statistics.open_regions, statistics.holds) == (0, 1, 1)
    gate.release()
    response = running.result(timeout=CALL_TIMEOUT)
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], "<f4"), values)
    wait_until(lambda: descriptors(source.key) == 0, "the descriptor to go with the request")
    statistics = server.registry.statistics()
    assert (statistics.open_regions, statistics.open_bytes, statistics.holds) == (0, 0, 0)


def test_a_region_unregistered_while_its_request_waits_for_a_slot_is_refused_and_nothing_is_written(server, shm):
    values = np.arange(6, dtype=np.float32)
    source, target = shm(values.nbytes), shm(values.nbytes)
    source.write(0, values)
    target.write(0, b"\xee" * values.nbytes)
    register(server.stub, "queued_in", source.key, values.nbytes, timeout=CALL_TIMEOUT)
    register(server.stub, "queued_out", target.key, values.nbytes, timeout=CALL_TIMEOUT)
    gate = server.controls.gate("gated", "execute").hold()
    first = server.stub.ModelInfer.future(gated_request(None, values), timeout=CALL_TIMEOUT)
    gate.wait_blocked(1)  # the one slot is taken
    second = server.stub.ModelInfer.future(gated_request("queued_in", values, "queued_out"), timeout=CALL_TIMEOUT)
    wait_until(lambda: server.running.management.get("gated").queued_requests == 1, "the second request queued")
    unregister(server.stub, "queued_in")
    gate.release()
    first.result(timeout=CALL_TIMEOUT)
    with pytest.raises(grpc.RpcError) as info:
        second.result(timeout=CALL_TIMEOUT)
    error = ClientError.from_rpc_error(info.value)
    assert error.code == "INVALID_ARGUMENT"
    assert "region 'queued_in' was unregistered after this request was accepted and before it ran" in error.message
    assert target.read(0, values.nbytes) == b"\xee" * values.nbytes
    wait_until(lambda: descriptors(source.key) == 0, "the unregistered region to be closed")


def test_shutdown_closes_every_region(tmp_path, shm):
    source = shm(4096)
    repository = demo_subset(tmp_path / "repository", "identity_fp32")
    with serve(repository, shared_memory="system") as running:
        register(pb_grpc.GRPCInferenceServiceStub(running.client.channel), "r", source.key, 4096, timeout=CALL_TIMEOUT)
        assert descriptors(source.key) == 1
    assert descriptors(source.key) == 0
    assert running.server.shared_memory.statistics().open_regions == 0


# ---- bad registrations ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        "empty_name",
        "long_name",
        "long_utf8_name",
        "huge_name",
        "long_key",
        "twice",
        "missing",
        "no_slash",
        "path",
        "bare_slash",
        "dot_dot",
        "outside_prefix",
        "fifo",
        "folder",
        "zero_size",
        "past_the_end",
    ],
)
def test_a_bad_registration_is_refused_naming_the_problem_and_changes_nothing(server, shm, case):
    existing = shm(4096)
    register(server.stub, "existing", existing.key, 4096, timeout=CALL_TIMEOUT)
    target = shm(100)
    special = None
    name, key, offset, size = "r", target.key, 0, 100
    if case == "empty_name":
        name, says = "", ["needs a name"]
    elif case == "long_name":
        name, says = "n" * 256, ["name may be at most 255 bytes (UTF-8); this one has 256"]
    elif case == "long_utf8_name":
        name, says = "\u00e9" * 128, ["name may be at most 255 bytes (UTF-8); this one has 256"]
    elif case == "huge_name":  # what once took 1 MiB of the server's memory per region
        name, says = "n" * (1 << 20), [f"name may be at most 255 bytes (UTF-8); this one has {1 << 20}"]
    elif case == "long_key":
        key, says = PREFIX + "k" * 256, ["at most 255 bytes after the '/'"]
    elif case == "twice":
        name, says = "existing", ["'existing' already in manager", existing.key, "4096 bytes"]
    elif case == "missing":
        key, says = PREFIX + "missing", ["'r'", PREFIX + "missing", "does not exist"]
    elif case == "no_slash":
        key, says = target.key[1:], ["must start with '/'"]
    elif case == "path":
        key, says = "/dev/shm" + target.key, ["no '/' after the first", "never a path"]
    elif case == "bare_slash":
        key, says = "/", ["must name an object"]
    elif case == "dot_dot":
        key, says = "/..", ["must name an object"]
    elif case == "outside_prefix":
        key, says = "/elsewhere", ["'/elsewhere'", f"starting with {PREFIX!r}", "--shared-memory-prefix"]
    elif case == "fifo":
        special = f"/dev/shm/{PREFIX[1:]}fifo_{os.getpid()}"
        os.mkfifo(special)
        key, says = "/" + os.path.basename(special), ["is not a shared-memory object"]
    elif case == "folder":
        special = f"/dev/shm/{PREFIX[1:]}folder_{os.getpid()}"
        os.mkdir(special)
        key, says = "/" + os.path.basename(special), ["is not a shared-memory object"]
    elif case == "zero_size":
        size, says = 0, ["failed to register shared memory region 'r': invalid args", "byte_size must be > 0, got 0"]
    else:
        offset, size, says = (
            60,
            50,
            [
                "failed to register shared memory region 'r': invalid args",
                "offset 60 + byte_size 50 = 110 is past the end of the object (100 bytes)",
            ],
        )
    try:
        error = rpc_error(
            server.stub.SystemSharedMemoryRegister,
            pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=offset, byte_size=size),
        )
    finally:
        if special is not None:
            (os.rmdir if os.path.isdir(special) else os.unlink)(special)
    expected = ("ALREADY_EXISTS", "region_exists") if case == "twice" else ("INVALID_ARGUMENT", "invalid_request_error")
    assert (error.code, error.reason) == expected, error  # Triton's codes
    for phrase in says:
        assert phrase in error.message, f"{phrase!r} not in {error.message!r}"
    assert len(error.message) < 400
    assert status(server.stub) == {"existing": (existing.key, 0, 4096)}
    assert descriptors(target.key) == 0 and descriptors(existing.key) == 1
    assert server.registry.statistics().open_regions == 1


def test_names_and_keys_of_255_bytes_are_accepted(server, shm):
    """The bounds are NAME_MAX (255) bytes: a name that long registers and serves, as does a key of "/" and 255."""
    source = shm(4096, "/" + (PREFIX[1:] + "k" * 255)[:255])
    source.write(0, np.arange(4, dtype="<f4"))
    name = "\u00e9" * 127 + "n"  # 255 bytes of UTF-8
    register(server.stub, name, source.key, 4096, timeout=CALL_TIMEOUT)
    request = pb.ModelInferRequest(model_name="identity_fp32")
    in_region(request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4]), name, 16)
    response = server.stub.ModelInfer(request, timeout=CALL_TIMEOUT)
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], "<f4"), np.arange(4))
    assert status(server.stub) == {name: (source.key, 0, 4096)}


def test_registering_beyond_the_byte_bound_is_refused_and_running_requests_count(server, shm):
    big, more = shm(MAX_BYTES - 4096), shm(8192)
    register(server.stub, "big", big.key, big.size, timeout=CALL_TIMEOUT)
    error = rpc_error(
        server.stub.SystemSharedMemoryRegister,
        pb.SystemSharedMemoryRegisterRequest(name="more", key=more.key, byte_size=8192),
    )
    assert (error.code, error.reason) == ("RESOURCE_EXHAUSTED", "shared_memory_limit")
    assert f"it takes 8192 bytes and {MAX_BYTES - 4096} are registered already" in error.message
    assert f"--shared-memory-max-bytes is {MAX_BYTES}" in error.message
    assert "more" not in status(server.stub) and descriptors(more.key) == 0
    register(server.stub, "more", more.key, 4096, timeout=CALL_TIMEOUT)  # what fits is still accepted


# ---- bad requests -----------------------------------------------------------------------------------------------


def _parameter(tensor, key: str, **value) -> None:
    tensor.parameters[key].Clear()
    field, number = next(iter(value.items()))
    setattr(tensor.parameters[key], field, number)


BAD_REQUESTS = {
    # case: (how the valid request is changed, code, phrases of the message)
    "unknown_region": (
        lambda r: _parameter(r.inputs[1], "shared_memory_region", string_param="missing"),
        "NOT_FOUND",
        ["Unable to find shared memory region: 'missing'", "input 'INPUT1'"],
    ),
    "past_the_region": (
        lambda r: _parameter(r.inputs[1], "shared_memory_offset", int64_param=100),
        "INVALID_ARGUMENT",
        [
            "Invalid offset + byte size for shared memory region: 'in' (input 'INPUT1': the region holds 128 bytes; "
            "shared_memory_offset 100 + shared_memory_byte_size 64 = 164 is past its end"
        ],
    ),
    "size_not_the_shape": (
        lambda r: _parameter(r.inputs[0], "shared_memory_byte_size", int64_param=60),
        "INVALID_ARGUMENT",
        [
            "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60",
            "in shared memory region 'in'",
            "shared_memory_byte_size is 60",
        ],
    ),
    "output_region_too_small": (
        lambda r: _parameter(r.outputs[1], "shared_memory_byte_size", int64_param=32),
        "INVALID_ARGUMENT",
        ["output 'OUTPUT1' needs 64 bytes", "region 'out' gives it 32", "ask for at least 64"],
    ),
    "typed_and_region": (
        lambda r: r.inputs[0].contents.int_contents.extend(range(16)),
        "INVALID_ARGUMENT",
        ["unexpected 'content' provided when using shared memory for input tensor 'INPUT0'", "region 'in'"],
    ),
    "raw_and_region": (
        lambda r: r.raw_input_contents.extend([b"\0" * ROW, b"\0" * ROW]),
        "INVALID_ARGUMENT",
        ["input 'INPUT0' names shared memory region 'in' and has a raw_input_contents entry too"],
    ),
    "negative_offset": (
        lambda r: _parameter(r.inputs[0], "shared_memory_offset", int64_param=-8),
        "INVALID_ARGUMENT",
        ["input 'INPUT0'", "'shared_memory_offset' must be >= 0, got -8"],
    ),
    "overflowing_offset": (
        lambda r: _parameter(r.outputs[0], "shared_memory_offset", uint64_param=2**64 - 1),
        "INVALID_ARGUMENT",
        [
            "Invalid offset for shared memory region: 'out' (output 'OUTPUT0': the region holds 128 bytes",
            f"shared_memory_offset {2**64 - 1} + shared_memory_byte_size 64 = {2**64 + 63} is past its end",
        ],
    ),
    "negative_size": (
        lambda r: _parameter(r.outputs[0], "shared_memory_byte_size", int64_param=-1),
        "INVALID_ARGUMENT",
        ["output 'OUTPUT0'", "'shared_memory_byte_size' must be >= 0, got -1"],
    ),
    "offset_without_region": (
        lambda r: r.inputs[0].parameters.pop("shared_memory_region"),
        "INVALID_ARGUMENT",
        ["input 'INPUT0' has 'shared_memory_offset' without 'shared_memory_region'"],
    ),
    "region_without_size": (
        lambda r: r.outputs[0].parameters.pop("shared_memory_byte_size"),
        "INVALID_ARGUMENT",
        ["output 'OUTPUT0' names shared memory region 'out' without 'shared_memory_byte_size'"],
    ),
    "region_not_a_string": (
        lambda r: _parameter(r.inputs[0], "shared_memory_region", int64_param=1),
        "INVALID_ARGUMENT",
        ["input 'INPUT0'", "'shared_memory_region' must be a string_param"],
    ),
    "size_not_an_integer": (
        lambda r: _parameter(r.inputs[0], "shared_memory_byte_size", string_param="64"),
        "INVALID_ARGUMENT",
        ["input 'INPUT0'", "'shared_memory_byte_size' must be an int64_param"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_a_bad_request_is_refused_naming_region_and_numbers_and_changes_nothing(server, shm, case):
    source, target, a, b = simple_regions(server, shm, batch=1)
    change, code, says = BAD_REQUESTS[case]
    request = simple_in_regions(1, "in", "out")
    change(request)
    before = status(server.stub)
    error = rpc_error(server.stub.ModelInfer, request)
    assert error.code == code, error
    for phrase in says:
        assert phrase in error.message, f"{phrase!r} not in {error.message!r}"
    assert target.read(0, target.size) == b"\xee" * target.size  # no output written
    assert status(server.stub) == before
    statistics = server.registry.statistics()
    assert (statistics.holds, statistics.open_regions) == (0, 2)
    # The same regions still serve a valid request.
    server.stub.ModelInfer(simple_in_regions(1, "in", "out"), timeout=CALL_TIMEOUT)
    np.testing.assert_array_equal(target.array(0, "<i4", (1, 16)), a + b)


# ---- who may register, and servers without shared memory ----------------------------------------------------------


def test_registering_needs_the_inference_token_when_one_is_set(tmp_path, shm):
    source = shm(4096)
    repository = demo_subset(tmp_path / "repository", "identity_fp32")
    with serve(repository, shared_memory="system", inference_token="secret-token") as running:
        stub = pb_grpc.GRPCInferenceServiceStub(running.client.channel)
        error = rpc_error(
            stub.SystemSharedMemoryRegister,
            pb.SystemSharedMemoryRegisterRequest(name="r", key=source.key, byte_size=4096),
        )
        assert error.code == "UNAUTHENTICATED" and descriptors(source.key) == 0
        register(
            stub, "r", source.key, 4096, timeout=CALL_TIMEOUT, metadata=(("authorization", "Bearer secret-token"),)
        )
        assert descriptors(source.key) == 1


def test_without_the_flag_a_request_naming_a_region_is_refused_saying_how_to_enable_it(tmp_path):
    repository = demo_subset(tmp_path / "repository", "identity_fp32")
    with serve(repository) as running:
        stub = pb_grpc.GRPCInferenceServiceStub(running.client.channel)
        request = pb.ModelInferRequest(model_name="identity_fp32")
        in_region(request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4]), "r", 16)
        error = rpc_error(stub.ModelInfer, request)
        assert error.code == "INVALID_ARGUMENT"
        assert "names shared memory region 'r'" in error.message and "--shared-memory system" in error.message
        assert running.server.shared_memory is None
