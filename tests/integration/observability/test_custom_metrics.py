"""Custom metrics from python models on a real server: a model (tests/python_models/custom_metrics/metrics_ops)
makes families and metrics with pb_utils, each test scrapes the metrics port over HTTP and reads the values back
(parsed by prometheus_client, so the exposition stays valid), and the registry's rules hold end to end: values
shared by the model's workers and kept across a worker's death, gone with an unload and fresh after the reload,
bad names and too many metrics refused in the model's execute in Triton's words, the server serving on."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import signal
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from client import ClientError
from service.process.custom_metrics import MetricBounds
from tests.integration.python_models.test_python_models import wait_until_dead
from tests.python_models import REPOSITORY

MODEL = "metrics_ops"
SOURCE = REPOSITORY.parent / "custom_metrics" / MODEL
WAIT = 60.0  # seconds: a loaded machine; a request answers in well under one otherwise


@pytest.fixture
def repository(tmp_path) -> Path:
    root = tmp_path / "repository"
    shutil.copytree(SOURCE, root / MODEL)
    return root


def with_instances(repository: Path, count: int) -> Path:
    config = repository / MODEL / "config.pbtxt"
    config.write_text(config.read_text().replace("count: 1", f"count: {count}"))
    return repository


def run(running, *ops: dict) -> tuple[list, int]:
    """The model's outcome of each op, and the pid of the worker that ran them."""
    answer = running.client.infer(MODEL, {"OPS": np.array([json.dumps(ops)], dtype=np.object_)}, timeout=WAIT)
    return json.loads(answer["RESULTS"][0]), int(answer["PID"][0])


def metrics_text(running) -> str:
    url = f"http://127.0.0.1:{running.server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=WAIT) as reply:
        assert reply.status == 200
        return reply.read().decode()


def samples(running) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics keyed by (name, sorted labels): parsing it proves the exposition valid. The parser
    names a counter's samples `<name>_total`; the text itself has the bare name, as Triton's (asserted apart)."""
    found = {}
    for family in text_string_to_metric_families(metrics_text(running)):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_a_counter_a_gauge_and_a_histogram_are_served_beside_the_servers_own(slotserve, repository):
    running = slotserve(repository, metrics_port=0)
    outcomes, _ = run(
        running,
        {"family": "app_requests", "description": "Requests by route", "kind": "COUNTER"},
        {"family": "app_queue_depth", "kind": "GAUGE"},
        {"family": "app_latency_seconds", "kind": "HISTOGRAM"},
        {"metric": "c", "family": "app_requests", "labels": {"route": "/a", "code": "200"}},
        {"metric": "g", "family": "app_queue_depth"},
        {"metric": "h", "family": "app_latency_seconds", "labels": {"route": "/a"}, "buckets": [0.1, 1.0, 2.5]},
        {"do": "increment", "metric": "c", "value": 3},
        {"do": "increment", "metric": "c", "value": 0.5},
        {"do": "set", "metric": "g", "value": 7},
        {"do": "increment", "metric": "g", "value": -2.5},
        *({"do": "observe", "metric": "h", "value": value} for value in (0.05, 1.5, 6.0)),
        {"do": "value", "metric": "c"},
        {"do": "value", "metric": "g"},
    )
    assert outcomes == ["ok"] * 13 + [3.5, 4.5]
    found = samples(running)
    assert found[("app_requests_total", (("code", "200"), ("route", "/a")))] == 3.5  # no _total: Triton's name
    assert found[("app_queue_depth", ())] == 4.5
    histogram = {key: value for key, value in found.items() if key[0].startswith("app_latency_seconds")}
    assert histogram == {
        ("app_latency_seconds_count", (("route", "/a"),)): 3,
        ("app_latency_seconds_sum", (("route", "/a"),)): 7.55,
        ("app_latency_seconds_bucket", (("le", "0.1"), ("route", "/a"))): 1,
        ("app_latency_seconds_bucket", (("le", "1"), ("route", "/a"))): 1,
        ("app_latency_seconds_bucket", (("le", "2.5"), ("route", "/a"))): 2,
        ("app_latency_seconds_bucket", (("le", "+Inf"), ("route", "/a"))): 3,
    }
    assert found[("metrics_ops_workers_total", ())] == 1  # initialize's
    assert (
        found[("nv_inference_request_success_total", (("model", MODEL), ("version", "1")))] == 1
    )  # ours are still there
    text = metrics_text(running)
    assert "# HELP app_requests Requests by route\n# TYPE app_requests counter\n" in text
    assert 'app_requests{code="200",route="/a"} 3.5\n' in text  # the counter under its own name, no _total
    assert 'app_latency_seconds_bucket{route="/a",le="0.1"} 1\n' in text  # Triton's spelling of a bound


def test_the_workers_of_a_model_share_one_value(slotserve, repository, tmp_path):
    running = slotserve(with_instances(repository, 3), metrics_port=0, parallel_jobs=3)
    folder = tmp_path / "arrived"
    folder.mkdir()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:  # three requests at once: the three slots' workers
        together = list(pool.map(lambda _: run(running, {"arrive": str(folder), "together": 3}), range(3)))
    assert [outcomes for outcomes, _ in together] == [["ok"]] * 3
    assert len({pid for _, pid in together}) == 3
    outcomes, _ = run(
        running,
        {"family": "metrics_ops_workers", "kind": "COUNTER"},
        {"metric": "w", "family": "metrics_ops_workers"},
        {"do": "value", "metric": "w"},
    )
    assert outcomes == ["ok", "ok", 3.0]  # each worker's initialize added one to the same metric
    assert samples(running)[("metrics_ops_workers_total", ())] == 3


def test_a_killed_workers_replacement_sees_the_same_values(slotserve, repository):
    running = slotserve(repository, metrics_port=0)
    made = (
        {"family": "app_kept", "kind": "COUNTER"},
        {"metric": "k", "family": "app_kept", "labels": {"a": "1"}},
    )
    outcomes, first = run(running, *made, {"do": "increment", "metric": "k", "value": 5})
    assert outcomes == ["ok", "ok", "ok"]
    os.kill(first, signal.SIGKILL)  # idle: no request fails; the slot starts a new worker for the next one
    wait_until_dead(first)  # dead before the next request arrives: it was idle when it died
    outcomes, second = run(
        running, *made, {"do": "increment", "metric": "k", "value": 1}, {"do": "value", "metric": "k"}
    )
    assert second != first
    assert outcomes == ["ok", "ok", "ok", 6.0]
    found = samples(running)
    assert found[("app_kept_total", (("a", "1"),))] == 6
    assert found[("metrics_ops_workers_total", ())] == 2  # both workers' initialize


def test_an_unload_takes_the_models_families_and_the_reload_starts_them_afresh(slotserve, repository):
    running = slotserve(repository, metrics_port=0, allow_management=True)
    run(
        running,
        {"family": "app_gone", "kind": "GAUGE"},
        {"metric": "g", "family": "app_gone"},
        {"do": "set", "metric": "g", "value": 42},
    )
    assert samples(running)[("app_gone", ())] == 42
    running.management.unload(MODEL)
    found = samples(running)
    assert not [key for key in found if key[0] in ("app_gone", "metrics_ops_workers_total")]
    assert "app_gone" not in metrics_text(running)
    outcomes, _ = run(
        running,
        {"family": "app_gone", "kind": "GAUGE"},
        {"metric": "g", "family": "app_gone"},
        {"do": "value", "metric": "g"},
    )
    assert outcomes == ["ok", "ok", 0.0]  # the reload's: fresh
    assert samples(running)[("metrics_ops_workers_total", ())] == 1


def test_finalize_updates_a_metric_and_ends_without_waiting_to_be_killed(slotserve, repository, tmp_path):
    running = slotserve(repository, metrics_port=0, allow_management=True)
    marker = tmp_path / "finalized"
    assert run(running, {"finalize_marker": str(marker)})[0] == ["ok"]
    running.management.unload(MODEL)
    deadline = time.monotonic() + WAIT
    while not marker.exists():  # finalize runs after the unload returned (its worker ends on a thread of its own)
        assert time.monotonic() < deadline, "finalize never wrote its marker"
        time.sleep(0.01)  # ordering-free: polls for the model's file until a deadline
    assert marker.read_text() == "ok"  # the increment was answered (unanswered, finalize would hang until killed)
    assert "metrics_ops_workers" not in metrics_text(running)  # recorded nowhere: the model's unload began


def test_bad_names_and_kinds_are_refused_in_execute_in_tritons_words_and_nothing_breaks(slotserve, repository):
    running = slotserve(repository, metrics_port=0)
    before = metrics_text(running)
    outcomes, _ = run(
        running,
        {"family": "bad-name", "kind": "COUNTER"},
        {"family": "nv_inference_count", "kind": "COUNTER"},
        {"family": "slotserve_mine", "kind": "GAUGE"},
        {"family": "app_c", "kind": "COUNTER"},
        {"family": "app_c", "kind": "GAUGE"},
        {"family": "app_h", "kind": "HISTOGRAM"},
        {"family": "app_h_count", "kind": "GAUGE"},
        {"metric": "c", "family": "app_c", "labels": {"__x": "1"}},
        {"metric": "c", "family": "app_c", "buckets": [1.0]},
        {"metric": "h", "family": "app_h", "buckets": [2.0, 1.0]},
        {"metric": "h", "family": "app_h", "labels": {"le": "1"}, "buckets": [1.0]},
        {"metric": "c", "family": "app_c"},
        {"do": "set", "metric": "c", "value": 1},
        {"do": "increment", "metric": "c", "value": -1},
        {"do": "observe", "metric": "c", "value": 1},
    )
    prefix = (
        "TritonModelException: Error when creating MetricFamily: Failed to process the request for model "
        f"'{MODEL}_0_0', message: "
    )
    assert outcomes[0].startswith(prefix + "Invalid metric name 'bad-name'")
    assert outcomes[1].startswith(prefix + "Invalid metric name 'nv_inference_count': names starting with nv_")
    assert outcomes[2].startswith(prefix + "Invalid metric name 'slotserve_mine'")
    assert outcomes[3] == "ok"
    assert outcomes[4].startswith(prefix + "Family name already exists with different type")
    assert outcomes[5] == "ok"
    assert outcomes[6].startswith(prefix + "Invalid metric name 'app_h_count': its series (app_h_count) would collide")
    assert (
        "Error when creating Metric: Failed to process the request" in outcomes[7]
        and "Invalid label name '__x'" in outcomes[7]
    )
    assert outcomes[8] == "TritonModelException: Failed to create metric. Unexpected buckets found."
    assert "Bucket Boundaries must be strictly sorted" in outcomes[9]
    assert "Invalid label name 'le'" in outcomes[10]
    assert outcomes[11] == "ok"
    assert outcomes[12].endswith("message: TRITONSERVER_METRIC_KIND_COUNTER does not support Set")
    assert outcomes[12].startswith("TritonModelException: Failed to set metric value: ")
    assert outcomes[13].endswith("can only be incremented monotonically by non-negative values.")
    assert outcomes[14].endswith("TRITONSERVER_METRIC_KIND_COUNTER does not support Observe")
    found = samples(running)  # still valid, our own families intact, the refused ones absent
    assert found[("app_c_total", ())] == 0
    assert not [key for key in found if key[0].startswith(("bad", "app_h"))]
    triton_family = "# TYPE nv_inference_count counter"
    assert before.count(triton_family) == metrics_text(running).count(triton_family) == 1


def test_a_refusal_the_model_does_not_catch_fails_only_its_request(slotserve, repository):
    running = slotserve(repository, metrics_port=0)
    with pytest.raises(ClientError) as refused:
        run(running, {"raise": "nv_inference_count"})
    assert refused.value.code == "INTERNAL"
    assert "Error when creating MetricFamily" in refused.value.message
    assert "names starting with nv_ (Triton's) or slotserve_" in refused.value.message
    assert run(running, {"family": "app_after", "kind": "COUNTER"})[0] == ["ok"]  # the worker serves on


def test_too_many_metrics_in_a_family_are_refused_and_the_first_ones_kept(slotserve, repository):
    bound = MetricBounds().metrics_per_family
    running = slotserve(repository, metrics_port=0)
    outcomes, _ = run(running, {"family": "app_wide", "kind": "GAUGE"}, {"many": "app_wide", "count": bound + 1})
    assert outcomes[0] == "ok"
    assert f"too many metrics in family 'app_wide': model '{MODEL}' made {bound}" in outcomes[1]
    found = samples(running)
    assert len([key for key in found if key[0] == "app_wide"]) == bound
    outcomes, _ = run(running, {"many": "app_wide", "count": bound})  # the same labels again: the same metrics
    assert outcomes == [f"ok {bound}"]


def test_too_many_families_are_refused(slotserve, repository):
    bound = MetricBounds().families_per_model
    running = slotserve(repository, metrics_port=0)
    # initialize made one (metrics_ops_workers)
    outcomes, _ = run(running, *({"family": f"app_f{index}", "kind": "COUNTER"} for index in range(bound)))
    assert outcomes[:-1] == ["ok"] * (bound - 1)
    assert f"too many metric families: model '{MODEL}' has {bound}" in outcomes[-1]
