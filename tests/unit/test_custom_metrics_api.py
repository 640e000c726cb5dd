"""pb_utils.MetricFamily and Metric (engine/python/triton_python_backend_utils.py) over a registry in this process
(the worker's call replaced by one that applies each record to service/process/custom_metrics.py): the checks made
in the model's process, the records sent, and Triton's words for each refusal (asked of Triton 2.51:
tests/differential/qa/test_backend_python_custom_metrics.py)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from engine.python import triton_python_backend_utils as pb_utils
from engine.python.messages import FamilyNew, MetricAction, MetricKind, MetricNew, MetricOp, MetricRead, MetricUpdate
from service.process.custom_metrics import CustomMetrics

F = pb_utils.MetricFamily
INSTANCE = "m_0_0"
PREFIX = f"Failed to process the request for model '{INSTANCE}', message: "


@pytest.fixture
def sent(monkeypatch) -> list[MetricOp]:
    """Every record the API sends, applied to a fresh registry as model 'm'."""
    registry = CustomMetrics()
    records: list[MetricOp] = []

    def call(op: MetricOp):
        records.append(op)
        return registry.apply("m", op)

    monkeypatch.setattr(pb_utils, "_metrics_caller", call)
    monkeypatch.setattr(pb_utils, "_instance_name", INSTANCE)
    return records


def test_each_operation_is_one_typed_record(sent):
    family = F(name="requests", description="what it counts", kind=F.COUNTER)
    metric = family.Metric(labels={"route": "/a", "code": "200"})
    metric.increment(2)
    assert metric.value() == 2.0
    histogram = F(name="latency", description="d", kind=F.HISTOGRAM).Metric(labels={}, buckets=[1, 2.5])
    assert sent == [
        FamilyNew("requests", "what it counts", MetricKind.COUNTER),
        MetricNew("requests", (("code", "200"), ("route", "/a")), None),
        MetricUpdate("requests", (("code", "200"), ("route", "/a")), MetricAction.INCREMENT, 2.0),
        MetricRead("requests", (("code", "200"), ("route", "/a"))),
        FamilyNew("latency", "d", MetricKind.HISTOGRAM),
        MetricNew("latency", (), (1.0, 2.5)),
    ]
    assert histogram is not None


def test_kinds_are_tritons_enum():
    assert repr(F.COUNTER) == "<MetricKind.COUNTER: 0>"
    assert [int(F.COUNTER), int(F.GAUGE), int(F.HISTOGRAM)] == [0, 1, 2]
    assert F.COUNTER == 0


def test_arguments_are_checked_in_the_models_process_in_tritons_words(sent):
    counter = F(name="c", description="d", kind=F.COUNTER)
    histogram = F(name="h", description="d", kind=F.HISTOGRAM)
    sent.clear()
    with pytest.raises(pb_utils.TritonModelException, match=r"^Failed to create metric. Labels must be a dictionary.$"):
        counter.Metric(labels=[("a", "1")])
    with pytest.raises(pb_utils.TritonModelException, match=r"^Failed to create metric. Unexpected buckets found.$"):
        counter.Metric(buckets=[1.0])
    with pytest.raises(pb_utils.TritonModelException, match=r"^Failed to create metric. Missing required buckets.$"):
        histogram.Metric(labels={})
    with pytest.raises(pb_utils.TritonModelException, match=r"^Failed to create metric. Buckets must be a list.$"):
        histogram.Metric(buckets=(1.0, 2.0))
    with pytest.raises(RuntimeError, match="Unable to cast Python instance to C\\+\\+ type"):
        histogram.Metric(buckets=["x"])
    with pytest.raises(pb_utils.TritonModelException) as not_text:
        counter.Metric(labels={"a": 1})
    assert str(not_text.value).startswith(
        f"Error when creating Metric: {PREFIX}attempt to access JSON non-string as string"
    )
    with pytest.raises(TypeError, match="incompatible constructor arguments"):
        F(name="k", description="d", kind=0)  # Triton's binding takes its enum only
    with pytest.raises(TypeError, match="incompatible constructor arguments"):
        F(name="k", description=None, kind=F.GAUGE)
    metric = counter.Metric()
    sent.clear()
    with pytest.raises(TypeError, match=r"^increment\(\): incompatible function arguments"):
        metric.increment("2")
    with pytest.raises(TypeError, match=r"^set\(\): incompatible function arguments"):
        metric.set(True)
    assert sent == []  # none of these reached the server
    metric.increment(np.float32(1.5))
    assert metric.value() == 1.5


def test_the_servers_refusals_come_back_in_tritons_words(sent):
    with pytest.raises(pb_utils.TritonModelException) as bad:
        F(name="bad-name", description="d", kind=F.COUNTER)
    assert str(bad.value).startswith(f"Error when creating MetricFamily: {PREFIX}Invalid metric name 'bad-name'")
    counter = F(name="c", description="d", kind=F.COUNTER).Metric  # a bound method keeps its family
    metric = counter(labels={"a": "1"})
    counter_kind = PREFIX + "TRITONSERVER_METRIC_KIND_COUNTER"
    for call, words in (
        (lambda: metric.set(1), f"Failed to set metric value: {counter_kind} does not support Set"),
        (lambda: metric.observe(1), f"Failed to observe metric value: {counter_kind} does not support Observe"),
        (
            lambda: metric.increment(-1),
            f"Failed to increment metric value: {counter_kind} can only be incremented monotonically by "
            "non-negative values.",
        ),
    ):
        with pytest.raises(pb_utils.TritonModelException) as refused:
            call()
        assert str(refused.value) == words
    with pytest.raises(pb_utils.TritonModelException) as other_kind:
        F(name="c", description="d", kind=F.GAUGE)
    assert "Family name already exists with different type" in str(other_kind.value)


def test_two_metrics_of_the_same_labels_share_one_value(sent):
    family = F(name="dup", description="d", kind=F.COUNTER)
    first, second = family.Metric(labels={"a": "1"}), family.Metric(labels={"a": "1"})
    first.increment(7.5)
    assert second.value() == 7.5


def test_a_deleted_familys_metrics_refuse_every_operation_as_tritons_do(sent):
    family = F(name="g", description="d", kind=F.GAUGE)
    metric = family.Metric(labels={})
    metric.set(3)
    del family
    gc.collect()
    for call, failing in (
        (lambda: metric.set(1), "Failed to set metric value"),
        (lambda: metric.increment(1), "Failed to increment metric value"),
        (metric.value, "Failed to get metric value"),
        (lambda: metric.observe(1), "Failed to observe metric value"),
    ):
        with pytest.raises(pb_utils.TritonModelException) as refused:
            call()
        assert str(refused.value) == (
            f"{failing}: Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
            "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have been deleted."
        )
    # Triton's quirk, asked of Triton 2.51: a metric made from a family nobody keeps is dead at once
    with pytest.raises(pb_utils.TritonModelException, match="has been deleted"):
        F(name="g2", description="d", kind=F.GAUGE).Metric().set(1)


def test_outside_a_worker_custom_metrics_are_refused_by_name(monkeypatch):
    monkeypatch.setattr(pb_utils, "_metrics_caller", None)
    with pytest.raises(pb_utils.TritonModelException, match="custom metrics need a server"):
        F(name="m", description="d", kind=F.COUNTER)
    with pytest.raises(TypeError, match="made by MetricFamily.Metric"):
        pb_utils.Metric()
