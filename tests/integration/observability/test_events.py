"""One structured log line per lifecycle event; `--log-format json` for machines; internal details stay in the log.

In process, the log records are captured (caplog) and rendered through the JSON formatter the CLI uses; in a
subprocess, `python -m service --log-format json` must write nothing but JSON objects, and its events must tell
the story of what the test did: registration, loads, an eviction, an unload, the shutdown's phases.
"""

from __future__ import annotations

import json
import logging
import signal
import time
import urllib.request

import numpy as np
import pytest

from engine.errors import ExecutionError
from engine.testing.fixture import Defect, FixtureBackend
from service.core.events import FIXED_KEYS, JsonFormatter
from service.testing import serve
from tests.shutdown.harness import ServerProcess
from tests.shutdown.harness import write_fixture_model as write_gated_fixture_model

from .._support import client_error, write_fixture_model

TENSOR = [("INPUT0", "FP32", [-1])]
OUT = [("OUTPUT0", "FP32", [-1])]
VALUES = {"INPUT0": np.arange(4, dtype=np.float32)}


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "repository"
    for name in "ab":
        write_fixture_model(root, name, inputs=TENSOR, outputs=OUT)
    return root


def json_events(records) -> list[dict]:
    """The event records as the JSON formatter writes them (parsed back)."""
    formatter = JsonFormatter()
    return [json.loads(formatter.format(record)) for record in records if getattr(record, "event", None)]


def test_load_eviction_reconfigure_rejection_and_unload_each_log_one_event(repository, controls, caplog):
    caplog.set_level(logging.INFO)
    with serve(
        repository,
        backends={"fixture": FixtureBackend(controls)},
        parallel_jobs=2,
        load_at_startup=False,
        max_resident_models=1,
        allow_management=True,
    ) as running:
        running.client.infer("a", VALUES)
        running.client.infer("b", VALUES)  # evicts a
        running.management.register("b", slots=3)  # same engine: resized in place
        client_error(running.client.infer, "b", VALUES, version="9")
        running.management.unload("b")
        lines = [line for line in json_events(caplog.records) if line["model"] is not None]
    assert [(line["event"], line["model"]) for line in lines] == [
        ("registered", "a"),
        ("registered", "b"),
        ("load_started", "a"),
        ("loaded", "a"),
        ("load_started", "b"),
        ("evicted", "a"),
        ("loaded", "b"),
        ("reconfigured", "b"),
        ("rejected", "b"),
        ("unloaded", "b"),
    ]
    by_event = {(line["event"], line["model"]): line for line in lines}
    for line in lines:
        assert list(line)[: len(FIXED_KEYS)] == list(FIXED_KEYS)
    assert by_event[("load_started", "a")]["cause"] == "first_request"
    loaded = by_event[("loaded", "a")]
    assert (loaded["backend"], loaded["slots"], loaded["level"]) == ("fixture", 2, "INFO")
    assert loaded["seconds"] >= 0 and loaded["message"].startswith("model 'a': loaded 2 slot(s) on fixture in ")
    evicted = by_event[("evicted", "a")]
    assert (evicted["reason"], evicted["for_model"]) == ("max_resident_models", "b")
    assert evicted["message"] == "model 'a': evicted to make room for model 'b'"
    reconfigured = by_event[("reconfigured", "b")]
    assert (reconfigured["slots"], reconfigured["in_place"]) == (3, True)
    rejected = by_event[("rejected", "b")]
    assert (rejected["reason"], rejected["count"]) == ("model_not_found", 1)
    assert by_event[("unloaded", "b")]["seconds"] >= 0


def test_a_failed_load_is_logged_with_its_reason(repository, controls, caplog):
    from engine.errors import ModelLoadError

    caplog.set_level(logging.INFO)
    with serve(repository, backends={"fixture": FixtureBackend(controls)}, load_at_startup=False) as running:
        controls.gate("a", "load").fail_next(ModelLoadError("fixture: the engine file is corrupt"))
        assert client_error(running.client.infer, "a", VALUES).reason == "load_failed"
    (failed,) = [line for line in json_events(caplog.records) if line["event"] == "load_failed"]
    assert (failed["model"], failed["reason"], failed["level"]) == ("a", "load_failed", "WARNING")
    assert "the engine file is corrupt" in failed["error"]


@pytest.mark.parametrize(
    "error, client_message",
    [
        (ExecutionError("secret-detail /srv/internal/path"), "the model failed to execute this request"),
        (Defect("secret-detail of a bug"), "internal error (reference "),
    ],
)
def test_internal_error_details_go_to_the_log_never_to_the_client(repository, controls, caplog, error, client_message):
    caplog.set_level(logging.INFO)
    with serve(repository, backends={"fixture": FixtureBackend(controls)}, metrics_port=0) as running:
        controls.gate("a", "execute").fail_next(error)
        failure = client_error(running.client.infer, "a", VALUES)
        text = running.server.metrics.render()
    assert failure.code == "INTERNAL" and failure.reason == "internal"
    assert client_message in failure.message and "secret-detail" not in failure.message
    assert 'slotserve_model_requests_total{model="a",outcome="failed"} 1.0' in text
    assert any("secret-detail" in (record.getMessage() + str(record.exc_info)) for record in caplog.records)
    if "reference" in client_message:  # the reference the client got leads to the log line
        reference = failure.message.split("reference ")[1].split(")")[0]
        assert any(reference in record.getMessage() for record in caplog.records)


def test_json_log_format_writes_only_json_lines_that_tell_the_lifecycle(tmp_path):
    for name in "ab":
        write_gated_fixture_model(tmp_path, name)
    flags = (
        "--log-format",
        "json",
        "--metrics-port",
        "0",
        "--max-resident-models",
        "1",
        "--no-load-at-startup",
        "--allow-management",
    )
    with ServerProcess(tmp_path, *flags) as server:
        server.client.infer("a", VALUES)
        server.client.infer("b", VALUES)  # evicts a
        server.management.unload("b")
        (serving,) = [json.loads(line) for line in server.log.splitlines() if '"serving"' in line]
        metrics = urllib.request.urlopen(f"http://{serving['metrics_address']}/metrics", timeout=10).read().decode()
        assert 'slotserve_model_evictions_total{model="a"} 1.0' in metrics
        server.signal(signal.SIGTERM)
        assert server.wait_exit() == 0
        lines = [json.loads(line) for line in server.log.splitlines()]  # every line is one JSON object
    for line in lines:
        assert list(line)[: len(FIXED_KEYS)] == list(FIXED_KEYS)
    events = [(line["event"], line["model"]) for line in lines if line["event"] is not None]
    assert events == [
        ("registered", "a"),
        ("registered", "b"),
        ("serving", None),
        ("load_started", "a"),
        ("loaded", "a"),
        ("load_started", "b"),
        ("evicted", "a"),
        ("loaded", "b"),
        ("unloaded", "b"),
        ("shutdown_signal", None),
        ("shutdown_draining", None),
        ("shutdown_closed_to_new_calls", None),
        ("shutdown_done", None),
    ]
    evicted = next(line for line in lines if line["event"] == "evicted")
    assert (evicted["reason"], evicted["for_model"], evicted["logger"]) == (
        "max_resident_models",
        "b",
        "service.core.lifecycle",
    )
    assert next(line for line in lines if line["event"] == "shutdown_signal")["signal"] == "SIGTERM"


def test_startup_failure_refused_reconfigure_and_shutdown_close_each_log_one_event(tmp_path, controls, caplog):
    caplog.set_level(logging.INFO)
    root = tmp_path / "repository"
    write_fixture_model(
        root, "a", inputs=TENSOR, outputs=OUT, extra='parameters { key: "capacity" value { string_value: "2" } }\n'
    )
    write_fixture_model(
        root,
        "broken",
        inputs=TENSOR,
        outputs=OUT,
        extra='parameters { key: "fail_load" value { string_value: "disk on fire" } }\n',
    )
    with serve(root, backends={"fixture": FixtureBackend(controls)}, parallel_jobs=2, allow_management=True) as running:
        client_error(running.management.register, "a", slots=3)  # above the capacity of 2
        running.client.infer("a", VALUES)  # the old pool still serves
    by_event: dict[str, list[dict]] = {}
    for line in json_events(caplog.records):
        by_event.setdefault(line["event"], []).append(line)
    (startup,) = by_event["not_loaded_at_startup"]
    assert startup["model"] == "broken" and startup["level"] == "ERROR" and "disk on fire" in startup["error"]
    (refused,) = by_event["reconfigure_refused"]
    assert refused["model"] == "a" and "at most 2" in refused["error"]
    assert [line["model"] for line in by_event["closed_at_shutdown"]] == ["a"]  # the one loaded model


def test_idle_retirement_logs_one_event(tmp_path, controls, caplog):
    caplog.set_level(logging.INFO)
    root = tmp_path / "repository"
    write_fixture_model(root, "idle", inputs=TENSOR, outputs=OUT)
    with serve(root, backends={"fixture": FixtureBackend(controls)}, idle_unload=0.2) as running:
        running.client.infer("idle", VALUES)
        deadline = time.monotonic() + 10
        while running.management.get("idle").loaded:
            assert time.monotonic() < deadline, "the idle model was never retired"
            time.sleep(0.01)  # ordering-free: re-checks a state predicate
    (retired,) = [line for line in json_events(caplog.records) if line["event"] == "idle_retired"]
    assert retired["model"] == "idle" and retired["idle_seconds"] == pytest.approx(0.2)
    assert not [line for line in json_events(caplog.records) if line["event"] == "closed_at_shutdown"]
