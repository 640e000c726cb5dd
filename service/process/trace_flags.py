"""tritonserver's tracing flags, read as tritonserver 2.51 reads them, into the startup TraceSettings
(service/core/trace_settings.py).

* `--trace-config [MODE,]SETTING=VALUE`, repeatable: without a mode, the global `level=` (OFF, TIMESTAMPS, TENSORS;
  Triton's synonyms too; repeated levels add up, OFF anywhere turns tracing off), `rate=`, `count=` and `mode=`
  (triton or opentelemetry); `triton,file=PATH` and `triton,log-frequency=N`; `opentelemetry,url=URL`,
  `opentelemetry,resource=KEY=VALUE` (repeatable) and `opentelemetry,bsp_max_queue_size=`/`bsp_schedule_delay=`/
  `bsp_max_export_batch_size=` (their defaults, as Triton's, from OTEL_BSP_* or 2048/5000/512).
* The older `--trace-file`, `--trace-level` (repeatable), `--trace-rate`, `--trace-count` and `--trace-log-frequency`,
  which tritonserver 2.51 still takes (deprecated there); a --trace-config value of the same setting wins.

Stricter than tritonserver, each refused at startup naming the flag (exit 2): a setting or mode it does not know
(Triton ignores an unknown setting), a number out of its range (Triton reads a negative rate as 4294967295), and a
level other than OFF in triton mode without a trace file or with rate 0 (Triton starts, traces nothing and then
refuses every TraceSetting update).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ..core.trace_settings import TraceLevel, TraceMode, TraceSettings, parse_level_option

_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1
GLOBAL_SETTINGS = ("level", "rate", "count", "mode")
TRITON_SETTINGS = ("file", "log-frequency")
OPENTELEMETRY_SETTINGS = ("url", "resource", "bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")
# Triton's batch span processor defaults, each overridden by its environment variable (OTEL_BSP_MAX_QUEUE_SIZE...).
BSP_DEFAULTS = {"bsp_max_queue_size": "2048", "bsp_schedule_delay": "5000", "bsp_max_export_batch_size": "512"}
_SETTINGS = {"": GLOBAL_SETTINGS, "triton": TRITON_SETTINGS, "opentelemetry": OPENTELEMETRY_SETTINGS}


@dataclass(frozen=True)
class TraceConfig:
    """One --trace-config value: its mode ("" global), setting and value."""

    mode: str
    setting: str
    value: str


def trace_config(text: str) -> TraceConfig:
    """argparse type of --trace-config: `[MODE,]SETTING=VALUE` as tritonserver splits it (the first ',' ends the
    mode, the first '=' after it the setting). Raises ArgumentTypeError naming what is wrong."""
    mode, comma, rest = text.partition(",")
    if not comma:
        mode, rest = "", text
    elif not mode:
        raise argparse.ArgumentTypeError(f"no trace mode before ',' in {text!r} (triton or opentelemetry)")
    mode = mode.lower()
    if mode not in _SETTINGS:
        raise argparse.ArgumentTypeError(f"unknown trace mode {mode!r} in {text!r} (triton or opentelemetry)")
    setting, equals, value = rest.partition("=")
    if not equals or not setting or not value:
        raise argparse.ArgumentTypeError(f"expected [MODE,]SETTING=VALUE, got {text!r}")
    if setting not in _SETTINGS[mode]:
        known = ", ".join(_SETTINGS[mode])
        where = f"{mode}," if mode else ""
        raise argparse.ArgumentTypeError(f"unknown setting {where}{setting} in {text!r} ({where or 'global: '}{known})")
    return TraceConfig(mode, setting, value)


def trace_level(text: str) -> frozenset[TraceLevel]:
    """argparse type of --trace-level (and level=): OFF, TIMESTAMPS, TENSORS in any case, and Triton's synonyms."""
    levels = parse_level_option(text)
    if levels is None:
        raise argparse.ArgumentTypeError(f"invalid trace level {text!r} (OFF, TIMESTAMPS or TENSORS)")
    return levels


def add_trace_flags(parser: argparse.ArgumentParser) -> None:
    """The tracing flags, in a group of their own (off by default)."""
    group = parser.add_argument_group(
        "Tracing (Triton's flags)",
        "request traces as tritonserver's --trace-config sets them; off by default (docs/observability.md)",
    )
    add = group.add_argument
    add(
        "--trace-config",
        type=trace_config,
        action="append",
        metavar="[MODE,]SETTING=VALUE",
        help="repeatable: level=OFF|TIMESTAMPS|TENSORS, rate=N (trace 1 request in N), count=N (-1: no limit), "
        "mode=triton|opentelemetry; triton,file=PATH and triton,log-frequency=N; opentelemetry,url=URL, "
        "opentelemetry,resource=KEY=VALUE and opentelemetry,bsp_*=N (default: tracing off)",
    )
    add("--trace-file", metavar="PATH", help="Triton's older spelling of --trace-config triton,file=PATH")
    add(
        "--trace-level",
        type=trace_level,
        action="append",
        metavar="LEVEL",
        help="Triton's older spelling of --trace-config level=LEVEL (repeatable)",
    )
    add("--trace-rate", metavar="N", help="Triton's older spelling of --trace-config rate=N")
    add("--trace-count", metavar="N", help="Triton's older spelling of --trace-config count=N")
    add("--trace-log-frequency", metavar="N", help="Triton's older spelling of --trace-config triton,log-frequency=N")


def trace_settings(args: argparse.Namespace, environment: Mapping[str, str] | None = None) -> TraceSettings:
    """The startup TraceSettings the parsed flags give. Raises ValueError naming the flag for a bad value or a
    combination that cannot trace."""
    environment = os.environ if environment is None else environment
    configs: list[TraceConfig] = list(getattr(args, "trace_config", None) or [])
    chosen = {(config.mode, config.setting): config.value for config in configs}

    def number(flag: str, text: str | None, default: int, low: int, high: int) -> int:
        if text is None:
            return default
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{flag} must be a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise ValueError(f"{flag} must be within {low}..{high}, got {text}")
        return value

    def pick(mode: str, setting: str, older_flag: str, older: str | None) -> tuple[str, str | None]:
        if (mode, setting) in chosen:
            where = f"{mode}," if mode else ""
            return f"--trace-config {where}{setting}", chosen[(mode, setting)]
        return older_flag, older

    levels: set[TraceLevel] = set()
    turned_off = False
    for level_set in getattr(args, "trace_level", None) or []:
        levels |= level_set
        turned_off |= not level_set
    for config in configs:
        if (config.mode, config.setting) == ("", "level"):
            try:
                level_set = trace_level(config.value)
            except argparse.ArgumentTypeError as error:
                raise ValueError(f"--trace-config level={config.value}: {error}") from None
            levels |= level_set
            turned_off |= not level_set
    if turned_off:  # as tritonserver: OFF anywhere wins
        levels = set()
    mode_text = chosen.get(("", "mode"), "triton").lower()
    if mode_text not in ("triton", "opentelemetry"):
        raise ValueError(f"--trace-config mode={mode_text}: the mode is triton or opentelemetry")
    mode = TraceMode(mode_text)
    rate = number(*pick("", "rate", "--trace-rate", args.trace_rate), 1000, 0, _UINT32_MAX)
    count = number(*pick("", "count", "--trace-count", args.trace_count), -1, -1, _INT32_MAX)
    frequency_flag, frequency = pick("triton", "log-frequency", "--trace-log-frequency", args.trace_log_frequency)
    log_frequency = number(frequency_flag, frequency, 0, 0, _UINT32_MAX)
    file = chosen.get(("triton", "file"), args.trace_file or "")
    settings = TraceSettings(
        levels=frozenset(levels),
        rate=rate,
        count=count,
        log_frequency=log_frequency if mode is TraceMode.TRITON else 0,
        file=file if mode is TraceMode.TRITON else "",
        mode=mode,
        opentelemetry=_opentelemetry_options(configs, environment) if mode is TraceMode.OPENTELEMETRY else {},
    )
    reason = settings.invalid_reason()
    if settings.levels and reason is not None:
        fix = "--trace-config triton,file=PATH" if "file" in reason else "--trace-config rate=N with N >= 1"
        raise ValueError(f"--trace-config level={_level_words(settings)}: {reason} (add {fix})")
    return settings


def _level_words(settings: TraceSettings) -> str:
    return ",".join(settings.level_names())


def _opentelemetry_options(configs: list[TraceConfig], environment: Mapping[str, str]) -> Mapping[str, str]:
    """The opentelemetry,KEY=VALUE options (resource values joined with ',', as OTEL_RESOURCE_ATTRIBUTES writes
    them), the batch span processor's defaults filled in."""
    options: dict[str, str] = {}
    for config in configs:
        if config.mode != "opentelemetry":
            continue
        if config.setting == "resource":
            if "=" not in config.value:
                raise ValueError(f"--trace-config opentelemetry,resource={config.value}: expected KEY=VALUE")
            options["resource"] = ",".join(filter(None, (options.get("resource"), config.value)))
        else:
            options[config.setting] = config.value
    for name, default in BSP_DEFAULTS.items():
        flag = f"--trace-config opentelemetry,{name}"
        if name not in options:
            flag = f"OTEL_{name.upper()}"
            options[name] = environment.get(flag, default)
        if not options[name].isdigit() or int(options[name]) > _UINT32_MAX:
            raise ValueError(f"{flag} must be a whole number within 0..{_UINT32_MAX}, got {options[name]!r}")
    return MappingProxyType(options)
