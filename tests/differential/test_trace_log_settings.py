"""TraceSetting and LogSettings asked of tritonserver 2.51 and of slotserve, on the same add/sub repository, both
started with a trace file (`--trace-config triton,file=...`): the answers' settings, per-model overrides and their
fallback to the global settings, and the refusals (codes and Triton's words). Where slotserve is deliberately
stricter (a value Triton reads oddly or ignores), Triton's answer and ours are both asserted, as documented in
docs/observability.md."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from generated import grpc_service_pb2 as pb
from service.core.trace_settings import TraceSettings

from .calls import outcome
from .conftest import INSTALLATION, MISSING_REASON, Endpoint, _start_slotserve, _start_triton
from .repositories import write_add_sub_repositories

CLEAR_ALL: dict[str, list[str]] = {"trace_level": [], "trace_rate": [], "trace_count": [], "log_frequency": []}


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> Iterator[tuple[Endpoint, Endpoint]]:
    """(triton, slotserve), each with a trace file of its own, started once for the module."""
    if INSTALLATION is None:
        pytest.skip(MISSING_REASON)
    root = tmp_path_factory.mktemp("trace-settings")
    repositories = write_add_sub_repositories(root / "repositories")
    with ExitStack() as stack:
        triton = _start_triton(
            stack, root / "triton-run", repositories.triton, f"--trace-config=triton,file={root / 'triton.json'}"
        )
        ours = _start_slotserve(
            stack, repositories.slotserve, trace_settings=TraceSettings(file=str(root / "slotserve.json"))
        )
        yield triton, ours


@pytest.fixture
def both(traced) -> Iterator[tuple[Endpoint, Endpoint]]:
    """The module's servers, their trace settings back to the startup ones after each test, and this process's
    logging (slotserve's LogSettings changes it: the server runs here) put back."""
    root = logging.getLogger()
    level = root.level
    yield traced
    root.setLevel(level)
    for endpoint in traced:
        for model in ("", "simple"):
            assert ask_one(endpoint, trace_request(model, **CLEAR_ALL))[0] == "OK"


def trace_request(model: str = "", **settings: list[str]) -> pb.TraceSettingRequest:
    request = pb.TraceSettingRequest(model_name=model)
    for name, values in settings.items():
        request.settings[name].value.extend(values)
    return request


def log_request(**settings: object) -> pb.LogSettingsRequest:
    request = pb.LogSettingsRequest()
    for name, value in settings.items():
        field = {bool: "bool_param", int: "uint32_param", str: "string_param"}[type(value)]
        setattr(request.settings[name], field, value)
    return request


def ask_one(endpoint: Endpoint, request) -> tuple[str, object]:
    method = endpoint.stub.TraceSetting if isinstance(request, pb.TraceSettingRequest) else endpoint.stub.LogSettings
    code, answer = outcome(method, request)
    if code != "OK":
        return code, answer
    if isinstance(answer, pb.TraceSettingResponse):
        return code, {name: list(value.value) for name, value in answer.settings.items()}
    return code, {
        name: (value.WhichOneof("parameter_choice"), _value(value)) for name, value in answer.settings.items()
    }


def _value(value: pb.LogSettingsResponse.SettingValue) -> object:
    choice = value.WhichOneof("parameter_choice")
    return None if choice is None else getattr(value, choice)


def ask(both, request) -> tuple[tuple[str, object], tuple[str, object]]:
    triton, ours = both
    return ask_one(triton, request), ask_one(ours, request)


def without_file(answer: object) -> object:
    assert isinstance(answer, dict) and "trace_file" in answer, answer
    return {name: value for name, value in answer.items() if name != "trace_file"}


# ---- TraceSetting ---------------------------------------------------------------------------------------------


def test_the_global_answer_has_tritons_settings_and_defaults(both):
    (code_t, triton), (code, ours) = ask(both, trace_request())
    assert (code_t, code) == ("OK", "OK")
    assert (
        without_file(ours)
        == without_file(triton)
        == {
            "trace_level": ["OFF"],
            "trace_rate": ["1000"],
            "trace_count": ["-1"],
            "log_frequency": ["0"],
            "trace_mode": ["triton"],
        }
    )
    assert triton["trace_file"][0].endswith("triton.json") and ours["trace_file"][0].endswith("slotserve.json")


def test_a_model_overrides_what_it_sets_follows_global_changes_and_falls_back_when_cleared(both):
    steps = [
        ("simple", {"trace_rate": ["5"], "trace_level": ["TIMESTAMPS"]}),
        ("", {"trace_rate": ["7"], "trace_count": ["3"], "log_frequency": ["2"]}),
        ("simple", {}),
        ("simple_int8", {}),  # no settings of its own: the global ones
        ("simple", {"trace_rate": []}),
        ("simple", {"trace_level": ["TIMESTAMPS", "TENSORS"]}),
        ("", {"trace_level": ["TENSORS"], "trace_rate": ["9"]}),
        ("simple", {"trace_level": []}),
        ("", {"trace_rate": [], "trace_count": []}),  # back to the startup values
        ("simple", {}),
    ]
    for model, settings in steps:
        (code_t, triton), (code, ours) = ask(both, trace_request(model, **settings))
        assert (code_t, code) == ("OK", "OK"), (model, settings, triton, ours)
        assert without_file(ours) == without_file(triton), (model, settings)


@pytest.mark.parametrize(
    ("settings", "code", "words"),
    [
        (
            {"trace_file": ["/tmp/elsewhere.json"]},
            "UNIMPLEMENTED",
            "trace file location can not be updated through network protocol",
        ),
        ({"trace_file": ["/x"], "trace_rate": ["abc"]}, "UNIMPLEMENTED", "trace file location can not be updated"),
        ({"trace_rate": ["abc"]}, "INVALID_ARGUMENT", "Unable to parse 'trace_rate', got: abc"),
        ({"trace_rate": ["1", "2"]}, "INVALID_ARGUMENT", "expect only 1 value for 'trace_rate'"),
        (
            {"trace_rate": ["99999999999"]},
            "INVALID_ARGUMENT",
            "value is out of range [ 0, 4294967295 ], got: 99999999999",
        ),
        ({"trace_count": ["-2"]}, "INVALID_ARGUMENT", "Unable to parse 'trace_count'. Expecting value >= -1, got: -2"),
        ({"log_frequency": ["often"]}, "INVALID_ARGUMENT", "Unable to parse 'log_frequency', got: often"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, "INVALID_ARGUMENT", "Expect only one trace level 'OFF' is specified"),
        (
            {"trace_level": ["TIMESTAMPS"], "trace_rate": ["0"]},
            "INVALID_ARGUMENT",
            "Attempting to set invalid trace setting :sample rate must be non-zero",
        ),
    ],
)
@pytest.mark.parametrize("model", ["", "simple"])
def test_refusals_have_tritons_code_and_words_and_change_nothing(both, model, settings, code, words):
    before = ask(both, trace_request(model))
    (code_t, triton), (ours_code, ours) = ask(both, trace_request(model, **settings))
    assert (code_t, ours_code) == (code, code), (triton, ours)
    assert words in str(triton) and words in str(ours), (triton, ours)
    assert ask(both, trace_request(model)) == before


@pytest.mark.parametrize("settings", [{}, {"trace_rate": ["2"]}])
def test_a_model_that_is_not_served_is_invalid_argument_with_tritons_words(both, settings):
    (code_t, triton), (code, ours) = ask(both, trace_request("no_such_model", **settings))
    assert (code_t, code) == ("INVALID_ARGUMENT", "INVALID_ARGUMENT")
    assert "Request for unknown model : no_such_model" in str(triton)
    assert "Request for unknown model : no_such_model" in str(ours)


def test_numbers_are_read_as_tritons_stoi_reads_them(both):
    (code_t, triton), (code, ours) = ask(both, trace_request(trace_rate=["12abc"]))
    assert (code_t, code) == ("OK", "OK")
    assert triton["trace_rate"] == ours["trace_rate"] == ["12"]


@pytest.mark.parametrize(
    ("settings", "tritons", "words"),
    [
        # Triton reads -1 as 4294967295 (a uint32): slotserve refuses it as out of range.
        ({"trace_rate": ["-1"]}, {"trace_rate": ["4294967295"]}, "value is out of range [ 0, 4294967295 ], got: -1"),
        ({"log_frequency": ["-3"]}, {"log_frequency": ["4294967293"]}, "value is out of range"),
        # Triton skips a level name it does not know (nothing changes): slotserve names it.
        ({"trace_level": ["TIMESTAMP"]}, {"trace_level": ["OFF"]}, "Unable to parse 'trace_level', got: TIMESTAMP"),
        # Triton ignores a field it does not update (trace_mode is answered, never updated): slotserve names it.
        ({"trace_mode": ["opentelemetry"]}, {"trace_mode": ["triton"]}, "trace setting 'trace_mode' cannot be updated"),
    ],
)
def test_slotserve_refuses_by_name_what_triton_reads_oddly_or_ignores(both, settings, tritons, words):
    (code_t, triton), (code, ours) = ask(both, trace_request(**settings))
    assert code_t == "OK" and {name: triton[name] for name in tritons} == tritons  # type: ignore[index]
    assert code == "INVALID_ARGUMENT" and words in str(ours)


# ---- LogSettings ----------------------------------------------------------------------------------------------


def test_the_log_answer_has_tritons_fields_and_types(both):
    (code_t, triton), (code, ours) = ask(both, log_request())
    assert (code_t, code) == ("OK", "OK")
    kinds = {name: kind for name, (kind, _) in triton.items()}  # type: ignore[union-attr]
    assert kinds == {name: kind for name, (kind, _) in ours.items()}  # type: ignore[union-attr]
    assert kinds == {
        "log_file": "string_param",
        "log_info": "bool_param",
        "log_warning": "bool_param",
        "log_error": "bool_param",
        "log_verbose_level": "uint32_param",
        "log_format": "string_param",
    }


def test_an_update_of_the_levels_answers_as_triton(both):
    update = log_request(log_info=True, log_warning=True, log_error=True, log_verbose_level=1)
    (code_t, triton), (code, ours) = ask(both, update)
    assert (code_t, code) == ("OK", "OK")
    names = ("log_info", "log_warning", "log_error", "log_verbose_level")
    assert {n: triton[n] for n in names} == {n: ours[n] for n in names}  # type: ignore[index]
    (_, triton), (_, ours) = ask(both, log_request(log_verbose_level=0))
    assert triton["log_verbose_level"] == ours["log_verbose_level"] == ("uint32_param", 0)  # type: ignore[index]


@pytest.mark.parametrize(
    ("settings", "code", "words"),
    [
        (
            {"log_file": "/tmp/elsewhere.log"},
            "UNIMPLEMENTED",
            "log file location can not be updated through network protocol",
        ),
        ({"log_info": "yes"}, "INVALID_ARGUMENT", "expect boolean for 'log_info'"),
        ({"log_error": 1}, "INVALID_ARGUMENT", "expect boolean for 'log_error'"),
        ({"log_verbose_level": True}, "INVALID_ARGUMENT", "expect int32 for 'log_verbose_level'"),
        ({"log_format": True}, "INVALID_ARGUMENT", "expect string for 'log_format'"),
        ({"log_format": "yaml"}, "INVALID_ARGUMENT", "invalid argument for log_format, got: yaml"),
    ],
)
def test_log_refusals_have_tritons_code_and_words(both, settings, code, words):
    (code_t, triton), (ours_code, ours) = ask(both, log_request(**settings))
    assert (code_t, ours_code) == (code, code), (triton, ours)
    assert words in str(triton) and words in str(ours)


def test_slotserve_checks_a_log_update_whole_where_triton_applies_the_fields_before_the_bad_one(both):
    before_t, before = ask(both, log_request())
    (code_t, _), (code, _) = ask(both, log_request(log_warning=False, log_format="yaml"))
    assert (code_t, code) == ("INVALID_ARGUMENT", "INVALID_ARGUMENT")
    after_t, after = ask(both, log_request())
    assert after_t[1]["log_warning"] == ("bool_param", False)  # type: ignore[index]  # Triton applied it
    assert after == before  # slotserve changed nothing
    ask(both, log_request(log_warning=True, log_info=True))


def test_log_format_words(both):
    # Triton answers its own words; slotserve takes them (they mean text lines) and answers text or json.
    (code_t, triton), (code, ours) = ask(both, log_request(log_format="ISO8601"))
    assert (code_t, code) == ("OK", "OK")
    assert triton["log_format"] == ("string_param", "ISO8601") and ours["log_format"] == ("string_param", "text")  # type: ignore[index]
    (_, triton), (_, ours) = ask(both, log_request(log_format="default"))
    assert triton["log_format"] == ("string_param", "default") and ours["log_format"] == ("string_param", "text")  # type: ignore[index]


# ---- opentelemetry mode ---------------------------------------------------------------------------------------


def test_opentelemetry_mode_answers_the_same_settings(tmp_path):
    if INSTALLATION is None:
        pytest.skip(MISSING_REASON)
    from service.process.cli import build_parser
    from service.process.trace_flags import trace_settings

    flags = [
        "--trace-config=mode=opentelemetry",
        "--trace-config=opentelemetry,url=localhost:4318/v1/traces",
        "--trace-config=opentelemetry,resource=a=b",
        "--trace-config=opentelemetry,resource=c=d",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=1",
    ]
    repositories = write_add_sub_repositories(tmp_path / "repositories")
    with ExitStack() as stack:
        triton = _start_triton(stack, tmp_path / "triton-run", repositories.triton, *flags)
        settings = trace_settings(build_parser().parse_args(flags), {})
        ours = _start_slotserve(stack, repositories.slotserve, trace_settings=settings)
        answers = (ask_one(triton, trace_request()), ask_one(ours, trace_request()))
    assert answers[0] == answers[1]
    assert answers[0][1]["resource"] == ["a=b", "c=d"] and "trace_file" not in answers[0][1]  # type: ignore[index]


def test_a_global_update_that_would_break_a_tracing_model_is_refused_and_slotserve_changes_nothing(both):
    assert ask(both, trace_request("simple", trace_level=["TIMESTAMPS"]))[1][0] == "OK"
    (code_t, triton), (code, ours) = ask(both, trace_request(trace_rate=["0"]))
    assert (code_t, code) == ("INVALID_ARGUMENT", "INVALID_ARGUMENT")
    words = "Attempting to set invalid trace setting :sample rate must be non-zero"
    assert words in str(triton) and words in str(ours) and "for model 'simple'" in str(ours)
    (_, triton), (_, ours) = ask(both, trace_request())
    assert triton["trace_rate"] == ["0"]  # type: ignore[index]  # Triton changed the global settings before failing
    assert ours["trace_rate"] == ["1000"]  # type: ignore[index]  # slotserve checks the whole update first
