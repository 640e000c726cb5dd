"""TraceSetting and LogSettings on a real server: tritonclient's get/update calls from a separate process, the
access rule (reading with the read token, updating with the management token), and refusals that name the problem
and leave the settings, the server and its models intact."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from generated import grpc_service_pb2 as pb
from service.core.trace_settings import TraceLevel, TraceSettings
from tests.integration._support import check_simple_response, demo_subset, rpc_error, simple_request, stub
from tests.interop.support import last_json_line, run_process

CLIENT = Path(__file__).resolve().parent / "_settings_client.py"
MANAGEMENT_TOKEN = "trace-settings-management-token"
INFERENCE_TOKEN = "trace-settings-inference-token"
TIMEOUT = 30


@pytest.fixture
def root_logging() -> Iterator[None]:
    """The server runs in this process: a LogSettings update changes this process's root logger; put it back."""
    root = logging.getLogger()
    level, formatters = root.level, [handler.formatter for handler in root.handlers]
    yield
    root.setLevel(level)
    for handler, formatter in zip(root.handlers, formatters, strict=False):
        handler.setFormatter(formatter)


def _settings(answer: pb.TraceSettingResponse) -> dict[str, list[str]]:
    return {name: list(value.value) for name, value in answer.settings.items()}


def _bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def _update(model: str = "", **settings: list[str]) -> pb.TraceSettingRequest:
    request = pb.TraceSettingRequest(model_name=model)
    for name, values in settings.items():
        request.settings[name].value.extend(values)
    return request


def test_tritonclient_reads_and_updates_trace_and_log_settings_from_another_process(
    slotserve, tmp_path, root_logging
) -> None:
    trace_file = str(tmp_path / "trace.json")
    server = slotserve(
        demo_subset(tmp_path / "repository", "simple"),
        allow_management=True,
        management_token=MANAGEMENT_TOKEN,
        trace_settings=TraceSettings(file=trace_file),
    )
    completed = run_process([sys.executable, str(CLIENT), server.address, MANAGEMENT_TOKEN], timeout=120)
    assert completed.returncode == 0, completed.stderr
    result = last_json_line(completed)

    def values(step: str) -> dict[str, list[str]]:
        return {name: value["value"] for name, value in result[step].items()}

    assert values("global") == {
        "trace_level": ["OFF"],
        "trace_rate": ["1000"],
        "trace_count": ["-1"],
        "log_frequency": ["0"],
        "trace_file": [trace_file],
        "trace_mode": ["triton"],
    }
    assert result["update_without_token"]["refused"] == "StatusCode.UNAUTHENTICATED"
    assert values("update_global")["trace_level"] == ["TIMESTAMPS"] and values("update_global")["trace_rate"] == ["5"]
    assert values("update_model")["trace_count"] == ["3"]
    assert values("model")["trace_count"] == ["3"] and values("model")["trace_rate"] == ["5"]  # rate: the global one
    assert values("clear_model")["trace_count"] == ["-1"]  # cleared: the global value again
    assert result["unknown_model"]["refused"] == "StatusCode.INVALID_ARGUMENT"
    assert "Request for unknown model : no_such_model" in result["unknown_model"]["message"]
    assert result["trace_file"]["refused"] == "StatusCode.UNIMPLEMENTED"
    assert "trace file location can not be updated through network protocol" in result["trace_file"]["message"]
    assert result["bad_rate"]["refused"] == "StatusCode.INVALID_ARGUMENT"
    assert "Unable to parse 'trace_rate', got: fast" in result["bad_rate"]["message"]
    # The server's store is what the RPC changed (tracespans hands it to the dataplane).
    assert server.server.trace_settings.settings().levels == frozenset({TraceLevel.TIMESTAMPS})
    assert server.server.trace_settings.settings().rate == 5

    assert set(result["logs"]) == {
        "log_file",
        "log_info",
        "log_warning",
        "log_error",
        "log_verbose_level",
        "log_format",
    }
    assert result["logs_update"]["log_verbose_level"] == {"uint32_param": 2}
    assert result["logs_update"]["log_format"] == {"string_param": "json"}
    assert result["logs_bad"]["refused"] == "StatusCode.INVALID_ARGUMENT"
    assert "invalid argument for log_format, got: yaml" in result["logs_bad"]["message"]
    assert result["logs_file"]["refused"] == "StatusCode.UNIMPLEMENTED"
    assert result["logs_after"] == result["logs_update"]  # the refusals changed nothing
    assert logging.getLogger().level == logging.DEBUG

    request, first, second = simple_request()
    check_simple_response(stub(server).ModelInfer(request, timeout=TIMEOUT), first, second)  # still serving


def test_reading_needs_the_read_token_and_updating_the_management_token(slotserve, tmp_path, root_logging) -> None:
    server = slotserve(
        demo_subset(tmp_path / "repository", "simple"),
        allow_management=True,
        management_token=MANAGEMENT_TOKEN,
        inference_token=INFERENCE_TOKEN,
        trace_settings=TraceSettings(file=str(tmp_path / "trace.json")),
    )
    raw = stub(server)
    read = _bearer(INFERENCE_TOKEN)
    assert _settings(raw.TraceSetting(pb.TraceSettingRequest(), metadata=read, timeout=TIMEOUT))["trace_rate"] == [
        "1000"
    ]
    assert (
        raw.LogSettings(pb.LogSettingsRequest(), metadata=read, timeout=TIMEOUT)
        .settings["log_info"]
        .HasField("bool_param")
    )
    assert rpc_error(raw.TraceSetting, pb.TraceSettingRequest()).code == "UNAUTHENTICATED"

    for token in (None, INFERENCE_TOKEN):
        metadata = _bearer(token) if token else None
        refused = rpc_error(raw.TraceSetting, _update(trace_rate=["7"]), metadata=metadata)
        assert (refused.code, refused.reason) == ("UNAUTHENTICATED", "unauthenticated")
        if token:  # with no token at all, the read check refuses first
            assert "TraceSetting (an update) needs the management token" in refused.message
        logs = pb.LogSettingsRequest()
        logs.settings["log_info"].bool_param = False
        assert rpc_error(raw.LogSettings, logs, metadata=metadata).code == "UNAUTHENTICATED"
    assert server.server.trace_settings.settings().rate == 1000  # the refused updates changed nothing
    assert logging.getLogger().level != logging.CRITICAL

    manage = _bearer(MANAGEMENT_TOKEN)
    updated = raw.TraceSetting(_update(trace_rate=["7"]), metadata=manage, timeout=TIMEOUT)
    assert _settings(updated)["trace_rate"] == ["7"]
    # The management token reads too, as it does every call.
    assert _settings(raw.TraceSetting(pb.TraceSettingRequest(), metadata=manage, timeout=TIMEOUT))["trace_rate"] == [
        "7"
    ]


def test_a_refused_update_names_the_field_and_changes_nothing(slotserve, tmp_path) -> None:
    server = slotserve(
        demo_subset(tmp_path / "repository", "simple"), trace_settings=TraceSettings(file=str(tmp_path / "t"))
    )
    raw = stub(server)
    before = _settings(raw.TraceSetting(_update("simple"), timeout=TIMEOUT))
    for request, words in (
        (_update("simple", trace_rate=["3"], trace_count=["-5"]), "Expecting value >= -1, got: -5"),
        (_update("simple", trace_level=["OFF", "TENSORS"]), "Expect only one trace level 'OFF'"),
        (_update("simple", trace_mode=["opentelemetry"]), "trace setting 'trace_mode' cannot be updated"),
        (_update("", trace_level=["TIMESTAMPS"], trace_rate=["0"]), "sample rate must be non-zero"),
    ):
        refused = rpc_error(raw.TraceSetting, request)
        assert (refused.code, refused.reason) == ("INVALID_ARGUMENT", "invalid_request_error"), refused
        assert words in refused.message
    assert _settings(raw.TraceSetting(_update("simple"), timeout=TIMEOUT)) == before
    assert server.server.trace_settings.overridden("simple") == frozenset()
    infer, first, second = simple_request()
    check_simple_response(raw.ModelInfer(infer, timeout=TIMEOUT), first, second)


def test_opentelemetry_mode_answers_its_options_and_no_file(slotserve, tmp_path) -> None:
    from service.core.trace_settings import TraceMode

    server = slotserve(
        demo_subset(tmp_path / "repository", "simple"),
        trace_settings=TraceSettings(
            levels=frozenset({TraceLevel.TIMESTAMPS}),
            mode=TraceMode.OPENTELEMETRY,
            opentelemetry={"url": "localhost:4317", "resource": "a=b,c=d", "bsp_max_queue_size": "2048"},
        ),
    )
    answer = _settings(stub(server).TraceSetting(pb.TraceSettingRequest(), timeout=TIMEOUT))
    assert answer["trace_mode"] == ["opentelemetry"] and answer["trace_level"] == ["TIMESTAMPS"]
    assert answer["url"] == ["localhost:4317"] and answer["bsp_max_queue_size"] == ["2048"]
    assert answer["resource"] == ["a=b", "c=d"]  # one value per resource attribute, as Triton answers
    assert "trace_file" not in answer and "log_frequency" not in answer


def test_a_model_that_is_not_served_is_refused_with_tritons_words(slotserve, tmp_path) -> None:
    server = slotserve(demo_subset(tmp_path / "repository", "simple"))
    refused = rpc_error(stub(server).TraceSetting, _update("absent", trace_rate=["2"]))
    assert refused.code == "INVALID_ARGUMENT" and "Request for unknown model : absent" in refused.message
    assert server.server.trace_settings.overridden("absent") == frozenset()


def test_server_metadata_lists_tritons_trace_and_logging_extensions(slotserve, tmp_path) -> None:
    server = slotserve(demo_subset(tmp_path / "repository", "simple"))
    extensions = stub(server).ServerMetadata(pb.ServerMetadataRequest(), timeout=TIMEOUT).extensions
    assert {"trace", "logging"} <= set(extensions)


def test_grpc_status_is_the_tables(slotserve, tmp_path) -> None:
    server = slotserve(
        demo_subset(tmp_path / "repository", "simple"), trace_settings=TraceSettings(file=str(tmp_path / "t"))
    )
    with pytest.raises(grpc.RpcError) as raised:
        stub(server).TraceSetting(_update(trace_file=["/elsewhere"]), timeout=TIMEOUT)
    assert raised.value.code() is grpc.StatusCode.UNIMPLEMENTED
