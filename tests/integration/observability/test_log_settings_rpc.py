"""LogSettings on a real `python -m service` process: a change takes effect on the next log line of the server's
own output (stderr), and a refused update changes nothing there either.

The lines watched are the access refusals the server logs at INFO ("refused <method> from <peer>: no bearer
token", service/transport/auth.py), made on demand by calling without the inference token. The log is a pipe
read in order, so once a later line has arrived, an earlier line that is missing was never written."""

from __future__ import annotations

import json

import grpc
import pytest

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from tests.shutdown.harness import WAIT, ServerProcess

INFERENCE_TOKEN = "log-settings-inference-token"
MANAGEMENT_TOKEN = "log-settings-management-token"
MANAGE = [("authorization", f"Bearer {MANAGEMENT_TOKEN}")]


def _update(stub: pb_grpc.GRPCInferenceServiceStub, **settings: object) -> dict[str, object]:
    request = pb.LogSettingsRequest()
    for name, value in settings.items():
        field = {bool: "bool_param", int: "uint32_param", str: "string_param"}[type(value)]
        setattr(request.settings[name], field, value)
    answer = stub.LogSettings(request, metadata=MANAGE, timeout=WAIT)
    return {name: getattr(value, value.WhichOneof("parameter_choice")) for name, value in answer.settings.items()}


def _refused_call(stub: pb_grpc.GRPCInferenceServiceStub, method: str, request) -> None:
    """Call `method` without a token: refused, and logged at INFO as 'refused <method>'."""
    with pytest.raises(grpc.RpcError) as raised:
        getattr(stub, method)(request, timeout=WAIT)
    assert raised.value.code() is grpc.StatusCode.UNAUTHENTICATED


@pytest.fixture
def server(tmp_path):
    flags = ("--allow-management", "--management-token", MANAGEMENT_TOKEN, "--inference-token", INFERENCE_TOKEN)
    with ServerProcess(tmp_path, *flags, test_backends=False) as running:
        yield running


def test_turning_info_off_and_on_shows_on_the_next_line(server) -> None:
    stub = pb_grpc.GRPCInferenceServiceStub(server.channel())
    _refused_call(stub, "ServerMetadata", pb.ServerMetadataRequest())
    server.wait_log("refused ServerMetadata")  # INFO lines are written at the start (--log-level INFO)

    assert _update(stub, log_info=False)["log_info"] is False
    _refused_call(stub, "ModelMetadata", pb.ModelMetadataRequest(name="simple"))
    assert _update(stub, log_info=True)["log_info"] is True
    _refused_call(stub, "ModelConfig", pb.ModelConfigRequest(name="simple"))
    server.wait_log("refused ModelConfig")
    assert "refused ModelMetadata" not in server.log  # written between the two updates: dropped


def test_format_switches_to_json_for_the_next_line(server) -> None:
    stub = pb_grpc.GRPCInferenceServiceStub(server.channel())
    assert _update(stub, log_format="json")["log_format"] == "json"
    _refused_call(stub, "ModelStatistics", pb.ModelStatisticsRequest(name="simple"))
    server.wait_log("refused ModelStatistics")
    line = next(line for line in server.log.splitlines() if "refused ModelStatistics" in line)
    record = json.loads(line)
    assert record["level"] == "INFO" and record["message"].startswith("refused ModelStatistics")


def test_a_refused_update_changes_nothing_in_the_output(server) -> None:
    stub = pb_grpc.GRPCInferenceServiceStub(server.channel())
    before = _update(stub)
    request = pb.LogSettingsRequest()
    request.settings["log_info"].bool_param = False
    request.settings["log_format"].string_param = "yaml"
    with pytest.raises(grpc.RpcError) as raised:
        stub.LogSettings(request, metadata=MANAGE, timeout=WAIT)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "invalid argument for log_format, got: yaml" in (raised.value.details() or "")
    assert _update(stub) == before
    _refused_call(stub, "ServerMetadata", pb.ServerMetadataRequest())
    server.wait_log("refused ServerMetadata")  # log_info stayed on: the line is written, as text
    line = next(line for line in server.log.splitlines() if "refused ServerMetadata" in line)
    assert not line.startswith("{")


@pytest.mark.parametrize("level", [1, 3])
def test_log_verbose_reads_back_the_level_the_flag_gave(tmp_path, level) -> None:
    """tritonserver's --log-verbose N: LogSettings answers log_verbose_level N (it read back 1 for any N)."""
    flags = ("--allow-management", "--management-token", MANAGEMENT_TOKEN, "--log-verbose", str(level))
    with ServerProcess(tmp_path, *flags, test_backends=False) as running:
        stub = pb_grpc.GRPCInferenceServiceStub(running.channel())
        settings = _update(stub)
        assert settings["log_verbose_level"] == level
        assert settings["log_info"] is True
