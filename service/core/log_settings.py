"""The server's log settings at run time: Triton's LogSettings fields over slotserve's logging (service/core/events.py's
formatters on the handler `service/process/cli.py` configures, one lowest level on the root logger).

What each of Triton 2.51's fields means here:

* `log_info`, `log_warning`, `log_error` (bool) and `log_verbose_level` (uint32): slotserve logs every line at or
  above one level, so the switches move that level. Turning a level on turns on the levels above it (log_info true
  also logs WARNING and ERROR lines); turning one off turns off the levels below it (log_warning false also drops
  INFO and DEBUG lines). `log_verbose_level` 1 or more is DEBUG (slotserve has one debug level; the number given is
  kept and answered), 0 leaves DEBUG. An update that asks for a level on below one it turns off (log_info true
  with log_warning false) cannot be honoured and is refused, naming both fields.
* `log_format` (string): `text` or `json` (--log-format's), or Triton's `default` and `ISO8601`, which mean text
  lines here as they do on the command line. Answered as `text` or `json`.
* `log_file` (string): answered (the --log-file path, "" for stderr); an update is refused as Triton refuses it
  (UNSUPPORTED there: reason `unimplemented`, UNIMPLEMENTED, with Triton's words).

A value of the wrong type is refused with Triton's words ("expect boolean for 'log_info'"); a field Triton does
not have is refused by name (Triton ignores it); an update is checked whole before anything changes, so a refused
update changes nothing (Triton applies the fields before the bad one). A change applies to the next log line.

Thread safety: `_lock` (a leaf) serializes updates and reads; logging's own locks are taken under it
(`Logger.setLevel`, `Handler.setFormatter`), never the reverse.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import InvalidRequest, ServiceError
from .events import JsonFormatter, QuietStreamHandler, TextFormatter

FILE, INFO, WARNING, ERROR, VERBOSE, FORMAT = (
    "log_file",
    "log_info",
    "log_warning",
    "log_error",
    "log_verbose_level",
    "log_format",
)
FIELDS = (FILE, INFO, WARNING, ERROR, VERBOSE, FORMAT)
# The lowest level logged, by threshold: 0 DEBUG ... 3 ERROR, 4: only CRITICAL lines.
_LEVELS = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
# The switch of each threshold (the verbose level is DEBUG's).
_SWITCHES = {VERBOSE: 0, INFO: 1, WARNING: 2, ERROR: 3}
_FORMATS = {"text": "text", "default": "text", "ISO8601": "text", "json": "json"}
_TYPE_WORDS = {bool: "boolean", int: "int32", str: "string"}  # Triton's words in "expect <type> for '<field>'"
_FIELD_TYPES: dict[str, type] = {FILE: str, INFO: bool, WARNING: bool, ERROR: bool, VERBOSE: int, FORMAT: str}
_UINT32_MAX = 2**32 - 1


@dataclass(frozen=True)
class LogSettings:
    """The answer of LogSettings: what is logged now."""

    file: str
    info: bool
    warning: bool
    error: bool
    verbose_level: int
    format: str  # "text" or "json"


class LogSettingInvalid(InvalidRequest):
    """A LogSettings update with a value of the wrong type, an unknown field or switches that cannot go together
    (INVALID_ARGUMENT); nothing changed."""

    def __init__(self, message: str, setting: str) -> None:
        super().__init__(message)
        self.setting = setting


class LogFileNotUpdatable(ServiceError):
    """log_file named in a LogSettings update: refused as Triton 2.51 refuses it (UNSUPPORTED: UNIMPLEMENTED)."""

    error_reason = "unimplemented"

    def __init__(self) -> None:
        super().__init__("log file location can not be updated through network protocol")


class LogControl:
    """Reads and changes the process's logging: the root logger's level and the formatter of slotserve's handlers
    (QuietStreamHandler, installed by service/process/cli.py; other handlers, such as a test runner's, keep theirs).

    Nothing blocks: a short leaf lock."""

    def __init__(self, root: logging.Logger | None = None, *, verbose_level: int = 0) -> None:
        self._root = root if root is not None else logging.getLogger()
        self._lock = threading.Lock()
        self._verbose = max(1, verbose_level) if self._threshold() == 0 else 0
        # The format asked for (answered even where no slotserve handler is installed: a server embedded in a
        # process that configured its own logging, such as a test runner).
        self._format = "json" if any(isinstance(h.formatter, JsonFormatter) for h in self._handlers()) else "text"

    def settings(self) -> LogSettings:
        """What is logged now (read from the logger and its handlers, so a change made elsewhere shows too)."""
        with self._lock:
            return self._settings()

    def update(self, changes: Mapping[str, object]) -> LogSettings:
        """Apply a LogSettings update (field -> bool, int or str, None for a value of no type) and return the new
        settings. Raises LogFileNotUpdatable (log_file named) or LogSettingInvalid naming the field; nothing
        changes then."""
        if FILE in changes:
            raise LogFileNotUpdatable()
        for name, value in changes.items():
            _check_type(name, value)
        form = _format_of(changes[FORMAT]) if FORMAT in changes else None
        switches = {name: _switch_value(name, changes[name]) for name in _SWITCHES if name in changes}
        with self._lock:
            threshold = _threshold_for(switches, self._threshold())
            self._root.setLevel(_LEVELS[threshold])
            if VERBOSE in changes and isinstance(changes[VERBOSE], int) and changes[VERBOSE]:
                self._verbose = int(changes[VERBOSE])  # type: ignore[call-overload]
            elif threshold == 0:
                self._verbose = self._verbose or 1
            else:
                self._verbose = 0
            if form is not None:
                self._format = form
                for handler in self._handlers():
                    handler.setFormatter(JsonFormatter() if form == "json" else TextFormatter())
            return self._settings()

    def _threshold(self) -> int:
        level = self._root.level
        return sum(1 for below in _LEVELS[:-1] if below < level)

    def _handlers(self) -> list[QuietStreamHandler]:
        return [handler for handler in self._root.handlers if isinstance(handler, QuietStreamHandler)]

    def _settings(self) -> LogSettings:
        threshold = self._threshold()
        handlers = self._handlers()
        streams = [handler.stream for handler in handlers if handler.stream not in (sys.stderr, sys.stdout)]
        file = str(getattr(streams[0], "name", "")) if streams else ""
        return LogSettings(
            file=file,
            info=threshold <= 1,
            warning=threshold <= 2,
            error=threshold <= 3,
            verbose_level=self._verbose if threshold == 0 else 0,
            format=self._format,
        )


def _check_type(name: str, value: object) -> None:
    expected = _FIELD_TYPES.get(name)
    if expected is None:
        raise LogSettingInvalid(
            f"unknown log setting '{name}' (LogSettings has {', '.join(FIELDS)}); nothing was changed", name
        )
    # bool is an int in Python: a boolean is never the verbose level, nor a number a switch.
    if type(value) is not expected:
        raise LogSettingInvalid(f"expect {_TYPE_WORDS[expected]} for '{name}'", name)
    if name == VERBOSE and not 0 <= value <= _UINT32_MAX:  # type: ignore[operator]
        raise LogSettingInvalid(f"expect int32 for '{name}'", name)


def _format_of(value: object) -> str:
    form = _FORMATS.get(str(value))
    if form is None:
        raise LogSettingInvalid(
            f"invalid argument for log_format, got: {value} (slotserve takes text, json, or Triton's default and "
            "ISO8601, which mean text)",
            FORMAT,
        )
    return form


def _switch_value(name: str, value: object) -> bool:
    return bool(value) if name != VERBOSE else int(value) >= 1  # type: ignore[call-overload]


def _threshold_for(switches: Mapping[str, bool], current: int) -> int:
    """The lowest level that honours every switch asked for, as near to `current` as they allow. Raises
    LogSettingInvalid, naming the two fields, when a level would be on below one that is off."""
    on = [name for name, value in switches.items() if value]
    off = [name for name, value in switches.items() if not value]
    highest_off = max(off, key=_SWITCHES.__getitem__, default=None)
    lowest_on = min(on, key=_SWITCHES.__getitem__, default=None)
    low = _SWITCHES[highest_off] + 1 if highest_off is not None else 0
    high = _SWITCHES[lowest_on] if lowest_on is not None else len(_LEVELS) - 1
    if low > high:
        raise LogSettingInvalid(
            f"'{lowest_on}' on with '{highest_off}' off cannot be honoured: slotserve logs every line at or above "
            "one level, so a level is on only with the levels above it; nothing was changed",
            str(lowest_on),
        )
    return min(max(current, low), high)
