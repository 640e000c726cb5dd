"""Triton's metric names at the metrics endpoint: typed and labelled as Triton 2.51 serves them, and equal to what
ModelStatistics reports for the same model after known traffic (successes, cache hits, a failure)."""

from __future__ import annotations

import re
import urllib.request

import numpy as np
import pytest

from engine.testing.fixture import FixtureBackend
from service.metrics import TRITON_CACHE_COUNTERS, TRITON_COUNTERS
from service.testing import serve

from .._support import client_error, write_fixture_model

TENSOR = [("INPUT0", "FP32", [-1])]
OUT = [("OUTPUT0", "FP32", [-1])]
WAIT = 10.0


@pytest.fixture
def running(tmp_path, controls):
    root = tmp_path / "repository"
    write_fixture_model(root, "cached", inputs=TENSOR, outputs=OUT, extra="response_cache { enable: true }\n")
    write_fixture_model(root, "plain", inputs=TENSOR, outputs=OUT)
    with serve(
        root, backends={"fixture": FixtureBackend(controls)}, metrics_port=0, response_cache_bytes=1 << 20
    ) as server:
        yield server


def exposition(running) -> str:
    url = f"http://127.0.0.1:{running.server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=WAIT) as response:
        return response.read().decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """name{labels} value lines of the text format, parsed here by a regular expression of our own (not by the
    prometheus_client parser, which would rename counters to *_total)."""
    found = {}
    for name, labels, value in re.findall(r"^(nv_\w+)(?:\{([^}]*)\})? (\S+)$", text, flags=re.M):
        pairs = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', labels)))
        found[(name, pairs)] = float(value)
    return found


def types(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (nv_\w+) (\w+)$", text, flags=re.M))


def labels(model: str, **more: str) -> tuple:
    return tuple(sorted({"model": model, "version": "1", **more}.items()))


def test_triton_counters_equal_model_statistics_after_known_traffic(running, controls):
    for value in (1, 2, 1, 1):  # two distinct requests, two repeats: 2 misses, 2 hits
        running.client.infer("cached", {"INPUT0": np.asarray([value], np.float32)})
    for _ in range(3):
        running.client.infer("plain", {"INPUT0": np.asarray([1, 2], np.float32)})
    controls.gate("plain", "execute").fail_next(RuntimeError("broken"))
    assert client_error(running.client.infer, "plain", {"INPUT0": np.asarray([1], np.float32)}).code == "INTERNAL"
    client_error(running.client.infer, "plain", {"WRONG": np.asarray([1], np.float32)})  # invalid: OTHER

    text = exposition(running)
    found = samples(text)
    for model in ("cached", "plain"):
        (stats,) = running.client.statistics(model)
        inference = stats.inference_stats
        expected = {
            "nv_inference_request_success": inference.success.count,
            "nv_inference_count": stats.inference_count,
            "nv_inference_exec_count": stats.execution_count,
            "nv_inference_request_duration_us": inference.success.ns // 1000,
            "nv_inference_queue_duration_us": inference.queue.ns // 1000,
            "nv_inference_compute_input_duration_us": inference.compute_input.ns // 1000,
            "nv_inference_compute_infer_duration_us": inference.compute_infer.ns // 1000,
            "nv_inference_compute_output_duration_us": inference.compute_output.ns // 1000,
        }
        for name, value in expected.items():
            assert found[(name, labels(model))] == value, (model, name)
        failures = sum(found[("nv_inference_request_failure", labels(model, reason=r))] for r in TRITON_REASONS)
        assert failures == inference.fail.count
    assert found[("nv_inference_request_success", labels("cached"))] == 4
    assert found[("nv_inference_count", labels("cached"))] == 2  # hits are not inferences
    assert found[("nv_inference_request_failure", labels("plain", reason="BACKEND"))] == 1
    assert found[("nv_inference_request_failure", labels("plain", reason="OTHER"))] == 1

    (cached,) = running.client.statistics("cached")
    assert found[("nv_cache_num_hits_per_model", labels("cached"))] == cached.inference_stats.cache_hit.count == 2
    assert found[("nv_cache_num_misses_per_model", labels("cached"))] == cached.inference_stats.cache_miss.count == 2
    assert found[("nv_cache_hit_duration_per_model", labels("cached"))] == cached.inference_stats.cache_hit.ns // 1000
    assert found[("nv_cache_miss_duration_per_model", labels("cached"))] == cached.inference_stats.cache_miss.ns // 1000
    assert ("nv_cache_num_hits_per_model", labels("plain")) not in found  # only models using the cache
    assert found[("nv_cache_num_entries", ())] == 2


TRITON_REASONS = ("BACKEND", "OTHER", "CANCELED", "REJECTED")


def test_every_triton_family_is_typed_as_triton_types_it(running):
    running.client.infer("cached", {"INPUT0": np.asarray([1], np.float32)})
    text = exposition(running)
    typed = types(text)
    counters = [name for name, _, _ in TRITON_COUNTERS + TRITON_CACHE_COUNTERS] + ["nv_inference_request_failure"]
    assert {name: typed.get(name) for name in counters} == dict.fromkeys(counters, "counter")
    for gauge in ("nv_inference_pending_request_count", "nv_cache_num_entries", "nv_cache_util"):
        assert typed[gauge] == "gauge"
    assert "nv_inference_request_success_total" not in text  # Triton's names, without prometheus_client's suffix
    assert "slotserve_model_requests_total" in text  # ours are still there
