"""tritonserver's tracing flags on slotserve (service/process/trace_flags.py): --trace-config spelled as
tritonserver spells it and the older --trace-* flags give the startup TraceSettings; bad values are refused at
startup naming the flag; tracing is off by default."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from service.core.trace_settings import TraceLevel, TraceMode, TraceSettings
from service.process.cli import build_parser, option_fields
from service.process.options import ServerOptions
from service.process.trace_flags import trace_settings

ROOT = Path(__file__).resolve().parents[3]
TIMESTAMPS = frozenset({TraceLevel.TIMESTAMPS})


def settings_from(*argv: str, environment: dict[str, str] | None = None) -> TraceSettings:
    return trace_settings(build_parser().parse_args(list(argv)), environment or {})


def refused(*argv: str, capsys: pytest.CaptureFixture[str] | None = None) -> str:
    """The one line that refuses `argv`: the parser's (exit 2) or the options' ValueError."""
    try:
        args = build_parser().parse_args(list(argv))
    except SystemExit as exit_info:
        assert exit_info.code == 2
        assert capsys is not None
        return capsys.readouterr().err
    with pytest.raises(ValueError) as raised:
        trace_settings(args, {})
    return str(raised.value)


def test_tracing_is_off_by_default() -> None:
    options = ServerOptions(**option_fields(build_parser().parse_args([])))
    assert options.trace_settings == TraceSettings()
    assert not options.trace_settings.on


def test_trace_config_in_triton_mode() -> None:
    settings = settings_from(
        "--trace-config",
        "triton,file=/tmp/trace.json",
        "--trace-config",
        "triton,log-frequency=50",
        "--trace-config",
        "level=TIMESTAMPS",
        "--trace-config",
        "level=TENSORS",
        "--trace-config",
        "rate=10",
        "--trace-config",
        "count=100",
    )
    assert settings == TraceSettings(
        levels=frozenset({TraceLevel.TIMESTAMPS, TraceLevel.TENSORS}),
        rate=10,
        count=100,
        log_frequency=50,
        file="/tmp/trace.json",
        mode=TraceMode.TRITON,
    )
    assert settings.on


def test_opentelemetry_mode_keeps_its_options_with_tritons_batch_defaults() -> None:
    settings = settings_from(
        "--trace-config",
        "mode=opentelemetry",
        "--trace-config",
        "opentelemetry,url=localhost:4317",
        "--trace-config",
        "opentelemetry,resource=service.name=api",
        "--trace-config",
        "opentelemetry,resource=deployment=blue",
        "--trace-config",
        "opentelemetry,bsp_max_queue_size=64",
        "--trace-config",
        "level=timestamps",
        environment={"OTEL_BSP_SCHEDULE_DELAY": "100"},
    )
    assert settings.mode is TraceMode.OPENTELEMETRY and settings.on
    assert dict(settings.opentelemetry) == {
        "url": "localhost:4317",
        "resource": "service.name=api,deployment=blue",
        "bsp_max_queue_size": "64",
        "bsp_schedule_delay": "100",
        "bsp_max_export_batch_size": "512",
    }
    assert settings.file == ""  # no file in opentelemetry mode


def test_the_older_flags_still_work_and_trace_config_wins_over_them() -> None:
    settings = settings_from(
        "--trace-file",
        "/tmp/a.json",
        "--trace-level",
        "TIMESTAMPS",
        "--trace-rate",
        "3",
        "--trace-count",
        "5",
        "--trace-log-frequency",
        "2",
    )
    assert (settings.file, settings.levels, settings.rate, settings.count, settings.log_frequency) == (
        "/tmp/a.json",
        TIMESTAMPS,
        3,
        5,
        2,
    )
    overridden = settings_from("--trace-file", "/tmp/a.json", "--trace-rate", "3", "--trace-config", "rate=9")
    assert overridden.rate == 9


def test_off_anywhere_turns_tracing_off_as_tritonserver_does() -> None:
    settings = settings_from("--trace-level", "TIMESTAMPS", "--trace-config", "level=OFF", "--trace-file", "/tmp/t")
    assert settings.levels == frozenset() and not settings.on


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--trace-config", "rate"], "argument --trace-config: expected [MODE,]SETTING=VALUE"),
        (["--trace-config", ",rate=3"], "argument --trace-config: no trace mode before ','"),
        (["--trace-config", "jaeger,url=x"], "argument --trace-config: unknown trace mode 'jaeger'"),
        (["--trace-config", "triton,url=x"], "unknown setting triton,url"),
        (["--trace-config", "colour=red"], "unknown setting colour"),
        (["--trace-level", "loud"], "argument --trace-level: invalid trace level 'loud'"),
        (["--trace-config", "rate=fast"], "--trace-config rate must be a whole number, got 'fast'"),
        (["--trace-rate", "-1"], "--trace-rate must be within 0..4294967295, got -1"),
        (["--trace-config", "count=-2"], "--trace-config count must be within -1..2147483647, got -2"),
        (["--trace-config", "triton,log-frequency=x"], "--trace-config triton,log-frequency must be a whole number"),
        (["--trace-config", "mode=jaeger"], "--trace-config mode=jaeger: the mode is triton or opentelemetry"),
        (["--trace-config", "level=x"], "--trace-config level=x"),
        (["--trace-level", "TIMESTAMPS"], "trace file name is not given (add --trace-config triton,file=PATH)"),
        (["--trace-level", "TIMESTAMPS", "--trace-file", "/t", "--trace-rate", "0"], "sample rate must be non-zero"),
        (
            ["--trace-config", "mode=opentelemetry", "--trace-config", "opentelemetry,bsp_schedule_delay=soon"],
            "--trace-config opentelemetry,bsp_schedule_delay must be a whole number",
        ),
        (
            ["--trace-config", "mode=opentelemetry", "--trace-config", "opentelemetry,resource=novalue"],
            "opentelemetry,resource=novalue: expected KEY=VALUE",
        ),
    ],
)
def test_bad_values_are_refused_at_startup_naming_the_flag(argv: list[str], words: str, capsys) -> None:
    assert words in refused(*argv, capsys=capsys)


def test_a_bad_value_stops_the_server_before_it_serves(tmp_path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "service", "--model-repository", str(tmp_path), "--trace-config", "rate=fast"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert completed.returncode == 2
    assert "slotserve: --trace-config rate must be a whole number, got 'fast'" in completed.stderr
    assert "listening" not in completed.stdout
