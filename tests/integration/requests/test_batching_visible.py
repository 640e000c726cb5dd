"""What a batching model shows through a real server (issue 13, item 6): GetModel/ListModels and the client's
status block name its settings, ModelConfig carries the dynamic_batching block, /metrics counts executions and
batch sizes, and the `loaded` event names the settings."""

from __future__ import annotations

import logging
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from client import _render as render
from engine.testing.fixture import FixtureBackend, FixtureControls
from service.testing import serve
from tests.contract.test_batching import write_batching_model


@pytest.fixture
def running(tmp_path, caplog):
    write_batching_model(
        tmp_path, "m", 4, delay_us=250, preferred=(2, 4), extra="default_queue_policy { max_queue_size: 7 }"
    )
    with caplog.at_level(logging.INFO, logger="service.core.lifecycle"):
        with serve(tmp_path, backends={"fixture": FixtureBackend(FixtureControls())}, metrics_port=0) as running:
            yield running


def test_status_and_the_client_show_the_batching_settings(running):
    status = running.management.get("m")
    batching = status.batching
    assert (
        batching.max_batch_size,
        batching.max_queue_delay_microseconds,
        batching.preferred_batch_sizes,
        batching.max_queue_size,
        batching.allow_timeout_override,
    ) == (4, 250, (2, 4), 7, False)
    assert [s.batching for s in running.management.list()] == [batching]
    assert "dynamic batching up to 4 rows, delay 250 us, preferred 2/4, queue 7" in " ".join(
        render.status_block(status).split()
    )


def test_model_config_carries_the_dynamic_batching_block(running):
    config = running.client.model_config("m")
    assert config.max_batch_size == 4
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 4]
    assert config.dynamic_batching.max_queue_delay_microseconds == 250
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 7


def test_metrics_count_executions_and_batch_sizes(running):
    for rows in (1, 3):
        running.client.infer("m", {"INPUT0": np.ones((rows, 2), np.float32)})
    text = urllib.request.urlopen(f"http://127.0.0.1:{running.server.metrics_port}/metrics", timeout=10).read()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }
    model = (("model", "m"),)
    assert samples[("slotserve_model_executions_total", model)] == 2
    assert samples[("slotserve_model_batch_size_count", model)] == 2
    assert samples[("slotserve_model_batch_size_sum", model)] == 4
    assert samples[("slotserve_model_batch_size_bucket", (("le", "2"), ("model", "m")))] == 1
    assert samples[("slotserve_model_batch_size_bucket", (("le", "4"), ("model", "m")))] == 2


def test_the_loaded_event_names_the_settings(running, caplog):
    loaded = [r for r in caplog.get_records("setup") if getattr(r, "event", None) == "loaded"]
    assert len(loaded) == 1
    assert loaded[0].getMessage().endswith("; dynamic batching: up to 4 rows, delay 250 us, preferred 2/4")
    assert loaded[0].event_fields["batching"] == "up to 4 rows, delay 250 us, preferred 2/4"
