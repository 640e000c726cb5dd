"""tritonclient[grpc] against a running slotserve, in its own process.

    python tritonclient_cases.py HOST:PORT CASE [ARGS...]

tritonclient registers its own copy of the protocol's .proto files in protobuf's default pool, so it must never be
imported into the process that holds slotserve's generated code; tests/interop/test_tritonclient.py runs this
script in a subprocess instead. Each case asserts what it checks (any failure exits non-zero with a traceback)
and prints one JSON object as the last line of stdout, which the test checks again.
"""

from __future__ import annotations

import asyncio
import json
import queue
import sys
from collections.abc import Callable

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

WAIT = 60.0  # seconds any one callback or response may take before the case fails
RNG = np.random.default_rng(20261101)


def simple_inputs(batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Random INT32 inputs for `simple`, kept small enough that sum and difference cannot overflow."""
    a = RNG.integers(-1_000_000, 1_000_000, size=(batch, 16), dtype=np.int32)
    b = RNG.integers(-1_000_000, 1_000_000, size=(batch, 16), dtype=np.int32)
    return a, b


def triton_inputs(a: np.ndarray, b: np.ndarray, module=grpcclient) -> list:
    inputs = [module.InferInput("INPUT0", list(a.shape), "INT32"), module.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def check_simple(result, a: np.ndarray, b: np.ndarray) -> dict:
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    assert out0 is not None and out1 is not None, "an output is missing from the response"
    assert out0.dtype == np.int32 and out1.dtype == np.int32, (out0.dtype, out1.dtype)
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)
    return {"INPUT0": a.tolist(), "INPUT1": b.tolist(), "OUTPUT0": out0.tolist(), "OUTPUT1": out1.tolist()}


# ---- cases ---------------------------------------------------------------------------------------------------


def case_infer(client: grpcclient.InferenceServerClient) -> dict:
    """Sync infer with raw inputs (tritonclient always sends raw_input_contents)."""
    a, b = simple_inputs(3)
    result = client.infer("simple", triton_inputs(a, b), request_id="sync-1")
    response = result.get_response()
    assert response.id == "sync-1", response.id
    assert response.model_name == "simple" and response.model_version == "1", response
    full = check_simple(result, a, b)
    # Asking for one output returns only that one.
    only = client.infer("simple", triton_inputs(a, b), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    names = [output.name for output in only.get_response().outputs]
    assert names == ["OUTPUT1"], names
    np.testing.assert_array_equal(only.as_numpy("OUTPUT1"), a - b)
    return {
        "full": full,
        "id": response.id,
        "model_version": response.model_version,
        "only_outputs": names,
        "only_OUTPUT1": only.as_numpy("OUTPUT1").tolist(),
    }


def case_compressed(client: grpcclient.InferenceServerClient) -> dict:
    """Sync infer with gzip- and deflate-compressed messages."""
    results = {}
    for algorithm in ("gzip", "deflate"):
        a, b = simple_inputs(8)
        result = client.infer("simple", triton_inputs(a, b), compression_algorithm=algorithm)
        results[algorithm] = check_simple(result, a, b)
    return results


def case_async(client: grpcclient.InferenceServerClient) -> dict:
    """async_infer with a callback: several requests in flight, each answered once with its own values."""
    answers: queue.Queue = queue.Queue()
    sent = {}
    for index in range(4):
        a, b = simple_inputs(index + 1)
        request_id = f"async-{index}"
        sent[request_id] = (a, b)
        client.async_infer(
            "simple",
            triton_inputs(a, b),
            callback=lambda result, error: answers.put((result, error)),
            request_id=request_id,
        )
    checked = {}
    for _ in sent:
        result, error = answers.get(timeout=WAIT)
        assert error is None, f"async_infer failed: {error}"
        request_id = result.get_response().id
        assert request_id in sent and request_id not in checked, request_id
        checked[request_id] = check_simple(result, *sent[request_id])
    return checked


def case_batched(client: grpcclient.InferenceServerClient, model: str, count: str) -> dict:
    """`count` concurrent async_infer requests of one row each on a dynamically batching model; every answer is
    its own (matched by request id), and the model's statistics say how many rows each execution took."""
    answers: queue.Queue = queue.Queue()
    sent = {}
    for index in range(int(count)):
        rows = RNG.standard_normal((1, 1024)).astype(np.float32)
        request = grpcclient.InferInput("INPUT0", list(rows.shape), "FP32")
        request.set_data_from_numpy(rows)
        request_id = f"batched-{index}"
        sent[request_id] = rows
        client.async_infer(
            model, [request], callback=lambda result, error: answers.put((result, error)), request_id=request_id
        )
    received = {}
    for _ in sent:
        result, error = answers.get(timeout=WAIT)
        assert error is None, f"async_infer failed: {error}"
        request_id = result.get_response().id
        assert request_id in sent and request_id not in received, request_id
        output = result.as_numpy("OUTPUT0")
        assert output.shape == (1, 1024) and output.dtype == np.float32, (output.shape, output.dtype)
        received[request_id] = {"INPUT0": sent[request_id].tolist(), "OUTPUT0": output.tolist()}
    statistics = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return {"answers": received, "statistics": statistics}


def case_aio(address: str) -> dict:
    """The asyncio client: liveness, then concurrent infers gathered."""

    async def main() -> dict:
        client = aioclient.InferenceServerClient(address)
        try:
            assert await client.is_server_live()
            assert await client.is_model_ready("simple")
            batches = [simple_inputs(size) for size in (1, 2, 5)]
            results = await asyncio.gather(
                *(
                    client.infer("simple", triton_inputs(a, b, aioclient), request_id=f"aio-{i}")
                    for i, (a, b) in enumerate(batches)
                )
            )
            checked = {}
            for i, ((a, b), result) in enumerate(zip(batches, results, strict=True)):
                assert result.get_response().id == f"aio-{i}"
                checked[f"aio-{i}"] = check_simple(result, a, b)
            return checked
        finally:
            await client.close()

    return asyncio.run(main())


def case_explicit_int(address: str) -> dict:
    """Typed `int_contents` inputs through tritonclient's raw stubs (as Triton's grpc_explicit_int_content_client)."""
    a, b = simple_inputs(2)
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="simple", id="typed-1")
        for name, array in (("INPUT0", a), ("INPUT1", b)):
            tensor = request.inputs.add(name=name, datatype="INT32", shape=list(array.shape))
            tensor.contents.int_contents[:] = array.reshape(-1).tolist()
        request.outputs.add(name="OUTPUT0")
        request.outputs.add(name="OUTPUT1")
        response = stub.ModelInfer(request, timeout=WAIT)
    assert response.id == "typed-1", response.id
    # Outputs come back raw, one raw_output_contents entry per output, by position.
    assert len(response.raw_output_contents) == len(response.outputs) == 2, response
    outputs = {}
    for output, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        assert output.datatype == "INT32" and list(output.shape) == [2, 16], output
        outputs[output.name] = np.frombuffer(raw, dtype="<i4").reshape(tuple(output.shape))
    np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(outputs["OUTPUT1"], a - b)
    return {
        "INPUT0": a.tolist(),
        "INPUT1": b.tolist(),
        "OUTPUT0": outputs["OUTPUT0"].tolist(),
        "OUTPUT1": outputs["OUTPUT1"].tolist(),
        "id": response.id,
    }


def case_bytes(client: grpcclient.InferenceServerClient) -> dict:
    """BYTES through simple_identity: tritonclient's 4-byte-length serialization both ways."""
    texts = ["hello", "", "héllo wörld ✓", "x" * 1000, "tab\tnewline\n"]
    data = np.array([[text.encode("utf-8") for text in texts]], dtype=np.object_)
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    result = client.infer("simple_identity", [tensor])
    output = result.as_numpy("OUTPUT0")
    assert output.shape == data.shape, output.shape
    assert output.tolist() == data.tolist(), output
    [declared] = result.get_response().outputs
    assert declared.datatype == "BYTES", declared
    return {"sent": texts, "received": [element.decode("utf-8") for element in output.reshape(-1)]}


def case_stream(address: str) -> dict:
    """start_stream / async_stream_infer: the middle request is wrong (FP32 for an INT32 input). It comes back as
    an error for that request only; the stream stays open and the requests after it succeed."""
    client = grpcclient.InferenceServerClient(address)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    plan: list[tuple[str, tuple | None]] = []
    try:
        for index in range(5):
            request_id = f"stream-{index}"
            if index == 2:
                bad = np.ones((1, 16), dtype=np.float32)
                inputs = [
                    grpcclient.InferInput("INPUT0", [1, 16], "FP32"),
                    grpcclient.InferInput("INPUT1", [1, 16], "FP32"),
                ]
                inputs[0].set_data_from_numpy(bad)
                inputs[1].set_data_from_numpy(bad)
                plan.append((request_id, None))
            else:
                a, b = simple_inputs(1)
                inputs = triton_inputs(a, b)
                plan.append((request_id, (a, b)))
            client.async_stream_infer("simple", inputs, request_id=request_id)
        received = []
        # The server answers a stream's requests in order, so the n-th callback belongs to the n-th request.
        for request_id, arrays in plan:
            result, error = answers.get(timeout=WAIT)
            if arrays is None:
                assert result is None and error is not None, (result, error)
                received.append({"id": request_id, "error": error.message()})
            else:
                assert error is None, f"{request_id} failed: {error}"
                assert result.get_response().id == request_id, (result.get_response().id, request_id)
                received.append({"id": result.get_response().id, **check_simple(result, *arrays)})
    finally:
        client.stop_stream()
        client.close()
    # Nothing more arrived after the five answers (stop_stream joined the response thread).
    assert answers.empty(), answers.get_nowait()
    return {"responses": received, "error_id_echo": _stream_error_id_echo(address)}


def _stream_error_id_echo(address: str) -> dict:
    """tritonclient's callback hides the response that carries an error; read it with the raw stubs to see that
    the failed request's `id` is echoed next to `error_message`."""
    good = service_pb2.ModelInferRequest(model_name="simple", id="raw-ok")
    a, b = simple_inputs(1)
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        good.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        good.raw_input_contents.append(array.tobytes())
    bad = service_pb2.ModelInferRequest(model_name="simple", id="raw-bad")
    for name in ("INPUT0", "INPUT1"):
        bad.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        bad.raw_input_contents.append(np.ones((1, 16), np.float32).tobytes())
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        responses = list(stub.ModelStreamInfer(iter([bad, good]), timeout=WAIT))
    assert len(responses) == 2, responses
    first, second = responses
    assert first.error_message and first.infer_response.id == "raw-bad", first
    assert first.infer_response.model_name == "simple", first
    assert second.error_message == "" and second.infer_response.id == "raw-ok", second
    out0 = np.frombuffer(second.infer_response.raw_output_contents[0], "<i4").reshape(1, 16)
    np.testing.assert_array_equal(out0, a + b)
    return {
        "error_message": first.error_message,
        "error_id": first.infer_response.id,
        "ok_id": second.infer_response.id,
    }


def case_config(client: grpcclient.InferenceServerClient) -> dict:
    """get_model_config: the protobuf message and its JSON form."""
    config = client.get_model_config("simple").config
    assert config.name == "simple" and config.max_batch_size == 8, config
    assert [tensor.name for tensor in config.input] == ["INPUT0", "INPUT1"], config.input
    assert [tensor.name for tensor in config.output] == ["OUTPUT0", "OUTPUT1"], config.output
    for tensor in list(config.input) + list(config.output):
        assert list(tensor.dims) == [16], tensor
        assert tensor.data_type == grpcclient.model_config_pb2.TYPE_INT32, tensor
    assert len(config.instance_group) >= 1
    return client.get_model_config("simple", as_json=True)


def case_statistics(client: grpcclient.InferenceServerClient) -> dict:
    """get_inference_statistics before and after a known set of requests: the counts grow by exactly those."""

    def stats() -> dict:
        answer = client.get_inference_statistics("simple", as_json=True)
        [entry] = answer["model_stats"]
        assert entry["name"] == "simple" and entry["version"] == "1", entry
        return entry

    before = stats()
    batches = [1, 3, 2, 8]
    for size in batches:
        a, b = simple_inputs(size)
        check_simple(client.infer("simple", triton_inputs(a, b)), a, b)
    failed = 0
    try:  # one refused request (wrong datatype) counts as a failure, not a success
        bad = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        bad.set_data_from_numpy(np.ones((1, 16), np.float32))
        bad1 = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
        bad1.set_data_from_numpy(np.ones((1, 16), np.float32))
        client.infer("simple", [bad, bad1])
    except InferenceServerException:
        failed += 1
    assert failed == 1, "a request with the wrong datatype succeeded"
    after = stats()
    every = client.get_inference_statistics(as_json=True)  # no name: every model
    return {
        "before": before,
        "after": after,
        "batches": batches,
        "failed": failed,
        "all_models": sorted(entry["name"] for entry in every["model_stats"]),
    }


def case_index(client: grpcclient.InferenceServerClient) -> dict:
    return client.get_model_repository_index(as_json=True)


def case_control(client: grpcclient.InferenceServerClient) -> dict:
    """load_model / unload_model / is_model_ready, the `config` override, and failed loads."""
    steps = {}
    steps["ready_at_start"] = client.is_model_ready("simple")
    steps["mbs_at_start"] = client.get_model_config("simple").config.max_batch_size

    client.unload_model("simple")
    steps["ready_after_unload"] = client.is_model_ready("simple")
    steps["index_after_unload"] = {
        m["name"]: m.get("state", "") for m in client.get_model_repository_index(as_json=True)["models"]
    }

    client.load_model("simple")
    steps["ready_after_load"] = client.is_model_ready("simple")
    a, b = simple_inputs(2)
    check_simple(client.infer("simple", triton_inputs(a, b)), a, b)

    client.load_model("simple", config=json.dumps({"max_batch_size": 4}))
    steps["ready_after_override"] = client.is_model_ready("simple")
    steps["mbs_after_override"] = client.get_model_config("simple").config.max_batch_size
    a, b = simple_inputs(4)
    check_simple(client.infer("simple", triton_inputs(a, b)), a, b)
    try:  # beyond the new max_batch_size
        a, b = simple_inputs(5)
        client.infer("simple", triton_inputs(a, b))
        steps["batch_5_after_override"] = "accepted"
    except InferenceServerException as error:
        steps["batch_5_after_override"] = str(error.status())

    # Failed loads answer in Triton's words ("failed to load 'x', failed to poll ..." / "load failed for model 'x'").
    errors: dict[str, dict | None] = {}
    for label, (name, config) in FAILING_LOADS.items():
        try:
            client.load_model(name, config=config)
            errors[label] = None
        except InferenceServerException as error:
            errors[label] = {"status": str(error.status()), "message": error.message()}
    steps["failed_loads"] = errors

    client.load_model("simple")  # from the repository again: whatever the failures did, this one loads
    steps["ready_after_reload"] = client.is_model_ready("simple")
    steps["mbs_after_reload"] = client.get_model_config("simple").config.max_batch_size
    client.unload_model("simple")
    steps["ready_at_end"] = client.is_model_ready("simple")
    return steps


FAILING_LOADS = {
    # Rejected while reading the override.
    "not_json": ("simple", "invalid config"),
    "unknown_model": ("no_such_model", None),
    # Reads fine, but the model file has no such input: found only when the engine is checked against it.
    "unknown_input": (
        "simple",
        json.dumps(
            {"max_batch_size": 2, "input": [{"name": "NO_SUCH_INPUT", "data_type": "TYPE_INT32", "dims": [16]}]}
        ),
    ),
}


def case_failed_reload(client: grpcclient.InferenceServerClient) -> dict:
    """A reload that fails leaves the model that was serving as it was: still ready, same configuration, still
    answering. Triton documents this for explicit model control (docs/user_guide/model_management.md: when a
    reload of a loaded model fails for any reason, the loaded model stays unchanged and loaded). The serving
    model carries an override (max_batch_size 4), told apart from the repository's 8 and the failed one's 2."""
    client.load_model("simple", config=json.dumps({"max_batch_size": 4}))
    outcomes = {}
    for label, (name, config) in FAILING_LOADS.items():
        try:
            client.load_model(name, config=config)
            error = None
        except InferenceServerException as failure:
            error = {"status": str(failure.status()), "message": failure.message()}
        a, b = simple_inputs(1)
        try:
            check_simple(client.infer("simple", triton_inputs(a, b)), a, b)
            infer = "ok"
        except InferenceServerException as failure:
            infer = f"{failure.status()}: {failure.message()}"
        outcomes[label] = {
            "error": error,
            "ready_after": client.is_model_ready("simple"),
            "mbs_after": client.get_model_config("simple").config.max_batch_size,
            "infer_after": infer,
        }
        if infer != "ok":  # put the serving model back so the next case starts from the same state
            client.load_model("simple", config=json.dumps({"max_batch_size": 4}))
    return outcomes


def case_metadata(client: grpcclient.InferenceServerClient) -> dict:
    """Health, server and model metadata, and the unknown-model error clients look for."""
    assert client.is_server_live() and client.is_server_ready()
    server = client.get_server_metadata(as_json=True)
    model = client.get_model_metadata("simple", as_json=True)
    errors: dict[str, dict | None] = {}
    for label, call in (
        ("metadata", lambda: client.get_model_metadata("no_such_model")),
        ("infer", lambda: client.infer("no_such_model", triton_inputs(*simple_inputs(1)))),
        ("config", lambda: client.get_model_config("no_such_model")),
    ):
        try:
            call()
            errors[label] = None
        except InferenceServerException as error:
            errors[label] = {"status": str(error.status()), "message": error.message()}
    return {
        "server": server,
        "model": model,
        "errors": errors,
        "unknown_model_ready": client.is_model_ready("no_such_model"),
    }


def case_secure(address: str, ca: str, cert: str, key: str, inference_token: str, management_token: str) -> dict:
    """Mutual TLS plus tokens, with tritonclient's own options: ssl/root_certificates/private_key/
    certificate_chain (file paths) and per-call `headers`. Health needs no token; inference needs the inference
    token; repository control needs the management token."""
    client = grpcclient.InferenceServerClient(
        address, ssl=True, root_certificates=ca, private_key=key, certificate_chain=cert
    )
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("simple")
        a, b = simple_inputs(2)
        refused = {}
        for label, headers in (("none", None), ("wrong", {"authorization": "Bearer wrong"})):
            try:
                client.infer("simple", triton_inputs(a, b), headers=headers)
            except InferenceServerException as error:
                refused[label] = error.status()
        inference = {"authorization": f"Bearer {inference_token}"}
        check_simple(client.infer("simple", triton_inputs(a, b), headers=inference), a, b)
        try:
            client.unload_model("simple", headers=inference)
        except InferenceServerException as error:
            refused["unload_with_inference_token"] = error.status()
        management = {"authorization": f"Bearer {management_token}"}
        client.unload_model("simple", headers=management)
        client.load_model("simple", headers=management)
        result = check_simple(client.infer("simple", triton_inputs(a, b), headers=inference), a, b)
        return {"refused": refused, "result": result}
    finally:
        client.close()


CASES = {
    "infer": case_infer,
    "compressed": case_compressed,
    "async": case_async,
    "bytes": case_bytes,
    "config": case_config,
    "statistics": case_statistics,
    "index": case_index,
    "control": case_control,
    "failed_reload": case_failed_reload,
    "metadata": case_metadata,
}
CLIENT_CASES_WITH_ARGUMENTS = {"batched": case_batched}
ADDRESS_CASES: dict[str, Callable[..., object]] = {
    "aio": case_aio,
    "explicit_int": case_explicit_int,
    "stream": case_stream,
    "secure": case_secure,
}


def main() -> None:
    address, case = sys.argv[1], sys.argv[2]
    if case in ADDRESS_CASES:
        result = ADDRESS_CASES[case](address, *sys.argv[3:])
    else:
        client = grpcclient.InferenceServerClient(address)
        try:
            if case in CLIENT_CASES_WITH_ARGUMENTS:
                result = CLIENT_CASES_WITH_ARGUMENTS[case](client, *sys.argv[3:])
            else:
                result = CASES[case](client)
        finally:
            client.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
