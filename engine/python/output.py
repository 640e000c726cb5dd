"""What a python-model worker writes to its stdout and stderr, turned into the server's log records.

A worker never writes to the server's own stdout or stderr: both of its streams are pipes that a `WorkerOutput`
thread of the server reads (started and stopped by the worker's owner, engine/python/backend.py). Each line
becomes one record of the server's logger `slotserve.python_model`, through the server's logging (its level, its
format: JSON lines under `--log-format json`), carrying the model's name (`model`) and the worker's slot
(`instance`, `stream` in JSON):

    stdout  a `print()`                          INFO
    stderr  a record of the worker's `logging`   its own level, message and traceback in one record
            (pb_utils.Logger, the worker's own
            messages: `RecordFormatter`)
    stderr  anything else (warnings, a crash)    WARNING

So a server whose stdout reader went away never fails a request of a model that prints (the worker's pipe is
always read), and a JSON log stays JSON. The worker's `logging` writes each record as one line, RECORD_MARK
followed by a JSON object (`RecordFormatter`), so a multi-line message (a traceback) stays one record.

A line longer than MAX_LINE is logged in pieces of MAX_LINE bytes. Bytes that are not UTF-8 are replaced.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import threading
from collections.abc import Iterable

RECORD_MARK = "\x1eslotserve-record "
MAX_LINE = 64 << 10
_READ = 1 << 16
_DRAIN_READS = 256  # at most this many reads once stopped (16 MiB)
_LOG = logging.getLogger("slotserve.python_model")


class RecordFormatter(logging.Formatter):
    """The worker's log format: RECORD_MARK + {"level", "logger", "message"} (the traceback in the message)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message = f"{message}\n{self.formatException(record.exc_info)}"
        return RECORD_MARK + json.dumps({"level": record.levelname, "logger": record.name, "message": message})


class WorkerOutput:
    """Reads one worker's stdout and stderr pipes on a thread of its own until both end (the worker exited) or
    `stop` is called, and logs each line. Owns the two read ends (closes them when it ends)."""

    def __init__(self, model: str, instance: int, stdout: int, stderr: int) -> None:
        self._model = model
        self._instance = instance
        self._streams = {stdout: "stdout", stderr: "stderr"}
        self._pending = {stdout: b"", stderr: b""}
        self._wake_read, self._wake_write = os.pipe()
        self._stopped = False  # only the owner's thread reads and sets it (stop)
        self._thread = threading.Thread(target=self._run, name=f"python-output-{model}-{instance}", daemon=True)

    def start(self) -> None:
        """Start reading the worker's pipes on the thread of its own. Never blocks."""
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Log what is still in the pipes and end the thread (the worker has exited: called by its owner after
        that). Waits at most `timeout` seconds; returns whether the thread ended. A pipe a child process of the
        model still holds open is not waited for. Called once (later calls only wait)."""
        if self._stopped:
            if self._thread.ident is not None:
                self._thread.join(timeout)
            return not self._thread.is_alive()
        self._stopped = True
        try:
            os.write(self._wake_write, b"x")
        except OSError:
            pass  # the thread ended already (it closed the read end)
        if self._thread.ident is None:  # never started: nobody else will close the read ends
            self._close([*self._streams, self._wake_read, self._wake_write])
            return True
        self._thread.join(timeout)
        ended = not self._thread.is_alive()
        if ended:  # the thread is done with the wake pipe: its write end can go (not before: a reused number)
            self._close([self._wake_write])
        return ended

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        try:
            for descriptor in self._streams:
                selector.register(descriptor, selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            while len(selector.get_map()) > 1:
                ready = selector.select()  # no timeout: the worker's exit (EOF) or `stop` (the wake pipe) ends it
                if any(key.fd == self._wake_read for key, _ in ready):
                    self._drain(selector)
                    return
                for key, _ in ready:
                    self._read(key.fd, selector)
        except Exception:  # noqa: BLE001 (a reader that fails must not leave the worker writing into a full pipe)
            _LOG.exception("model '%s' instance %d: reading the worker's output failed", self._model, self._instance)
        finally:
            selector.close()
            self._close([*self._streams, self._wake_read])

    def _drain(self, selector: selectors.BaseSelector) -> None:
        """What is readable now, without waiting (a bounded number of reads: a child of the model may still be
        writing); then the partial lines."""
        for _ in range(_DRAIN_READS):
            ready = [key.fd for key, _ in selector.select(timeout=0) if key.fd != self._wake_read]
            if not ready:
                break
            for descriptor in ready:
                self._read(descriptor, selector)
        for descriptor, rest in self._pending.items():
            if rest:
                self._line(descriptor, rest)
                self._pending[descriptor] = b""

    def _read(self, descriptor: int, selector: selectors.BaseSelector) -> None:
        try:
            data = os.read(descriptor, _READ)
        except OSError:
            data = b""
        if not data:  # the worker (and whatever inherited the pipe) closed it
            selector.unregister(descriptor)
            rest, self._pending[descriptor] = self._pending[descriptor], b""
            if rest:
                self._line(descriptor, rest)
            return
        buffered = self._pending[descriptor] + data
        *lines, rest = buffered.split(b"\n")
        for line in lines:
            self._line(descriptor, line)
        while len(rest) >= MAX_LINE:
            self._line(descriptor, rest[:MAX_LINE])
            rest = rest[MAX_LINE:]
        self._pending[descriptor] = rest

    def _line(self, descriptor: int, raw: bytes) -> None:
        for start in range(0, max(1, len(raw)), MAX_LINE):
            self._log(self._streams[descriptor], raw[start : start + MAX_LINE].decode("utf-8", "replace").rstrip("\r"))

    def _log(self, stream: str, text: str) -> None:
        level = logging.INFO if stream == "stdout" else logging.WARNING
        fields: dict[str, object] = {"instance": self._instance, "stream": stream}
        if stream == "stderr" and text.startswith(RECORD_MARK):
            try:
                record = json.loads(text[len(RECORD_MARK) :])
                named = logging.getLevelName(str(record["level"]))
                level = named if isinstance(named, int) else logging.WARNING
                text = str(record["message"])
                fields["worker_logger"] = str(record["logger"])
            except (ValueError, KeyError, TypeError):
                pass  # not one of ours after all: the line as it is
        if _LOG.isEnabledFor(level):
            _LOG.log(
                level,
                "model '%s' instance %d: %s",
                self._model,
                self._instance,
                text,
                extra={"model": self._model, "event_fields": fields},
            )

    @staticmethod
    def _close(descriptors: Iterable[int]) -> None:
        for descriptor in descriptors:
            try:
                os.close(descriptor)
            except OSError:
                pass
