"""client/: InferenceClient, ManagementClient, ClientError and the CLI against a fake server on a real channel.

The fake servicers below implement just enough of GRPCInferenceService, ModelManagement and gRPC health: echo
and add models, a model answering with typed contents, one with a broken response, and refusals carrying a rich
status with an ErrorInfo, as slotserve sends them. The server listens on 127.0.0.1, port 0.
"""

from __future__ import annotations

import json
import socket
from concurrent import futures

import grpc
import numpy as np
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from client import ClientError, InferenceClient, ManagementClient, cli
from client.management import ModelStatus
from engine import tensor_codec
from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from generated import management_pb2 as mpb
from generated import management_pb2_grpc as mpb_grpc

BUSY_MESSAGE = "admission timed out after 0.5 s"


def _busy_status() -> grpc.Status:
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason="server_busy", domain="slotserve"))
    return rpc_status.to_status(status_pb2.Status(code=code_pb2.UNAVAILABLE, message=BUSY_MESSAGE, details=[detail]))


def _echo(request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    """Each input back as an output of the same name, decoded and re-encoded the way a server does."""
    response = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
    wanted = {output.name for output in request.outputs}
    for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True):
        if wanted and tensor.name not in wanted:
            continue
        array = tensor_codec.decode_raw(raw, tensor.datatype, tuple(tensor.shape), tensor.name)
        response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        response.raw_output_contents.append(tensor_codec.encode_raw(array))
    return response


def _add(request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    arrays = [
        tensor_codec.decode_raw(raw, t.datatype, tuple(t.shape), t.name)
        for t, raw in zip(request.inputs, request.raw_input_contents, strict=True)
    ]
    total = arrays[0] + arrays[1]
    response = pb.ModelInferResponse(model_name="add", id=request.id)
    response.outputs.add(name="OUTPUT0", datatype=request.inputs[0].datatype, shape=total.shape)
    response.raw_output_contents.append(tensor_codec.encode_raw(total))
    return response


def _typed() -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name="typed")
    response.outputs.add(name="F", datatype="FP32", shape=[2, 2]).contents.fp32_contents.extend([1, 2.5, 3, 4])
    response.outputs.add(name="I", datatype="INT8", shape=[3]).contents.int_contents.extend([-1, 0, 127])
    response.outputs.add(name="U", datatype="UINT64", shape=[1]).contents.uint64_contents.append(2**64 - 1)
    response.outputs.add(name="B", datatype="BOOL", shape=[1, 2]).contents.bool_contents.extend([True, False])
    response.outputs.add(name="S", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"ab", b""])
    return response


class FakeInference(pb_grpc.GRPCInferenceServiceServicer):
    """Models: echo, add (INT32), typed (typed contents), short (raw bytes missing), busy (rich refusal)."""

    def __init__(self) -> None:
        self.requests: list[pb.ModelInferRequest] = []
        self.loads: list[pb.RepositoryModelLoadRequest] = []

    def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=True)

    def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name="fake", version="0.1", extensions=["model_repository"])

    def ModelMetadata(self, request, context):
        if request.name != "add":
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model '{request.name}'")
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name="add",
            versions=["1"],
            platform="fixture",
            inputs=[
                tensor(name="INPUT0", datatype="INT32", shape=[-1, 3]),
                tensor(name="INPUT1", datatype="INT32", shape=[-1, 3]),
            ],
            outputs=[tensor(name="OUTPUT0", datatype="INT32", shape=[-1, 3])],
        )

    def ModelInfer(self, request, context):
        self.requests.append(request)
        if request.model_name == "busy":
            context.abort_with_status(_busy_status())
        if request.model_name == "add":
            return _add(request)
        if request.model_name == "typed":
            return _typed()
        if request.model_name == "short":
            response = _echo(request)
            response.raw_output_contents[0] = response.raw_output_contents[0][:-1]
            return response
        return _echo(request)

    def ModelStreamInfer(self, request_iterator, context):
        for request in request_iterator:
            if any(tensor.name == "fail" for tensor in request.inputs):
                yield pb.ModelStreamInferResponse(
                    error_message="input 'fail'\nrefused", infer_response=pb.ModelInferResponse(id=request.id)
                )
            else:
                yield pb.ModelStreamInferResponse(infer_response=_echo(request))

    def RepositoryIndex(self, request, context):
        entry = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(
            models=[
                entry(name="add", version="1", state="READY"),
                entry(name="echo", version="1", state="UNAVAILABLE", reason="unloaded"),
            ]
        )

    def RepositoryModelLoad(self, request, context):
        self.loads.append(request)
        return pb.RepositoryModelLoadResponse()


def _status(model_id: str, *, loaded: bool) -> mpb.ModelStatus:
    status = mpb.ModelStatus(
        model_id=model_id,
        loaded=loaded,
        slots=2,
        backend="fixture",
        version="1",
        state=mpb.MODEL_STATE_READY if loaded else mpb.MODEL_STATE_UNLOADED,
    )
    if loaded:
        status.active_slots, status.queued_requests = 1, 3
        status.max_parallel_slots, status.memory_bytes = 4, 3 * 2**20
    return status


class FakeManagement(mpb_grpc.ModelManagementServicer):
    """Known ids: add (loaded) and echo (not loaded). Records each call's metadata and request."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str], object]] = []

    def _record(self, name, request, context) -> None:
        self.calls.append((name, dict(context.invocation_metadata()), request))

    def RegisterModel(self, request, context):
        self._record("RegisterModel", request, context)
        if request.model_id == "busy":
            context.abort_with_status(_busy_status())
        status = _status(request.model_id, loaded=True)
        if request.HasField("slots"):
            status.slots = request.slots
        status.admission_timeout_seconds = request.admission_timeout_seconds
        return status

    def UnloadModel(self, request, context):
        self._record("UnloadModel", request, context)
        if request.model_id not in ("add", "echo"):
            context.abort(grpc.StatusCode.NOT_FOUND, f"model '{request.model_id}' is not registered")
        return _status(request.model_id, loaded=False)

    def UnloadModels(self, request, context):
        self._record("UnloadModels", request, context)
        ids = ["add", "echo"] if request.all else list(request.model_ids)
        return mpb.UnloadModelsResponse(
            unloaded=[i for i in ids if i in ("add", "echo")], not_found=[i for i in ids if i not in ("add", "echo")]
        )

    def ListModels(self, request, context):
        self._record("ListModels", request, context)
        return mpb.ListModelsResponse(models=[_status("add", loaded=True), _status("echo", loaded=False)])

    def GetModel(self, request, context):
        self._record("GetModel", request, context)
        return _status(request.model_id, loaded=request.model_id == "add")


@pytest.fixture(scope="module")
def fakes():
    inference, management = FakeInference(), FakeManagement()
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(inference, server)
    mpb_grpc.add_ModelManagementServicer_to_server(management, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", inference, management
    server.stop(None)


@pytest.fixture
def address(fakes):
    return fakes[0]


@pytest.fixture
def client(address):
    with InferenceClient(address, timeout=10) as client:
        yield client


@pytest.fixture
def management_client(address, monkeypatch):
    monkeypatch.delenv("SLOTSERVE_MANAGEMENT_TOKEN", raising=False)
    with ManagementClient(address, timeout=10, token="s3cret") as client:
        yield client


# ---- inference -------------------------------------------------------------------------------------------------

ARRAYS = [
    np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
    np.array([-(2**31), -1, 0, 2**31 - 1], dtype=np.int32),
    np.array([[b"a", b""], ["\u00e9t\u00e9".encode(), b"\x00\xff"]], dtype=object),
    np.array([True, False, True, True, False, False]).reshape(3, 1, 2),
    np.array([0.5, -2.0, 65504.0, np.inf], dtype=np.float16).reshape(2, 1, 2),
    np.zeros((0, 4), dtype=np.float32),
    np.array(3.25, dtype=np.float64),
    np.arange(12, dtype=np.uint8).reshape(2, 2, 3),
    np.array([2**62, -5], dtype=np.int64),
]


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}{list(a.shape)}")
def test_infer_round_trips_datatypes_and_shapes(client, array):
    result = client.infer("echo", {"x": array})["x"]
    assert result.dtype == array.dtype
    assert result.shape == array.shape
    np.testing.assert_array_equal(result, array)


def test_infer_sends_raw_inputs_with_kserve_datatypes(client, fakes):
    client.infer(
        "echo",
        {"i": np.array([1, 258], dtype=np.int32), "s": np.array(["ab", "c"]), "big": np.array([1.5], dtype=">f4")},
        ["i"],
        version="2",
        request_id="r-1",
        parameters={"timeout": 5000, "flag": True, "ratio": 0.5, "tag": "x", "huge": 2**63},
    )
    request = fakes[1].requests[-1]
    assert (request.model_name, request.model_version, request.id) == ("echo", "2", "r-1")
    assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [
        ("i", "INT32", [2]),
        ("s", "BYTES", [2]),
        ("big", "FP32", [1]),
    ]
    assert request.raw_input_contents[0] == b"\x01\x00\x00\x00\x02\x01\x00\x00"
    assert request.raw_input_contents[1] == b"\x02\x00\x00\x00ab\x01\x00\x00\x00c"
    assert request.raw_input_contents[2] == np.array([1.5], dtype="<f4").tobytes()
    assert [output.name for output in request.outputs] == ["i"]
    params = request.parameters
    assert params["timeout"].int64_param == 5000
    assert params["flag"].bool_param is True
    assert params["ratio"].double_param == 0.5
    assert params["tag"].string_param == "x"
    assert params["huge"].uint64_param == 2**63


def test_infer_add_and_selected_outputs(client):
    a = np.array([[1, 2, 3]], dtype=np.int32)
    outputs = client.infer("add", {"INPUT0": a, "INPUT1": a * 10})
    np.testing.assert_array_equal(outputs["OUTPUT0"], [[11, 22, 33]])
    assert list(client.infer("echo", {"a": a, "b": a}, ["b"])) == ["b"]


def test_typed_contents_are_decoded(client):
    outputs = client.infer("typed", {})
    np.testing.assert_array_equal(outputs["F"], np.array([[1, 2.5], [3, 4]], dtype=np.float32))
    assert outputs["F"].dtype == np.float32
    assert outputs["I"].dtype == np.int8 and outputs["I"].tolist() == [-1, 0, 127]
    assert outputs["U"].dtype == np.uint64 and outputs["U"].tolist() == [2**64 - 1]
    assert outputs["B"].dtype == np.bool_ and outputs["B"].tolist() == [[True, False]]
    assert outputs["S"].dtype == object and outputs["S"].tolist() == [b"ab", b""]


def test_malformed_response_is_a_client_error(client):
    with pytest.raises(ClientError) as caught:
        client.infer("short", {"x": np.ones(3, dtype=np.float32)})
    assert caught.value.code == "INTERNAL"
    assert "12 bytes, got 11" in caught.value.message


def test_unencodable_input_is_invalid_argument(client):
    with pytest.raises(ClientError) as caught:
        client.infer("echo", {"c": np.ones(2, dtype=np.complex64)})
    assert caught.value.code == "INVALID_ARGUMENT"
    assert "'c'" in caught.value.message


def test_stream_infer_yields_errors_as_items_and_continues(client):
    a, b = np.arange(3, dtype=np.float32), np.array([b"z"], dtype=object)
    items = list(client.stream_infer("echo", [{"a": a}, {"fail": a}, {"b": b}]))
    assert len(items) == 3
    np.testing.assert_array_equal(items[0]["a"], a)
    error = items[1]
    assert isinstance(error, ClientError)
    assert (error.code, error.request_id, str(error)) == ("UNKNOWN", "1", "UNKNOWN: input 'fail' refused")
    assert items[2]["b"].tolist() == [b"z"]


def test_stream_infer_raises_an_encoding_failure_after_earlier_responses(client):
    requests = [{"a": np.ones(1, dtype=np.int32)}, {"c": np.ones(1, dtype=np.complex128)}]
    stream = client.stream_infer("echo", requests)
    assert next(stream)["a"].tolist() == [1]
    with pytest.raises(ClientError) as caught:
        next(stream)
    assert caught.value.code == "INVALID_ARGUMENT"


def test_health_metadata_and_repository(client, fakes):
    assert client.live() and client.ready()
    assert client.health() == "SERVING"
    with pytest.raises(ClientError) as caught:
        client.health("no.such.Service")
    assert caught.value.code == "NOT_FOUND"
    assert client.server_metadata().extensions == ("model_repository",)
    metadata = client.model_metadata("add")
    assert metadata.versions == ("1",)
    assert [(t.name, t.datatype, t.shape) for t in metadata.inputs][0] == ("INPUT0", "INT32", (-1, 3))
    assert [(m.name, m.state, m.reason) for m in client.repository_index()] == [
        ("add", "READY", ""),
        ("echo", "UNAVAILABLE", "unloaded"),
    ]
    client.load("add", {"max_batch_size": 4})
    assert json.loads(fakes[1].loads[-1].parameters["config"].string_param) == {"max_batch_size": 4}


def test_compressed_channel_and_borrowed_channel(address):
    array = np.arange(1000, dtype=np.int64)
    with InferenceClient(address, compression="gzip", timeout=10) as client:
        np.testing.assert_array_equal(client.infer("echo", {"x": array})["x"], array)
    with grpc.insecure_channel(address) as channel:
        with InferenceClient(channel=channel, timeout=10) as borrowed:
            assert borrowed.live()
        # The client did not close a channel it did not open.
        assert InferenceClient(channel=channel, timeout=10).ready()


# ---- errors ----------------------------------------------------------------------------------------------------


def test_rich_status_becomes_client_error_fields(client):
    with pytest.raises(ClientError) as caught:
        client.infer("busy", {"x": np.ones(1, dtype=np.float32)})
    error = caught.value
    assert (error.code, error.message, error.reason, error.domain) == (
        "UNAVAILABLE",
        BUSY_MESSAGE,
        "server_busy",
        "slotserve",
    )
    assert str(error) == f"UNAVAILABLE (server_busy): {BUSY_MESSAGE}"


def test_plain_status_has_no_reason(client):
    with pytest.raises(ClientError) as caught:
        client.model_metadata("nope")
    assert (caught.value.code, caught.value.reason) == ("NOT_FOUND", None)
    assert str(caught.value) == "NOT_FOUND: unknown model 'nope'"


def test_client_error_str_is_one_line():
    assert str(ClientError("INTERNAL", "first\n  second")) == "INTERNAL: first second"
    assert str(ClientError("CANCELLED", "", "gone")) == "CANCELLED (gone)"


def test_client_error_str_names_the_reason_once():
    error = ClientError("UNAVAILABLE", "server_busy: model 'simple' had no free slot", "server_busy")
    assert str(error) == "UNAVAILABLE (server_busy): model 'simple' had no free slot"
    assert error.message.startswith("server_busy: ")  # the message itself is kept as the server sent it
    other = ClientError("UNAVAILABLE", "busy_elsewhere: x", "server_busy")
    assert str(other) == "UNAVAILABLE (server_busy): busy_elsewhere: x"


def test_unreachable_server_is_unavailable():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with InferenceClient(f"127.0.0.1:{port}", timeout=10) as client:
        with pytest.raises(ClientError) as caught:
            client.live()
    assert caught.value.code == "UNAVAILABLE"


# ---- management ------------------------------------------------------------------------------------------------


def test_model_status_optional_fields():
    loaded = ModelStatus.from_proto(_status("add", loaded=True))
    assert (loaded.state, loaded.loaded, loaded.max_parallel_slots, loaded.memory_bytes) == (
        "READY",
        True,
        4,
        3 * 2**20,
    )
    cold = ModelStatus.from_proto(_status("echo", loaded=False))
    assert (cold.state, cold.max_parallel_slots, cold.memory_bytes) == ("UNLOADED", None, None)
    zero = _status("z", loaded=False)
    zero.max_parallel_slots = 0  # present but zero is not absent
    assert ModelStatus.from_proto(zero).max_parallel_slots == 0
    with pytest.raises(AttributeError):
        loaded.slots = 3


def test_management_calls_and_token(management_client, fakes):
    status = management_client.register(
        "add",
        source="dir",
        backend="fixture",
        options={"threads": 2},
        slots=3,
        admission_timeout=1.5,
        config_json={"name": "add"},
    )
    assert (status.slots, status.admission_timeout_seconds) == (3, 1.5)
    name, metadata, request = fakes[2].calls[-1]
    assert name == "RegisterModel" and metadata["authorization"] == "Bearer s3cret"
    assert dict(request.options) == {"threads": "2"} and json.loads(request.config_json) == {"name": "add"}
    assert request.HasField("slots") and request.HasField("admission_timeout_seconds")
    management_client.register("echo")
    assert not fakes[2].calls[-1][2].HasField("slots")
    assert [s.model_id for s in management_client.list()] == ["add", "echo"]
    assert management_client.get("echo").memory_bytes is None
    assert management_client.unload("add").loaded is False
    assert management_client.unload_many(["add", "ghost"]) == (["add"], ["ghost"])
    assert management_client.unload_many(all=True) == (["add", "echo"], [])


def test_management_token_from_environment_or_none(address, fakes, monkeypatch):
    monkeypatch.setenv("SLOTSERVE_MANAGEMENT_TOKEN", "from-env")
    with ManagementClient(address, timeout=10) as client:
        client.list()
    assert fakes[2].calls[-1][1]["authorization"] == "Bearer from-env"
    with ManagementClient(address, timeout=10, token="") as client:
        client.list()
    assert "authorization" not in fakes[2].calls[-1][1]


def test_management_errors(management_client):
    with pytest.raises(ClientError) as caught:
        management_client.register("busy")
    assert (caught.value.code, caught.value.reason) == ("UNAVAILABLE", "server_busy")
    with pytest.raises(ClientError) as caught:
        management_client.unload("ghost")
    assert caught.value.code == "NOT_FOUND"


# ---- command line ----------------------------------------------------------------------------------------------


def _run(capsys, address, *args):
    code = cli.main(["--address", address, "--timeout", "10", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_infer_npy_input(capsys, address, tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.array([[1.5, 2.0, -3.0]], dtype=np.float32))
    code, out, err = _run(capsys, address, "infer", "echo", "--input", f"x={path}")
    assert (code, err) == (0, "")
    assert out.splitlines() == ["x  FP32  [1, 3]", "[[ 1.5,  2. , -3. ]]"]


def test_cli_infer_json_input_takes_the_model_datatype(capsys, address, fakes):
    code, out, err = _run(
        capsys, address, "infer", "add", "--input", "INPUT0=[[1,2,3]]", "--input", "INPUT1=[[10,20,30]]", "--json"
    )
    assert (code, err) == (0, "")
    assert json.loads(out) == {"OUTPUT0": {"datatype": "INT32", "shape": [1, 3], "data": [[11, 22, 33]]}}
    assert [t.datatype for t in fakes[1].requests[-1].inputs] == ["INT32", "INT32"]


def test_cli_infer_json_with_datatype_and_output_dir(capsys, address, tmp_path):
    code, out, err = _run(
        capsys,
        address,
        "infer",
        "echo",
        "--input",
        "h=[0.5, 1]",
        "--datatype",
        "h=fp16",
        "--input",
        's=["a", "b"]',
        "--datatype",
        "s=BYTES",
        "--output-dir",
        str(tmp_path),
    )
    assert (code, err) == (0, "")
    assert "h  FP16  [2]" in out.splitlines()
    assert np.load(tmp_path / "h.npy").dtype == np.float16
    assert np.load(tmp_path / "s.npy").tolist() == [b"a", b"b"]


def test_cli_error_is_one_line_with_status_1(capsys, address):
    code, out, err = _run(capsys, address, "infer", "busy", "--input", "x=[1]", "--datatype", "x=FP32")
    assert (code, out) == (1, "")
    assert err == f"error: UNAVAILABLE (server_busy): {BUSY_MESSAGE}\n"


def test_cli_usage_errors_exit_2(capsys, address):
    code, _, err = _run(capsys, address, "infer", "echo", "--input", "x")
    assert code == 2 and err.startswith("error: --input 'x' is not NAME=VALUE") and err.count("\n") == 1
    code, _, err = _run(capsys, address, "infer", "add", "--input", "INPUT0=[1.5]")
    assert code == 2 and "INT32 needs integers" in err
    code, _, err = _run(capsys, address, "frobnicate")
    assert code == 2 and err.startswith("error: argument COMMAND: invalid choice") and err.count("\n") == 1


def test_cli_models_health_and_management(capsys, address, monkeypatch):
    monkeypatch.delenv("SLOTSERVE_MANAGEMENT_TOKEN", raising=False)
    code, out, _ = _run(capsys, address, "models")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "SLOTS", "ACTIVE", "QUEUED", "MAX_PARALLEL_SLOTS", "MEMORY", "REASON"]
    assert lines[1].split() == ["add", "READY", "2", "1", "3", "4", "3.0", "MiB"]
    assert lines[2].split() == ["echo", "UNLOADED", "2", "0", "0", "-", "-", "unloaded"]
    code, out, _ = _run(capsys, address, "--json", "health")
    assert (code, json.loads(out)) == (0, {"live": True, "ready": True, "health": "SERVING"})
    code, out, _ = _run(capsys, address, "load", "add", "--slots", "2", "--json")
    assert code == 0 and json.loads(out)["slots"] == 2
    code, out, err = _run(capsys, address, "unload", "add", "ghost")
    assert (code, out, err) == (1, "unloaded add\n", "error: NOT_FOUND: not registered: ghost\n")
