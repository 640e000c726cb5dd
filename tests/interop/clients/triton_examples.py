"""The flows of tritonclient's own gRPC example clients for Triton's classic example models, in their own process.

    python triton_examples.py HOST:PORT FLOW      FLOW: string | explicit_int8 | explicit_byte

Written here after the logic of the examples in tritonclient's repository (src/python/examples/):
simple_grpc_string_infer_client.py (`string`), grpc_explicit_int8_content_client.py (`explicit_int8`) and
grpc_explicit_byte_content_client.py (`explicit_byte`): the same models, tensors, shapes, encodings and checks, so
a server that passes these runs those examples unmodified. Each flow asserts what the example checks (a failure
exits non-zero with a traceback) and prints one JSON object as the last line of stdout, which the test checks
again with numpy.
"""

from __future__ import annotations

import json
import sys

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient import utils
from tritonclient.grpc import service_pb2, service_pb2_grpc

WAIT = 60.0  # seconds any one call may take before the flow fails


def _text(array: np.ndarray) -> list:
    """BYTES elements as text for JSON (latin-1 keeps every byte, control bytes included)."""
    return [element.decode("latin-1") for element in array.reshape(-1)]


def _identity(client: grpcclient.InferenceServerClient, data: np.ndarray) -> np.ndarray:
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    result = client.infer(
        "simple_identity", [tensor], outputs=[grpcclient.InferRequestedOutput("OUTPUT0")], client_timeout=WAIT
    )
    return result.as_numpy("OUTPUT0")


def flow_string(address: str) -> dict:
    """simple_grpc_string_infer_client.py: decimal text through simple_string with tritonclient's InferInput,
    then simple_identity with an embedded NUL and with 4-byte binary elements (a numpy bytes_ array)."""
    client = grpcclient.InferenceServerClient(address)
    try:
        in0 = np.arange(16, dtype=np.int32).reshape(1, 16)
        in1 = np.ones((1, 16), dtype=np.int32)
        as_text = np.vectorize(lambda value: str(value).encode("utf-8"), otypes=[np.object_])
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "BYTES"), grpcclient.InferInput("INPUT1", [1, 16], "BYTES")]
        inputs[0].set_data_from_numpy(as_text(in0))
        inputs[1].set_data_from_numpy(as_text(in1))
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
        result = client.infer("simple_string", inputs, outputs=outputs, client_timeout=WAIT)
        out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
        assert out0.shape == out1.shape == (1, 16), (out0.shape, out1.shape)
        for i in range(16):  # the example converts each output element with int() and compares
            assert int(out0[0][i]) == in0[0][i] + in1[0][i], ("incorrect sum", i, out0[0][i])
            assert int(out1[0][i]) == in0[0][i] - in1[0][i], ("incorrect difference", i, out1[0][i])

        with_nul = np.array([b"he\x00llo" for _ in range(16)], dtype=np.object_).reshape(1, 16)
        echoed_nul = _identity(client, with_nul)
        assert np.array_equal(with_nul, echoed_nul), echoed_nul

        binary = np.array([b"\x00\x01\x02\x03" for _ in range(16)], dtype=np.bytes_).reshape(1, 16)
        echoed_binary = _identity(client, binary)
        # the example's own comparison for a bytes_ input: decode the object output, encode again
        assert np.array_equal(binary, np.char.encode(echoed_binary.astype(str))), echoed_binary
        return {
            "INPUT0": in0.tolist(),
            "INPUT1": in1.tolist(),
            "OUTPUT0": _text(out0),
            "OUTPUT1": _text(out1),
            "identity_nul": _text(echoed_nul),
            "identity_binary": _text(echoed_binary),
        }
    finally:
        client.close()


def _request(model: str, datatype: str, contents: str, in0: list, in1: list) -> service_pb2.ModelInferRequest:
    """A ModelInferRequest with typed `contents` (no raw_input_contents), as the explicit examples build it."""
    request = service_pb2.ModelInferRequest(model_name=model, model_version="")
    for name, values in (("INPUT0", in0), ("INPUT1", in1)):
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[1, 16])
        getattr(tensor.contents, contents).extend(values)
    request.outputs.add(name="OUTPUT0")
    request.outputs.add(name="OUTPUT1")
    return request


def _raw_outputs(response: service_pb2.ModelInferResponse, decode) -> list[np.ndarray]:
    """The outputs, by position, from raw_output_contents (the examples read them this way)."""
    assert len(response.outputs) == len(response.raw_output_contents) == 2, response
    return [
        np.resize(decode(raw), list(output.shape))
        for output, raw in zip(response.outputs, response.raw_output_contents, strict=True)
    ]


def flow_explicit_int8(address: str) -> dict:
    """grpc_explicit_int8_content_client.py: INT8 inputs in `int_contents` through the raw stubs, outputs read
    from raw_output_contents; then a malformed model version, which the server must refuse. One more request
    (not in the example) covers both ends of the INT8 range."""
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        results = {}
        rng = np.random.default_rng(20261201)
        extremes = rng.integers(-128, 128, size=16).tolist()
        extremes[:2] = [127, -128]
        for label, in0, in1 in (("example", list(range(16)), [1] * 16), ("extremes", extremes, [1] * 16)):
            response = stub.ModelInfer(_request("simple_int8", "INT8", "int_contents", in0, in1), timeout=WAIT)
            assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
                ("OUTPUT0", "INT8", [1, 16]),
                ("OUTPUT1", "INT8", [1, 16]),
            ], response.outputs
            out0, out1 = _raw_outputs(response, lambda raw: np.frombuffer(raw, dtype=np.int8))
            expected0 = (np.array(in0, np.int8) + np.array(in1, np.int8)).tolist()
            expected1 = (np.array(in0, np.int8) - np.array(in1, np.int8)).tolist()
            assert out0[0].tolist() == expected0 and out1[0].tolist() == expected1, (out0, out1)
            results[label] = {"INPUT0": in0, "INPUT1": in1, "OUTPUT0": out0.tolist(), "OUTPUT1": out1.tolist()}

        request = _request("simple_int8", "INT8", "int_contents", list(range(16)), [1] * 16)
        request.model_version = "wrong_specification"
        try:
            stub.ModelInfer(request, timeout=WAIT)
        except grpc.RpcError as error:
            results["wrong_version"] = {"code": error.code().name, "details": error.details()}
        else:
            raise AssertionError("a malformed model version was accepted")
    return results


def flow_explicit_byte(address: str) -> dict:
    """grpc_explicit_byte_content_client.py: decimal text in `bytes_contents` through the raw stubs to
    simple_string, outputs deserialized from raw_output_contents with tritonclient.utils."""
    in0 = [str(i).encode("utf-8") for i in range(16)]
    in1 = [b"1"] * 16
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response = stub.ModelInfer(_request("simple_string", "BYTES", "bytes_contents", in0, in1), timeout=WAIT)
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("OUTPUT0", "BYTES", [1, 16]),
        ("OUTPUT1", "BYTES", [1, 16]),
    ], response.outputs
    out0, out1 = _raw_outputs(response, utils.deserialize_bytes_tensor)
    for i in range(16):
        assert int(out0[0][i]) == i + 1, ("incorrect sum", i, out0[0][i])
        assert int(out1[0][i]) == i - 1, ("incorrect difference", i, out1[0][i])
    return {
        "INPUT0": [e.decode() for e in in0],
        "INPUT1": [e.decode() for e in in1],
        "OUTPUT0": _text(out0),
        "OUTPUT1": _text(out1),
    }


FLOWS = {"string": flow_string, "explicit_int8": flow_explicit_int8, "explicit_byte": flow_explicit_byte}


if __name__ == "__main__":
    print(json.dumps(FLOWS[sys.argv[2]](sys.argv[1])))
