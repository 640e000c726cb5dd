"""A client cannot kill the server through system shared memory. Whatever it does to its own objects (shrinks one
to nothing, below its region's offset or into a tensor; grows one; between register and use, or while its request
runs after it has unregistered the region, as the protocol allows), the request that meets a shrunk region is
refused with INVALID_ARGUMENT naming the region and both sizes, nothing is written into a shrunk object (it is not
grown back either), and the server and every other request go on.

The server runs as its own process (`python -m service`, tests/shutdown/harness.py): a server that maps regions
gets SIGBUS when it touches a page past the end of a shrunk object, which kills it; here that shows as the
process gone (exit code -7) rather than as this test process dying. Requests are held inside their run with the
fixture's file gates; nothing is ordered by sleeping.
"""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
import numpy as np
import pytest

from client import ClientError
from generated import grpc_service_pb2 as pb
from tests.shutdown.harness import FileGates, ServerProcess, assert_ok, outcome, write_fixture_model

from .._shm import ShmObject, descriptors, in_region, mappings, register, wait_until
from .._support import CALL_TIMEOUT, rpc_error

PREFIX = "/slotserve_test_"
REGION_OFFSET = 4096  # every region starts one page into its object ...
REGION_SIZE = 4096  # ... and ends at the object's end
TENSOR_OFFSET = 64  # the tensor's shared_memory_offset inside its region
VALUES = np.arange(16, dtype=np.float32) * 0.5  # 64 bytes: bytes 4160 to 4224 of the object
TENSOR_START = REGION_OFFSET + TENSOR_OFFSET
TENSOR_END = TENSOR_START + VALUES.nbytes
# How far a client shrinks its object: to nothing, to below the region's start, to the middle of the tensor.
SHRUNK_SIZES = {"emptied": 0, "below_the_region": 1000, "into_the_tensor": TENSOR_START + 8}


@pytest.fixture(scope="module")
def gate_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gates")


@pytest.fixture(scope="module")
def process(tmp_path_factory, gate_dir):
    repository = tmp_path_factory.mktemp("hostile") / "repository"
    write_fixture_model(repository, "m", {"gate_dir": gate_dir})  # output = input, FP32 [-1]
    with ServerProcess(repository, "--shared-memory", "system", "--shared-memory-prefix", PREFIX) as server:
        yield server


@pytest.fixture
def server(process, gate_dir):
    """The module's server; after each test it is still running and serving (the point of every test here), its
    gates are open, and nothing of the test's stays registered or open in it."""
    yield process
    for entry in gate_dir.iterdir():
        entry.unlink()
    assert_alive(process)
    process.stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(), timeout=CALL_TIMEOUT)


@pytest.fixture
def shm(server):
    """`shm(name) -> ShmObject`: an object of REGION_OFFSET + REGION_SIZE bytes registered as region `name` (its
    last REGION_SIZE bytes). Unlinked after the test, once the server holds no descriptor of it."""
    objects = []

    def make(name: str) -> ShmObject:
        item = ShmObject(REGION_OFFSET + REGION_SIZE)
        objects.append(item)
        item.write(0, b"\xee" * item.size)
        register(server.stub, name, item.key, REGION_SIZE, offset=REGION_OFFSET, timeout=CALL_TIMEOUT)
        return item

    try:
        yield make
        server.stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(), timeout=CALL_TIMEOUT)
        for item in objects:
            wait_until(
                lambda item=item: descriptors(item.key, server.process.pid) == 0, f"the server to close {item.key}"
            )
    finally:  # a server that died leaves them too
        for item in objects:
            item.close()


def status(server) -> set[str]:
    response = server.stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(), timeout=CALL_TIMEOUT)
    return set(response.regions)


def assert_alive(server) -> None:
    code = server.process.poll()
    assert code is None, f"the server died with exit code {code} (-7 is SIGBUS):\n{server.log[-3000:]}"


def request_for(input_region: str | None = None, output_region: str | None = None) -> pb.ModelInferRequest:
    """`m` with INPUT0 = VALUES, from `input_region` (at TENSOR_OFFSET) or raw; OUTPUT0 into `output_region` (at
    TENSOR_OFFSET) or raw."""
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[VALUES.size])
    if input_region is None:
        request.raw_input_contents.append(VALUES.tobytes())
    else:
        in_region(tensor, input_region, VALUES.nbytes, TENSOR_OFFSET)
    if output_region is not None:
        in_region(request.outputs.add(name="OUTPUT0"), output_region, VALUES.nbytes, TENSOR_OFFSET)
    return request


def write_values(item: ShmObject) -> None:
    item.write(TENSOR_START, VALUES.astype("<f4"))


def size_of(item: ShmObject) -> int:
    return os.stat(item.path).st_size


def assert_shrunk_error(error, tensor: str, region: str, size: int, consequence: str) -> None:
    assert (error.code, error.reason) == ("INVALID_ARGUMENT", "invalid_request_error"), error
    for phrase in (
        f"{tensor}: shared memory region '{region}'",
        f"registered as {REGION_SIZE} bytes from offset {REGION_OFFSET}",
        f"needs bytes {TENSOR_START} to {TENSOR_END} of the object",
        f"now holds {size} bytes",
        consequence,
    ):
        assert phrase in error.message, f"{phrase!r} not in {error.message!r}"


def assert_serves(server, shm) -> None:
    """The server runs, and serves requests in and out of a fresh region as well as raw ones."""
    assert_alive(server)
    server.stub.ServerLive(pb.ServerLiveRequest(), timeout=CALL_TIMEOUT)
    response = server.stub.ModelInfer(request_for(), timeout=CALL_TIMEOUT)
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], "<f4"), VALUES)
    healthy = shm("healthy")
    write_values(healthy)
    response = server.stub.ModelInfer(request_for("healthy", "healthy"), timeout=CALL_TIMEOUT)
    assert list(response.raw_output_contents) == [b""]
    np.testing.assert_array_equal(healthy.array(TENSOR_START, "<f4", VALUES.shape), VALUES)


@pytest.mark.parametrize("shrunk", sorted(SHRUNK_SIZES))
def test_a_request_reading_a_region_shrunk_since_register_is_refused_and_the_server_lives(server, shm, shrunk):
    item = shm("in")
    write_values(item)
    os.truncate(item.path, SHRUNK_SIZES[shrunk])
    error = rpc_error(server.stub.ModelInfer, request_for("in"))
    assert_shrunk_error(error, "input 'INPUT0'", "in", SHRUNK_SIZES[shrunk], "the request is refused")
    assert size_of(item) == SHRUNK_SIZES[shrunk]
    assert_serves(server, shm)


@pytest.mark.parametrize("shrunk", sorted(SHRUNK_SIZES))
def test_a_request_writing_into_a_region_shrunk_since_register_is_refused_and_nothing_is_written(server, shm, shrunk):
    item = shm("out")
    os.truncate(item.path, SHRUNK_SIZES[shrunk])
    error = rpc_error(server.stub.ModelInfer, request_for(None, "out"))
    assert_shrunk_error(error, "output 'OUTPUT0'", "out", SHRUNK_SIZES[shrunk], "nothing was written")
    assert size_of(item) == SHRUNK_SIZES[shrunk]  # not grown back by a write
    assert item.read(0, item.size) == b"\xee" * SHRUNK_SIZES[shrunk]
    assert_serves(server, shm)


def test_a_region_whose_object_grew_since_register_serves_as_before(server, shm):
    item = shm("grown")
    write_values(item)
    os.truncate(item.path, item.size + (1 << 20))
    response = server.stub.ModelInfer(request_for("grown", "grown"), timeout=CALL_TIMEOUT)
    assert list(response.raw_output_contents) == [b""]
    np.testing.assert_array_equal(item.array(TENSOR_START, "<f4", VALUES.shape), VALUES)
    assert size_of(item) == item.size + (1 << 20)
    assert mappings(item.key) == 0  # (this process's own maps: the test side maps nothing either)


def test_unregistering_while_the_request_runs_then_shrinking_fails_that_request_alone(server, shm, gate_dir):
    """The well-behaved client: unregister answers at once while its request runs (as documented), and the client
    then frees its objects' memory. Its input was read when the request was decoded, so the run goes on; its
    output finds the object shrunk and is refused, naming the region and both sizes."""
    source, target = shm("in"), shm("out")
    write_values(source)
    gates = FileGates(gate_dir, "m")
    gates.hold("execute")
    running = server.stub.ModelInfer.future(request_for("in", "out"), timeout=CALL_TIMEOUT)
    gates.wait_arrived("execute")
    server.stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(), timeout=CALL_TIMEOUT)
    os.truncate(source.path, 0)
    os.truncate(target.path, 0)
    other = server.stub.ModelInfer.future(request_for(), timeout=CALL_TIMEOUT)  # waits for the one slot
    gates.release("execute")
    code, error = outcome(running, timeout=CALL_TIMEOUT)
    assert code == "INVALID_ARGUMENT", error
    assert_shrunk_error(error, "output 'OUTPUT0'", "out", 0, "nothing was written")
    assert size_of(target) == 0
    assert_ok(other, VALUES)
    for item in (source, target):
        wait_until(
            lambda item=item: descriptors(item.key, server.process.pid) == 0, "the server to close the descriptor"
        )
    assert_serves(server, shm)


def test_shrinking_an_input_while_its_request_runs_does_not_change_the_answer(server, shm, gate_dir):
    source = shm("in")
    write_values(source)
    gates = FileGates(gate_dir, "m")
    gates.hold("execute")
    running = server.stub.ModelInfer.future(request_for("in"), timeout=CALL_TIMEOUT)
    gates.wait_arrived("execute")
    server.stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name="in"), timeout=CALL_TIMEOUT)
    os.truncate(source.path, 0)
    gates.release("execute")
    assert_ok(running, VALUES)  # read into the server's memory when the request was decoded
    assert_serves(server, shm)


def test_a_shrunk_region_fails_its_request_on_a_stream_and_the_stream_goes_on(server, shm):
    item = shm("in")
    write_values(item)
    os.truncate(item.path, 0)
    answers = list(server.stub.ModelStreamInfer(iter([request_for("in"), request_for()]), timeout=CALL_TIMEOUT))
    assert len(answers) == 2
    assert "shared memory region 'in'" in answers[0].error_message and "now holds 0 bytes" in answers[0].error_message
    assert not answers[1].error_message
    np.testing.assert_array_equal(np.frombuffer(answers[1].infer_response.raw_output_contents[0], "<f4"), VALUES)
    assert_serves(server, shm)


def test_the_server_never_maps_a_region(server, shm):
    item = shm("in")
    with open(f"/proc/{server.process.pid}/maps") as maps:
        assert item.path.name not in maps.read()
    assert descriptors(item.key, server.process.pid) == 1


LEASE_HOLDER = """
import fcntl, os, signal, sys
signal.signal(signal.SIGIO, signal.SIG_IGN)  # the kernel tells a lease holder with SIGIO that someone opens
descriptor = os.open(sys.argv[1], os.O_RDONLY)
try:
    fcntl.fcntl(descriptor, fcntl.F_SETLEASE, fcntl.F_RDLCK)
except OSError as error:
    print(f"no lease: {error}", flush=True)
    sys.exit(0)
print("leased", flush=True)
sys.stdin.read()
"""


def test_registering_an_object_another_process_holds_a_lease_on_is_refused_at_once(server, tmp_path):
    """A read lease (fcntl F_SETLEASE) makes every open for writing wait until the holder lets go or the kernel's
    lease-break-time (45 s) passes: a register must not pin a handler thread that long, so it is refused at once."""
    item = ShmObject(4096)
    holder = subprocess.Popen(
        [sys.executable, "-c", LEASE_HOLDER, str(item.path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        said = holder.stdout.readline().strip()
        if said != "leased":
            pytest.skip(f"this kernel gives no lease on /dev/shm objects ({said})")
        # The deadline is well below the 45 s an open would wait: a server that waits answers DEADLINE_EXCEEDED.
        with pytest.raises(grpc.RpcError) as info:
            server.stub.SystemSharedMemoryRegister(
                pb.SystemSharedMemoryRegisterRequest(name="leased", key=item.key, byte_size=4096), timeout=30
            )
        error = ClientError.from_rpc_error(info.value)
        assert (error.code, error.reason) == ("INVALID_ARGUMENT", "invalid_request_error"), error
        assert "holds a lease on it" in error.message and "'leased'" in error.message, error.message
        assert descriptors(item.key, server.process.pid) == 0
        assert "leased" not in status(server)
    finally:
        holder.kill()
        holder.wait(timeout=CALL_TIMEOUT)
        item.close()
