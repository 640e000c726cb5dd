"""Warmup without a server: a sample becomes the arrays Triton would send (engine/warmup.py), and the samples run
`count` times on every slot, stop at a shutdown and fail naming the sample (service/core/warmup.py)."""

from __future__ import annotations

import struct
import threading

import numpy as np
import pytest

from engine.config.specs import ModelSpec, TensorSpec, WarmupInput, WarmupSample
from engine.config.warmup import RANDOM_BYTES_LENGTH, sample_inputs
from engine.errors import ExecutionError, ModelConfigError
from engine.interface import CancelToken, Context, ModelMetadata
from engine.testing.fixture import Defect, FixtureBackend, FixtureControls
from service.core.errors import SHUTDOWN_CANCEL_REASON, ShuttingDown
from service.core.warmup import WarmupFailed, warm_up

# Every datatype by family, with its numpy dtype written out here (not read from engine.datatypes).
NUMERIC = {
    "UINT8": "<u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "<i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
}


def sample(*inputs: WarmupInput, batch_size: int = 1, count: int = 1, name: str = "s") -> WarmupSample:
    return WarmupSample(name, batch_size, count, tuple(inputs))


def one(datatype: str, data: str, shape=(2, 3), file=None) -> WarmupInput:
    return WarmupInput("X", datatype, shape, data, file)


def rng() -> np.random.Generator:
    return np.random.default_rng(7)


# ---- sample -> arrays ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", [*NUMERIC, "BOOL", "BF16"])
def test_zero_data_is_zeros_of_the_datatype_and_shape(datatype):
    (array,) = sample_inputs(sample(one(datatype, "zero")), 0, rng()).values()
    expected = {"BOOL": "bool", "BF16": "bfloat16"}.get(datatype) or str(np.dtype(NUMERIC[datatype]))
    assert array.shape == (2, 3) and str(array.dtype) == expected
    assert not np.any(array.astype(np.float64))


@pytest.mark.parametrize("datatype", NUMERIC)
def test_random_data_has_the_datatype_and_is_finite(datatype):
    (array,) = sample_inputs(sample(one(datatype, "random", shape=(64,))), 0, rng()).values()
    assert array.dtype == np.dtype(NUMERIC[datatype]) and array.shape == (64,)
    assert len(np.unique(array)) > 1  # random, not a constant
    if datatype.startswith("FP"):
        assert np.all(np.isfinite(array)) and np.all((array >= 0) & (array <= 1))


def test_random_bool_and_bf16():
    inputs = sample_inputs(
        sample(WarmupInput("B", "BOOL", (64,), "random"), WarmupInput("H", "BF16", (64,), "random")), 0, rng()
    )
    assert inputs["B"].dtype == np.bool_ and set(inputs["B"].tolist()) == {True, False}
    assert str(inputs["H"].dtype) == "bfloat16" and np.all(np.isfinite(inputs["H"].astype(np.float32)))


def test_bytes_zero_data_is_empty_elements_and_random_data_random_bytes():
    inputs = sample_inputs(
        sample(WarmupInput("Z", "BYTES", (3,), "zero"), WarmupInput("R", "BYTES", (2, 20), "random")), 0, rng()
    )
    assert inputs["Z"].dtype == object and inputs["Z"].tolist() == [b"", b"", b""]
    elements = inputs["R"].reshape(-1).tolist()
    assert inputs["R"].shape == (2, 20) and all(isinstance(e, bytes) for e in elements)
    assert all(len(e) <= RANDOM_BYTES_LENGTH for e in elements) and len(set(elements)) > 1


def test_input_data_file_is_read_row_major_and_bytes_length_prefixed(tmp_path):
    values = np.arange(6, dtype="<i4")
    (tmp_path / "ints").write_bytes(values.tobytes())
    (tmp_path / "strings").write_bytes(
        struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0) + struct.pack("<I", 1) + b"c"
    )
    inputs = sample_inputs(
        sample(
            WarmupInput("I", "INT32", (2, 3), "file", tmp_path / "ints"),
            WarmupInput("S", "BYTES", (3,), "file", tmp_path / "strings"),
        ),
        0,
        rng(),
    )
    np.testing.assert_array_equal(inputs["I"], values.reshape(2, 3))
    assert inputs["I"].flags.writeable
    assert inputs["S"].tolist() == [b"ab", b"", b"c"]


def test_a_batching_model_gets_the_batch_dimension_every_row_the_same(tmp_path):
    (tmp_path / "f").write_bytes(np.array([1.5, 2.5], dtype="<f4").tobytes())
    inputs = sample_inputs(
        sample(
            WarmupInput("F", "FP32", (2,), "file", tmp_path / "f"),
            WarmupInput("R", "INT64", (4,), "random"),
            WarmupInput("Z", "BYTES", (1,), "zero"),
            batch_size=3,
        ),
        8,
        rng(),
    )
    assert {name: a.shape for name, a in inputs.items()} == {"F": (3, 2), "R": (3, 4), "Z": (3, 1)}
    assert np.all(inputs["F"] == np.array([1.5, 2.5], dtype=np.float32))
    assert all(np.array_equal(row, inputs["R"][0]) for row in inputs["R"])
    assert inputs["F"].flags.writeable  # a copy, not a broadcast view


def test_no_batch_dimension_without_max_batch_size():
    (array,) = sample_inputs(sample(one("FP32", "zero", shape=(4,))), 0, rng()).values()
    assert array.shape == (4,)


def test_a_file_that_changed_since_the_model_was_read_is_a_config_error_naming_the_sample(tmp_path):
    (tmp_path / "f").write_bytes(b"\0" * 5)
    with pytest.raises(ModelConfigError, match=r"warmup sample 's': input 'X': .*changed.* needs 24 bytes, got 5"):
        sample_inputs(sample(one("FP32", "file", file=tmp_path / "f")), 0, rng())
    with pytest.raises(ModelConfigError, match="warmup sample 's': input 'X': cannot read"):
        sample_inputs(sample(one("FP32", "file", file=tmp_path / "gone")), 0, rng())


# ---- running the samples on slots ------------------------------------------------------------------------------

METADATA = ModelMetadata((TensorSpec("X", "FP32", (2, 3)),), (TensorSpec("Y", "FP32", (2, 3)),))


class Recording(Context):
    """A slot that records what it ran; `fail_at` raises on that run (1-based)."""

    def __init__(self, slot: int, log: list, fail_at: int = 0, error: Exception | None = None) -> None:
        self.slot, self.log, self.fail_at, self.error = slot, log, fail_at, error
        self.runs = 0

    def execute(self, inputs, outputs, cancel):
        self.runs += 1
        self.log.append((self.slot, {k: v.shape for k, v in inputs.items()}, tuple(outputs)))
        if self.runs == self.fail_at:
            raise self.error or ExecutionError("boom")
        return {"Y": inputs["X"]}


def test_every_sample_runs_count_times_on_every_slot_in_order():
    log: list = []
    contexts = [Recording(slot, log) for slot in range(3)]
    samples = [sample(one("FP32", "zero"), count=2, name="a"), sample(one("FP32", "random"), name="b")]
    times = warm_up("m", METADATA, samples, contexts)
    assert [entry[0] for entry in log] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert all(shapes == {"X": (2, 3)} and outputs == () for _, shapes, outputs in log)
    assert times.warmup_runs == 9 and times.warmup_seconds > 0 and times.load_seconds == 0


def test_no_samples_runs_nothing():
    log: list = []
    assert warm_up("m", METADATA, [], [Recording(0, log)]).warmup_runs == 0 and log == []


def test_a_failed_run_fails_naming_the_sample_the_slot_and_the_reason():
    log: list = []
    contexts = [Recording(0, log), Recording(1, log, fail_at=2, error=ExecutionError("kernel exploded"))]
    samples = [sample(one("FP32", "zero"), count=3, name="hot")]
    with pytest.raises(WarmupFailed) as info:
        warm_up("m", METADATA, samples, contexts)
    assert str(info.value) == "model 'm': warmup sample 'hot' failed on slot 1 (run 2 of 3): kernel exploded"
    assert info.value.error_reason == "load_failed"
    assert len(log) == 5  # stopped at the failure


def test_a_backend_bug_keeps_its_traceback():
    contexts = [Recording(0, [], fail_at=1, error=KeyError("oops"))]
    with pytest.raises(WarmupFailed, match=r"slot 0 \(run 1 of 1\): 'oops'") as info:
        warm_up("m", METADATA, [sample(one("FP32", "zero"))], contexts)
    assert isinstance(info.value.__cause__, KeyError)


def test_a_sample_that_does_not_fit_the_loaded_model_is_a_config_error_before_any_run():
    log: list = []
    wrong = sample(WarmupInput("X", "FP32", (5,), "zero"), name="odd")
    with pytest.raises(
        ModelConfigError, match=r"warmup sample 'odd' does not fit the model: input 'X' has shape \[5\]"
    ):
        warm_up("m", METADATA, [wrong], [Recording(0, log)])
    assert log == []


def test_a_shutdown_stops_before_the_next_run():
    log: list = []
    closed = threading.Event()

    class ClosesAfterFirstRun(Recording):
        def execute(self, inputs, outputs, cancel):
            closed.set()
            return super().execute(inputs, outputs, cancel)

    with pytest.raises(ShuttingDown, match="warmup stopped: the server is shutting down"):
        warm_up(
            "m", METADATA, [sample(one("FP32", "zero"), count=5)], [ClosesAfterFirstRun(0, log)], stopping=closed.is_set
        )
    assert len(log) == 1


def test_a_shutdown_interrupts_a_run_but_a_client_giving_up_does_not():
    controls = FixtureControls()
    model = FixtureBackend(controls).load(ModelSpec("m", "fixture", inputs=METADATA.inputs, outputs=METADATA.outputs))
    gate = controls.gate("m", "execute").hold()
    samples = [sample(one("FP32", "zero"), count=2)]

    def run(cancel, outcome):
        try:
            outcome.append(warm_up("m", model.metadata, samples, [model.create_context()], cancel=cancel))
        except Exception as error:
            outcome.append(error)

    client, client_outcome = CancelToken(), []
    worker = threading.Thread(target=run, args=(client, client_outcome))
    worker.start()
    gate.wait_blocked(1)
    client.cancel("client")  # the first request's client left: its load (and warmup) go on
    assert gate.blocked == 1 and client_outcome == []
    gate.release()
    worker.join(30)
    assert client_outcome[0].warmup_runs == 2

    gate.hold()
    shutdown, shutdown_outcome = CancelToken(), []
    worker = threading.Thread(target=run, args=(shutdown, shutdown_outcome))
    worker.start()
    gate.wait_blocked(1)
    shutdown.cancel(SHUTDOWN_CANCEL_REASON)
    worker.join(30)
    assert isinstance(shutdown_outcome[0], ShuttingDown)
    assert controls.count("m", "execute") == 3  # two runs, then one interrupted


def test_a_failing_fixture_run_fails_the_warmup():
    controls = FixtureControls()
    model = FixtureBackend(controls).load(ModelSpec("m", "fixture", inputs=METADATA.inputs, outputs=METADATA.outputs))
    controls.gate("m", "execute").fail_next(Defect("gate failed"))
    with pytest.raises(WarmupFailed, match="warmup sample 's' failed on slot 0 .*: gate failed"):
        warm_up("m", model.metadata, [sample(one("FP32", "zero"))], [model.create_context()])
