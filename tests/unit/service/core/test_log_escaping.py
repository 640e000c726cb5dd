"""The text log format writes one line per record whatever a client put in it (issue 33, item 11): control
characters of the line escaped, a traceback's lines kept with its exception messages escaped."""

from __future__ import annotations

import logging

from service.core.events import TextFormatter, escape_controls


def record(message: str, *args: object, exc_info=None) -> logging.LogRecord:
    return logging.LogRecord("slotserve", logging.ERROR, __file__, 1, message, args, exc_info)


def test_escape_controls_writes_every_control_character_as_its_escape():
    assert escape_controls("a\nb\rc\td\x1b[31me\x00f\x7fg\x85h\u2028i\u2029j") == (
        "a\\nb\\rc\\td\\x1b[31me\\x00f\\x7fg\\x85h\\u2028i\\u2029j"
    )
    assert escape_controls("C:\\path é ünïcode ✓") == "C:\\path é ünïcode ✓"  # printable text unchanged


def test_a_message_and_its_arguments_stay_on_one_line():
    line = TextFormatter().format(record("refused %s: %r", "id\n2026 ERROR x: forged", "\x1b[2J"))
    assert "\n" not in line and "\x1b" not in line
    assert line.endswith("ERROR slotserve: refused id\\n2026 ERROR x: forged: '\\x1b[2J'")


def test_a_tracebacks_lines_stay_and_its_messages_are_escaped():
    try:
        try:
            raise KeyError("inner\nforged line")
        except KeyError as error:
            error.add_note("note\nforged note")
            raise ValueError("outer\n2026 ERROR slotserve: forged\x1b[0m") from error
    except ValueError as error:
        text = TextFormatter().format(record("failed", exc_info=(type(error), error, error.__traceback__)))
    lines = text.splitlines()
    assert lines[0].endswith("ERROR slotserve: failed") and lines[1] == "Traceback (most recent call last):"
    assert "ValueError: outer\\n2026 ERROR slotserve: forged\\x1b[0m" in lines
    assert "note\\nforged note" in lines and "KeyError: 'inner\\nforged line'" in lines
    assert not any(line.startswith(("2026", "forged")) for line in lines[1:]) and "\x1b" not in text
