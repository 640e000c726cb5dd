"""`--metrics-port` serves Prometheus text over HTTP, and its counters move by exactly what the server did.

Each test starts a real server (fixture-backend models driven by the test's own gates) with metrics on port 0,
scrapes it with urllib, acts, scrapes again and compares: every counter (`*_total` and histogram `_count`) that
moved must be one the test expected to move, by exactly the expected amount, and no other may move. Gauges are
checked where the test holds the model in a known state (a slot held at a gate, a request queued behind it).
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.errors import ModelLoadError
from engine.testing.fixture import FixtureBackend
from service.process.options import ServerOptions
from service.testing import serve

from .._support import client_error, write_fixture_model

TENSOR = [("INPUT0", "FP32", [-1])]
OUT = [("OUTPUT0", "FP32", [-1])]
VALUES = {"INPUT0": np.arange(4, dtype=np.float32)}
WAIT = 10.0  # seconds: bounds every poll, so a broken server fails the test instead of hanging it

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def memory_parameter(size: int) -> str:
    return f'parameters {{ key: "memory_bytes" value {{ string_value: "{size}" }} }}\n'


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "repository"
    write_fixture_model(root, "a", inputs=TENSOR, outputs=OUT, extra=memory_parameter(1000))
    write_fixture_model(root, "b", inputs=TENSOR, outputs=OUT, extra=memory_parameter(500))
    write_fixture_model(root, "c", inputs=TENSOR, outputs=OUT)
    return root


def scrape(running) -> Samples:
    """Every sample of the running server's /metrics, fetched over HTTP, keyed by (name, sorted labels)."""
    url = f"http://127.0.0.1:{running.server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=WAIT) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def key(name: str, **labels: str):
    return name, tuple(sorted(labels.items()))


def counter_moves(before: Samples, after: Samples) -> dict:
    """slotserve's counters (and histogram counts) whose value changed, with by how much. Triton's `nv_*` names,
    read from the same statistics, are checked by tests/integration/observability/test_triton_metrics.py."""
    moved = {}
    for sample_key, now in after.items():
        name = sample_key[0]
        if name.startswith("slotserve_") and (name.endswith("_total") or name.endswith("_count")):
            delta = now - before.get(sample_key, 0.0)
            if delta:
                moved[sample_key] = delta
    return moved


def successes(model: str, count: int) -> dict:
    """A model's counters after `count` successful requests (each run alone, as on a model without dynamic
    batching): outcome, both time histograms, executions and the batch-size histogram."""
    return {
        key("slotserve_model_requests_total", model=model, outcome="success"): count,
        key("slotserve_model_admission_wait_seconds_count", model=model): count,
        key("slotserve_model_compute_seconds_count", model=model): count,
        key("slotserve_model_executions_total", model=model): count,
        key("slotserve_model_batch_size_count", model=model): count,
    }


def poll(running, predicate, what: str) -> Samples:
    """Scrape until `predicate(samples)` holds (waiting on the server's own figures, not on time)."""
    deadline = threading.Event()
    timer = threading.Timer(WAIT, deadline.set)
    timer.start()
    try:
        while not deadline.is_set():
            samples = scrape(running)
            if predicate(samples):
                return samples
            deadline.wait(0.01)
    finally:
        timer.cancel()
    raise AssertionError(f"metrics never showed {what} within {WAIT} s")


def test_counters_move_by_exactly_what_the_server_did(repository, controls):
    with serve(
        repository,
        backends={"fixture": FixtureBackend(controls)},
        metrics_port=0,
        load_at_startup=False,
        max_resident_models=1,
        allow_management=True,
    ) as running:
        assert running.server.metrics_port > 0
        start = scrape(running)
        for model in "abc":
            assert value(start, "slotserve_model_loaded", model=model) == 0
            assert value(start, "slotserve_model_slots", model=model) == 1
            assert value(start, "slotserve_model_requests_total", model=model, outcome="success") == 0
            assert value(start, "slotserve_model_requests_total", model=model, outcome="server_busy") == 0
            assert value(start, "slotserve_model_loads_total", model=model) == 0
        assert value(start, "slotserve_resident_models") == 0
        assert value(start, "slotserve_max_resident_models") == 1

        # Three successes on a: its first request loads it.
        for _ in range(3):
            running.client.infer("a", VALUES)
        after_a = scrape(running)
        assert counter_moves(start, after_a) == {**successes("a", 3), key("slotserve_model_loads_total", model="a"): 1}
        assert value(after_a, "slotserve_model_loaded", model="a") == 1
        assert value(after_a, "slotserve_resident_models") == 1
        assert value(after_a, "slotserve_memory_bytes") == 1000
        assert value(after_a, "slotserve_model_memory_bytes", model="a") == 1000

        # b's first request needs a's place: a is evicted.
        running.client.infer("b", VALUES)
        after_b = scrape(running)
        assert counter_moves(after_a, after_b) == {
            **successes("b", 1),
            key("slotserve_model_loads_total", model="b"): 1,
            key("slotserve_model_evictions_total", model="a"): 1,
        }
        assert value(after_b, "slotserve_model_loaded", model="a") == 0
        assert value(after_b, "slotserve_model_loaded", model="b") == 1
        assert value(after_b, "slotserve_resident_models") == 1
        assert value(after_b, "slotserve_memory_bytes") == 500

        # Refusals, each under its reason; an unknown model name is counted server-wide only.
        assert client_error(running.client.infer, "b", {"WRONG": VALUES["INPUT0"]}).reason == "invalid_request_error"
        assert client_error(running.client.infer, "b", VALUES, version="9").reason == "model_not_found"
        assert client_error(running.client.infer, "zz", VALUES).reason == "model_not_found"
        refused = scrape(running)
        assert counter_moves(after_b, refused) == {
            key("slotserve_model_requests_total", model="b", outcome="invalid_request_error"): 1,
            key("slotserve_model_requests_total", model="b", outcome="model_not_found"): 1,
            key("slotserve_unknown_model_requests_total"): 1,
        }

        # A slot held at the execute gate, one request queued behind it, one refused at its own deadline.
        gate = controls.gate("b", "execute").hold()
        results: list = []
        workers = [threading.Thread(target=lambda: results.append(running.client.infer("b", VALUES))) for _ in range(2)]
        workers[0].start()
        gate.wait_blocked(1)
        workers[1].start()
        busy = poll(
            running, lambda s: value(s, "slotserve_model_queued_requests", model="b") == 1, "one request queued on b"
        )
        assert value(busy, "slotserve_model_active_slots", model="b") == 1
        error = client_error(running.client.infer, "b", VALUES, parameters={"timeout": 1000})
        assert error.reason == "server_busy"
        gate.release()
        for worker in workers:
            worker.join(WAIT)
        assert len(results) == 2
        drained = scrape(running)
        assert value(drained, "slotserve_model_queued_requests", model="b") == 0
        assert value(drained, "slotserve_model_active_slots", model="b") == 0
        assert counter_moves(refused, drained) == {
            **successes("b", 2),
            key("slotserve_model_requests_total", model="b", outcome="server_busy"): 1,
            key("slotserve_model_refusals_total", model="b", reason="server_busy"): 1,
        }

        # An operator's unload.
        running.management.unload("b")
        unloaded = scrape(running)
        assert counter_moves(drained, unloaded) == {key("slotserve_model_unloads_total", model="b"): 1}
        assert value(unloaded, "slotserve_resident_models") == 0
        assert value(unloaded, "slotserve_memory_bytes") == 0

        # A load that fails: its request gets load_failed, the model a load failure.
        controls.gate("c", "load").fail_next(ModelLoadError("fixture: no engine today"))
        assert client_error(running.client.infer, "c", VALUES).reason == "load_failed"
        failed = scrape(running)
        assert counter_moves(unloaded, failed) == {
            key("slotserve_model_load_failures_total", model="c"): 1,
            key("slotserve_model_requests_total", model="c", outcome="load_failed"): 1,
        }


def test_histograms_are_cumulative_and_agree_with_model_statistics(repository, controls):
    with serve(repository, backends={"fixture": FixtureBackend(controls)}, metrics_port=0) as running:
        for _ in range(5):
            running.client.infer("a", VALUES)
        samples = scrape(running)
        statistics = running.client.statistics("a")[0]
        buckets = sorted(
            (
                (float(dict(labels)["le"]), count)
                for (name, labels), count in samples.items()
                if name == "slotserve_model_compute_seconds_bucket" and dict(labels)["model"] == "a"
            )
        )
        counts = [count for _, count in buckets]
        assert counts == sorted(counts) and buckets[-1] == (float("inf"), 5)
        assert value(samples, "slotserve_model_compute_seconds_count", model="a") == 5
        # /metrics and ModelStatistics read the same counters.
        assert (
            value(samples, "slotserve_model_requests_total", model="a", outcome="success")
            == statistics.inference_stats.success.count
        )
        assert value(samples, "slotserve_model_compute_seconds_sum", model="a") == pytest.approx(
            statistics.inference_stats.compute_infer.ns / 1e9
        )
        assert value(samples, "slotserve_model_admission_wait_seconds_sum", model="a") == pytest.approx(
            statistics.inference_stats.queue.ns / 1e9
        )


def test_idle_retirement_is_counted_apart_from_unloads(repository, controls):
    with serve(
        repository,
        backends={"fixture": FixtureBackend(controls)},
        metrics_port=0,
        load_at_startup=False,
        idle_unload=0.2,
    ) as running:
        running.client.infer("a", VALUES)
        # A scrape reads each family in turn, not one snapshot: the gauge read before the retirement and the
        # counter read after it can meet in one scrape (seen under make stress), so both are waited for.
        retired = poll(
            running,
            lambda s: (
                value(s, "slotserve_model_idle_retirements_total", model="a") == 1
                and value(s, "slotserve_model_loaded", model="a") == 0
            ),
            "a retired after 0.2 s idle",
        )
        assert value(retired, "slotserve_model_unloads_total", model="a") == 0
        assert value(retired, "slotserve_model_evictions_total", model="a") == 0


def test_each_server_has_its_own_registry_and_stopping_frees_the_port_and_thread(repository, tmp_path):
    other = tmp_path / "other"
    write_fixture_model(other, "x", inputs=TENSOR, outputs=OUT)
    with serve(repository, metrics_port=0) as first, serve(other, metrics_port=0) as second:
        assert first.server.metrics_port != second.server.metrics_port
        first_models = {dict(labels)["model"] for (name, labels) in scrape(first) if name == "slotserve_model_slots"}
        second_models = {dict(labels)["model"] for (name, labels) in scrape(second) if name == "slotserve_model_slots"}
        assert first_models == {"a", "b", "c"} and second_models == {"x"}
        port = first.server.metrics_port
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT)
    assert not [thread for thread in threading.enumerate() if thread.name == "metrics-http"]


def test_without_metrics_port_nothing_is_served_but_the_text_is_still_there(repository):
    with serve(repository) as running:
        assert running.server.metrics_port is None
        assert "slotserve_model_requests_total" in running.server.metrics.render()


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"metrics_port": 70000}, "--metrics-port must be 0..65535"),
        ({"metrics_port": -1}, "--metrics-port must be 0..65535"),
        ({"metrics_port": 9100, "port": 9100}, "--metrics-port must differ from --port"),
    ],
)
def test_metrics_port_is_validated(fields, problem):
    with pytest.raises(ValueError, match=problem):
        ServerOptions(**fields)


def test_a_metrics_port_in_use_fails_startup_and_leaves_nothing_running(repository, controls):
    with serve(repository, backends={"fixture": FixtureBackend(controls)}, metrics_port=0) as running:
        taken = running.server.metrics_port
        with pytest.raises(RuntimeError, match="cannot serve metrics"):
            with serve(repository, backends={"fixture": FixtureBackend(controls)}, metrics_port=taken):
                pass
        assert controls.live_engines("a") == 1  # the failed server loaded nothing


def test_a_model_serving_two_versions_has_one_series_per_family_summed_over_them(tmp_path):
    """Each served version is its own entry: slotserve_model_* must not repeat a series (Prometheus refuses a
    scrape with duplicate samples); the figures are the versions' sum (Triton's nv_* names keep `version`)."""
    root = tmp_path / "repository"
    directory = write_fixture_model(root, "m", inputs=TENSOR, outputs=OUT, extra="version_policy { all { } }\n")
    for version in ("1", "2"):
        (directory / version).mkdir(exist_ok=True)
    with serve(root, metrics_port=0) as running:
        x = np.ones(4, np.float32)
        running.client.infer("m", {"INPUT0": x}, version="1")
        running.client.infer("m", {"INPUT0": x}, version="2")
        running.client.infer("m", {"INPUT0": x}, version="2")
        url = f"http://127.0.0.1:{running.server.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=WAIT) as response:
            text = response.read().decode()
    series = [line.split(" ")[0] for line in text.splitlines() if line.startswith("slotserve_model_")]
    assert len(series) == len(set(series)), sorted(s for s in series if series.count(s) > 1)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert value(samples, "slotserve_model_slots", model="m") == 2  # one slot per version
    assert value(samples, "slotserve_model_loaded", model="m") == 1
    assert value(samples, "slotserve_model_requests_total", model="m", outcome="success") == 3
    assert value(samples, "slotserve_model_executions_total", model="m") == 3
    versions = {dict(labels).get("version") for (name, labels) in samples if name.startswith("nv_inference_count")}
    assert versions == {"1", "2"}
