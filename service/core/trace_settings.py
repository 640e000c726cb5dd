"""Triton's trace settings (the TraceSetting RPC's and --trace-config's), per model and global, and the sampling
decision made once per request.

Semantics are Triton 2.51's (its trace manager, read in `src/tracer.cc`; answers checked against tritonserver in
tests/differential/test_trace_log_settings.py):

* The global settings start from the command line (`--trace-config`, `--trace-*`); clearing a global field (an empty
  value list) restores its startup value.
* A model has its own settings only for the fields updated for it; every other field follows the global settings,
  also when those change later. Clearing every field a model set gives it back to the global settings.
* Sampling: each settings holder (the global one, and every model with settings of its own) counts the requests it
  decides on; the request that makes that count a multiple of `rate` is traced while `count` (traces left) is not 0,
  and is one trace fewer when `count` > 0 (-1: unlimited). An update replaces a holder: its request count starts
  again, and a model that takes its count from the global settings takes the count left at that moment.
* An update whose result traces (a level other than OFF) but cannot (rate 0, or triton mode without a trace file) is
  refused and changes nothing, with Triton's words; a global update is refused so too when a model that follows it
  would be left so (Triton changes the global settings first, then fails on the model).
* `trace_file` cannot be updated through the network (Triton refuses it with UNSUPPORTED: `unimplemented` here).
* Stricter than Triton, each refused by name and changing nothing: a field it does not update (trace_mode, an
  unknown name: Triton ignores it), a level name it does not know (Triton skips it), a negative trace_rate or
  log_frequency (Triton reads -1 as 4294967295).

Thread safety: one lock (`_lock`, a leaf: nothing is taken under it) guards the holders and their counters. When
tracing is off everywhere, `sample` reads `_any_on` and returns without it: the inference path pays one attribute
read. Subscribers are called after every update, outside the lock, on the updating thread.
"""

from __future__ import annotations

import enum
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TypeVar

from .errors import InvalidRequest, ServiceError

_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1
MIN_TRACE_COUNT = -1

# The fields a TraceSetting update may name (trace_file is refused as Triton refuses it; others by name).
LEVEL, RATE, COUNT, LOG_FREQUENCY, FILE = "trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file"
UPDATABLE_FIELDS = (LEVEL, RATE, COUNT, LOG_FREQUENCY)


class TraceLevel(enum.Enum):
    TIMESTAMPS = "TIMESTAMPS"
    TENSORS = "TENSORS"


class TraceMode(enum.Enum):
    TRITON = "triton"
    OPENTELEMETRY = "opentelemetry"


@dataclass(frozen=True)
class TraceSettings:
    """One holder's settings as a request is sampled under them (count: traces left when read)."""

    levels: frozenset[TraceLevel] = frozenset()  # empty: OFF
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: TraceMode = TraceMode.TRITON
    # Not hashed (a mapping is not hashable), so settings stay usable as dictionary keys.
    opentelemetry: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    @property
    def on(self) -> bool:
        """Whether requests under these settings can be traced: a level, a rate, traces left, and (triton mode) a
        file to write them to."""
        return self.invalid_reason() is None and self.count != 0

    def invalid_reason(self) -> str | None:
        """Triton's reason why these settings cannot trace, count aside (None when they can)."""
        if not self.levels:
            return "tracing is disabled"
        if self.rate == 0:
            return "sample rate must be non-zero"
        if self.mode is TraceMode.TRITON and not self.file:
            return "trace file name is not given"
        return None

    def level_names(self) -> list[str]:
        """The trace_level values as Triton answers them: OFF, or TIMESTAMPS before TENSORS."""
        if not self.levels:
            return ["OFF"]
        return [level.value for level in TraceLevel if level in self.levels]


@dataclass(frozen=True)
class Sampled:
    """What a traced request carries: the model it was sampled for and the settings it was sampled under."""

    model: str
    settings: TraceSettings


class TraceSettingInvalid(InvalidRequest):
    """A TraceSetting update with a bad value or a result that cannot trace (INVALID_ARGUMENT); nothing changed."""

    def __init__(self, message: str, setting: str) -> None:
        super().__init__(message)
        self.setting = setting


class UnknownTraceModel(InvalidRequest):
    """TraceSetting for a model the server does not serve: Triton answers INVALID_ARGUMENT with these words."""

    def __init__(self, model: str) -> None:
        super().__init__(f"Request for unknown model : {model}")
        self.model = model


class TraceFileNotUpdatable(ServiceError):
    """trace_file named in a TraceSetting update: Triton 2.51 refuses it (UNSUPPORTED, gRPC UNIMPLEMENTED)."""

    error_reason = "unimplemented"

    def __init__(self) -> None:
        super().__init__("trace file location can not be updated through network protocol")


@dataclass(frozen=True)
class _Overrides:
    """The fields one holder set itself (None: follows its fallback)."""

    levels: frozenset[TraceLevel] | None = None
    rate: int | None = None
    count: int | None = None
    log_frequency: int | None = None

    @property
    def empty(self) -> bool:
        return self.levels is None and self.rate is None and self.count is None and self.log_frequency is None

    def over(self, base: TraceSettings) -> TraceSettings:
        return replace(
            base,
            levels=base.levels if self.levels is None else self.levels,
            rate=base.rate if self.rate is None else self.rate,
            count=base.count if self.count is None else self.count,
            log_frequency=base.log_frequency if self.log_frequency is None else self.log_frequency,
        )


class _Holder:
    """One settings holder's live state: its settings (count being traces left) and the requests it decided on.
    Guarded by the store's lock."""

    __slots__ = ("active", "overrides", "seen", "settings")

    def __init__(self, overrides: _Overrides, settings: TraceSettings) -> None:
        self.overrides = overrides
        self.settings = settings
        self.active = settings.on  # kept with `settings`: decide() runs per request
        self.seen = 0

    def decide(self) -> TraceSettings | None:
        """One request: the settings it is traced under, or None."""
        if not self.active:
            return None
        settings = self.settings
        self.seen += 1
        if self.seen % settings.rate != 0:
            return None
        if settings.count > 0:
            self.settings = replace(settings, count=settings.count - 1)
            self.active = settings.count > 1
        return settings


# std::stoi's reading, as Triton parses these fields: leading blanks, a sign, digits; anything after is ignored.
_STOI = re.compile(r"\s*([+-]?\d+)")


class TraceSettingsStore:
    """The global and per-model trace settings, updated by the TraceSetting RPC, read by the dataplane per request.

    Nothing blocks but a short leaf lock; `sample` takes no lock at all while tracing is off everywhere."""

    def __init__(self, initial: TraceSettings) -> None:
        self._startup = initial
        self._lock = threading.Lock()
        self._global = _Holder(_Overrides(), initial)
        self._models: dict[str, _Holder] = {}
        self._subscribers: list[Callable[[], None]] = []
        # Read without the lock by sample(): a stale True costs one locked decision, a stale False skips requests
        # that arrive while an update is being published, as a request arriving just before it would be.
        self._any_on = initial.on

    @property
    def any_on(self) -> bool:
        """Whether some holder may trace (a cheap check for callers that want to skip work)."""
        return self._any_on

    def settings(self, model: str = "") -> TraceSettings:
        """The settings `model` is sampled under ("" = global; a model without its own: the global ones), count
        being the traces left now."""
        with self._lock:
            return self._holder(model).settings

    def overridden(self, model: str) -> frozenset[str]:
        """The fields `model` set itself (empty: it follows the global settings)."""
        with self._lock:
            holder = self._models.get(model)
            if holder is None:
                return frozenset()
            names = {LEVEL: holder.overrides.levels, RATE: holder.overrides.rate, COUNT: holder.overrides.count}
            names[LOG_FREQUENCY] = holder.overrides.log_frequency
            return frozenset(name for name, value in names.items() if value is not None)

    def update(self, model: str, changes: Mapping[str, Sequence[str] | None]) -> TraceSettings:
        """Apply a TraceSetting update for `model` ("" = global) and return the settings it answers with.

        `changes` maps a field to its values (TraceSetting's SettingValue list); an empty list or None clears the
        field (back to the fallback: the global settings for a model, the startup value for the global ones).
        Another field is refused by name (Triton ignores it).
        Raises TraceFileNotUpdatable (trace_file named) or TraceSettingInvalid (a bad value, or a result that would
        trace but cannot), naming the field; nothing changes then. Does not check that the model exists."""
        if FILE in changes:
            raise TraceFileNotUpdatable()
        fixed = [name for name in changes if name not in UPDATABLE_FIELDS]
        if fixed:
            # Triton ignores them (trace_mode and the opentelemetry options are answered, never updated): refused
            # by name here, so an update that cannot happen is not taken for one that did.
            raise TraceSettingInvalid(
                f"trace setting '{fixed[0]}' cannot be updated (updatable: {', '.join(UPDATABLE_FIELDS)}); "
                "nothing was changed",
                fixed[0],
            )
        parsed = _parse_changes(changes)
        with self._lock:
            if model:
                current = self._models.get(model)
                overrides = _merge(current.overrides if current else _Overrides(), parsed)
                if overrides.empty:
                    self._models.pop(model, None)
                else:
                    self._models[model] = self._checked(overrides, self._global.settings)
            else:
                new_global = self._checked(_merge(self._global.overrides, parsed), self._startup)
                # Models that follow some global fields are rebuilt over the new global settings, as Triton does;
                # checked before anything changes (Triton changes the global settings, then fails on the model).
                models = {
                    name: self._checked(holder.overrides, new_global.settings, model=name)
                    for name, holder in self._models.items()
                }
                self._global, self._models = new_global, models
            self._any_on = self._global.active or any(h.active for h in self._models.values())
            answer = self._holder(model).settings
            subscribers = list(self._subscribers)
        for callback in subscribers:
            callback()
        return answer

    def sample(self, model: str) -> Sampled | None:
        """One decision for one request to `model`: None when it is not traced. Lock-free while tracing is off
        everywhere."""
        if not self._any_on:
            return None
        with self._lock:
            settings = self._holder(model).decide()
            if settings is not None and settings.count == 1:
                # That was the last trace of this holder: maybe the last anywhere.
                self._any_on = self._global.active or any(h.active for h in self._models.values())
        return None if settings is None else Sampled(model, settings)

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call `callback` (no arguments, outside the store's lock) after every successful update."""
        with self._lock:
            self._subscribers.append(callback)

    def _holder(self, model: str) -> _Holder:
        if model:
            holder = self._models.get(model)
            if holder is not None:
                return holder
        return self._global

    @staticmethod
    def _checked(overrides: _Overrides, fallback: TraceSettings, *, model: str = "") -> _Holder:
        """A holder of `overrides` over `fallback`. Raises TraceSettingInvalid when the result would trace but
        cannot (naming `model` when the update was global and the model's own settings are the ones that would)."""
        settings = overrides.over(fallback)
        reason = settings.invalid_reason()
        if settings.levels and reason is not None:
            whose = f" (for model '{model}', which sets its own trace_level)" if model else ""
            raise TraceSettingInvalid(f"Attempting to set invalid trace setting :{reason}{whose}", _field_of(reason))
        return _Holder(overrides, settings)


def _field_of(reason: str) -> str:
    return RATE if "rate" in reason else FILE


class _Clear:
    """Marks a field cleared in a parsed update."""


_CLEAR = _Clear()


@dataclass(frozen=True)
class _Parsed:
    levels: frozenset[TraceLevel] | _Clear | None = None
    rate: int | _Clear | None = None
    count: int | _Clear | None = None
    log_frequency: int | _Clear | None = None


_T = TypeVar("_T")


def _pick(new: _T | _Clear | None, old: _T | None) -> _T | None:
    if new is None:
        return old
    return None if isinstance(new, _Clear) else new


def _merge(overrides: _Overrides, parsed: _Parsed) -> _Overrides:
    return _Overrides(
        levels=_pick(parsed.levels, overrides.levels),
        rate=_pick(parsed.rate, overrides.rate),
        count=_pick(parsed.count, overrides.count),
        log_frequency=_pick(parsed.log_frequency, overrides.log_frequency),
    )


def _parse_changes(changes: Mapping[str, Sequence[str] | None]) -> _Parsed:
    levels: frozenset[TraceLevel] | _Clear | None = None
    if LEVEL in changes:
        levels = _parse_levels(changes[LEVEL])
    numbers: dict[str, int | _Clear | None] = {}
    for name, low, high in (
        (RATE, 0, _UINT32_MAX),
        (COUNT, MIN_TRACE_COUNT, _INT32_MAX),
        (LOG_FREQUENCY, 0, _UINT32_MAX),
    ):
        numbers[name] = _parse_number(name, changes[name], low, high) if name in changes else None
    return _Parsed(levels=levels, rate=numbers[RATE], count=numbers[COUNT], log_frequency=numbers[LOG_FREQUENCY])


def _parse_levels(values: Sequence[str] | None) -> frozenset[TraceLevel] | _Clear | None:
    if not values:
        return _CLEAR
    if "OFF" in values:
        if len(values) != 1:
            raise TraceSettingInvalid("Expect only one trace level 'OFF' is specified", LEVEL)
        return frozenset()
    unknown = [value for value in values if value not in TraceLevel._value2member_map_]
    if unknown:
        # Triton 2.51 skips level names it does not know (an update of only those changes nothing): refused here,
        # naming them, so a typo is not a silent no-op (tests/differential/test_trace_log_settings.py).
        raise TraceSettingInvalid(
            f"Unable to parse 'trace_level', got: {', '.join(unknown)} (expected OFF, TIMESTAMPS or TENSORS)", LEVEL
        )
    return frozenset(TraceLevel(value) for value in values)


def _parse_number(name: str, values: Sequence[str] | None, low: int, high: int) -> int | _Clear:
    if not values:
        return _CLEAR
    if len(values) != 1:
        raise TraceSettingInvalid(f"expect only 1 value for '{name}'", name)
    text = values[0]
    match = _STOI.match(text)
    if match is None:
        raise TraceSettingInvalid(f"Unable to parse '{name}', got: {text}", name)
    number = int(match.group(1))
    if name == COUNT and number < MIN_TRACE_COUNT:
        raise TraceSettingInvalid(f"Unable to parse '{name}'. Expecting value >= {MIN_TRACE_COUNT}, got: {text}", name)
    if not low <= number <= high:
        raise TraceSettingInvalid(
            f"Unable to parse '{name}', value is out of range [ {low}, {high} ], got: {text}", name
        )
    return number


def parse_level_option(text: str) -> frozenset[TraceLevel] | None:
    """A --trace-level / --trace-config level= value as tritonserver reads it (case-insensitive): an empty set for
    OFF/false, TIMESTAMPS for timestamps/true/on/min/max, TENSORS for tensors; None for anything else."""
    word = text.lower()
    if word in ("false", "off"):
        return frozenset()
    if word in ("true", "on", "min", "max", "timestamps"):
        return frozenset({TraceLevel.TIMESTAMPS})
    if word == "tensors":
        return frozenset({TraceLevel.TENSORS})
    return None
