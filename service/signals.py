"""Stop signals, whichever thread the kernel delivers them to, decided on the main thread.

Why not a plain Python handler and `Event.wait()`: CPython runs Python signal handlers on the main thread only,
and a process-directed signal may be delivered to any thread that does not block it (gRPC's and ONNX Runtime's
threads do not). The C-level handler then only sets a flag; a main thread blocked in a lock wait is never
interrupted and sleeps on, so the server would never shut down. Here the C-level handler also writes the signal
number into a pipe (`signal.set_wakeup_fd`), which it does on whatever thread it runs, and the main thread
blocks reading that pipe: it wakes for every signal, at once.

The rules (`decide`):

* SIGTERM, SIGINT or SIGHUP while serving: start the shutdown (drain, grace, ...), on a thread of its own, so that
  the main thread keeps listening. SIGHUP is a stop signal like SIGTERM: the terminal that started the server
  hung up, and its default action (exit 129 at once) dropped every request in flight. A server started with
  SIGHUP ignored (`nohup`) keeps ignoring it.
* SIGTERM or SIGHUP again while shutting down: changes nothing (process supervisors send SIGTERM twice:
  `timeout(1)` signals its child and then its whole group, init systems signal a process group).
* SIGINT again while shutting down (Ctrl-C twice at a terminal), or SIGQUIT at any time: exit at once with
  128 + the signal's number, without draining.
* Any of them before the server serves (during the startup loads): exit at once; nothing was served, so there
  is nothing to drain.
"""

from __future__ import annotations

import enum
import logging
import os
import signal
from types import FrameType

from .core.events import log_event

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FORCE_SIGNALS = (signal.SIGQUIT,)
_SHUTDOWN_DONE = 0  # the byte the shutdown thread writes when it has finished (no signal has number 0)


class Decision(enum.Enum):
    START_SHUTDOWN = "start_shutdown"
    IGNORE = "ignore"  # a repeated SIGTERM or SIGHUP
    EXIT_NOW = "exit_now"


def decide(signum: int, shutting_down: bool) -> Decision:
    """What the server does on `signum` (see the module docstring)."""
    if signum in FORCE_SIGNALS:
        return Decision.EXIT_NOW
    if not shutting_down:
        return Decision.START_SHUTDOWN
    return Decision.EXIT_NOW if signum == signal.SIGINT else Decision.IGNORE


class SignalPipe:
    """Signal numbers (and the end of the shutdown) as bytes on a pipe that the main thread reads.

    `install` must be called on the main thread (a requirement of `signal.set_wakeup_fd`). `next` blocks until
    a signal arrives or `shutdown_done` is called, without a time limit; it never misses a signal delivered to
    another thread.
    """

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self.serving = False  # set once the server serves: from then on the main thread reads the pipe
        self._read_fd, self._write_fd = os.pipe()
        # The C handler must never block: a full pipe drops the byte, and `next` has long read the earlier ones.
        os.set_blocking(self._write_fd, False)

    def install(self) -> None:
        for signum in STOP_SIGNALS + FORCE_SIGNALS:
            if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
                continue  # started under nohup (or told so by its supervisor): a hang-up is not for us
            signal.signal(signum, self._on_signal)
        signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """The Python-level handler (main thread). Once serving, the number already went into the pipe and the
        main thread acts on it there. During startup the main thread is loading models, not reading the pipe:
        exit at once (this runs as soon as it executes Python code again)."""
        if not self.serving:
            log_event(self._log, "shutdown_forced", signal=signal.Signals(signum).name)
            logging.shutdown()
            os._exit(128 + signum)

    def next(self) -> int | None:
        """The next signal number, or None once the shutdown has finished. Blocks."""
        while True:
            data = os.read(self._read_fd, 1)  # retried by Python after EINTR (PEP 475)
            if data[0] == _SHUTDOWN_DONE:
                return None
            if data[0] in STOP_SIGNALS + FORCE_SIGNALS:
                return data[0]

    def shutdown_done(self) -> None:
        """Wake `next` with None (called by the shutdown thread when it has finished)."""
        os.write(self._write_fd, bytes([_SHUTDOWN_DONE]))
