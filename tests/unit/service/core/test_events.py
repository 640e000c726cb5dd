"""The event table, the JSON log format, the rejection log's rate limit, and request outcomes (service/core/events.py,
service/core/outcomes.py), without a server."""

from __future__ import annotations

import json
import logging

import pytest

from engine.interface import CancelToken
from service import status_codes
from service.core import errors, outcomes
from service.core.events import EVENTS, FIXED_KEYS, JsonFormatter, RejectionLog, log_event
from service.servicers.common import SHUTDOWN

SAMPLE_VALUES = {
    "seconds": 0.0451,
    "warmup_seconds": 0.25,
    "slots": 2,
    "backend": "onnxruntime",
    "models": ["h"],
    "count": 3,
    "idle_seconds": 30.0,
    "drain_seconds": 5.0,
    "grace_seconds": 30.0,
    "in_place": True,
    "reason": "max_resident_models",
    "for_model": "y",
    "memory_bytes": 1024,
    "calls": 1,
    "closed_models": 2,
    "metrics_address": "127.0.0.1:9100",
}


def sample_fields(event: str) -> dict:
    return {name: SAMPLE_VALUES.get(name, f"<{name}>") for name in EVENTS[event].fields}


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def logger():
    log = logging.getLogger("tests.unit.events")
    capture = Capture()
    log.addHandler(capture)
    log.setLevel(logging.INFO)
    log.propagate = False
    log.capture = capture
    yield log
    log.removeHandler(capture)


@pytest.mark.parametrize("event", sorted(EVENTS))
def test_every_event_renders_from_its_declared_fields_and_none_shadows_a_fixed_key(event, logger):
    assert not set(EVENTS[event].fields) & set(FIXED_KEYS)
    log_event(logger, event, "m", **sample_fields(event))
    (record,) = logger.capture.records
    line = json.loads(JsonFormatter().format(record))
    assert list(line)[: len(FIXED_KEYS)] == list(FIXED_KEYS)
    assert line["event"] == event and line["model"] == "m" and line["logger"] == "tests.unit.events"
    assert line["message"].startswith("model 'm': ")
    for name, value in sample_fields(event).items():
        assert line[name] == value


def test_text_lines_read_as_before(logger):
    log_event(logger, "loaded", "x", backend="onnxruntime", slots=2, seconds=0.045, memory_bytes=1)
    log_event(logger, "loaded", "w", backend="onnxruntime", slots=1, seconds=0.045, warmup_seconds=0.25)
    log_event(logger, "evicted", "simple", reason="max_resident_models", for_model="matmul_chain", seconds=0.001)
    log_event(logger, "shutdown_engines_left_open", models=["h"])
    assert [record.getMessage() for record in logger.capture.records] == [
        "model 'x': loaded 2 slot(s) on onnxruntime in 0.045 s",
        "model 'w': loaded 1 slot(s) on onnxruntime in 0.045 s, then warmed up in 0.250 s",
        "model 'simple': evicted to make room for model 'matmul_chain'",
        "shutdown: engines of h left open: still held by hung calls",
    ]


def test_a_line_that_is_not_an_event_has_null_event_and_model_and_its_traceback(logger):
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("plain %s", "line")
    line = json.loads(JsonFormatter().format(logger.capture.records[0]))
    assert line["event"] is None and line["model"] is None and line["message"] == "plain line"
    assert line["level"] == "ERROR" and line["time"].endswith("Z")
    assert "ValueError: boom" in line["exception"]


def test_rejections_are_logged_at_most_once_per_model_and_reason_per_interval(logger):
    now = [100.0]
    rejections = RejectionLog(logger, interval=10.0, clock=lambda: now[0])
    for moment in (100.0, 101.0, 102.0):
        now[0] = moment
        rejections.note("m", "server_busy", "busy")
    rejections.note("m", "invalid_request_error", "bad")  # another reason has its own window
    rejections.note("n", "server_busy", "busy")  # and another model
    now[0] = 110.5
    rejections.note("m", "server_busy", "busy")
    lines = [(r.model, r.event_fields["reason"], r.event_fields["count"]) for r in logger.capture.records]
    assert lines == [
        ("m", "server_busy", 1),
        ("m", "invalid_request_error", 1),
        ("n", "server_busy", 1),
        ("m", "server_busy", 3),
    ]  # the two not logged, plus this one
    assert (
        logger.capture.records[-1].getMessage()
        == "model 'm': rejected a request (server_busy): busy (2 more since the previous line)"
    )


def test_at_debug_every_rejection_is_logged(logger):
    logger.setLevel(logging.DEBUG)
    rejections = RejectionLog(logger, interval=10.0, clock=lambda: 5.0)
    for _ in range(3):
        rejections.note("m", "server_busy", "busy")
    assert [r.event_fields["count"] for r in logger.capture.records] == [1, 1, 1]


# ---- outcomes ------------------------------------------------------------------------------------------------


REASONED = sorted(status_codes.reasoned_classes().items(), key=lambda kv: kv[0].__name__)


@pytest.mark.parametrize(
    "cls, reason",
    REASONED,
    ids=lambda value: getattr(value, "__name__", value),
)
def test_every_error_reason_has_a_status_code_and_is_the_outcome_counted(cls, reason):
    assert reason in status_codes.TABLE, f"{cls.__name__}: reason {reason!r} has no status code"
    error = cls.__new__(cls)  # the class is what counts; constructors differ
    assert outcomes.outcome_of(error) == reason
    assert status_codes.describe(error)[::2] == (status_codes.TABLE[reason], reason)


def test_subclasses_without_a_reason_of_their_own_take_their_bases():
    assert outcomes.outcome_of(errors.AdmissionTimeout("x")) == "server_busy"
    assert outcomes.outcome_of(errors.UnsupportedSlotCount("x")) == "invalid_request_error"


def test_every_reason_of_the_table_is_some_class_s():
    assert set(status_codes.TABLE) == set(status_codes.reasoned_classes().values())


def test_internal_errors_and_closed_streams_have_their_own_outcomes():
    from engine.errors import ExecutionError

    assert outcomes.outcome_of(ExecutionError("x")) == "failed"
    assert outcomes.outcome_of(RuntimeError("x")) == "failed"
    assert outcomes.outcome_of(GeneratorExit()) == "cancelled"


def test_a_cancellation_by_the_shutdown_counts_as_shutting_down_as_the_client_sees_it():
    assert errors.SHUTDOWN_CANCEL_REASON == SHUTDOWN
    token = CancelToken()
    token.cancel(SHUTDOWN)
    assert outcomes.outcome_of(errors.RequestCancelled("x"), token) == "shutting_down"
    client = CancelToken()
    client.cancel()
    assert outcomes.outcome_of(errors.RequestCancelled("x"), client) == "cancelled"
