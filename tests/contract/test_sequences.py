"""Sequence cells (SEQUENCE.nn, tests/contract/cells.tsv): the direct strategy's rule (a slot per sequence, its
requests in arrival order on that slot), and what a manager's barrier, eviction, idle retirement and shutdown do
with open sequences. Requests go through the real request path of a Dataplane over a real registry: fixture
sequence models (gates hold a request at `execute`) and the ONNX accumulator with implicit state
(tests/sequence_builders.py). Orders come from gates and statistics, never from sleeps."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.errors import RequestRescheduled
from engine.interface import CancelToken
from engine.onnxruntime_backend import OnnxRuntimeBackend
from generated import grpc_service_pb2 as pb
from service.core.errors import AdmissionTimeout, RequestCancelled, ResidencyLimit, ShuttingDown
from service.core.lifecycle import Lease, ModelState
from service.core.sequences import SequenceNotStarted
from service.dataplane import Dataplane
from service.status_codes import describe
from service.tensors import as_message, inference_request
from tests.sequence_builders import expected_sums, write_accumulate, write_fixture_sequence

from .harness import WAIT, Lab

cell = pytest.mark.cell


def message(
    model: str, value, sequence_id, *, start=False, end=False, datatype="FP32", shape=(1,)
) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    array = np.full(shape, value, np.float32 if datatype == "FP32" else np.int32)
    request.inputs.add(name="INPUT0" if datatype == "FP32" else "INPUT", datatype=datatype, shape=list(shape))
    request.raw_input_contents.append(array.tobytes())
    if sequence_id:
        request.parameters["sequence_id"].int64_param = sequence_id
    request.parameters["sequence_start"].bool_param = start  # tritonclient always sends both flags
    request.parameters["sequence_end"].bool_param = end
    return request


class Sequences:
    """A Lab with sequence models and the ONNX Runtime backend, and a Dataplane over its registry."""

    def __init__(self, tmp_path, *, slots: int = 1, idle_us: int = 30_000_000, **lab_options) -> None:
        root = tmp_path / "repository"
        write_fixture_sequence(root, "seq", slots=slots, idle_us=idle_us)
        write_accumulate(root, "acc", slots=slots, idle_us=idle_us)
        # max_batch_size 2: two sequence slots per slot, as Triton's direct
        write_accumulate(root, "acc2", slots=slots, idle_us=idle_us, batched=True, max_batch_size=2)
        # iterative_sequence, max_batch_size 2: two sequence slots on each slot's context (SEQUENCE.13)
        iterative = "direct { } iterative_sequence: true"
        write_fixture_sequence(root, "iter", slots=slots, idle_us=idle_us, strategy=iterative, max_batch_size=2)
        streams = {"stream_responses": 2}
        write_fixture_sequence(
            root, "iter_stream", slots=slots, idle_us=idle_us, strategy=iterative, parameters=streams
        )
        self.lab = Lab(root, {"other": {}}, load=False, parallel_jobs=max(2, slots), **lab_options)
        self.lab.runtime.backends["onnxruntime"] = OnnxRuntimeBackend()  # type: ignore[index]
        self.dataplane = Dataplane(self.lab.registry, clock=self.lab.clock)

    def infer(self, model: str, value, sequence_id, *, start=False, end=False, cancel=None, timeout_us=0):
        datatype = "INT32" if model.startswith("acc") else "FP32"
        shape = (1, 1) if model in ("acc2", "iter") else (1,)
        request = message(model, value, sequence_id, start=start, end=end, datatype=datatype, shape=shape)
        if timeout_us:
            request.parameters["timeout"].int64_param = timeout_us
        output = "OUTPUT" if model.startswith("acc") else "OUTPUT0"

        def run():
            response = self.dataplane.infer(inference_request(request, as_message), cancel=cancel or CancelToken())
            names = [o.name for o in response.outputs]
            assert names == [output], names
            dtype = np.int32 if model.startswith("acc") else np.float32
            return np.frombuffer(response.raw_output_contents[0], dtype)[0]

        return self.lab.start(f"{model}:{sequence_id}:{value}", run)

    def entry(self, model: str):
        return self.lab.registry.get(model)

    def table(self, model: str):
        return self.entry(model).sequences.statistics()

    def wait_table(self, model: str, predicate, what: str):
        self.lab.wait_until(lambda: predicate(self.table(model)), what)

    def close(self) -> None:
        self.lab.close()


@pytest.fixture
def sequences(tmp_path):
    made: list[Sequences] = []

    def make(**options) -> Sequences:
        made.append(Sequences(tmp_path / str(len(made)), **options))
        return made[-1]

    yield make
    for item in made:
        item.close()


def record_contexts(monkeypatch) -> list[tuple[int, float]]:
    """(id of the context, INPUT0's value) of every run, in run order (around the real Lease.execute)."""
    runs: list[tuple[int, float]] = []
    execute = Lease.execute

    def recorded(self, inputs, outputs, cancel):
        value = inputs["INPUT0"] if "INPUT0" in inputs else inputs["INPUT"]
        runs.append((id(self.context), float(np.asarray(value).reshape(-1)[0])))
        return execute(self, inputs, outputs, cancel)

    monkeypatch.setattr(Lease, "execute", recorded)
    return runs


@cell("SEQUENCE.01")
def test_a_sequences_requests_run_in_arrival_order_one_at_a_time_on_its_slot(sequences, monkeypatch):
    env = sequences(slots=2)
    runs = record_contexts(monkeypatch)
    assert env.infer("seq", 1.0, 1, start=True).result() == 1.0
    assert env.infer("seq", 10.0, 2, start=True).result() == 10.0
    gate = env.lab.gate("seq", "execute").hold()
    first = env.infer("seq", 2.0, 1)
    gate.wait_blocked(1)
    second = env.infer("seq", 3.0, 1)  # waits for its turn, not for a slot (the other slot is free)
    env.wait_table("seq", lambda s: s.queued_turns == 1, "sequence 1's second request waiting for its turn")
    other = env.infer("seq", 11.0, 2)  # another sequence runs meanwhile on its own slot
    gate.wait_blocked(2)
    assert env.entry("seq").admission.statistics().active_slots == 2
    assert [value for _, value in runs] == [1.0, 10.0, 2.0, 11.0]  # 3.0 has not run: 2.0 still runs
    gate.release()
    assert (first.result(), second.result(), other.result()) == (2.0, 3.0, 11.0)
    assert [value for _, value in runs] == [1.0, 10.0, 2.0, 11.0, 3.0]
    one, two = {runs[i][0] for i in (0, 2, 4)}, {runs[i][0] for i in (1, 3)}
    assert len(one) == 1 and len(two) == 1 and one != two  # each sequence on one context, never the other's


@cell("SEQUENCE.01")
@cell("SEQUENCE.02")
def test_direct_has_max_batch_size_sequences_per_slot_taking_turns_on_it(sequences, monkeypatch):
    env = sequences(slots=1)  # acc2: max_batch_size 2 x 1 slot = 2 sequence slots, both on the one context
    runs = record_contexts(monkeypatch)
    entered, release = threading.Event(), threading.Event()
    recorded = Lease.execute

    def held(self, inputs, outputs, cancel):  # the run of value 2 waits for the test (a gate on the ONNX model)
        if int(np.asarray(inputs["INPUT"]).reshape(-1)[0]) == 2:
            entered.set()
            assert release.wait(WAIT)
        return recorded(self, inputs, outputs, cancel)

    monkeypatch.setattr(Lease, "execute", held)
    assert env.infer("acc2", 1, 1, start=True).result() == 1
    assert env.infer("acc2", 10, 2, start=True).result() == 10  # open at once, as on Triton
    assert env.table("acc2").slots_in_use == (0, 1)
    first = env.infer("acc2", 2, 1)
    assert entered.wait(WAIT)
    other = env.infer("acc2", 20, 2)  # pinned to the same context: waits for it
    env.lab.wait_until(lambda: env.lab.status("acc2").queued_requests == 1, "sequence 2's request queued")
    assert [value for _, value in runs] == [1.0, 10.0]  # 20 has not run: 2 holds the context
    release.set()
    assert (first.result(), other.result()) == (3, 30)
    assert [value for _, value in runs] == [1.0, 10.0, 2.0, 20.0]
    assert len({context for context, _ in runs}) == 1
    late = env.infer("acc2", 5, 3, start=True, timeout_us=50_000).error()  # a third sequence: no sequence slot
    assert isinstance(late, AdmissionTimeout) and "(2 sequence slots, all held" in str(late), late
    assert env.infer("acc2", 1, 1, end=True).result() == 4 and env.infer("acc2", 1, 2, end=True).result() == 31
    assert env.table("acc2").open == 0


@cell("SEQUENCE.02")
def test_a_start_without_a_free_slot_waits_fifo_until_its_deadline(sequences):
    env = sequences(slots=1)
    env.infer("seq", 1.0, 1, start=True).result()
    late = env.infer("seq", 2.0, 2, start=True, timeout_us=50_000)
    error = late.error()
    assert isinstance(error, AdmissionTimeout) and "no free sequence slot for sequence 2" in str(error)
    assert describe(error)[2] == "server_busy"
    waiting = [env.infer("seq", 3.0, 3, start=True)]
    env.wait_table("seq", lambda s: s.waiting_starts == 1, "sequence 3 waiting for a slot")
    waiting.append(env.infer("seq", 4.0, 4, start=True, end=True))
    env.wait_table("seq", lambda s: s.waiting_starts == 2, "sequences 3 and 4 waiting for a slot")
    assert env.entry("seq").sequences.pending_count() == 2  # nv_inference_pending_request_count counts them
    env.infer("seq", 5.0, 1, end=True).result()  # frees the slot: it goes to 3, the oldest
    assert waiting[0].result() == 3.0
    env.wait_table("seq", lambda s: s.open == 1 and s.waiting_starts == 1, "3 open, 4 still waiting")
    env.infer("seq", 6.0, 3, end=True).result()
    assert waiting[1].result() == 4.0
    assert env.table("seq").open == 0


@cell("SEQUENCE.03")
def test_an_idle_sequence_is_ended_and_its_next_request_is_told(sequences):
    env = sequences(slots=1, idle_us=200_000)
    env.infer("seq", 1.0, 1, start=True).result()
    waiting = env.infer("seq", 2.0, 2, start=True)  # wakes when sequence 1's idle time is up, takes its slot
    assert waiting.result() == 2.0
    assert env.table("seq").idle_ended == 1
    error = env.infer("seq", 3.0, 1).error()
    assert isinstance(error, SequenceNotStarted) and describe(error)[2] == "invalid_request_error"
    assert str(error).startswith(  # Triton's words first, then why
        "inference request for sequence 1 to model 'seq' must specify the START flag on the first request of the "
        "sequence: the sequence was ended because it was idle for more than 200000"
    ), error


@cell("SEQUENCE.04")
def test_requests_without_an_id_or_for_no_open_sequence_are_refused_and_lose_nothing(sequences):
    env = sequences(slots=1)
    env.infer("seq", 1.0, 1, start=True).result()
    no_id = env.infer("seq", 1.0, 0).error()
    assert "must specify a non-zero or non-empty correlation ID" in str(no_id)
    never = env.infer("seq", 1.0, 9).error()
    assert "sequence 9 to model 'seq' must specify the START flag on the first request" in str(never)
    assert describe(no_id)[0].name == describe(never)[0].name == "INVALID_ARGUMENT"
    assert env.infer("seq", 2.0, 1, end=True).result() == 2.0  # sequence 1 kept its slot
    assert env.table("seq").open == 0 and env.lab.status("seq").state is ModelState.READY


@cell("SEQUENCE.05")
@pytest.mark.parametrize("operation", ["reconfigure", "unload"])
def test_a_manager_waits_for_the_running_request_not_for_open_sequences_and_ends_them(sequences, operation):
    env = sequences(slots=2)
    env.infer("seq", 1.0, 1, start=True).result()
    env.infer("seq", 1.0, 2, start=True).result()  # open, idle: the manager does not wait for it
    gate = env.lab.gate("seq", "execute").hold()
    running = env.infer("seq", 2.0, 1)
    gate.wait_blocked(1)
    if operation == "reconfigure":
        manager = env.lab.register("seq", slots=2, admission_timeout=5.0)
    else:
        manager = env.lab.unload("seq")
    env.lab.wait_queued("seq", managers=1)
    queued = env.infer("seq", 3.0, 1)  # sequence 1's next request: its turn waits behind the running one
    gate.release()
    assert running.result() == 2.0  # the running request finished before the manager went
    manager.result()
    why = "reconfigured" if operation == "reconfigure" else "unloaded"
    error = queued.error()
    assert isinstance(error, SequenceNotStarted) and f"because its model was {why}" in str(error)
    later = env.infer("seq", 4.0, 2).error()
    assert isinstance(later, SequenceNotStarted) and f"because its model was {why}" in str(later)
    assert env.table("seq").open == 0
    assert env.infer("seq", 5.0, 2, start=True).result() == 5.0  # a new start runs on the new configuration


@cell("SEQUENCE.06")
def test_a_model_with_open_sequences_is_not_evicted_until_they_end(sequences):
    env = sequences(slots=1, max_resident_models=1)
    env.infer("seq", 1.0, 1, start=True).result()
    assert env.lab.status("seq").active_slots == 0  # nothing runs: only the sequence holds it
    error = env.lab.infer("other").error()
    assert isinstance(error, ResidencyLimit), error
    assert env.lab.status("seq").loaded and env.table("seq").open == 1
    env.infer("seq", 2.0, 1, end=True).result()
    assert env.lab.infer("other").result()["OUTPUT0"][0] == 1.0  # evicted once its sequence ended
    assert not env.lab.status("seq").loaded


@cell("SEQUENCE.07")
def test_idle_retirement_skips_a_model_with_open_sequences(sequences):
    env = sequences(slots=1)
    env.infer("seq", 1.0, 1, start=True).result()
    entry = env.entry("seq")
    assert entry.retire_if_idle("idle_retired") is False  # the reaper's own call
    assert env.lab.status("seq").loaded and env.table("seq").open == 1
    env.infer("seq", 2.0, 1, end=True).result()
    assert entry.retire_if_idle("idle_retired") is True
    assert not env.lab.status("seq").loaded


@cell("SEQUENCE.08")
def test_shutdown_closes_a_model_with_open_sequences_and_ends_them(sequences):
    env = sequences(slots=2)
    env.infer("seq", 1.0, 1, start=True).result()
    env.infer("seq", 1.0, 2, start=True).result()
    closed, held = env.lab.registry.close_idle_models()  # the shutdown's close does not wait for sequences
    assert "seq" in closed and "seq" not in held
    assert env.table("seq").open == 0
    error = env.infer("seq", 2.0, 1).error()
    assert isinstance(error, SequenceNotStarted) and "because its model was closed at shutdown" in str(error)
    env.entry("seq").admission.close()  # what the server does at shutdown before closing models
    refused = env.infer("seq", 3.0, 3, start=True).error()
    assert isinstance(refused, ShuttingDown), refused


@cell("SEQUENCE.09")
def test_no_sequence_slot_leaks(sequences):
    """Every way a sequence or a start can end gives its slot back: END (after a good run and after a failed
    one), idle, a start that times out or is cancelled while waiting, a manager ending it."""
    env = sequences(slots=1, idle_us=300_000)
    env.infer("seq", 1.0, 1, start=True, end=True).result()  # END in the start
    env.infer("seq", 1.0, 2, start=True).result()
    env.lab.gate("seq", "execute").fail_next()
    assert env.infer("seq", 1.0, 2, end=True).error() is not None  # a failed END still ends it
    env.infer("seq", 1.0, 3, start=True).result()
    timed_out = env.infer("seq", 1.0, 4, start=True, timeout_us=20_000).error()
    assert isinstance(timed_out, AdmissionTimeout)
    cancel = CancelToken()
    cancelled = env.infer("seq", 1.0, 5, start=True, cancel=cancel)
    env.wait_table("seq", lambda s: s.waiting_starts == 1, "sequence 5 waiting")
    cancel.cancel("client")
    assert isinstance(cancelled.error(), RequestCancelled)
    assert env.infer("seq", 1.0, 6, start=True).result() == 1.0  # takes 3's slot once 3 is idle
    env.lab.unload("seq").result()  # ends 6
    for sequence_id in (7, 8):  # the one slot is free each time: no start waits
        assert env.infer("seq", 1.0, sequence_id, start=True, end=True).result() == 1.0
    stats = env.table("seq")
    assert (stats.open, stats.waiting_starts, stats.running, stats.queued_turns, stats.slots_in_use) == (
        0,
        0,
        0,
        0,
        (),
    )


@cell("SEQUENCE.10")
def test_implicit_state_is_kept_per_sequence_on_the_server(sequences):
    env = sequences(slots=2)
    a, b = [1, 2, 3, 4], [100, 200, 300, 400]
    got: dict[int, list[int]] = {1: [], 2: []}
    for index in range(4):
        for sequence_id, values in ((1, a), (2, b)):
            op = env.infer("acc", values[index], sequence_id, start=index == 0, end=index == 3)
            got[sequence_id].append(int(op.result()))
    assert got == {1: expected_sums(a), 2: expected_sums(b)}
    env.infer("acc", 5, 3, start=True).result()
    assert env.infer("acc", 6, 3).result() == 11
    assert env.infer("acc", 7, 3, start=True).result() == 7  # a START on an open sequence restarts its state
    assert env.infer("acc", 1, 3, end=True).result() == 8


@cell("SEQUENCE.11")
@pytest.mark.parametrize(
    "head, block, field",
    [
        (
            "max_batch_size: 2\nmodel_transaction_policy { decoupled: true }",
            "oldest { max_candidate_sequences: 2 }",
            "sequence_batching.oldest: not supported for a decoupled model",
        ),
        (
            "model_transaction_policy { decoupled: true }",
            'state [ { input_name: "SI" output_name: "SO" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            "sequence_batching.state: not supported for a decoupled model",
        ),
        ("", "oldest { max_candidate_sequences: -1 }", "max_candidate_sequences must not be negative, got -1"),
    ],
)
def test_sequence_settings_that_cannot_work_are_refused_at_load_naming_the_field(tmp_path, head, block, field):
    from engine.config.repository import ModelRepository

    directory = tmp_path / "m"
    directory.mkdir()
    config = f'name: "m"\nbackend: "python"\n{head}\nsequence_batching {{ {block} }}\n'
    (directory / "config.pbtxt").write_text(config)
    (directory / "1").mkdir()
    (directory / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    # (iterative_sequence: SEQUENCE.13; oldest with max_batch_size 0 loads and runs each request alone, as Triton)
    with pytest.raises(Exception) as refused:
        ModelRepository(tmp_path).read("m")
    assert field in str(refused.value) and describe(refused.value)[0].name == "INVALID_ARGUMENT"


@cell("SEQUENCE.11")
def test_a_model_without_a_filled_input_is_refused_at_load_naming_it(tmp_path):
    root = tmp_path / "repository"
    directory = write_accumulate(root, "acc")
    config = (directory / "config.pbtxt").read_text().replace('name: "START"', 'name: "BEGIN"')
    (directory / "config.pbtxt").write_text(config)
    lab = Lab(root, {}, load=False)
    lab.runtime.backends["onnxruntime"] = OnnxRuntimeBackend()  # type: ignore[index]
    try:
        error = lab.register("acc").error()
        assert error is not None and "sequence_batching fills input 'BEGIN', which is not in the model" in str(error)
    finally:
        lab.close()


def test_concurrent_sequences_on_the_dataplane_keep_their_sums(sequences):
    """Eight sequences on two slots, each driven by its own thread (starts wait for slots in turn)."""
    env = sequences(slots=2)
    results: dict[int, list[int]] = {}

    def drive(sequence_id: int) -> None:
        values = [sequence_id * 10 + k for k in range(5)]
        results[sequence_id] = [
            int(env.infer("acc", v, sequence_id, start=k == 0, end=k == 4).result()) for k, v in enumerate(values)
        ]

    threads = [threading.Thread(target=drive, args=(sequence_id,)) for sequence_id in range(1, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {s: expected_sums([s * 10 + k for k in range(5)]) for s in range(1, 9)}
    assert env.table("acc").open == 0


def write_oldest(root, *, candidates: int = 4) -> None:
    write_fixture_sequence(
        root,
        "seqo",
        slots=1,
        idle_us=30_000_000,
        max_batch_size=4,
        strategy=f"oldest {{ max_candidate_sequences: {candidates} }}",
    )
    write_accumulate(
        root,
        "acco",
        batched=True,
        max_batch_size=4,
        idle_us=30_000_000,
        strategy="oldest { max_candidate_sequences: 4 }",
    )


def oldest_request(model: str, value, sequence_id, *, start=False, end=False) -> pb.ModelInferRequest:
    request = message(model, value, sequence_id, start=start, end=end, datatype="FP32" if model == "seqo" else "INT32")
    request.inputs[0].shape[:] = [1, 1]
    return request


@cell("SEQUENCE.12")
def test_oldest_batches_the_next_requests_of_different_sequences_each_in_order(tmp_path):
    root = tmp_path / "repository"
    write_oldest(root)
    lab = Lab(root, {}, load=False, parallel_jobs=1)
    lab.runtime.backends["onnxruntime"] = OnnxRuntimeBackend()  # type: ignore[index]
    dataplane = Dataplane(lab.registry, clock=lab.clock)

    def infer(model, value, sequence_id, **flags):
        request = oldest_request(model, value, sequence_id, **flags)

        def run():
            response = dataplane.infer(inference_request(request, as_message), cancel=CancelToken())
            dtype = np.float32 if model == "seqo" else np.int32
            return float(np.frombuffer(response.raw_output_contents[0], dtype)[0])

        return lab.start(f"{model}:{sequence_id}:{value}", run)

    try:
        for sequence_id in (1, 2, 3, 4):
            assert infer("seqo", sequence_id, sequence_id, start=True).result() == sequence_id
        gate = lab.gate("seqo", "execute").hold()
        first = infer("seqo", 10.0, 1)
        gate.wait_blocked(1)
        later = infer("seqo", 11.0, 1)  # sequence 1's next: waits for its turn, so not in the next batch
        others = [infer("seqo", 20.0 + s, s) for s in (2, 3, 4)]
        entry = lab.registry.get("seqo")
        lab.wait_until(lambda: entry.admission.statistics().queued_requests == 3, "3 sequences' requests queued")
        assert entry.sequences.statistics().queued_turns == 1
        gate.release()
        assert first.result() == 10.0 and [op.result() for op in others] == [22.0, 23.0, 24.0]
        assert later.result() == 11.0
        batches = lab.controls.batches("seqo")
        assert batches[-2:] == [3, 1], batches  # 2, 3 and 4 together; then 1's next request
        counts = entry.statistics.snapshot()
        assert (counts.inference_count, counts.execution_count) == (9, len(batches))  # a batch counts one run
        # A fifth sequence waits for one of the four candidates to end.
        fifth = infer("seqo", 5.0, 5, start=True, end=True)
        lab.wait_until(lambda: entry.sequences.statistics().waiting_starts == 1, "sequence 5 waiting")
        infer("seqo", 0.0, 2, end=True).result()
        assert fifth.result() == 5.0

        # Implicit state per sequence, batched: four interleaved accumulators.
        results: dict[int, list[int]] = {}

        def drive(sequence_id: int) -> None:
            values = [sequence_id * 100 + k for k in range(4)]
            results[sequence_id] = [
                int(infer("acco", v, sequence_id, start=k == 0, end=k == 3).result()) for k, v in enumerate(values)
            ]

        threads = [threading.Thread(target=drive, args=(s,)) for s in (1, 2, 3, 4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert results == {s: expected_sums([s * 100 + k for k in range(4)]) for s in (1, 2, 3, 4)}
        assert lab.registry.get("acco").sequences.statistics().open == 0
    finally:
        lab.close()


def rescheduling(monkeypatch) -> list[float]:
    """Make every run of a request with INPUT0 = n > 1 reschedule it until its n-th execution, as a python model with
    `set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)` does (the engine raises RequestRescheduled); returns
    INPUT0 of every execution, in run order."""
    runs: list[float] = []
    left: dict[float, int] = {}
    execute = Lease.execute

    def run(self, inputs, outputs, cancel):
        value = float(np.asarray(inputs["INPUT0"]).reshape(-1)[0])
        runs.append(value)
        produced = execute(self, inputs, outputs, cancel)
        left[value] = left.get(value, int(value)) - 1
        if left[value] > 0:
            raise RequestRescheduled("rescheduled by the test's model")
        return produced

    monkeypatch.setattr(Lease, "execute", run)
    return runs


@cell("SEQUENCE.13")
def test_an_iterative_sequences_rescheduled_request_runs_again_through_admission(sequences, monkeypatch):
    env = sequences(slots=1)  # iter: two sequence slots, both on the one context
    runs = rescheduling(monkeypatch)
    gate = env.lab.gate("iter", "execute").hold()
    three = env.infer("iter", 3.0, 0)  # no id: a sequence of its own, three executions
    gate.wait_blocked(1)
    one = env.infer("iter", 1.0, 0)  # another sequence: its request queues for the context behind the first run
    env.lab.wait_queued("iter", requests=1)
    gate.release()
    assert (three.result(), one.result()) == (3.0, 1.0)
    # The rescheduled request went back through admission: the other sequence's request ran between its executions.
    assert runs == [3.0, 1.0, 3.0, 3.0]
    stats = env.table("iter")
    assert stats.open == 0 and stats.running == 0 and stats.queued_turns == 0  # each request's end ended its sequence
    assert env.entry("iter").statistics.snapshot().success.count == 2  # counted per request, not per execution
    error = env.infer("iter", 1.0, 5).error()  # an id of one's own still needs its START
    assert isinstance(error, SequenceNotStarted) and describe(error)[0].name == "INVALID_ARGUMENT"


@cell("SEQUENCE.13")
def test_an_iterative_streaming_models_answers_come_from_every_execution(sequences, monkeypatch):
    env = sequences(slots=1)
    executions = []
    stream = Lease.execute_stream

    def run(self, inputs, outputs, cancel):  # two answers per execution; reschedules after the first execution
        executions.append(cancel.request.flags)
        yield from stream(self, inputs, outputs, cancel)
        if len(executions) == 1:
            raise RequestRescheduled("rescheduled by the test's model")

    monkeypatch.setattr(Lease, "execute_stream", run)
    request = message("iter_stream", 4.0, 0)
    answers = list(env.dataplane.infer_stream(inference_request(request, as_message), cancel=CancelToken()))
    assert len(answers) == 4 and executions == [1, 0]  # START on the first execution only (Triton's flags)
    assert [a.parameters["triton_final_response"].bool_param for a in answers] == [False, False, False, False]
    assert env.table("iter_stream").open == 0
    unary = env.infer("iter_stream", 4.0, 0).error()  # ModelInfer: Triton's words for a decoupled model
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in str(unary)
