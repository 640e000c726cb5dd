"""Logging never stops a server (issue 19, item 9): the server's log handler drops a line its stream cannot take
(EPIPE, EIO after a hang-up, a closed file) instead of raising or printing a "Logging error" traceback per line;
other errors are still reported as logging reports them. The real process with a closed stdout is in
tests/shutdown/test_signals.py."""

from __future__ import annotations

import io
import logging

import pytest

from service.core.events import QuietStreamHandler


class BrokenStream(io.TextIOBase):
    def __init__(self, error: Exception) -> None:
        self.error = error
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        raise self.error


def _logger(handler: logging.Handler) -> logging.Logger:
    logger = logging.getLogger(f"test_quiet_logging.{id(handler)}")
    logger.propagate = False
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    return logger


@pytest.mark.parametrize(
    "error",
    [BrokenPipeError(32, "Broken pipe"), OSError(5, "Input/output error"), ValueError("I/O operation on closed file.")],
    ids=repr,
)
def test_a_broken_stream_drops_the_line_silently(error, capsys):
    stream = BrokenStream(error)
    logger = _logger(QuietStreamHandler(stream))
    logger.info("serving on %s", "127.0.0.1:8001")  # must not raise
    logger.warning("and again")
    assert stream.writes == 2  # each line was tried (a stream may recover), none raised
    assert capsys.readouterr().err == ""  # and no "--- Logging error ---" traceback


def test_other_logging_errors_are_still_reported(capsys):
    logger = _logger(QuietStreamHandler(io.StringIO()))
    logger.info("%d", "not a number")  # a bug in a log call, not a broken stream
    assert "--- Logging error ---" in capsys.readouterr().err
