"""NaN, infinities, negatives and huge numbers in every management field and every numeric flag (issue 19, item 6).

`admission_timeout_seconds = NaN` used to escape the server's --admission-timeout ceiling (`min(nan, ceiling)` is
NaN) and the model then waited without limit. Every number a caller gives is now checked: management fields are
refused with INVALID_ARGUMENT naming the field and the value, flags with one line naming the flag and its range
(tests/unit/service/test_flag_ranges.py has the explicit cases of the flags).

The management fields a RegisterModel carries, fuzzed here: `admission_timeout_seconds` (a double: every float,
NaN and infinities included), `slots` (a uint32), the backend `options` map (numbers as text, for ONNX Runtime's
thread counts and slot limit) and the numbers inside `config_json` (max_batch_size, instance_group count, dims,
dynamic_batching's delay, preferred sizes and queue policy), against a server of its own with management and an
admission ceiling. What must hold for every example:

* the call ends within CALL_TIMEOUT with OK or INVALID_ARGUMENT, never INTERNAL, UNKNOWN or a hang;
* a non-finite, negative or over-a-year admission timeout is INVALID_ARGUMENT naming `admission_timeout_seconds`;
* an OK answer has a finite admission timeout in (0, ceiling] and 1..16 slots, and the model then serves;
* a refusal changes nothing: the model's status is what it was and it still serves.
"""

from __future__ import annotations

import json
import math
import threading

import grpc
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from engine.testing.fixture import FixtureBackend, FixtureControls
from generated import management_pb2 as mpb
from generated import management_pb2_grpc as mpb_grpc
from service.cli import build_parser, option_fields
from service.options import ServerOptions
from service.testing import serve
from tests.integration._support import demo_subset, write_fixture_model

from .lab import CALL_TIMEOUT, FUZZ, examples

CEILING = 2.0  # the server's --admission-timeout
YEAR = 365 * 24 * 3600
BATCHER = "batcher"  # a fixture model with a batch dimension, reconfigured through config_json
BATCHER_CONFIG = {
    "name": BATCHER,
    "backend": "fixture",
    "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
}
BAD_SECONDS = [math.nan, -math.nan, math.inf, -math.inf, -1.0, -5e-324, -1e308, YEAR + 1.0, 1e308]


@pytest.fixture(scope="module")
def numbers(tmp_path_factory):
    """(running server, ModelManagement stub, fixture controls): the demo `simple` (ONNX Runtime) and `batcher`,
    the parallel runtime, management allowed, an admission ceiling of CEILING seconds."""
    repository = demo_subset(tmp_path_factory.mktemp("numbers") / "repository", "simple")
    write_fixture_model(
        repository, BATCHER, inputs=[("INPUT0", "FP32", [-1])], outputs=[("OUTPUT0", "FP32", [-1])], max_batch_size=8
    )
    controls = FixtureControls()
    with serve(
        repository,
        backends={"fixture": FixtureBackend(controls)},
        parallel_jobs=1,
        allow_management=True,
        admission_timeout=CEILING,
    ) as running:
        try:
            yield running, mpb_grpc.ModelManagementStub(running.client.channel), controls
        finally:
            controls.release_all()


def register(stub, **fields):
    """RegisterModel; ("OK", ModelStatus) or (code name, details)."""
    try:
        return "OK", stub.RegisterModel(mpb.RegisterModelRequest(**fields), timeout=CALL_TIMEOUT)
    except grpc.RpcError as error:
        return error.code().name, error.details() or ""


def status_of(stub, model: str):
    return stub.GetModel(mpb.GetModelRequest(model_id=model), timeout=CALL_TIMEOUT)


def assert_serves(running, model: str) -> None:
    """A valid request to `model` as it is configured now (the fuzz reconfigures its shapes) gets its answer:
    simple adds its inputs, the fixture model echoes them."""
    if model == "simple":
        values: np.ndarray = np.arange(16, dtype=np.int32).reshape(1, 16)
        outputs = running.client.infer("simple", {"INPUT0": values, "INPUT1": values}, timeout=CALL_TIMEOUT)
        np.testing.assert_array_equal(outputs["OUTPUT0"], values + values)
        return
    shape = [1 if d < 0 else d for d in running.client.model_metadata(model).inputs[0].shape]
    if math.prod(shape) > 1 << 16:
        return  # a configuration the fuzz gave absurd dims: valid, but no request of that size is sent
    values = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    outputs = running.client.infer(model, {"INPUT0": values}, timeout=CALL_TIMEOUT)
    np.testing.assert_array_equal(outputs["OUTPUT0"], values)


def comparable(status) -> tuple:
    return (
        status.loaded,
        status.state,
        status.slots,
        status.admission_timeout_seconds,
        status.backend,
        status.batching.SerializeToString(),
    )


# ---- the reported defect, kept as explicit tests ----------------------------------------------------------------


@pytest.mark.parametrize("value", BAD_SECONDS, ids=repr)
def test_a_non_finite_negative_or_huge_admission_timeout_is_refused_by_name(numbers, value):
    """NaN used to be accepted (the status then said nan and the model waited without limit); inf and 1e308
    were silently capped, negatives refused without the field's name."""
    running, stub, _ = numbers
    before = status_of(stub, BATCHER)
    code, details = register(stub, model_id=BATCHER, admission_timeout_seconds=value)
    assert code == "INVALID_ARGUMENT", (code, details)
    assert "admission_timeout_seconds must be 0..31536000 seconds" in details and repr(value) in details, details
    assert comparable(status_of(stub, BATCHER)) == comparable(before)
    assert_serves(running, BATCHER)


def test_after_a_refused_nan_the_model_still_waits_at_most_the_ceiling(numbers):
    """What the NaN broke: with the one slot held, the next request is refused once the ceiling has passed
    (server_busy), instead of waiting until its client gives up."""
    running, stub, controls = numbers
    assert register(stub, model_id=BATCHER, admission_timeout_seconds=math.nan)[0] == "INVALID_ARGUMENT"
    assert status_of(stub, BATCHER).admission_timeout_seconds == CEILING
    gate = controls.gate(BATCHER, "execute")
    gate.hold()
    holder = threading.Thread(target=assert_serves, args=(running, BATCHER), daemon=True)
    holder.start()
    try:
        gate.wait_blocked(1, timeout=CALL_TIMEOUT)
        with pytest.raises(Exception) as info:
            running.client.infer(BATCHER, {"INPUT0": np.ones((1, 3), np.float32)}, timeout=CALL_TIMEOUT)
        assert getattr(info.value, "reason", None) == "server_busy", info.value
    finally:
        gate.release()
        holder.join(timeout=CALL_TIMEOUT)
    assert not holder.is_alive()


# ---- the fuzz ---------------------------------------------------------------------------------------------------

SECONDS = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(BAD_SECONDS + [0.0, -0.0, 5e-324, CEILING, CEILING * 2, float(YEAR)]),
)
NUMBER_TEXT = st.one_of(
    st.sampled_from(
        [
            "nan",
            "NaN",
            "inf",
            "-inf",
            "Infinity",
            "-1",
            "-0",
            "0",
            "1",
            "2",
            "1e309",
            "1.5",
            "",
            "256",
            "257",
            str(2**31),
            str(2**63),
            str(2**64),
            "-" + str(2**63),
            "99999999999",
        ]
    ),
    st.integers(-(2**70), 2**70).map(str),
)
ORT_OPTIONS = st.dictionaries(
    st.sampled_from(["intra_op_num_threads", "inter_op_num_threads", "max_parallel_slots"]), NUMBER_TEXT, max_size=2
)
JSON_NUMBER = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1, 0, 1, 2, 8, 9, 1.5, -0.5, 2**31, 2**64, 1e300]),
    st.integers(-(2**65), 2**65),
)


@st.composite
def batcher_config(draw) -> str:
    """The batcher's configuration with one to three of its numbers replaced by hostile ones."""
    config = json.loads(json.dumps(BATCHER_CONFIG))
    config["dynamic_batching"] = {}
    for field in draw(
        st.lists(
            st.sampled_from(
                ["max_batch_size", "instance_count", "dims", "delay", "preferred", "default_timeout", "max_queue_size"]
            ),
            min_size=1,
            max_size=3,
        )
    ):
        value = draw(JSON_NUMBER)
        if field == "max_batch_size":
            config["max_batch_size"] = value
        elif field == "instance_count":
            config["instance_group"] = [{"count": value}]
        elif field == "dims":
            config["input"][0]["dims"] = [value]
        elif field == "delay":
            config["dynamic_batching"]["max_queue_delay_microseconds"] = value
        elif field == "preferred":
            config["dynamic_batching"]["preferred_batch_size"] = [value]
        else:
            policy = config["dynamic_batching"].setdefault("default_queue_policy", {})
            policy["default_timeout_microseconds" if field == "default_timeout" else "max_queue_size"] = value
    return json.dumps(config)  # NaN and Infinity as JavaScript writes them, which JSON parsers often accept


@st.composite
def registrations(draw) -> dict:
    model = draw(st.sampled_from(["simple", BATCHER]))
    fields: dict = {"model_id": model}
    seconds = draw(SECONDS)
    if seconds is not None:
        fields["admission_timeout_seconds"] = seconds
    slots = draw(st.one_of(st.none(), st.sampled_from([0, 1, 2, 16, 17, 2**32 - 1]), st.integers(0, 2**32 - 1)))
    if slots is not None:
        fields["slots"] = slots
    if model == "simple":
        fields["options"] = draw(ORT_OPTIONS)
    elif draw(st.booleans()):
        fields["config_json"] = draw(batcher_config())
    return fields


def _bad_seconds(value: float) -> bool:
    return not (math.isfinite(value) and 0 <= value <= YEAR)


def test_hostile_numbers_in_management_fields_are_refused_by_name_or_served(numbers):
    running, stub, _ = numbers
    seen: dict[str, int] = {}

    @settings(FUZZ, max_examples=examples(80))
    @given(fields=registrations())
    def one(fields: dict) -> None:
        note(repr(fields))
        model = fields["model_id"]
        before = status_of(stub, model)
        code, answer = register(stub, **fields)
        seen[code] = seen.get(code, 0) + 1
        assert code in ("OK", "INVALID_ARGUMENT"), (code, answer)
        seconds = fields.get("admission_timeout_seconds")
        if seconds is not None and _bad_seconds(seconds):
            assert code == "INVALID_ARGUMENT" and "admission_timeout_seconds" in answer, (code, answer)
        if code == "OK":
            timeout = answer.admission_timeout_seconds
            assert math.isfinite(timeout) and 0 < timeout <= CEILING, answer
            assert 1 <= answer.slots <= 16 and answer.loaded, answer
        else:
            assert comparable(status_of(stub, model)) == comparable(before), answer
        assert_serves(running, model)
        # Whatever was accepted, no model's effective admission timeout is unbounded or beyond the ceiling.
        for status in stub.ListModels(mpb.ListModelsRequest(), timeout=CALL_TIMEOUT).models:
            assert math.isfinite(status.admission_timeout_seconds) and 0 < status.admission_timeout_seconds <= CEILING

    one()
    print(f"\nmanagement numbers fuzz: {seen}")


# ---- every numeric flag -----------------------------------------------------------------------------------------


def numeric_flags() -> dict[str, type]:
    return {
        action.option_strings[0]: action.type
        for action in build_parser()._actions
        if action.option_strings and action.type in (int, float)
    }


HOSTILE_FLOAT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, -1.0, -1e-300, 1e300, YEAR + 1.0]),
)
HOSTILE_INT = st.one_of(
    st.integers(-(2**70), 2**70), st.sampled_from([-1, 0, 1, 2**31 - 1, 2**31, 3_000_000_000, 2**63, 65536, 65535])
)


def test_hostile_numbers_in_every_numeric_flag_are_refused_naming_the_flag():
    """Any value is either refused, with one line naming the flag, or accepted as something that works: finite,
    not negative, within what grpc (an int32 message limit), ports (65535) and waits (threading.TIMEOUT_MAX)
    can hold. NaN, infinities and negatives are always refused."""
    kinds = numeric_flags()

    @settings(FUZZ, max_examples=examples(400))
    @given(data=st.data())
    def one(data) -> None:
        flag = data.draw(st.sampled_from(sorted(kinds)))
        value = data.draw(HOSTILE_FLOAT if kinds[flag] is float else HOSTILE_INT)
        try:
            options = ServerOptions(**option_fields(build_parser().parse_args([f"{flag}={value!r}"])))
        except ValueError as error:
            message = str(error)
            assert "\n" not in message and message.startswith(f"{flag} must be ") and "got" in message, message
            return
        accepted = getattr(options, flag[2:].replace("-", "_"))
        assert math.isfinite(value) and value >= 0, (flag, value, accepted)
        assert accepted == value, (flag, value, accepted)
        if "port" in flag:
            assert accepted <= 65535
        if flag == "--max-message-bytes":
            assert 0 < accepted < 2**31
        if kinds[flag] is float:
            assert accepted <= threading.TIMEOUT_MAX / 4  # sums of drain, grace and margins still fit a wait

    one()
