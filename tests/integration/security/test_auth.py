"""Bearer tokens (`--management-token`, `--inference-token`): who may call what, and what a refusal looks like.

Every method of both services is called without a token and classified by its status, so a method added later
without a decision fails here. Refusals are UNAUTHENTICATED (reason `unauthenticated`), for a missing and a
wrong token alike, with a message and a server log that contain no token; after each refusal the server still
answers a valid call.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import grpc
import numpy as np
import pytest
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client import ClientError, InferenceClient, ManagementClient
from client import cli as client_cli
from generated import grpc_service_pb2, management_pb2
from service.auth import Secret, bearer_tokens, read_token_file
from service.options import ServerOptions
from service.testing import serve

from .._support import CALL_TIMEOUT, ROOT, demo_subset

MANAGEMENT_TOKEN = "mgmt-Tk3n.9f2c"
INFERENCE_TOKEN = "inf-Tk3n.41ab"
WRONG_TOKEN = "wrong-Tk3n.77zz"
ALL_TOKENS = (MANAGEMENT_TOKEN, INFERENCE_TOKEN, WRONG_TOKEN)

SIMPLE_INPUTS = {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16), "INPUT1": np.ones((1, 16), dtype=np.int32)}

INFERENCE = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
MANAGEMENT = management_pb2.DESCRIPTOR.services_by_name["ModelManagement"]
OPEN = {"ServerLive", "ServerReady", "ModelReady"}
MANAGE = {"RegisterModel", "UnloadModel", "UnloadModels", "RepositoryModelLoad", "RepositoryModelUnload"}
STATUS = {"ListModels", "GetModel", "RepositoryIndex"}  # need the management token when one is set


@pytest.fixture
def repository(tmp_path):
    return demo_subset(tmp_path / "repository", "simple")


pytestmark = pytest.mark.usefixtures("no_token_environment")


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def call(channel: grpc.Channel, service, method_name: str, metadata=()) -> grpc.StatusCode:
    """Call any method with an empty request; its status code (OK or the failure's)."""
    method = service.methods_by_name[method_name]
    request = message_factory.GetMessageClass(method.input_type)()
    response_class = message_factory.GetMessageClass(method.output_type)
    path = f"/{service.full_name}/{method_name}"
    try:
        if method.client_streaming:
            stream = channel.stream_stream(
                path,
                request_serializer=type(request).SerializeToString,
                response_deserializer=response_class.FromString,
            )
            for _ in stream(iter([]), timeout=CALL_TIMEOUT, metadata=metadata):
                pass
        else:
            unary = channel.unary_unary(
                path,
                request_serializer=type(request).SerializeToString,
                response_deserializer=response_class.FromString,
            )
            unary(request, timeout=CALL_TIMEOUT, metadata=metadata)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def assert_unauthenticated(error: ClientError) -> None:
    assert (error.code, error.reason) == ("UNAUTHENTICATED", "unauthenticated")
    for token in ALL_TOKENS:
        assert token not in str(error)


def refused(function, *args, **kwargs) -> ClientError:
    with pytest.raises(ClientError) as info:
        function(*args, **kwargs)
    assert_unauthenticated(info.value)
    return info.value


def infers(client: InferenceClient) -> None:
    outputs = client.infer("simple", SIMPLE_INPUTS, timeout=CALL_TIMEOUT)
    np.testing.assert_array_equal(outputs["OUTPUT0"], SIMPLE_INPUTS["INPUT0"] + 1)


# ---- management token ------------------------------------------------------------------------------------------


def test_management_calls_need_the_management_token(repository, caplog):
    caplog.set_level(logging.DEBUG)
    with serve(repository, allow_management=True, management_token=MANAGEMENT_TOKEN) as running:
        for token in ("", WRONG_TOKEN, MANAGEMENT_TOKEN[:-1], MANAGEMENT_TOKEN + "x"):
            with (
                ManagementClient(running.address, token=token, timeout=CALL_TIMEOUT) as anonymous,
                InferenceClient(running.address, management_token=token, timeout=CALL_TIMEOUT) as inference,
            ):
                missing = refused(anonymous.register, "simple")
                assert ("no bearer token" in str(missing)) == (token == "")
                refused(anonymous.unload, "simple")
                refused(anonymous.unload_many, all=True)
                refused(inference.load, "simple")
                refused(inference.unload, "simple")
                # Status calls of the management and repository protocols need the token too ...
                refused(anonymous.get, "simple")
                refused(anonymous.list)
                refused(inference.repository_index)
                # ... inference stays open, and the refusals changed nothing.
                assert running.management.get("simple").loaded
                assert [status.model_id for status in running.management.list()] == ["simple"]
                assert [model.name for model in running.client.repository_index()] == ["simple"]
                infers(inference)
        # The right token works: running.management was given it by serve().
        assert running.management.unload("simple").loaded is False
        assert running.management.register("simple").loaded
        running.client.unload("simple")
        running.client.load("simple")
        infers(running.client)
    for token in ALL_TOKENS:
        assert token not in caplog.text


def test_management_token_checks(repository):
    """The scheme is case-insensitive; other schemes, malformed values and extra headers do not pass."""
    with serve(repository, allow_management=True, management_token=MANAGEMENT_TOKEN) as running:
        channel = running.client.channel
        register = "RegisterModel"
        assert (
            call(channel, MANAGEMENT, register, (("authorization", f"bearer {MANAGEMENT_TOKEN}"),))
            != grpc.StatusCode.UNAUTHENTICATED
        )  # got past the check (an empty request is then invalid)
        for metadata in (
            (("authorization", f"Basic {MANAGEMENT_TOKEN}"),),
            (("authorization", MANAGEMENT_TOKEN),),
            (("authorization", "Bearer"),),
            (("x-api-key", MANAGEMENT_TOKEN),),
            bearer(MANAGEMENT_TOKEN.upper()),
        ):
            assert call(channel, MANAGEMENT, register, metadata) == grpc.StatusCode.UNAUTHENTICATED, metadata
        infers(running.client)


def test_a_management_token_needs_allow_management():
    with pytest.raises(ValueError) as info:
        ServerOptions(management_token=MANAGEMENT_TOKEN)
    assert "--allow-management" in str(info.value) and MANAGEMENT_TOKEN not in str(info.value)
    for bad in ("", "has space", "tab\there", "caf\u00e9"):
        with pytest.raises(ValueError) as info:
            ServerOptions(allow_management=True, management_token=bad)
        assert "--management-token" in str(info.value)
        assert bad == "" or bad not in str(info.value)


def test_without_allow_management_a_call_is_denied_not_unauthenticated(repository):
    with serve(repository, inference_token=INFERENCE_TOKEN) as running:
        with pytest.raises(ClientError) as info:
            running.management.register("simple")
        assert (info.value.code, info.value.reason) == ("PERMISSION_DENIED", "management_disabled")


# ---- inference token -------------------------------------------------------------------------------------------


def test_every_method_is_classified(repository):
    """With both tokens set, no token reaches only the health probes; each token reaches what it should."""
    with serve(
        repository, allow_management=True, management_token=MANAGEMENT_TOKEN, inference_token=INFERENCE_TOKEN
    ) as running:
        channel = running.client.channel
        for service in (INFERENCE, MANAGEMENT):
            for method in service.methods:
                name = method.name
                anonymous = call(channel, service, name)
                if name in OPEN:
                    assert anonymous == grpc.StatusCode.OK, name
                else:
                    assert anonymous == grpc.StatusCode.UNAUTHENTICATED, name
                    assert call(channel, service, name, bearer(WRONG_TOKEN)) == grpc.StatusCode.UNAUTHENTICATED
                with_inference = call(channel, service, name, bearer(INFERENCE_TOKEN))
                assert (with_inference == grpc.StatusCode.UNAUTHENTICATED) == (name in MANAGE | STATUS), name
                # The management token may do everything (an empty request may still be invalid).
                assert call(channel, service, name, bearer(MANAGEMENT_TOKEN)) != grpc.StatusCode.UNAUTHENTICATED
        # Kubernetes' gRPC probe sends no credentials.
        health = health_pb2_grpc.HealthStub(channel)
        for service_name in ("", INFERENCE.full_name, MANAGEMENT.full_name):
            response = health.Check(health_pb2.HealthCheckRequest(service=service_name), timeout=CALL_TIMEOUT)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
        infers(running.client)


def test_inference_is_open_without_an_inference_token(repository):
    with serve(repository, allow_management=True, management_token=MANAGEMENT_TOKEN) as running:
        with InferenceClient(running.address, token="", management_token="", timeout=CALL_TIMEOUT) as anonymous:
            infers(anonymous)
            assert list(anonymous.stream_infer("simple", [SIMPLE_INPUTS]))[0]["OUTPUT1"].shape == (1, 16)
            assert anonymous.model_metadata("simple").name == "simple"
            assert anonymous.ready() and anonymous.health() == "SERVING"


def test_inference_token_guards_inference(repository, caplog):
    caplog.set_level(logging.DEBUG)
    with serve(
        repository, allow_management=True, management_token=MANAGEMENT_TOKEN, inference_token=INFERENCE_TOKEN
    ) as running:
        for token in ("", WRONG_TOKEN):
            with InferenceClient(running.address, token=token, management_token="", timeout=CALL_TIMEOUT) as client:
                refused(client.infer, "simple", SIMPLE_INPUTS)
                refused(lambda: list(client.stream_infer("simple", [SIMPLE_INPUTS])))
                refused(client.model_metadata, "simple")
                refused(client.repository_index)
                # Probes stay open.
                assert client.live() and client.ready() and client.model_ready("simple")
                assert client.health() == "SERVING"
                infers(running.client)  # the refusals left the server serving
        with InferenceClient(
            running.address, token=INFERENCE_TOKEN, management_token="", timeout=CALL_TIMEOUT
        ) as client:
            infers(client)
            assert [item["OUTPUT0"][0, 0] for item in client.stream_infer("simple", [SIMPLE_INPUTS] * 2)] == [1, 1]
            refused(client.load, "simple")  # the inference token does not manage
        with InferenceClient(
            running.address, token="", management_token=MANAGEMENT_TOKEN, timeout=CALL_TIMEOUT
        ) as client:
            infers(client)  # the management token is accepted for inference
        # With a management token set, status calls need it: the inference token may neither list nor register.
        with ManagementClient(
            running.address, token="", inference_token=INFERENCE_TOKEN, timeout=CALL_TIMEOUT
        ) as reader:
            refused(reader.get, "simple")
            refused(reader.register, "simple")
        with ManagementClient(running.address, token="", inference_token="", timeout=CALL_TIMEOUT) as anonymous:
            refused(anonymous.list)
    for token in ALL_TOKENS:
        assert token not in caplog.text


def test_inference_token_alone_also_guards_management(repository):
    """Management enabled with only an inference token: managing needs that token (never less than reading), and
    so does reading status."""
    with serve(repository, allow_management=True, inference_token=INFERENCE_TOKEN) as running:
        with ManagementClient(running.address, token="", inference_token="", timeout=CALL_TIMEOUT) as anonymous:
            refused(anonymous.unload, "simple")
            refused(anonymous.list)
        with ManagementClient(
            running.address, token="", inference_token=INFERENCE_TOKEN, timeout=CALL_TIMEOUT
        ) as reader:
            assert reader.get("simple").loaded
        assert running.management.unload("simple").loaded is False
        running.client.load("simple")
        infers(running.client)


# ---- client command line ---------------------------------------------------------------------------------------


def test_client_cli_sends_the_tokens(repository, capsys, monkeypatch):
    with serve(
        repository, allow_management=True, management_token=MANAGEMENT_TOKEN, inference_token=INFERENCE_TOKEN
    ) as running:
        base = ["--address", running.address, "--timeout", "30"]
        infer = [
            "infer",
            "simple",
            "--input",
            "INPUT0=[[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]]",
            "--input",
            "INPUT1=[[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]]",
        ]
        assert client_cli.main(base + infer) == 1
        assert "UNAUTHENTICATED" in capsys.readouterr().err
        assert client_cli.main(base + ["--inference-token", INFERENCE_TOKEN] + infer) == 0
        assert client_cli.main(base + ["--inference-token", INFERENCE_TOKEN, "unload", "simple"]) == 1
        assert "UNAUTHENTICATED" in capsys.readouterr().err
        # Both tokens from the environment: each call sends the one it needs.
        monkeypatch.setenv("SLOTSERVE_INFERENCE_TOKEN", INFERENCE_TOKEN)
        monkeypatch.setenv("SLOTSERVE_MANAGEMENT_TOKEN", MANAGEMENT_TOKEN)
        assert client_cli.main(base + ["unload", "simple"]) == 0
        assert client_cli.main(base + ["load", "simple"]) == 0
        assert client_cli.main(base + ["models"]) == 0
        assert "READY" in capsys.readouterr().out
        assert client_cli.main(base + infer) == 0


# ---- token files and the server command line --------------------------------------------------------------------


def test_token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(MANAGEMENT_TOKEN + "\n")
    assert read_token_file(path, "--management-token-file") == Secret(MANAGEMENT_TOKEN)
    path.write_text(MANAGEMENT_TOKEN + "\r\n")
    assert read_token_file(path, "--management-token-file").matches(MANAGEMENT_TOKEN)
    for content in ("", "\n"):
        path.write_text(content)
        with pytest.raises(ValueError, match="empty"):
            read_token_file(path, "--management-token-file")
    with pytest.raises(ValueError, match="cannot read"):
        read_token_file(tmp_path / "missing", "--management-token-file")
    assert repr(Secret(MANAGEMENT_TOKEN)) == "Secret('***')"
    assert MANAGEMENT_TOKEN not in repr(ServerOptions(allow_management=True, management_token=MANAGEMENT_TOKEN))


def test_bearer_tokens_parsing():
    assert bearer_tokens(
        [
            ("authorization", "Bearer a"),
            ("authorization", "BEARER  b "),
            ("other", "Bearer c"),
            ("authorization", "Basic d"),
            ("authorization", "Bearer "),
        ]
    ) == ["a", "b"]
    assert bearer_tokens(None) == []


def _server_command(repository, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "service",
        "--model-repository",
        str(repository),
        "--port",
        "0",
        "--no-load-at-startup",
        *flags,
    ]


def test_server_command_line_with_a_token_file(repository, tmp_path):
    """`--management-token-file` end to end: the banner says a token is needed and never shows it."""
    token_file = tmp_path / "token"
    token_file.write_text(MANAGEMENT_TOKEN + "\n")
    process = subprocess.Popen(
        _server_command(repository, "--allow-management", "--management-token-file", str(token_file)),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = process.stdout.readline()
        assert "listening on" in line, process.stderr.read() if process.poll() is not None else line
        address = line.split("listening on")[1].strip()
        with ManagementClient(address, token="", timeout=CALL_TIMEOUT) as anonymous:
            refused(anonymous.register, "simple")
        with ManagementClient(address, token=MANAGEMENT_TOKEN, timeout=CALL_TIMEOUT) as manager:
            assert manager.register("simple").loaded
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert "bearer token required" in stderr
    assert MANAGEMENT_TOKEN not in stderr


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--management-token", MANAGEMENT_TOKEN], "needs --allow-management"),
        (["--allow-management", "--management-token-file", "EMPTY"], "is empty"),
        (["--allow-management", "--management-token-file", "MISSING"], "cannot read"),
        (["--inference-token", "two words"], "visible ASCII"),
        (["--management-token", "a", "--management-token-file", "EMPTY"], "not allowed with"),
    ],
)
def test_server_command_line_refuses_bad_tokens(repository, tmp_path, flags, expected):
    (tmp_path / "empty").write_text("\n")
    flags = [
        str(tmp_path / "empty") if flag == "EMPTY" else str(tmp_path / "missing") if flag == "MISSING" else flag
        for flag in flags
    ]
    result = subprocess.run(_server_command(repository, *flags), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and expected in result.stderr, result.stderr
    assert MANAGEMENT_TOKEN not in result.stderr
