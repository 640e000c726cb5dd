"""The trace settings store (service/core/trace_settings.py): Triton 2.51's TraceSetting update rules, per-model
fallback to the global settings, sampling by rate and count, and the lock-free path when tracing is off."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from service.core.trace_settings import (
    Sampled,
    TraceFileNotUpdatable,
    TraceLevel,
    TraceMode,
    TraceSettingInvalid,
    TraceSettings,
    TraceSettingsStore,
    parse_level_option,
)

TIMESTAMPS = frozenset({TraceLevel.TIMESTAMPS})


def _store(**fields: object) -> TraceSettingsStore:
    return TraceSettingsStore(TraceSettings(**fields))  # type: ignore[arg-type]


def _traced(store: TraceSettingsStore, model: str, requests: int) -> list[int]:
    """The 1-based numbers of the requests among `requests` that were sampled."""
    return [n for n in range(1, requests + 1) if store.sample(model) is not None]


def test_default_settings_are_off_and_answer_triton_defaults() -> None:
    settings = _store().settings()
    assert not settings.on
    assert (settings.level_names(), settings.rate, settings.count, settings.log_frequency) == (["OFF"], 1000, -1, 0)
    assert settings.file == "" and settings.mode is TraceMode.TRITON


def test_settings_are_hashable_whatever_their_opentelemetry_options() -> None:
    options = TraceSettings(mode=TraceMode.OPENTELEMETRY, opentelemetry={"url": "localhost:4317"})
    assert {options: 1, TraceSettings(): 2}[options] == 1


def test_off_everywhere_samples_nothing_without_taking_the_lock() -> None:
    store = _store(rate=1)

    class ExplodingLock:
        def __enter__(self) -> None:
            raise AssertionError("sample() took the lock while tracing is off")

        def __exit__(self, *args: object) -> None:
            return None

    store._lock = ExplodingLock()  # type: ignore[assignment]
    assert store.sample("any") is None


def test_rate_traces_every_nth_request_counted_per_holder() -> None:
    store = _store(levels=TIMESTAMPS, rate=3, file="/tmp/t.json")
    assert _traced(store, "a", 9) == [3, 6, 9]


def test_count_limits_the_traces_and_the_answer_shows_traces_left() -> None:
    store = _store(levels=TIMESTAMPS, rate=1, count=2, file="/tmp/t.json")
    assert _traced(store, "a", 5) == [1, 2]
    assert store.settings().count == 0
    assert not store.settings().on
    assert not store.any_on  # the last trace turned the fast path back on


def test_sampled_carries_the_model_and_the_settings_it_was_sampled_under() -> None:
    store = _store(levels=TIMESTAMPS, rate=1, count=5, file="/tmp/t.json")
    sampled = store.sample("m")
    assert sampled == Sampled("m", replace(store.settings(), count=5))  # sampled with 5 left; 4 left now
    assert store.settings().count == 4


def test_global_level_update_in_triton_mode_without_a_file_is_refused_and_changes_nothing() -> None:
    store = _store()
    with pytest.raises(
        TraceSettingInvalid, match="Attempting to set invalid trace setting :trace file name is not given"
    ):
        store.update("", {"trace_level": ["TIMESTAMPS"], "trace_rate": ["5"]})
    assert store.settings().rate == 1000 and not store.settings().levels


def test_opentelemetry_mode_needs_no_file() -> None:
    store = _store(mode=TraceMode.OPENTELEMETRY)
    assert store.update("", {"trace_level": ["TIMESTAMPS"], "trace_rate": ["1"]}).on
    assert store.sample("m") is not None


def test_trace_file_update_is_refused_by_name() -> None:
    store = _store(file="/tmp/t.json")
    with pytest.raises(TraceFileNotUpdatable, match="trace file location can not be updated through network protocol"):
        store.update("", {"trace_file": ["/tmp/other.json"], "trace_rate": ["3"]})
    assert store.settings().rate == 1000 and store.settings().file == "/tmp/t.json"


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"trace_rate": ["abc"]}, "Unable to parse 'trace_rate', got: abc"),
        ({"trace_rate": ["1", "2"]}, "expect only 1 value for 'trace_rate'"),
        ({"trace_rate": ["99999999999"]}, "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ]"),
        ({"trace_count": ["-2"]}, "Unable to parse 'trace_count'. Expecting value >= -1, got: -2"),
        ({"log_frequency": ["x"]}, "Unable to parse 'log_frequency', got: x"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, "Expect only one trace level 'OFF' is specified"),
        ({"trace_level": ["TIMESTAMP"]}, "Unable to parse 'trace_level', got: TIMESTAMP"),
        ({"trace_level": ["TIMESTAMPS"], "trace_rate": ["0"]}, "sample rate must be non-zero"),
    ],
)
def test_bad_values_are_refused_naming_the_field_and_change_nothing(changes: dict, words: str) -> None:
    store = _store(file="/tmp/t.json", rate=7)
    before = store.settings()
    with pytest.raises(TraceSettingInvalid) as raised:
        store.update("", {**changes, "trace_count": changes.get("trace_count", ["9"])})
    assert words in str(raised.value)
    assert store.settings() == before


def test_numbers_are_read_as_tritons_stoi_reads_them() -> None:
    store = _store(file="/tmp/t.json")
    assert store.update("", {"trace_rate": [" 12abc"]}).rate == 12


def test_a_model_overrides_only_what_it_set_and_follows_later_global_changes() -> None:
    store = _store(file="/tmp/t.json")
    store.update("m", {"trace_rate": ["5"]})
    store.update("", {"trace_level": ["TIMESTAMPS"], "trace_count": ["10"]})
    model = store.settings("m")
    assert (model.rate, model.count, model.levels) == (5, 10, TIMESTAMPS)
    assert store.settings("other").rate == 1000  # no settings of its own: the global ones
    assert store.overridden("m") == {"trace_rate"}


def test_clearing_a_models_last_field_gives_it_back_to_the_global_settings() -> None:
    store = _store(file="/tmp/t.json", levels=TIMESTAMPS, rate=1)
    store.update("m", {"trace_rate": ["4"], "trace_level": ["OFF"]})
    assert store.settings("m").level_names() == ["OFF"]
    store.update("m", {"trace_level": []})
    assert store.settings("m").levels == TIMESTAMPS and store.settings("m").rate == 4
    store.update("m", {"trace_rate": None})
    assert store.overridden("m") == frozenset()
    assert store.settings("m") == store.settings()


def test_a_global_update_that_would_break_a_tracing_model_is_refused_whole() -> None:
    store = _store(file="/tmp/t.json", rate=4)
    store.update("m", {"trace_level": ["TIMESTAMPS"]})
    with pytest.raises(TraceSettingInvalid, match="sample rate must be non-zero \\(for model 'm'"):
        store.update("", {"trace_rate": ["0"]})
    assert store.settings().rate == 4 and store.settings("m").rate == 4 and store.settings("m").on


def test_clearing_a_global_field_restores_its_startup_value() -> None:
    store = _store(file="/tmp/t.json", rate=50)
    store.update("", {"trace_rate": ["3"]})
    assert store.update("", {"trace_rate": []}).rate == 50


def test_a_model_with_its_own_settings_counts_its_own_requests() -> None:
    store = _store(file="/tmp/t.json", levels=TIMESTAMPS, rate=2)
    store.update("m", {"trace_rate": ["3"]})
    assert _traced(store, "m", 6) == [3, 6]
    assert _traced(store, "x", 4) == [2, 4]  # the global holder's count was not moved by m's requests


def test_a_model_turned_on_while_global_is_off_is_sampled() -> None:
    store = _store(file="/tmp/t.json", rate=1)
    assert not store.any_on
    store.update("m", {"trace_level": ["TIMESTAMPS", "TENSORS"]})
    assert store.any_on
    assert store.sample("other") is None
    sampled = store.sample("m")
    assert sampled is not None and sampled.settings.level_names() == ["TIMESTAMPS", "TENSORS"]


def test_subscribers_are_called_after_each_successful_update_only() -> None:
    store = _store(file="/tmp/t.json")
    calls: list[int] = []
    store.subscribe(lambda: calls.append(store.settings().rate))
    store.update("", {"trace_rate": ["8"]})
    with pytest.raises(TraceSettingInvalid):
        store.update("", {"trace_rate": ["x"]})
    assert calls == [8]


@pytest.mark.parametrize("name", ["trace_mode", "colour", "url"])
def test_fields_that_cannot_be_updated_are_refused_by_name_and_change_nothing(name: str) -> None:
    store = _store(file="/tmp/t.json")
    with pytest.raises(TraceSettingInvalid, match=f"trace setting '{name}' cannot be updated") as raised:
        store.update("", {"trace_rate": ["3"], name: ["x"]})
    assert raised.value.setting == name
    assert store.settings().rate == 1000


def test_concurrent_sampling_never_exceeds_the_count() -> None:
    store = _store(file="/tmp/t.json", levels=TIMESTAMPS, rate=1, count=100)
    hits: list[Sampled] = []
    start = threading.Barrier(4)

    def worker() -> None:
        start.wait(timeout=10)
        for _ in range(200):
            sampled = store.sample("m")
            if sampled is not None:
                hits.append(sampled)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(hits) == 100
    assert sorted(hit.settings.count for hit in hits) == list(range(1, 101))  # each trace had its own place


@pytest.mark.parametrize(
    ("text", "levels"),
    [("OFF", frozenset()), ("false", frozenset()), ("TIMESTAMPS", TIMESTAMPS), ("max", TIMESTAMPS)]
    + [("Tensors", frozenset({TraceLevel.TENSORS})), ("loud", None)],
)
def test_level_option_reads_tritonserver_spellings(text: str, levels: frozenset[TraceLevel] | None) -> None:
    assert parse_level_option(text) == levels
