"""The custom-metrics registry (service/process/custom_metrics.py) on its own: Triton's rules for families and
metrics, the bounds on what one model may make, models coming and going, and the text it serves."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.python.messages import (
    FamilyNew,
    MetricAction,
    MetricAnswer,
    MetricKind,
    MetricNew,
    MetricRead,
    MetricUpdate,
)
from service.process.custom_metrics import CustomMetrics, MetricBounds

COUNTER, GAUGE, HISTOGRAM = MetricKind.COUNTER, MetricKind.GAUGE, MetricKind.HISTOGRAM
INC, SET, OBSERVE = MetricAction.INCREMENT, MetricAction.SET, MetricAction.OBSERVE
OK = MetricAnswer()


def made(registry: CustomMetrics, model: str, name: str, kind: MetricKind, *labels, buckets=None) -> None:
    """A family and one metric of `labels` ((name, value) pairs), both accepted."""
    assert registry.apply(model, FamilyNew(name, f"{name} help", kind)) == OK
    if kind == HISTOGRAM and buckets is None:
        buckets = (1.0, 2.0)
    assert registry.apply(model, MetricNew(name, tuple(labels), buckets)) == OK


def value(registry: CustomMetrics, model: str, name: str, *labels) -> float:
    answer = registry.apply(model, MetricRead(name, tuple(labels)))
    assert answer.error == ""
    return answer.value


def parsed(registry: CustomMetrics) -> dict:
    found = {}
    for family in text_string_to_metric_families(registry.text()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_a_counter_counts_and_refuses_what_triton_refuses():
    registry = CustomMetrics()
    made(registry, "m", "requests", COUNTER, ("route", "/a"))
    key = ("requests", (("route", "/a"),))
    assert registry.apply("m", MetricUpdate(*key, INC, 2.5)) == OK
    assert registry.apply("m", MetricUpdate(*key, INC, 0)) == OK
    assert value(registry, "m", "requests", ("route", "/a")) == 2.5
    assert registry.apply("m", MetricUpdate(*key, INC, -1)).error == (
        "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values."
    )
    assert registry.apply("m", MetricUpdate(*key, SET, 1)).error == (
        "TRITONSERVER_METRIC_KIND_COUNTER does not support Set"
    )
    assert registry.apply("m", MetricUpdate(*key, OBSERVE, 1)).error == (
        "TRITONSERVER_METRIC_KIND_COUNTER does not support Observe"
    )
    assert value(registry, "m", "requests", ("route", "/a")) == 2.5  # a refusal changes nothing


def test_a_gauge_goes_both_ways_and_is_never_observed():
    registry = CustomMetrics()
    made(registry, "m", "depth", GAUGE)
    assert registry.apply("m", MetricUpdate("depth", (), SET, 7)) == OK
    assert registry.apply("m", MetricUpdate("depth", (), INC, -2.5)) == OK
    assert value(registry, "m", "depth") == 4.5
    assert registry.apply("m", MetricUpdate("depth", (), OBSERVE, 1)).error == (
        "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe"
    )


def test_a_histogram_counts_in_its_buckets_and_has_no_value():
    registry = CustomMetrics()
    made(registry, "m", "latency", HISTOGRAM, ("a", "1"), buckets=(0.1, 1.0, 2.5, 5.0, 10.0))
    for observed in (0.05, 1.5, 6.0, 10.0):
        assert registry.apply("m", MetricUpdate("latency", (("a", "1"),), OBSERVE, observed)) == OK
    for action in (INC, SET):
        refused = registry.apply("m", MetricUpdate("latency", (("a", "1"),), action, 1)).error
        assert refused == f"TRITONSERVER_METRIC_KIND_HISTOGRAM does not support {action.value.capitalize()}"
    assert registry.apply("m", MetricRead("latency", (("a", "1"),))).error == (
        "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value"
    )
    text = registry.text()
    assert 'latency_count{a="1"} 4\n' in text and 'latency_sum{a="1"} 17.55\n' in text
    buckets = [line for line in text.splitlines() if line.startswith("latency_bucket")]
    assert buckets == [
        'latency_bucket{a="1",le="0.1"} 1',
        'latency_bucket{a="1",le="1"} 1',
        'latency_bucket{a="1",le="2.5"} 2',
        'latency_bucket{a="1",le="5"} 2',
        'latency_bucket{a="1",le="10"} 4',  # a bound is inclusive
        'latency_bucket{a="1",le="+Inf"} 4',
    ]


def test_the_same_name_and_kind_is_the_same_family_with_its_first_description():
    registry = CustomMetrics()
    assert registry.apply("m", FamilyNew("f", "first description", COUNTER)) == OK
    assert registry.apply("m", FamilyNew("f", "second description", COUNTER)) == OK
    assert registry.apply("m", FamilyNew("f", "first description", GAUGE)).error.startswith(
        "Family name already exists with different type (family 'f' is a counter, this one a gauge)"
    )
    assert registry.apply("m", MetricNew("f", (("k", "1"),), None)) == OK
    assert registry.apply("m", MetricNew("f", (("k", "1"),), None)) == OK  # the same metric: one series
    assert registry.apply("m", MetricUpdate("f", (("k", "1"),), INC, 7.5)) == OK
    assert value(registry, "m", "f", ("k", "1")) == 7.5
    text = registry.text()
    assert "# HELP f first description\n# TYPE f counter\n" in text and "second" not in text
    assert text.count('f{k="1"}') == 1


def test_a_histograms_first_buckets_are_kept_for_its_labels_and_bad_ones_refused_even_then():
    registry = CustomMetrics()
    made(registry, "m", "h", HISTOGRAM, ("a", "1"), buckets=(1.0, 2.0))
    assert registry.apply("m", MetricNew("h", (("a", "1"),), (5.0,))) == OK
    assert "strictly sorted" in registry.apply("m", MetricNew("h", (("a", "1"),), (5.0, 5.0))).error  # as Triton
    assert registry.apply("m", MetricUpdate("h", (("a", "1"),), OBSERVE, 1.0)) == OK
    assert 'h_bucket{a="1",le="2"} 1' in registry.text() and 'le="5"' not in registry.text()


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("bad-name", "Invalid metric name 'bad-name'"),
        ("1bad", "Invalid metric name '1bad'"),
        ("", "Invalid metric name ''"),
        ("x" * 201, "at most 200 characters"),
        ("nv_inference_count", "names starting with nv_ (Triton's) or slotserve_"),
        ("slotserve_model_loaded", "names starting with nv_ (Triton's) or slotserve_"),
    ],
)
def test_a_name_that_is_not_prometheus_or_is_the_servers_is_refused(name, words):
    registry = CustomMetrics()
    refused = registry.apply("m", FamilyNew(name, "d", COUNTER)).error
    assert words in refused
    assert registry.models() == {} and registry.text() == ""


def test_a_colon_is_a_valid_name():
    registry = CustomMetrics()
    made(registry, "m", "ok:name", GAUGE)
    assert "ok:name 0" in registry.text()


def test_a_name_whose_series_would_collide_with_anothers_is_refused_both_ways():
    registry = CustomMetrics()
    made(registry, "m", "h", HISTOGRAM)
    assert "its series (h_count) would collide with those of family 'h'" in (
        registry.apply("m", FamilyNew("h_count", "d", GAUGE)).error
    )
    made(registry, "m", "g_sum", GAUGE)
    assert "its series (g_sum) would collide with those of family 'g_sum'" in (
        registry.apply("m", FamilyNew("g", "d", HISTOGRAM)).error
    )


@pytest.mark.parametrize("label", ["1a", "a-b", "__x", "", "x" * 101])
def test_a_label_name_that_is_not_prometheus_is_refused(label):
    registry = CustomMetrics()
    assert registry.apply("m", FamilyNew("f", "d", COUNTER)) == OK
    assert registry.apply("m", MetricNew("f", ((label, "v"),), None)).error.startswith("Invalid label name")
    assert "f{" not in registry.text()


def test_le_is_refused_in_a_histogram_only():
    registry = CustomMetrics()
    assert registry.apply("m", FamilyNew("h", "d", HISTOGRAM)) == OK
    assert registry.apply("m", MetricNew("h", (("le", "1"),), (1.0,))).error.startswith("Invalid label name 'le'")
    made(registry, "m", "c", COUNTER, ("le", "1"))


@pytest.mark.parametrize(
    ("buckets", "words"),
    [
        ((2.0, 1.0), "Bucket Boundaries must be strictly sorted"),
        ((1.0, 1.0), "Bucket Boundaries must be strictly sorted"),
        ((1.0, math.inf), "Bucket Boundaries must be finite"),
        ((math.nan,), "Bucket Boundaries must be finite"),
        (tuple(float(i) for i in range(65)), "a histogram has 65 buckets; at most 64"),
        (None, "Failed to create metric. Missing required buckets."),
    ],
)
def test_bad_buckets_are_refused(buckets, words):
    registry = CustomMetrics()
    assert registry.apply("m", FamilyNew("h", "d", HISTOGRAM)) == OK
    assert words in registry.apply("m", MetricNew("h", (), buckets)).error


def test_buckets_on_a_counter_are_refused_and_none_on_a_histogram_is_one_bucket():
    registry = CustomMetrics()
    assert registry.apply("m", FamilyNew("c", "d", COUNTER)) == OK
    assert registry.apply("m", MetricNew("c", (), (1.0,))).error == "Failed to create metric. Unexpected buckets found."
    made(registry, "m", "h", HISTOGRAM, buckets=())  # an empty list is Triton's too: +Inf alone
    assert 'h_bucket{le="+Inf"} 0' in registry.text()


def test_every_bound_is_enforced_per_model_and_a_refusal_keeps_what_was_made():
    bounds = MetricBounds(families_per_model=2, metrics_per_family=3, metrics_per_model=4, labels_per_metric=2,
                          description_length=10, label_value_length=5)  # fmt: skip
    registry = CustomMetrics(bounds)
    assert registry.apply("m", FamilyNew("a", "d", GAUGE)) == OK
    assert registry.apply("m", FamilyNew("b", "d", GAUGE)) == OK
    assert "too many metric families: model 'm' has 2" in registry.apply("m", FamilyNew("c", "d", GAUGE)).error
    assert registry.apply("m", FamilyNew("a", "d", GAUGE)) == OK  # taking one it has is no new family
    assert registry.apply("other", FamilyNew("c", "d", GAUGE)) == OK  # the bound is the model's own
    assert "11 characters; at most 10" in registry.apply("other", FamilyNew("d", "x" * 11, GAUGE)).error
    for index in range(3):
        assert registry.apply("m", MetricNew("a", (("i", str(index)),), None)) == OK
    assert "too many metrics in family 'a': model 'm' made 3" in (
        registry.apply("m", MetricNew("a", (("i", "3"),), None)).error
    )
    assert registry.apply("m", MetricNew("a", (("i", "0"),), None)) == OK  # an existing one is no new metric
    assert registry.apply("m", MetricNew("b", (("i", "0"),), None)) == OK
    assert "too many metrics: model 'm' made 4 in all its families" in (
        registry.apply("m", MetricNew("b", (("i", "1"),), None)).error
    )
    assert "has 3 labels; at most 2" in (
        registry.apply("other", MetricNew("c", (("x", "1"), ("y", "2"), ("z", "3")), None)).error
    )
    assert "has 6 characters; at most 5" in registry.apply("other", MetricNew("c", (("x", "123456"),), None)).error
    assert len([key for key in parsed(registry) if key[0] in ("a", "b")]) == 4


def test_an_unload_takes_the_models_metrics_and_its_next_load_records_again():
    registry = CustomMetrics()
    made(registry, "m", "mine", GAUGE)
    made(registry, "n", "theirs", GAUGE)
    assert registry.apply("m", MetricUpdate("mine", (), SET, 3)) == OK
    registry.note_event("evicted", "m", {})  # still registered: its values stay for its next load
    assert value(registry, "m", "mine") == 3
    registry.note_event("unloaded", "m", {})
    assert registry.models() == {"n": ["theirs"]}
    assert "mine" not in registry.text() and "theirs 0" in registry.text()
    # its finalize, after the unload began: answered, recorded nowhere
    assert registry.apply("m", FamilyNew("late", "d", GAUGE)) == OK
    assert registry.apply("m", MetricNew("late", (), None)) == OK
    assert registry.apply("m", MetricUpdate("mine", (), SET, 9)) == OK
    assert "late" not in registry.text() and "mine" not in registry.text()
    registry.note_event("load_started", "m", {})
    made(registry, "m", "mine", GAUGE)
    assert value(registry, "m", "mine") == 0  # afresh
    assert "no metric family 'gone'" in registry.apply("m", MetricUpdate("gone", (), SET, 1)).error


def test_a_family_two_models_made_stays_until_both_have_unloaded():
    registry = CustomMetrics()
    made(registry, "a", "shared", COUNTER, ("model", "a"))
    made(registry, "b", "shared", COUNTER, ("model", "b"))
    assert registry.apply("b", MetricNew("shared", (("model", "a"),), None)) == OK  # Triton's names are global
    assert registry.apply("b", MetricUpdate("shared", (("model", "a"),), INC, 2)) == OK
    registry.drop_model("a")
    found = parsed(registry)
    assert found[("shared_total", (("model", "a"),))] == 2  # b holds it too
    assert found[("shared_total", (("model", "b"),))] == 0
    registry.drop_model("b")
    assert registry.text() == "" and registry.models() == {}


def test_the_text_escapes_what_the_format_needs_and_writes_values_as_triton_does():
    registry = CustomMetrics()
    assert registry.apply("m", FamilyNew("e", 'two\nlines \\ and "quotes"', GAUGE)) == OK
    assert registry.apply("m", MetricNew("e", (("q", 'a"b\\c\nd'),), None)) == OK
    assert registry.apply("m", MetricNew("e", (("v", "inf"),), None)) == OK
    assert registry.apply("m", MetricNew("e", (("v", "nan"),), None)) == OK
    assert registry.apply("m", MetricNew("e", (("v", "big"),), None)) == OK
    assert registry.apply("m", MetricUpdate("e", (("v", "inf"),), SET, math.inf)) == OK
    assert registry.apply("m", MetricUpdate("e", (("v", "nan"),), SET, math.nan)) == OK
    assert registry.apply("m", MetricUpdate("e", (("v", "big"),), SET, 1e20)) == OK
    text = registry.text()
    assert '# HELP e two\\nlines \\\\ and "quotes"\n' in text
    assert 'e{q="a\\"b\\\\c\\nd"} 0\n' in text  # as Triton escapes it (asked of Triton 2.51)
    assert 'e{v="inf"} +Inf\n' in text and 'e{v="nan"} NaN\n' in text and 'e{v="big"} 1e+20\n' in text
    found = parsed(registry)  # valid for a Prometheus parser
    assert found[("e", (("q", 'a"b\\c\nd'),))] == 0


def test_labels_are_keyed_sorted_whatever_order_they_come_in():
    registry = CustomMetrics()
    assert registry.apply("m", FamilyNew("f", "d", GAUGE)) == OK
    assert registry.apply("m", MetricNew("f", (("b", "2"), ("a", "1")), None)) == OK
    assert registry.apply("m", MetricUpdate("f", (("a", "1"), ("b", "2")), SET, 4)) == OK
    assert 'f{a="1",b="2"} 4' in registry.text()


def test_a_family_without_a_metric_is_not_served():
    registry = CustomMetrics()
    assert registry.apply("m", FamilyNew("empty", "d", GAUGE)) == OK
    assert registry.text() == ""
