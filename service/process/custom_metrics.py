"""Custom metrics from python models: the server's registry of the families and metrics that `model.py` makes with
`pb_utils.MetricFamily` and `family.Metric(...)` (engine/python/triton_python_backend_utils.py), served on the
metrics port after the server's own (service/process/metrics.py appends `text()`).

Every operation of a model's workers comes here as a record (engine/python/messages.py: FamilyNew, MetricNew,
MetricUpdate, MetricRead, in a MetricCall the python backend answers with `apply`), so the registry holds every
value: the workers of one model (its instances) share them, a worker that replaced a dead one finds them, and
`metric.value()` reads what every worker added. Values are kept per model: a model holds the families and the
metrics it made, and they go when the model is unloaded (an operator's unload, or its workers failing too often),
not when it is evicted or retired idle (it is still registered: its next load finds them); after an unload the
model's next load starts them afresh. A family (a metric) that two models made, as Triton's names are global, is
shared and goes with the last model holding it. Operations a model's finalize makes once its unload began are
answered but not recorded (nothing would serve them).

Triton's rules, as Triton 2.51 answers them (tests/differential/qa/test_backend_python_custom_metrics.py): a second
family of an existing name and kind is that family (its first description is kept); another kind is refused; a
second metric of the same labels is that metric (its first buckets are kept); a counter is incremented by
non-negative values only and is never set nor observed; a gauge is never observed; a histogram is only observed
and has no value. Refusals carry Triton's words, then ours.

Bounds (MetricBounds; per model, so one model cannot break /metrics nor take the server's memory):

    families per model          64     names: [a-zA-Z_:][a-zA-Z0-9_:]*, at most 200 characters; nv_* (Triton's)
                                       and slotserve_* (ours) refused, as a name whose series would collide with
                                       another family's (a histogram h makes h_bucket, h_sum, h_count)
    description                 1024 characters
    metrics per family          512 label sets a model made in one family
    metrics per model           2048 in all its families
    labels per metric           16     names: [a-zA-Z_][a-zA-Z0-9_]*, not starting with __, not le for a
                                       histogram, at most 100 characters; values at most 1024 characters
    buckets per histogram       64     finite, strictly increasing

A refused operation changes nothing. Lock: `_lock` guards every field below it; it is a leaf (nothing is called
while it is held: a scrape renders the text under it, a few microseconds a series).
"""

from __future__ import annotations

import collections
import math
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.python.messages import (
    FamilyNew,
    Labels,
    MetricAction,
    MetricAnswer,
    MetricKind,
    MetricNew,
    MetricOp,
    MetricRead,
    MetricUpdate,
)

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
RESERVED_PREFIXES = ("nv_", "slotserve_")  # Triton's names and ours: a model's family may not take one
TYPE_WORDS = {MetricKind.COUNTER: "counter", MetricKind.GAUGE: "gauge", MetricKind.HISTOGRAM: "histogram"}
TRITON_KIND = {kind: f"TRITONSERVER_METRIC_KIND_{kind.name}" for kind in MetricKind}  # Triton's words name them so
# What each kind allows (Triton's core: metric_family.cc); the rest is refused "<KIND> does not support <Action>".
ALLOWED: dict[MetricKind, frozenset[MetricAction]] = {
    MetricKind.COUNTER: frozenset({MetricAction.INCREMENT}),
    MetricKind.GAUGE: frozenset({MetricAction.INCREMENT, MetricAction.SET}),
    MetricKind.HISTOGRAM: frozenset({MetricAction.OBSERVE}),
}
# The events (service/core/events.py) after which a model's metrics go, and the one after which they may come back.
DROPPING_EVENTS = frozenset({"unloaded", "device_failed"})
LOADING_EVENT = "load_started"


@dataclass(frozen=True)
class MetricBounds:
    """How much one model may make (see the module's docstring)."""

    families_per_model: int = 64
    metrics_per_family: int = 512
    metrics_per_model: int = 2048
    labels_per_metric: int = 16
    buckets_per_histogram: int = 64
    name_length: int = 200
    description_length: int = 1024
    label_name_length: int = 100
    label_value_length: int = 1024


@dataclass(eq=False)
class _Series:
    """One metric: the models holding it, and its value (a histogram's: per-bucket counts, +Inf last, and sum)."""

    holders: set[str]
    value: float = 0.0
    bounds: tuple[float, ...] = ()
    counts: list[int] = field(default_factory=list)
    count: int = 0


@dataclass(eq=False)
class _Family:
    name: str
    description: str
    kind: MetricKind
    holders: set[str]  # the models that made it
    series: dict[Labels, _Series] = field(default_factory=dict)
    held: collections.Counter[str] = field(default_factory=collections.Counter)  # series per model holding them


class CustomMetrics:
    """A server's custom-metrics registry (see the module's docstring). Every method may be called from any thread
    and never blocks beyond its short lock."""

    def __init__(self, bounds: MetricBounds | None = None) -> None:
        self.bounds = bounds or MetricBounds()
        self._lock = threading.Lock()  # guards: _families, _per_model, _closed
        self._families: dict[str, _Family] = {}  # by name, in the order made (the order served)
        self._per_model: collections.Counter[str] = collections.Counter()  # series each model holds
        self._closed: set[str] = set()  # models unloaded (until their next load starts): nothing recorded for them

    # ---- the workers' operations ---------------------------------------------------------------------------

    def apply(self, model: str, op: MetricOp) -> MetricAnswer:
        """Apply `op` of `model`'s (engine/python/backend.py's CustomMetricsSink). Never raises: a refusal is the
        answer's `error` (Triton's words first), and changes nothing."""
        with self._lock:
            closed = model in self._closed
            try:
                if isinstance(op, FamilyNew):
                    return self._family_new(model, op, closed)
                if isinstance(op, MetricNew):
                    return self._metric_new(model, op, closed)
                if isinstance(op, MetricUpdate):
                    return self._update(op, closed)
                if isinstance(op, MetricRead):
                    return self._read(op, closed)
            except _Refused as refused:
                return MetricAnswer(error=str(refused))
        return MetricAnswer(error=f"not a metric operation: {type(op).__name__}")

    def _family_new(self, model: str, op: FamilyNew, closed: bool) -> MetricAnswer:
        family = self._families.get(op.name)
        if family is not None:
            if family.kind != op.kind:
                raise _Refused(
                    f"Family name already exists with different type (family '{op.name}' is a "
                    f"{TYPE_WORDS[family.kind]}, this one a {TYPE_WORDS[op.kind]})"
                )
            if not closed:
                family.holders.add(model)  # the first description stays, as on Triton
            return MetricAnswer()
        self._check_family(model, op)
        if not closed:
            self._families[op.name] = _Family(op.name, op.description, op.kind, {model})
        return MetricAnswer()

    def _check_family(self, model: str, op: FamilyNew) -> None:
        bounds = self.bounds
        if not NAME.match(op.name) or len(op.name) > bounds.name_length:
            raise _Refused(
                f"Invalid metric name '{op.name:.200}' (a Prometheus metric name: [a-zA-Z_:][a-zA-Z0-9_:]*, at most "
                f"{bounds.name_length} characters)"
            )
        if op.name.startswith(RESERVED_PREFIXES):
            raise _Refused(
                f"Invalid metric name '{op.name}': names starting with nv_ (Triton's) or slotserve_ (the server's "
                "own metrics) are reserved"
            )
        mine = _sample_names(op.name, op.kind)
        for other in self._families.values():
            clash = mine & _sample_names(other.name, other.kind)
            if clash:
                raise _Refused(
                    f"Invalid metric name '{op.name}': its series ({', '.join(sorted(clash))}) would collide with "
                    f"those of family '{other.name}'"
                )
        if len(op.description) > bounds.description_length:
            raise _Refused(
                f"the description of family '{op.name}' has {len(op.description)} characters; at most "
                f"{bounds.description_length} are allowed"
            )
        families = sum(1 for family in self._families.values() if model in family.holders)
        if families >= bounds.families_per_model:
            raise _Refused(
                f"too many metric families: model '{model}' has {families}, the most a model may make "
                "(docs/observability.md)"
            )

    def _metric_new(self, model: str, op: MetricNew, closed: bool) -> MetricAnswer:
        family = self._family_of(op.family, closed)
        if family is None:
            return MetricAnswer()
        if op.buckets is None and family.kind == MetricKind.HISTOGRAM:  # pb_utils refuses these two first
            raise _Refused("Failed to create metric. Missing required buckets.")
        if op.buckets is not None and family.kind != MetricKind.HISTOGRAM:
            raise _Refused("Failed to create metric. Unexpected buckets found.")
        labels = _key(op.labels)
        bounds: tuple[float, ...] = ()
        if family.kind == MetricKind.HISTOGRAM:  # checked even for labels that exist, as Triton checks them
            bounds = self._check_buckets(op.buckets or ())
        series = family.series.get(labels)
        if series is not None:  # the same labels: that metric (its first buckets are kept), as on Triton
            if not closed and model not in series.holders:
                self._check_room(model, family)
                self._hold(model, family, series)
            return MetricAnswer()
        self._check_labels(family, labels)
        self._check_room(model, family)
        if not closed:
            series = _Series(set(), bounds=bounds, counts=[0] * (len(bounds) + 1))
            family.series[labels] = series
            self._hold(model, family, series)
        return MetricAnswer()

    def _hold(self, model: str, family: _Family, series: _Series) -> None:
        series.holders.add(model)
        family.held[model] += 1
        family.holders.add(model)
        self._per_model[model] += 1

    def _check_labels(self, family: _Family, labels: Labels) -> None:
        bounds = self.bounds
        if len(labels) > bounds.labels_per_metric:
            raise _Refused(
                f"a metric of family '{family.name}' has {len(labels)} labels; at most {bounds.labels_per_metric} "
                "are allowed"
            )
        for name, value in labels:
            if (
                not LABEL_NAME.match(name)
                or name.startswith("__")
                or len(name) > bounds.label_name_length
                or (name == "le" and family.kind == MetricKind.HISTOGRAM)
            ):
                raise _Refused(
                    f"Invalid label name '{name:.100}' (a Prometheus label name: [a-zA-Z_][a-zA-Z0-9_]*, not "
                    f"starting with __, not le in a histogram, at most {bounds.label_name_length} characters)"
                )
            if len(value) > bounds.label_value_length:
                raise _Refused(
                    f"the value of label '{name}' has {len(value)} characters; at most {bounds.label_value_length} "
                    "are allowed"
                )

    def _check_buckets(self, buckets: tuple[float, ...]) -> tuple[float, ...]:
        if any(later <= earlier for earlier, later in zip(buckets, buckets[1:], strict=False)):
            raise _Refused(f"Bucket Boundaries must be strictly sorted (got {list(buckets)!r:.200})")
        if not all(math.isfinite(bound) for bound in buckets):
            raise _Refused("Bucket Boundaries must be finite (+Inf is every histogram's last bucket)")
        if len(buckets) > self.bounds.buckets_per_histogram:
            raise _Refused(
                f"a histogram has {len(buckets)} buckets; at most {self.bounds.buckets_per_histogram} are allowed"
            )
        return buckets

    def _check_room(self, model: str, family: _Family) -> None:
        bounds = self.bounds
        if family.held[model] >= bounds.metrics_per_family:
            raise _Refused(
                f"too many metrics in family '{family.name}': model '{model}' made {family.held[model]}, the most "
                "a model may make in one family (docs/observability.md)"
            )
        if self._per_model[model] >= bounds.metrics_per_model:
            raise _Refused(
                f"too many metrics: model '{model}' made {self._per_model[model]} in all its families, the most a "
                "model may make (docs/observability.md)"
            )

    def _family_of(self, name: str, closed: bool) -> _Family | None:
        """The family `name`, or None for a model whose unload began (nothing recorded). Raises _Refused when it
        is gone (the model was unloaded, its families went, while its workers still held them)."""
        family = self._families.get(name)
        if family is None and not closed:
            raise _Refused(f"no metric family '{name}': it went when its model was unloaded")
        return family

    def _series(self, family_name: str, labels: Labels, closed: bool) -> tuple[_Family, _Series] | None:
        family = self._family_of(family_name, closed)
        if family is None:
            return None
        series = family.series.get(_key(labels))
        if series is None:
            if closed:
                return None
            raise _Refused(f"no metric {_shown(labels)} in family '{family_name}': it went when its model was unloaded")
        return family, series

    def _update(self, op: MetricUpdate, closed: bool) -> MetricAnswer:
        found = self._series(op.family, op.labels, closed)
        if found is None:
            return MetricAnswer()
        family, series = found
        if op.action not in ALLOWED[family.kind]:
            raise _Refused(f"{TRITON_KIND[family.kind]} does not support {op.action.value.capitalize()}")
        if op.action == MetricAction.INCREMENT:
            if family.kind == MetricKind.COUNTER and op.value < 0.0:
                raise _Refused(
                    f"{TRITON_KIND[family.kind]} can only be incremented monotonically by non-negative values."
                )
            series.value += op.value
        elif op.action == MetricAction.SET:
            series.value = op.value
        else:
            _observe(series, op.value)
        return MetricAnswer()

    def _read(self, op: MetricRead, closed: bool) -> MetricAnswer:
        found = self._series(op.family, op.labels, closed)
        if found is None:
            return MetricAnswer()
        family, series = found
        if family.kind == MetricKind.HISTOGRAM:
            raise _Refused(f"{TRITON_KIND[family.kind]} does not support Value")
        return MetricAnswer(value=series.value)

    # ---- models coming and going ---------------------------------------------------------------------------

    def note_event(self, event: str, model: str, fields: Mapping[str, object]) -> None:
        """An Events listener (service/core/events.py `subscribe`): a model unloaded (an operator's unload, or its
        device failed) loses its metrics; its next load starts recording again. Never blocks, never raises."""
        if event in DROPPING_EVENTS:
            self.drop_model(model)
        elif event == LOADING_EVENT:
            with self._lock:
                self._closed.discard(model)

    def drop_model(self, model: str) -> None:
        """`model`'s families and metrics go (those another model holds too stay, for it), and what its workers
        still send is answered but not recorded until its next load starts."""
        with self._lock:
            self._closed.add(model)
            self._per_model.pop(model, None)
            for name, family in list(self._families.items()):
                family.holders.discard(model)
                family.held.pop(model, None)
                for labels, series in list(family.series.items()):
                    series.holders.discard(model)
                    if not series.holders:
                        del family.series[labels]
                if not family.holders and not family.series:
                    del self._families[name]

    def models(self) -> dict[str, list[str]]:
        """{model: the names of the families it holds}, for tests and diagnostics."""
        with self._lock:
            held: dict[str, list[str]] = {}
            for family in self._families.values():
                for model in sorted(family.holders):
                    held.setdefault(model, []).append(family.name)
            return held

    # ---- the exposition ------------------------------------------------------------------------------------

    def text(self) -> str:
        """Every family in the Prometheus text format, as Triton writes them: counters under their own names (no
        `_total`), labels sorted by name, a histogram's count, sum and buckets (cumulative, le="+Inf" last). A
        family without a metric is left out. Never blocks beyond the lock."""
        lines: list[str] = []
        with self._lock:
            for family in self._families.values():
                if not family.series:
                    continue
                lines.append(f"# HELP {family.name} {_help(family.description)}")
                lines.append(f"# TYPE {family.name} {TYPE_WORDS[family.kind]}")
                for labels, series in family.series.items():
                    if family.kind == MetricKind.HISTOGRAM:
                        lines.extend(_histogram_lines(family.name, labels, series))
                    else:
                        lines.append(f"{family.name}{_label_text(labels)} {_number(series.value)}")
        return "\n".join(lines) + "\n" if lines else ""


def _key(labels: Labels) -> Labels:
    """Labels as the registry keys them: sorted by name, each name once (pb_utils sends them so already)."""
    return tuple(sorted(dict(labels).items()))


class _Refused(Exception):
    """An operation refused: its message is the model's error."""


def _observe(series: _Series, value: float) -> None:
    index = next((i for i, bound in enumerate(series.bounds) if value <= bound), len(series.bounds))
    series.counts[index] += 1
    series.count += 1
    series.value += value  # a histogram's sum


def _sample_names(name: str, kind: MetricKind) -> set[str]:
    """The sample names a family writes (a histogram's three; a counter or gauge its own name)."""
    if kind == MetricKind.HISTOGRAM:
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return {name}


def _histogram_lines(name: str, labels: Labels, series: _Series) -> list[str]:
    lines = [
        f"{name}_count{_label_text(labels)} {series.count}",
        f"{name}_sum{_label_text(labels)} {_number(series.value)}",
    ]
    cumulative = 0
    for bound, count in zip((*series.bounds, math.inf), series.counts, strict=True):
        cumulative += count
        lines.append(f"{name}_bucket{_label_text((*labels, ('le', _number(bound))))} {cumulative}")
    return lines


def _number(value: float) -> str:
    """A value as Triton's exposition writes it (prometheus-cpp: 16 significant digits, +Inf, -Inf); NaN as
    Prometheus spells it."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return format(value, ".16g")


def _label_text(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in labels) + "}"


def _escape(value: str) -> str:
    """A label value escaped as the text format wants (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _help(text: str) -> str:
    """A HELP text escaped as the text format wants (backslash, newline)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _shown(labels: Labels) -> str:
    return _label_text(labels) or "{}"
