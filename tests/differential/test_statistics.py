"""ModelStatistics asked of both servers after the same requests (each test starts its own pair, so the counts
start at zero): which counts and durations are filled, and with what."""

from __future__ import annotations

import re
import urllib.request

import pytest

from generated import grpc_service_pb2 as pb

from .calls import add_sub_request, outcome

DURATIONS = ("success", "queue", "compute_input", "compute_infer", "compute_output")
BATCHES = (1, 1, 1, 2)  # four requests, one engine run each (no dynamic batching): five inferences


@pytest.fixture
def pair(triton, slotserve_endpoint, write_repositories):
    repositories = write_repositories(("simple",))
    return triton(repositories.triton), slotserve_endpoint(repositories.slotserve)


def _statistics(endpoint, name="simple", version="") -> pb.ModelStatistics:
    code, reply = outcome(endpoint.stub.ModelStatistics, pb.ModelStatisticsRequest(name=name, version=version))
    assert code == "OK", (endpoint.name, reply)
    assert len(reply.model_stats) == 1, reply
    return reply.model_stats[0]


def _send(pair, request) -> None:
    for endpoint in pair:
        code, reply = outcome(endpoint.stub.ModelInfer, request)
        assert code == "OK", (endpoint.name, reply)


@pytest.fixture
def served(pair):
    """The pair after BATCHES were inferred on both, one request at a time."""
    for batch in BATCHES:
        _send(pair, add_sub_request("simple", shape=(batch, 16)))
    return pair


def test_counts_after_successes(served):
    triton, ours = (_statistics(endpoint) for endpoint in served)
    assert (ours.name, ours.version) == (triton.name, triton.version) == ("simple", "1")
    expected = (len(BATCHES), sum(BATCHES), len(BATCHES))
    assert (triton.inference_stats.success.count, triton.inference_count, triton.execution_count) == expected
    assert (ours.inference_stats.success.count, ours.inference_count, ours.execution_count) == expected
    assert triton.last_inference > 0 and ours.last_inference > 0


@pytest.mark.parametrize("field", DURATIONS)
def test_durations_counted_and_non_zero(served, field):
    triton, ours = (getattr(_statistics(endpoint).inference_stats, field) for endpoint in served)
    assert triton.count == len(BATCHES) and triton.ns > 0, triton  # the reference's answer, so a change shows
    assert (ours.count, ours.ns > 0) == (triton.count, True), f"{field}: slotserve {ours}; triton {triton}"


def test_batch_stats_per_batch_size(served):
    def batches(statistics):
        return sorted(
            (b.batch_size, b.compute_input.count, b.compute_infer.count, b.compute_output.count)
            for b in statistics.batch_stats
        )

    triton, ours = (_statistics(endpoint) for endpoint in served)
    assert batches(ours) == batches(triton) == [(1, 3, 3, 3), (2, 1, 1, 1)]
    assert all(b.compute_infer.ns > 0 for b in ours.batch_stats)


def test_response_stats_and_cache_fields(served):
    triton, ours = (_statistics(endpoint) for endpoint in served)
    assert dict(ours.response_stats) == dict(triton.response_stats) == {}  # filled for decoupled models only
    for field in ("cache_hit", "cache_miss"):  # no response cache configured
        assert getattr(ours.inference_stats, field) == getattr(triton.inference_stats, field) == pb.StatisticDuration()


def test_memory_usage_is_reported_where_the_reference_reports_none(served):
    """Triton's python backend reports no memory usage (so it cannot check the figures); slotserve reports the
    loaded engine's memory as one entry, as GetModel does (docs/operations.md): a documented difference."""
    triton, ours = (_statistics(endpoint) for endpoint in served)
    assert list(triton.memory_usage) == []
    assert [(m.type, m.id) for m in ours.memory_usage] == [("CPU", 0)]
    assert ours.memory_usage[0].byte_size > 0


@pytest.mark.parametrize("case", ["wrong-shape", "missing-input"])
def test_request_refused_by_validation_counted_as_documented(pair, case):
    """Triton does not count a request its input validation refuses (INVALID_ARGUMENT before the model runs) in
    inference_stats.fail; slotserve counts every request that got no answer, a refused one too (outcome
    invalid_request_error, Triton's metric reason OTHER), so a failure rate shows clients that send bad requests
    (docs/operations.md, "Where slotserve differs from Triton")."""
    request = add_sub_request("simple", shape=(1, 15)) if case == "wrong-shape" else add_sub_request(names=("INPUT0",))
    for endpoint in pair:
        code, _ = outcome(endpoint.stub.ModelInfer, request)
        assert code == "INVALID_ARGUMENT", endpoint.name
    triton, ours = (_statistics(endpoint) for endpoint in pair)
    assert (triton.inference_stats.fail.count, triton.inference_count) == (0, 0)
    assert (ours.inference_stats.fail.count, ours.inference_count) == (1, 0)
    assert ours.inference_stats.success.count == triton.inference_stats.success.count == 0


@pytest.mark.parametrize("name, version", [("simple", "1"), ("", "")])
def test_statistics_by_name_and_version(pair, name, version):
    triton, ours = (
        outcome(endpoint.stub.ModelStatistics, pb.ModelStatisticsRequest(name=name, version=version))
        for endpoint in pair
    )
    assert ours[0] == triton[0] == "OK", (triton, ours)
    assert [(s.name, s.version) for s in ours[1].model_stats] == [(s.name, s.version) for s in triton[1].model_stats]


@pytest.mark.parametrize(
    "name, version, triton_answer, slotserve_answer",
    [
        (
            "simple",
            "2",
            ("INVALID_ARGUMENT", "requested model version is not available for model 'simple'"),
            ("NOT_FOUND", "Request for unknown model: 'simple' version 2 is not found"),
        ),
        (
            "nowhere",
            "",
            ("INVALID_ARGUMENT", "requested model 'nowhere' is not available"),
            ("NOT_FOUND", "Request for unknown model: 'nowhere' is not found"),
        ),
    ],
)
def test_statistics_of_unknown_model_or_version_codes_differ_on_purpose(
    pair, name, version, triton_answer, slotserve_answer
):
    """Triton answers INVALID_ARGUMENT here only (its ModelInfer, ModelMetadata and ModelConfig say NOT_FOUND);
    slotserve says NOT_FOUND on every call naming an unknown model or version (docs/errors.md, "Where slotserve
    differs from Triton")."""
    request = pb.ModelStatisticsRequest(name=name, version=version)
    triton, ours = (outcome(endpoint.stub.ModelStatistics, request) for endpoint in pair)
    assert (triton, ours) == (triton_answer, slotserve_answer)


# Triton's per-model inference metrics (issue 21 part 7), each with `model` and `version` labels.
TRITON_COUNTERS = {
    "nv_inference_request_success": len(BATCHES),
    "nv_inference_request_failure": 0,
    "nv_inference_count": sum(BATCHES),
    "nv_inference_exec_count": len(BATCHES),
}
TRITON_DURATIONS = (
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)


def _samples(url: str) -> dict[tuple[str, frozenset], float]:
    """{(metric name, labels): value} of a Prometheus text page."""
    with urllib.request.urlopen(url, timeout=60) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        match = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)", line.strip())
        if line.startswith("#") or not match:
            continue
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        samples[match.group(1), labels] = float(match.group(3))
    return samples


def _model_value(samples, name: str) -> float | None:
    """The sample of `name` for model simple version 1 (other labels, e.g. Triton's reason="REJECTED", aside)."""
    values = [
        value
        for (metric, labels), value in samples.items()
        if metric == name and {("model", "simple"), ("version", "1")} <= labels and ("reason", "REJECTED") not in labels
    ]
    return sum(values) if values else None


def test_triton_metric_names_and_labels(served):
    """The reference's answer: Triton serves these metrics per model and version after BATCHES."""
    samples = _samples(served[0].metrics_url)
    for name, expected in TRITON_COUNTERS.items():
        assert _model_value(samples, name) == expected, name
    for name in TRITON_DURATIONS:
        assert _model_value(samples, name) > 0, name


def test_slotserve_serves_tritons_metric_names(served):
    samples = _samples(served[1].metrics_url)
    for name, expected in TRITON_COUNTERS.items():
        assert _model_value(samples, name) == expected, name
    for name in TRITON_DURATIONS:
        assert (_model_value(samples, name) or 0) > 0, name
