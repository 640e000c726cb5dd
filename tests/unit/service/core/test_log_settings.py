"""Run-time log settings (service/core/log_settings.py): Triton's LogSettings fields over one root level and the
formatter of slotserve's handlers; a refused update changes nothing; a change shows on the next line."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from service.core.events import JsonFormatter, QuietStreamHandler, TextFormatter
from service.core.log_settings import LogControl, LogFileNotUpdatable, LogSettingInvalid, LogSettings


@pytest.fixture
def root() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A private logger tree standing for the root logger, with one slotserve handler writing to a buffer."""
    logger = logging.getLogger("test_log_settings.root")
    logger.propagate = False
    buffer = io.StringIO()
    handler = QuietStreamHandler(buffer)
    handler.setFormatter(TextFormatter())
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    yield logger, buffer
    logger.handlers = []


def test_startup_settings_are_read_from_the_logger(root) -> None:
    logger, _ = root
    assert LogControl(logger).settings() == LogSettings("", True, True, True, 0, "text")
    logger.setLevel(logging.DEBUG)
    assert LogControl(logger, verbose_level=2).settings().verbose_level == 2


def test_turning_info_off_drops_info_lines_from_the_next_line_on(root) -> None:
    logger, buffer = root
    control = LogControl(logger)
    logger.info("before")
    settings = control.update({"log_info": False})
    logger.info("after")
    logger.warning("still")
    assert (settings.info, settings.warning, settings.error) == (False, True, True)
    assert "before" in buffer.getvalue() and "after" not in buffer.getvalue() and "still" in buffer.getvalue()


def test_verbose_level_turns_debug_on_and_zero_turns_it_off(root) -> None:
    logger, buffer = root
    control = LogControl(logger)
    assert control.update({"log_verbose_level": 3}).verbose_level == 3
    logger.debug("shown")
    assert control.update({"log_verbose_level": 0}) == LogSettings("", True, True, True, 0, "text")
    logger.debug("hidden")
    assert "shown" in buffer.getvalue() and "hidden" not in buffer.getvalue()


def test_turning_a_level_on_turns_on_the_levels_above_it(root) -> None:
    logger, _ = root
    logger.setLevel(logging.CRITICAL)
    settings = LogControl(logger).update({"log_info": True})
    assert (settings.info, settings.warning, settings.error) == (True, True, True)
    assert logger.level == logging.INFO


def test_every_switch_off_leaves_only_critical_lines(root) -> None:
    logger, _ = root
    settings = LogControl(logger).update({"log_error": False})
    assert (settings.info, settings.warning, settings.error) == (False, False, False)
    assert logger.level == logging.CRITICAL


def test_format_switches_the_handlers_formatter_for_the_next_line(root) -> None:
    logger, buffer = root
    control = LogControl(logger)
    assert control.update({"log_format": "json"}).format == "json"
    logger.warning("as json")
    line = json.loads(buffer.getvalue().splitlines()[-1])
    assert line["message"] == "as json" and line["level"] == "WARNING"
    assert control.update({"log_format": "ISO8601"}).format == "text"  # Triton's word: text lines here
    assert isinstance(logger.handlers[0].formatter, TextFormatter)


def test_other_handlers_keep_their_formatter(root) -> None:
    logger, _ = root
    foreign = logging.StreamHandler(io.StringIO())
    logger.addHandler(foreign)
    LogControl(logger).update({"log_format": "json"})
    assert not isinstance(foreign.formatter, JsonFormatter)


@pytest.mark.parametrize(
    ("changes", "words", "field"),
    [
        ({"log_info": "yes"}, "expect boolean for 'log_info'", "log_info"),
        ({"log_warning": 1}, "expect boolean for 'log_warning'", "log_warning"),
        ({"log_verbose_level": True}, "expect int32 for 'log_verbose_level'", "log_verbose_level"),
        ({"log_format": 3}, "expect string for 'log_format'", "log_format"),
        ({"log_format": "yaml"}, "invalid argument for log_format, got: yaml", "log_format"),
        ({"log_colour": "red"}, "unknown log setting 'log_colour'", "log_colour"),
        ({"log_info": True, "log_warning": False}, "'log_info' on with 'log_warning' off", "log_info"),
        (
            {"log_verbose_level": 1, "log_error": False},
            "'log_verbose_level' on with 'log_error' off",
            "log_verbose_level",
        ),
    ],
)
def test_refused_updates_name_the_field_and_change_nothing(root, changes: dict, words: str, field: str) -> None:
    logger, _ = root
    control = LogControl(logger)
    before = control.settings()
    # A valid change beside the bad one is not applied either (Triton applies the fields before the bad one).
    with pytest.raises(LogSettingInvalid) as raised:
        control.update({"log_error": True, **changes} if "log_error" not in changes else changes)
    assert words in str(raised.value) and raised.value.setting == field
    assert control.settings() == before and logger.level == logging.INFO


def test_log_file_update_is_refused_with_tritons_words(root) -> None:
    logger, _ = root
    control = LogControl(logger)
    with pytest.raises(LogFileNotUpdatable, match="log file location can not be updated through network protocol"):
        control.update({"log_file": "/tmp/x.log", "log_info": False})
    assert control.settings().info


def test_log_file_is_answered_from_the_handlers_stream(root, tmp_path) -> None:
    logger, _ = root
    path = tmp_path / "server.log"
    with open(path, "a", encoding="utf-8") as stream:
        logger.handlers = [QuietStreamHandler(stream)]
        assert LogControl(logger).settings().file == str(path)
