"""tritonclient's system shared memory flows against a running slotserve (`--shared-memory system`), in its own
process, as tritonclient's examples simple_grpc_shm_client.py and simple_grpc_shm_string_client.py run them.

    python tritonclient_shm.py HOST:PORT CASE

Cases: `simple` (INT32 inputs and outputs of `simple` in regions), `string` (BYTES in the serialized form through
`simple_identity`), `errors` (what a client sees for a region registered twice and for an unknown one). Each
asserts what it checks and prints one JSON object as the last line of stdout, which the test checks again.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient import utils
from tritonclient.utils import InferenceServerException

RNG = np.random.default_rng(20261201)
PREFIX = f"/slotserve_interop_{os.getpid()}_"


def start_clean(client: grpcclient.InferenceServerClient) -> None:
    """What the examples do first: unregister every region, system and CUDA."""
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    assert len(client.get_system_shared_memory_status().regions) == 0


def case_simple(client: grpcclient.InferenceServerClient) -> dict:
    start_clean(client)
    a = RNG.integers(-1_000_000, 1_000_000, size=(1, 16), dtype=np.int32)
    b = RNG.integers(-1_000_000, 1_000_000, size=(1, 16), dtype=np.int32)
    size = a.nbytes
    output_handle = shm.create_shared_memory_region("output_data", PREFIX + "output", size * 2)
    input_handle = shm.create_shared_memory_region("input_data", PREFIX + "input", size * 2)
    try:
        client.register_system_shared_memory("output_data", PREFIX + "output", size * 2)
        shm.set_shared_memory_region(input_handle, [a])
        shm.set_shared_memory_region(input_handle, [b], offset=size)
        client.register_system_shared_memory("input_data", PREFIX + "input", size * 2)

        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("input_data", size)
        inputs[1].set_shared_memory("input_data", size, offset=size)
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("output_data", size)
        outputs[1].set_shared_memory("output_data", size, offset=size)
        result = client.infer("simple", inputs, outputs=outputs)

        found = {}
        for index, name in enumerate(("OUTPUT0", "OUTPUT1")):
            output = result.get_output(name)
            assert output is not None, f"{name} missing from the response"
            found[name] = shm.get_contents_as_numpy(
                output_handle, utils.triton_to_np_dtype(output.datatype), output.shape, offset=index * size
            ).copy()
        np.testing.assert_array_equal(found["OUTPUT0"], a + b)
        np.testing.assert_array_equal(found["OUTPUT1"], a - b)

        # Mixed: INPUT0 from the region, INPUT1 sent in the request; OUTPUT1 comes back in the response.
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("input_data", size)
        inputs[1].set_data_from_numpy(a)
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("output_data", size)
        mixed = client.infer("simple", inputs, outputs=outputs)
        np.testing.assert_array_equal(mixed.as_numpy("OUTPUT1"), a - a)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(output_handle, np.int32, [1, 16]), a + a)

        status = client.get_system_shared_memory_status(as_json=True)
        regions = {region["name"]: region for region in status.get("regions", {}).values()}
        client.unregister_system_shared_memory()
        after = client.get_system_shared_memory_status().regions
    finally:
        shm.destroy_shared_memory_region(output_handle)
        shm.destroy_shared_memory_region(input_handle)
    assert sorted(regions) == ["input_data", "output_data"], regions
    assert len(after) == 0
    return {
        "INPUT0": a.tolist(),
        "INPUT1": b.tolist(),
        "OUTPUT0": found["OUTPUT0"].tolist(),
        "OUTPUT1": found["OUTPUT1"].tolist(),
        "status": {
            name: {"key": region["key"], "byte_size": int(region["byte_size"])} for name, region in regions.items()
        },
    }


def case_string(client: grpcclient.InferenceServerClient) -> dict:
    start_clean(client)
    values = np.array([[str(x).encode("utf-8") for x in RNG.integers(-1000, 1000, 16)]], dtype=np.object_)
    serialized = utils.serialize_byte_tensor(values)
    size = utils.serialized_byte_size(serialized)
    input_handle = shm.create_shared_memory_region("input_data", PREFIX + "strings_in", size)
    output_handle = shm.create_shared_memory_region("output_data", PREFIX + "strings_out", size)
    try:
        shm.set_shared_memory_region(input_handle, [serialized])
        client.register_system_shared_memory("input_data", PREFIX + "strings_in", size)
        client.register_system_shared_memory("output_data", PREFIX + "strings_out", size)
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "BYTES")]
        inputs[0].set_shared_memory("input_data", size)
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0")]
        outputs[0].set_shared_memory("output_data", size)
        result = client.infer("simple_identity", inputs, outputs=outputs)
        output = result.get_output("OUTPUT0")
        assert output.datatype == "BYTES" and list(output.shape) == [1, 16], output
        echoed = shm.get_contents_as_numpy(output_handle, utils.triton_to_np_dtype(output.datatype), output.shape)
        assert echoed.tolist() == values.tolist(), (echoed, values)
        client.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(input_handle)
        shm.destroy_shared_memory_region(output_handle)
    return {"sent": [v.decode() for v in values.ravel()], "echoed": [v.decode() for v in echoed.ravel()]}


def case_errors(client: grpcclient.InferenceServerClient) -> dict:
    start_clean(client)
    handle = shm.create_shared_memory_region("region", PREFIX + "twice", 64)
    seen = {}
    try:
        client.register_system_shared_memory("region", PREFIX + "twice", 64)
        try:
            client.register_system_shared_memory("region", PREFIX + "twice", 64)
        except InferenceServerException as error:
            seen["twice"] = {"status": error.status(), "message": error.message()}
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("nowhere", 64)
        inputs[1].set_shared_memory("region", 64)
        try:
            client.infer("simple", inputs)
        except InferenceServerException as error:
            seen["unknown"] = {"status": error.status(), "message": error.message()}
        client.unregister_system_shared_memory("region")
    finally:
        shm.destroy_shared_memory_region(handle)
    assert sorted(seen) == ["twice", "unknown"], seen
    return seen


CASES = {"simple": case_simple, "string": case_string, "errors": case_errors}


def main() -> None:
    address, case = sys.argv[1], sys.argv[2]
    with grpcclient.InferenceServerClient(address) as client:
        print(json.dumps(CASES[case](client)))


if __name__ == "__main__":
    main()
