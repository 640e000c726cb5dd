"""L0_shared_memory (system shared memory, over gRPC), rewritten with a python `simple` add/sub model (INT32
[16], batching 8, as the QA's `simple`): registering, unregistering and the status list; re-registering a name;
inputs and outputs in regions; a region larger than the input; offsets and sizes out of bounds at register and at
inference; and unregistering while a request uses the regions (the QA's delayed model, here one that waits for
the test's word). Two cases of the QA file are the client library's own (creating a region of size -1, the
client's memory over 100000 regions) and are left out."""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import contextlib
import os
import threading

import numpy as np
import pytest

from .harness import ClientRegion, Model, build_request, in_region, python_model, wait_for
from .models import ADD_SUB

SIZE = 64  # bytes: 16 INT32
SIMPLE_CONFIG = """
    max_batch_size: 8
    input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
    instance_group [ { kind: KIND_CPU } ]
"""

# add/sub that first writes "started" into its folder and waits for a "release" file there (60 s at most).
DELAYED = ADD_SUB.replace(
    "        def execute(self, requests):\n",
    """        def execute(self, requests):
            import os, time

            folder = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            open(os.path.join(folder, "started"), "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(folder, "release")) and time.monotonic() < deadline:
                time.sleep(0.02)  # ordering-free: polls the test's release file until a deadline
""",
)

MODELS: dict[str, Model] = {
    "simple": python_model(SIMPLE_CONFIG, ADD_SUB),
    "simple_delayed": python_model(SIMPLE_CONFIG, DELAYED),
}
SLOTSERVE_OPTIONS = {"shared_memory": "system"}
NAMES = ("input0_data", "input1_data", "output0_data", "output1_data")


def _key(name: str) -> str:
    return f"/qa{os.getpid()}_{name}"  # other test runs on this machine use the same region names


@pytest.fixture
def regions(server):
    """Create (not register) the four 64-byte objects, inputs filled; unregister everything and unlink after."""
    made = {name: ClientRegion(_key(name), SIZE) for name in NAMES}
    made["input0_data"].write(np.arange(16, dtype=np.int32))
    made["input1_data"].write(np.ones(16, dtype=np.int32))
    server.unregister()
    yield made
    server.unregister()
    for region in made.values():
        region.close()


def _register_all(server, byte_size: int = SIZE, offset: int = 0) -> None:
    for name in NAMES:
        code, message = server.register(name, _key(name), byte_size, offset)
        assert code == "OK", message


def _infer(server, model="simple", input1=None, output_offset=0, output_size=SIZE, input1_size=SIZE):
    inputs = {
        "INPUT0": in_region("input0_data", "INT32", [1, 16], SIZE),
        "INPUT1": input1 if input1 is not None else in_region("input1_data", "INT32", [1, 16], input1_size),
    }
    outputs = {"OUTPUT0": ("output0_data", output_size, output_offset), "OUTPUT1": ("output1_data", SIZE, 0)}
    return server.send(build_request(model, inputs, outputs))


def _check_outputs(regions) -> None:
    assert regions["output0_data"].read(np.int32, 16).tolist() == list(range(1, 17))
    assert regions["output1_data"].read(np.int32, 16).tolist() == list(range(-1, 15))


@contextlib.contextmanager
def _dummy(server, size: int = 8):
    region = ClientRegion(_key("dummy_data"), size)
    try:
        region.write(np.array([1, 2], np.float32))
        server.unregister()
        yield region
    finally:
        server.unregister()
        region.close()


def test_valid_create_set_register(server):
    with _dummy(server):
        assert server.register("dummy_data", _key("dummy_data"), 8) == ("OK", "")
        assert server.regions()[2] == ["dummy_data"]


def test_unregister_before_register(server):
    with _dummy(server):
        assert server.unregister("dummy_data") == ("OK", "")
        assert server.regions()[2] == []


def test_unregister_after_register(server):
    with _dummy(server):
        assert server.register("dummy_data", _key("dummy_data"), 8) == ("OK", "")
        assert server.unregister("dummy_data") == ("OK", "")
        assert server.regions()[2] == []


def test_reregister_after_register(server):
    with _dummy(server):
        assert server.register("dummy_data", _key("dummy_data"), 8) == ("OK", "")
        code, message = server.register("dummy_data", _key("dummy_data"), 8)
        assert code == "ALREADY_EXISTS"
        assert "shared memory region 'dummy_data' already in manager" in message
        assert server.regions()[2] == ["dummy_data"]


def test_unregister_after_inference(server, regions):
    _register_all(server)
    assert _infer(server).ok
    _check_outputs(regions)
    assert server.unregister("output0_data") == ("OK", "")
    assert len(server.regions()[2]) == 3


def test_register_after_inference(server, regions):
    _register_all(server)
    assert _infer(server).ok
    extra = ClientRegion(_key("input2_data"), SIZE)
    try:
        assert server.register("input2_data", _key("input2_data"), SIZE) == ("OK", "")
        assert len(server.regions()[2]) == 5
    finally:
        server.unregister("input2_data")
        extra.close()


def test_too_big_shm(server, regions):
    """INPUT1 from a 128-byte region: the byte size does not match the shape."""
    _register_all(server)
    big = ClientRegion(_key("input2_data"), 128)
    try:
        assert server.register("input2_data", _key("input2_data"), 128) == ("OK", "")
        answer = _infer(server, input1=in_region("input2_data", "INT32", [1, 16], 128))
        assert not answer.ok
        assert "input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 128" in answer.message
    finally:
        server.unregister("input2_data")
        big.close()


def test_mixed_raw_shm(server, regions):
    _register_all(server)
    assert _infer(server, input1=np.ones([1, 16], np.int32)).ok
    _check_outputs(regions)


def test_unregisterall(server, regions):
    _register_all(server)
    assert len(server.regions()[2]) == 4
    assert server.unregister() == ("OK", "")
    assert server.regions()[2] == []


def test_infer_offset_out_of_bound(server, regions):
    _register_all(server)
    answer = _infer(server, output_offset=SIZE)
    assert not answer.ok
    assert "Invalid offset for shared memory region" in answer.message, answer.message


def test_infer_byte_size_out_of_bound(server, regions):
    _register_all(server)
    answer = _infer(server, output_offset=60, output_size=SIZE)
    assert not answer.ok
    assert "Invalid offset + byte size for shared memory region" in answer.message, answer.message


def test_register_out_of_bound(server, regions):
    for byte_size, offset in ((SIZE + 1, 0), (SIZE, 1), (1, SIZE), (0, SIZE + 1)):
        code, message = server.register("input0_data", _key("input0_data"), byte_size, offset)
        assert code != "OK", (byte_size, offset)
        assert "failed to register shared memory region" in message and "invalid args" in message, message
        assert server.regions()[2] == []


def test_unregister_shm_during_inference(server, regions):
    """While a request uses the four regions: Triton refuses to unregister them ("currently in use"); once it is
    done they unregister, and their status is then NOT_FOUND by name. slotserve unregisters at once by design (a
    running request keeps its regions open until it ends; docs/shared-memory.md): a deliberate difference."""
    folder = server.repository / "simple_delayed"
    for marker in ("started", "release"):
        (folder / marker).unlink(missing_ok=True)
    _register_all(server)
    answers = []
    worker = threading.Thread(target=lambda: answers.append(_infer(server, "simple_delayed")))
    worker.start()
    try:
        wait_for((folder / "started").exists, "the request is running")
        code, message = server.unregister()
        if server.kind == "triton":
            assert code != "OK" and (
                "Failed to unregister the following system shared memory regions: input0_data ,input1_data ,"
                "output0_data ,output1_data" in message
            ), message
            for name in NAMES:
                code, message = server.unregister(name)
                assert f"Cannot unregister shared memory region '{name}', it is currently in use." in message
        else:
            assert code == "OK", message
            assert server.regions()[2] == []
    finally:
        (folder / "release").write_text("go")
        worker.join(120)
    if server.kind == "triton":
        assert answers and answers[0].ok, answers
        _check_outputs(regions)
    assert server.unregister() == ("OK", "")
    for name in NAMES:
        code, message, _ = server.regions(name)
        assert code != "OK" and f"Unable to find system shared memory region: '{name}'" in message, (code, message)
