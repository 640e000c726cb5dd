"""Lifecycle events: one structured log line each, in text or JSON, and per-model counts for the metrics.

Every lifecycle site (register, load, reconfigure, unload, eviction, idle retirement, rejection, shutdown phase)
calls `log_event(logger, event, model=..., **fields)` or, where the event is also counted, `Events.emit` (one
`Events` per server, reached through `SharedRuntime.events`). `EVENTS` below is the one list of event names,
their levels, the fields each carries and the text line it renders as; docs/operations.md ("Logs") documents it.

* Text format (`TextFormatter`): the usual `time LEVEL logger: message` line, whose message reads like a sentence
  (`model 'x': loaded 2 slot(s) on onnxruntime in 0.045 s`).
* JSON format (`JsonFormatter`, `--log-format json`): one object per line with the fixed keys `time`, `level`,
  `logger`, `event`, `model`, `message`, then the event's own fields. Lines that are not events (warnings,
  tracebacks) have `event` and `model` null; a traceback goes under `exception`.

A record is one line whatever a client put in it: messages carry client-controlled strings (sequence and request
ids, model, tensor and region names, parameters, in error messages), and a newline in one would start a forged
line (`...\n2026-12-04 ... ERROR slotserve: ...`), an ANSI escape would rewrite a terminal. The text format escapes
every control character of the line (`escape_controls`: `\n`, `\r`, `\t`, `\x1b`, the C1 controls, U+2028/9)
and of an exception's message inside a traceback (whose own lines stay lines); JSON's string escaping does the same
for the JSON format. Escaping happens here, once, for every logger: no call site has to remember it.

Locking: `Events._lock` and `RejectionLog._lock` are leaves: nothing else is taken while they are held, so
events may be emitted from anywhere, even under a model lock (no site does: they emit after releasing it).
"""

from __future__ import annotations

import collections
import json
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TextIO

# The keys every JSON line has; an event's own fields never use these names (tests/unit/test_events.py checks).
FIXED_KEYS = ("time", "level", "logger", "event", "model", "message")


@dataclass(frozen=True)
class EventSpec:
    """An event's level, its fields (in the order docs/operations.md lists them) and its text line: a format string over
    the fields, or a function of them where the sentence depends on a field's value."""

    level: int
    fields: tuple[str, ...]
    text: str | Callable[[Mapping[str, Any]], str]  # Any: the fields are an emit's keyword arguments, of any type

    def render(self, fields: Mapping[str, object]) -> str:
        return self.text(fields) if callable(self.text) else self.text.format(**fields)


def _evicted_text(fields: Mapping[str, object]) -> str:
    # The residency wording is the documentation's ("evicted to make room for model 'y'").
    if fields["reason"] == "memory_growth":  # Residency.check_memory: no load asked for it
        return "evicted: the resident models' memory grew past the budget"
    if fields["reason"] == "memory_budget":
        return f"evicted to fit model '{fields['for_model']}' in the memory budget"
    return f"evicted to make room for model '{fields['for_model']}'"


def _rejected_text(fields: Mapping[str, Any]) -> str:
    more = int(fields["count"]) - 1
    tail = f" ({more} more since the previous line)" if more > 0 else ""
    return f"rejected a request ({fields['reason']}): {fields['error']}{tail}"


def _serving_text(fields: Mapping[str, object]) -> str:
    metrics = fields.get("metrics_address")
    tail = f"; metrics on http://{metrics}/metrics" if metrics else ""
    return f"slotserve {fields['version']} serving {fields['repository']} on {fields['address']}{tail}"


_INFO, _WARNING, _ERROR = logging.INFO, logging.WARNING, logging.ERROR

EVENTS: dict[str, EventSpec] = {
    # -- models --
    "registered": EventSpec(_INFO, ("backend", "slots", "source"), "registered ({backend}, {slots} slot(s))"),
    "not_loaded_at_startup": EventSpec(_ERROR, ("error",), "not loaded at startup: {error}"),
    "load_started": EventSpec(_INFO, ("backend", "slots", "cause"), "loading {slots} slot(s) on {backend} ({cause})"),
    # `seconds` is the load without its warmup; `warmup_seconds` the warmup of every slot (0 without model_warmup).
    "loaded": EventSpec(
        _INFO,
        ("backend", "slots", "seconds", "warmup_seconds", "memory_bytes", "batching"),
        lambda f: (
            f"loaded {f['slots']} slot(s) on {f['backend']} in {f['seconds']:.3f} s"
            + (f", then warmed up in {f['warmup_seconds']:.3f} s" if f.get("warmup_seconds") else "")
            + (f"; dynamic batching: {f['batching']}" if f.get("batching") else "")
        ),
    ),
    "load_failed": EventSpec(
        _WARNING, ("backend", "reason", "seconds", "error"), "load failed after {seconds:.3f} s ({reason}): {error}"
    ),
    "reconfigured": EventSpec(
        _INFO,
        ("slots", "in_place"),
        lambda f: f"reconfigured {'in place' if f['in_place'] else 'with a new engine'} ({f['slots']} slot(s))",
    ),
    "reconfigure_refused": EventSpec(_WARNING, ("error",), "reconfiguration refused before commit: {error}"),
    "unloaded": EventSpec(_INFO, ("seconds",), "unloaded in {seconds:.3f} s"),
    "evicted": EventSpec(_INFO, ("reason", "for_model", "seconds"), _evicted_text),
    "idle_retired": EventSpec(_INFO, ("idle_seconds", "seconds"), "retired after {idle_seconds:g} s idle"),
    "closed_at_shutdown": EventSpec(_INFO, ("seconds",), "closed at shutdown"),
    "device_failed": EventSpec(_ERROR, ("error", "seconds"), "taken out of service after its device failed: {error}"),
    "rejected": EventSpec(_INFO, ("reason", "error", "count"), _rejected_text),
    # -- the server --
    "serving": EventSpec(_INFO, ("version", "repository", "address", "metrics_address"), _serving_text),
    "frontend_replaced": EventSpec(
        _WARNING,
        ("index", "old_pid", "new_pid", "exit_code", "signal"),
        lambda f: (
            f"front end {f['index']} (pid {f['old_pid']}) ended "
            + (f"by {f['signal']}" if f.get("signal") else f"with exit code {f['exit_code']}")
            + f"; its calls in flight failed; replaced by pid {f['new_pid']}"
        ),
    ),
    "shutdown_signal": EventSpec(_INFO, ("signal",), "received {signal}: shutting down"),
    "shutdown_signal_repeated": EventSpec(
        _INFO, ("signal",), "received {signal} again: already shutting down, the shutdown goes on"
    ),
    "shutdown_forced": EventSpec(_WARNING, ("signal",), "received {signal}: exiting at once, without draining"),
    "shutdown_draining": EventSpec(
        _INFO, ("drain_seconds",), "shutdown: health NOT_SERVING; draining for {drain_seconds:.1f} s"
    ),
    "shutdown_closed_to_new_calls": EventSpec(
        _INFO,
        ("calls", "grace_seconds"),
        "shutdown: no longer accepting calls; {calls} in progress get {grace_seconds:.1f} s to finish",
    ),
    "shutdown_grace_over": EventSpec(
        _INFO, ("calls",), "shutdown: grace over; refusing queued work and cancelling {calls} call(s)"
    ),
    "shutdown_calls_abandoned": EventSpec(_ERROR, ("calls",), "shutdown: abandoning {calls} call(s) hung in a backend"),
    "shutdown_reaper_abandoned": EventSpec(
        _ERROR, (), "shutdown: the idle reaper is still tearing a model down; not waiting for it"
    ),
    "shutdown_engines_left_open": EventSpec(
        _ERROR,
        ("models",),
        lambda f: f"shutdown: engines of {', '.join(f['models'])} left open: still held by hung calls",
    ),
    "shutdown_done": EventSpec(
        _INFO, ("seconds", "closed_models"), "shutdown: done in {seconds:.3f} s ({closed_models} engine(s) closed)"
    ),
}


def log_event(
    logger: logging.Logger,
    event: str,
    model: str | None = None,
    *,
    exc_info: BaseException | None = None,
    **fields: object,
) -> None:
    """Log `event` (a key of EVENTS) as one line: a sentence for people, with the event name, model and fields
    attached to the record for the JSON formatter; `exc_info` adds a traceback (an unexpected error). Costs one
    dictionary lookup when the level is off."""
    spec = EVENTS[event]
    if not logger.isEnabledFor(spec.level):
        return
    text = spec.render(fields)
    if model is not None:
        text = f"model '{model}': {text}"
    logger.log(
        spec.level, "%s", text, exc_info=exc_info, extra={"event": event, "model": model, "event_fields": fields}
    )


class Events:
    """A server's lifecycle events: each is logged (`log_event`) and counted per (event, model), so the metrics
    can report loads, unloads, evictions and the like without a counter object on any code path."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards: _counts, _listeners
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._listeners: tuple[Callable[[str, str, Mapping[str, object]], None], ...] = ()

    def subscribe(self, listener: Callable[[str, str, Mapping[str, object]], None]) -> None:
        """Call `listener(event, model, fields)` after each event of a model is logged, on the emitting thread,
        which may hold a model's lease or lock: it must only note the event (never block, never raise)."""
        with self._lock:
            self._listeners = (*self._listeners, listener)

    def emit(
        self,
        logger: logging.Logger,
        event: str,
        model: str | None = None,
        *,
        exc_info: BaseException | None = None,
        **fields: object,
    ) -> None:
        if model is not None:
            with self._lock:
                self._counts[(event, model)] += 1
        log_event(logger, event, model, exc_info=exc_info, **fields)
        if model is not None:
            for listener in self._listeners:  # a tuple, replaced whole: read without the lock
                listener(event, model, fields)

    def counts(self) -> dict[tuple[str, str], int]:
        """(event, model) -> how many times it happened, for every pair that happened at least once."""
        with self._lock:
            return dict(self._counts)


class RejectionLog:
    """Rejected requests, logged without flooding.

    Under overload a server may refuse thousands of requests a second; a log line each would cost more than the
    refusal itself and bury every other line. So at INFO at most one `rejected` line is written per model and
    reason every `interval` seconds, carrying `count`: the rejections of that model and reason since the previous
    line, this one included (the exact totals are in the metrics). With the logger at DEBUG every rejection gets
    its own line.
    """

    def __init__(
        self, logger: logging.Logger, interval: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._logger = logger
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()  # guards: _windows
        self._windows: dict[tuple[str, str], list[float]] = {}  # (model, reason) -> [time of the last line, not logged]

    def note(self, model: str, reason: str, error: str) -> None:
        """One rejected request of `model` for `reason`, with the message its client got."""
        if not self._logger.isEnabledFor(EVENTS["rejected"].level):
            return
        interval = 0.0 if self._logger.isEnabledFor(logging.DEBUG) else self.interval
        now = self._clock()
        with self._lock:
            window = self._windows.get((model, reason))
            if window is not None and now - window[0] < interval:
                window[1] += 1
                return
            count = 1 + (window[1] if window is not None else 0)
            self._windows[(model, reason)] = [now, 0]
        log_event(self._logger, "rejected", model, reason=reason, error=error, count=count)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: the FIXED_KEYS, then the event's fields, then `exception` if any."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "event": getattr(record, "event", None),
            "model": getattr(record, "model", None),
            "message": record.getMessage(),
        }
        line.update(getattr(record, "event_fields", None) or {})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, default=str)


# Each control character a log line must not carry raw: C0 (newline, carriage return, tab, ESC, ...), DEL, C1
# (NEL among them) and the Unicode line and paragraph separators, as its escape.
_CONTROLS: dict[int, str] = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
_CONTROLS.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", 0x2028: "\\u2028", 0x2029: "\\u2029"})


def escape_controls(text: str) -> str:
    """`text` with each control character written as its escape (`\\n`, `\\x1b`, ...): one line, nothing a
    terminal would act on. Printable text, backslashes included, is unchanged."""
    return text.translate(_CONTROLS)


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message`, one line per record: the line's control characters escaped; a traceback
    after it keeps its lines, with the exception's message (and notes) escaped, so that only the server's own
    traceback lines start a line."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))

    def formatException(
        self, ei: tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]
    ) -> str:
        error = ei[1]
        if not isinstance(error, BaseException):
            return escape_controls(super().formatException(ei))
        described = traceback.TracebackException(type(error), error, ei[2], compact=True)
        if not _escape_messages(described, set()):
            return escape_controls(super().formatException(ei))  # an interpreter without _str: one long line
        return "".join(described.format()).rstrip("\n")


def _escape_messages(described: traceback.TracebackException, seen: set[int]) -> bool:
    """Escape the message and notes of `described` and of its causes, contexts and grouped exceptions, in place.
    False if this interpreter's TracebackException keeps its message elsewhere than `_str` (3.11-3.13 use it)."""
    if id(described) in seen:
        return True
    seen.add(id(described))
    if not isinstance(getattr(described, "_str", None), str):
        return False
    described._str = escape_controls(described._str)  # type: ignore[attr-defined]  # the message, as format() reads it
    notes = getattr(described, "__notes__", None)
    if notes:
        described.__notes__ = [escape_controls(str(note)) for note in notes]
    linked = [described.__cause__, described.__context__, *(getattr(described, "exceptions", None) or ())]
    return all(_escape_messages(other, seen) for other in linked if other is not None)


class QuietStreamHandler(logging.StreamHandler[TextIO]):
    """A StreamHandler that drops a record when its stream is broken (EPIPE once the reader of a pipe is gone, EIO
    after the terminal hung up, a closed file), instead of printing a "--- Logging error ---" traceback for every
    line: logging must never stop or stall a server, and a broken stream leaves nowhere to report it. Any other
    error (a bad format string) is reported as logging always does."""

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, OSError) or (isinstance(error, ValueError) and "closed file" in str(error)):
            return
        super().handleError(record)
