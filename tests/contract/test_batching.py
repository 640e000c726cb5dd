"""Dynamic batching cells (BATCH.nn, tests/contract/batching_cells.tsv): the admission rule that forms batches,
and each request's own contract inside one. Fixture models whose gates hold a whole batch at `execute`; requests
go through the real request path (decode, check, admission, batch run, split, encode) of a Dataplane over a
real registry; `FixtureControls.batches` records the rows of every engine run. Orders come from the gates and
the models' statistics, never from sleeps; delays and deadlines run on a fake clock the tests move."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ExecutionError
from engine.interface import CancelToken
from generated import grpc_service_pb2 as pb
from service.core.errors import AdmissionTimeout, RequestCancelled, ResidencyLimit
from service.core.lifecycle import ModelState
from service.request_path.dataplane import Dataplane
from service.transport.status_codes import describe
from service.transport.tensors import as_message, inference_request

from .harness import FakeClock, Lab

cell = pytest.mark.cell


def write_batching_model(
    root,
    name: str,
    max_batch_size: int = 8,
    *,
    delay_us: int = 0,
    preferred=(),
    block: bool = True,
    extra: str = "",
    parameters: dict | None = None,
) -> None:
    """A fixture model (output = input) with INPUT0 FP32 [-1] after the batch dimension, and a
    dynamic_batching block unless `block` is False."""
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    lines = [
        f'name: "{name}"',
        'backend: "fixture"',
        f"max_batch_size: {max_batch_size}",
        'input { name: "INPUT0" data_type: TYPE_FP32 dims: -1 }',
        'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: -1 }',
    ]
    for key, value in (parameters or {"capacity": "1"}).items():
        lines.append(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}')
    if block:
        sizes = "".join(f" preferred_batch_size: {size}" for size in preferred)
        lines.append(f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us}{sizes} {extra} }}")
    (directory / "config.pbtxt").write_text("\n".join(lines) + "\n")


def rows_of(value: float, rows: int = 1, width: int = 2) -> np.ndarray:
    """`rows` rows, each `width` wide; row i holds value + i (so every row of a batch is recognisable)."""
    return (np.arange(rows, dtype=np.float32)[:, None] + np.float32(value)) * np.ones((1, width), np.float32)


def request(model: str, array: np.ndarray, datatype: str = "FP32", timeout_us: int = 0) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name="INPUT0", datatype=datatype, shape=list(array.shape))
    message.raw_input_contents.append(array.tobytes())
    if timeout_us:
        message.parameters["timeout"].int64_param = timeout_us
    return message


def output(response) -> np.ndarray:
    shape = tuple(response.outputs[0].shape)
    return np.frombuffer(response.raw_output_contents[0], np.float32).reshape(shape)


class Batching:
    """A Lab whose requests go through a Dataplane, with the helpers these cells need."""

    def __init__(self, tmp_path, models: dict, *, clock=None, **lab_options) -> None:
        root = tmp_path / "repository"
        for name, options in models.items():
            write_batching_model(root, name, **options)
        self.clock = clock or FakeClock()
        self.lab = Lab(root, {"plain": {}}, clock=self.clock, **lab_options)
        self.dataplane = Dataplane(self.lab.registry, clock=self.clock)
        self.controls = self.lab.controls

    def infer(
        self,
        model: str,
        array: np.ndarray,
        *,
        cancel: CancelToken | None = None,
        name: str = "",
        timeout_us: int = 0,
        datatype: str = "FP32",
    ):
        message = request(model, array, datatype, timeout_us)
        return self.lab.start(
            name or f"infer:{model}",
            lambda: output(
                self.dataplane.infer(inference_request(message, as_message), cancel=cancel or CancelToken())
            ),
        )

    def entry(self, model: str):
        return self.lab.registry.get(model)

    def wait_queued_requests(self, model: str, count: int) -> None:
        self.lab.wait_until(
            lambda: self.entry(model).admission.statistics().queued_requests == count,
            f"{count} requests queued on {model}",
        )

    def poke(self, model: str) -> None:
        self.entry(model).admission.poke()

    def close(self) -> None:
        self.lab.close()


@pytest.fixture
def batching(tmp_path):
    made = []

    def make(models: dict, **options) -> Batching:
        made.append(Batching(tmp_path / str(len(made)), models, **options))
        return made[-1]

    yield make
    for item in made:
        item.close()


def start_busy(env: Batching, model: str, value: float = 100.0):
    """A request that found the slot free and runs alone, held at its `prepare` gate (so that the next run, the
    first batch, can be held at `execute` on its own). Returns (the running op, the prepare gate)."""
    gate = env.lab.gate(model, "prepare").hold()
    running = env.infer(model, rows_of(value), name="running")
    gate.wait_blocked(1)
    return running, gate


def hold_next_batch(env: Batching, model: str):
    """Hold the model's next run (the first after the running one) at its execute gate."""
    return env.lab.gate(model, "execute").hold_from(2)


def run_a_held_batch(env: Batching, count: int):
    """`count` requests (each with its own cancel token) queued behind a running one in index order (the first
    leads the batch), then run as one batch held at its execute gate. Returns (the execute gate, the tokens, the
    requests)."""
    running, gate = start_busy(env, "m")
    execute = hold_next_batch(env, "m")
    tokens = [CancelToken() for _ in range(count)]
    members = []
    for index in range(count):  # one at a time: each thread's arrival, not its start, decides its batch place
        members.append(env.infer("m", rows_of(float(index)), cancel=tokens[index], name=f"member{index}"))
        env.wait_queued_requests("m", index + 1)
    gate.release()
    running.result()
    execute.wait_blocked(1)  # the batch is executing
    assert env.controls.batches("m") == [1, count]
    return execute, tokens, members


@cell("BATCH.01")
def test_a_freed_slot_takes_the_oldest_requests_that_stack_and_stops_at_the_first_that_does_not(batching):
    env = batching({"m": {}})
    running, gate = start_busy(env, "m")
    a1 = env.infer("m", rows_of(1.0), name="a1")
    a2 = env.infer("m", rows_of(2.0), name="a2")
    env.wait_queued_requests("m", 2)
    wide = env.infer("m", rows_of(3.0, width=3), name="wide")  # another shape after the batch dimension
    env.wait_queued_requests("m", 3)
    a3 = env.infer("m", rows_of(4.0), name="a3")  # stacks with a1 and a2, but is younger than `wide`
    env.wait_queued_requests("m", 4)
    gate.release()
    for op, value, width in ((running, 100.0, 2), (a1, 1.0, 2), (a2, 2.0, 2), (wide, 3.0, 3), (a3, 4.0, 2)):
        np.testing.assert_array_equal(op.result(), rows_of(value, width=width))
    assert env.controls.batches("m") == [1, 2, 1, 1]  # [running], [a1 a2], [wide], [a3]: never a3 before wide
    stats = env.entry("m").statistics.snapshot()
    assert (stats.execution_count, stats.inference_count, stats.success.count) == (4, 5, 5)
    assert [(b.batch_size, b.count) for b in stats.batch_stats] == [(1, 3), (2, 1)]


@cell("BATCH.02")
def test_no_batch_crosses_a_queued_manager(batching):
    env = batching({"m": {}})
    running, gate = start_busy(env, "m")
    before = [env.infer("m", rows_of(v), name=f"before{v}") for v in (1.0, 2.0)]
    env.wait_queued_requests("m", 2)
    manager = env.lab.register("m", options={"marker": "new"})  # reconfigures in place (same engine)
    env.lab.wait_status("m", lambda s: s.queued_managers == 1, "the manager queued")
    after = [env.infer("m", rows_of(v), name=f"after{v}") for v in (3.0, 4.0)]
    env.wait_queued_requests("m", 4)
    gate.release()
    for op, value in zip([running, *before, *after], (100.0, 1.0, 2.0, 3.0, 4.0), strict=True):
        np.testing.assert_array_equal(op.result(), rows_of(value))
    assert manager.result().state is ModelState.READY
    assert env.controls.batches("m") == [1, 2, 2]  # [running], [before ...], manager alone, [after ...]
    assert env.entry("m").spec.parameter("marker") == "new"


@cell("BATCH.03")
def test_a_queued_member_expires_at_its_own_deadline_and_the_batch_forms_without_it(batching):
    env = batching({"m": {}})
    running, gate = start_busy(env, "m")
    early = env.infer("m", rows_of(1.0), name="early", timeout_us=2_000_000)  # a 2 s admission deadline
    late = env.infer("m", rows_of(2.0), name="late")
    env.wait_queued_requests("m", 2)
    env.clock.now += 3.0
    env.poke("m")
    error = early.error()
    assert isinstance(error, AdmissionTimeout) and describe(error)[2] == "server_busy"
    env.wait_queued_requests("m", 1)
    gate.release()
    running.result()
    np.testing.assert_array_equal(late.result(), rows_of(2.0))
    assert env.controls.batches("m") == [1, 1]


@cell("BATCH.04")
def test_a_member_that_gives_up_while_its_batch_runs_is_cancelled_and_the_others_get_their_results(batching):
    env = batching({"m": {}})
    execute, tokens, members = run_a_held_batch(env, 3)
    tokens[1].cancel("client")
    assert isinstance(members[1].error(), RequestCancelled)  # at once, while the batch still runs
    assert env.lab.status("m").active_slots == 1  # the batch keeps its slot
    execute.release()
    np.testing.assert_array_equal(members[0].result(), rows_of(0.0))
    np.testing.assert_array_equal(members[2].result(), rows_of(2.0))
    stats = env.entry("m").statistics.snapshot()
    assert stats.success.count == 3 and stats.failures == {"cancelled": 1}


@cell("BATCH.05")
def test_a_batch_whose_every_member_gave_up_is_terminated_and_the_slot_comes_back(batching):
    env = batching({"m": {}})
    execute, tokens, members = run_a_held_batch(env, 2)
    for token in tokens:
        token.cancel("client")
    for member in members:
        assert describe(member.error())[0].name == "CANCELLED"
    env.lab.wait_status("m", lambda s: s.active_slots == 0, "the slot back")  # the held run was terminated
    execute.release()
    np.testing.assert_array_equal(env.infer("m", rows_of(7.0)).result(), rows_of(7.0))
    assert env.entry("m").statistics.snapshot().execution_count == 2  # the terminated run is not counted


@cell("BATCH.06")
def test_a_batch_waiting_for_members_goes_at_the_earliest_deadline_of_its_members(batching):
    env = batching({"m": {"delay_us": 10_000_000}})  # a free slot may wait 10 s for more members
    first = env.infer("m", rows_of(1.0), name="first", timeout_us=2_000_000)  # but this one's deadline is 2 s
    env.wait_queued_requests("m", 1)
    second = env.infer("m", rows_of(2.0), name="second")
    env.wait_queued_requests("m", 2)
    env.clock.now += 1.0
    env.poke("m")
    assert env.entry("m").admission.statistics().queued_requests == 2 and env.controls.batches("m") == []
    env.clock.now += 1.0  # the first member's deadline
    env.poke("m")
    np.testing.assert_array_equal(first.result(), rows_of(1.0))  # served at its deadline, not expired
    np.testing.assert_array_equal(second.result(), rows_of(2.0))
    assert env.controls.batches("m") == [2]


@cell("BATCH.07")
def test_a_delayed_batch_goes_as_soon_as_it_reaches_a_preferred_size(batching):
    env = batching({"m": {"delay_us": 10_000_000, "preferred": (3,)}, "eager": {}})
    members = []
    for index in range(2):
        members.append(env.infer("m", rows_of(float(index)), name=f"m{index}"))
        env.wait_queued_requests("m", index + 1)
    assert env.controls.batches("m") == []  # two rows: it waits for a third (or the delay)
    members.append(env.infer("m", rows_of(2.0), name="m2"))  # three rows: a preferred size, it goes at once
    for index, member in enumerate(members):
        np.testing.assert_array_equal(member.result(), rows_of(float(index)))
    assert env.controls.batches("m") == [3]
    # Without a delay a request that finds a free slot runs at once, alone: idle adds no latency.
    np.testing.assert_array_equal(env.infer("eager", rows_of(5.0)).result(), rows_of(5.0))
    assert env.controls.batches("eager") == [1]


@cell("BATCH.08")
def test_rows_add_up_to_max_batch_size_and_a_request_that_would_pass_it_leads_the_next_batch(batching):
    env = batching({"m": {"max_batch_size": 4}})
    running, gate = start_busy(env, "m")
    three = env.infer("m", rows_of(1.0, rows=3), name="three")
    env.wait_queued_requests("m", 1)
    two = env.infer("m", rows_of(2.0, rows=2), name="two")
    env.wait_queued_requests("m", 2)
    one = env.infer("m", rows_of(3.0, rows=1), name="one")
    env.wait_queued_requests("m", 3)
    gate.release()
    running.result()
    for op, value, rows in ((three, 1.0, 3), (two, 2.0, 2), (one, 3.0, 1)):
        np.testing.assert_array_equal(op.result(), rows_of(value, rows=rows))
    assert env.controls.batches("m") == [1, 3, 3]  # [running], [three] (two would make 5), [two one]
    too_many = env.infer("m", rows_of(9.0, rows=5)).error()
    assert isinstance(too_many, Exception) and describe(too_many)[2] == "invalid_request_error"
    assert "batch size 5; the model accepts 1..4" in str(too_many)


@cell("BATCH.09")
def test_batching_settings_change_in_place_with_the_engine_kept(batching):
    env = batching({"m": {"delay_us": 10_000_000, "preferred": (4,)}}, parallel_jobs=1)
    loads = env.controls.count("m", "load")
    config = (
        '{"name": "m", "backend": "fixture", "max_batch_size": 8, '
        '"input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}], '
        '"output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}], '
        '"parameters": {"capacity": {"string_value": "1"}}, '
        '"dynamic_batching": {"preferred_batch_size": [2], "max_queue_delay_microseconds": "10000000"}}'
    )
    status = env.lab.register("m", config_json=config).result()
    assert status.state is ModelState.READY and env.controls.count("m", "load") == loads  # weights stayed
    assert env.entry("m").spec.batching.preferred_batch_sizes == (2,)
    first = env.infer("m", rows_of(1.0), name="first")
    env.wait_queued_requests("m", 1)
    second = env.infer("m", rows_of(2.0), name="second")  # two rows: the new preferred size
    np.testing.assert_array_equal(first.result(), rows_of(1.0))
    np.testing.assert_array_equal(second.result(), rows_of(2.0))
    assert env.controls.batches("m") == [2]


@cell("BATCH.10")
def test_a_model_running_a_batch_is_busy_for_eviction(batching):
    env = batching({"m": {}, "n": {}}, load=False, max_resident_models=1)
    gate = env.lab.gate("m", "execute").hold_from(2)
    np.testing.assert_array_equal(env.infer("m", rows_of(0.0)).result(), rows_of(0.0))  # m is resident
    members = [env.infer("m", rows_of(float(i)), name=f"member{i}") for i in (1, 2)]
    gate.wait_blocked(1)  # the first arrived alone and holds the slot ...
    env.wait_queued_requests("m", 1)  # ... the second waits for it
    refused = env.infer("n", rows_of(5.0)).error()
    assert isinstance(refused, ResidencyLimit), refused  # m is busy: it is no eviction victim
    gate.release()
    for index, member in enumerate(members, start=1):
        np.testing.assert_array_equal(member.result(), rows_of(float(index)))
    assert env.lab.residency.resident_names() == ["m"]


@cell("BATCH.13")
def test_an_engine_error_fails_every_member_with_the_same_status(batching):
    env = batching({"m": {}})
    running, gate = start_busy(env, "m")
    members = [env.infer("m", rows_of(float(i)), name=f"member{i}") for i in range(3)]
    env.wait_queued_requests("m", 3)
    env.lab.gate("m", "execute").fail_arrival(2, ExecutionError("the engine broke"))  # the batch's run
    gate.release()
    running.result()
    errors = [member.error() for member in members]
    assert all(isinstance(error, ExecutionError) for error in errors), errors
    assert len({id(error) for error in errors}) == 3  # each its own object
    assert {describe(error)[0].name for error in errors} == {"INTERNAL"}
    assert env.lab.status("m").active_slots == 0


@cell("BATCH.14")
def test_bad_input_is_refused_before_it_can_join_or_stop_a_batch(batching):
    env = batching({"m": {}})
    running, gate = start_busy(env, "m")
    good = [env.infer("m", rows_of(1.0), name="good1")]
    env.wait_queued_requests("m", 1)
    bad = env.infer("m", np.ones((1, 2), np.int32), datatype="INT32", name="bad").error()  # refused at once
    assert isinstance(bad, Exception) and describe(bad)[2] == "invalid_request_error"
    assert "datatype INT32, the model expects FP32" in str(bad)
    good.append(env.infer("m", rows_of(2.0), name="good2"))
    env.wait_queued_requests("m", 2)
    gate.release()
    running.result()
    for index, op in enumerate(good, start=1):
        np.testing.assert_array_equal(op.result(), rows_of(float(index)))
    assert env.controls.batches("m") == [1, 2]  # the bad request never stood between them


@cell("BATCH.15")
def test_without_the_block_or_without_a_batch_dimension_each_request_runs_alone(batching, caplog):
    env = batching({"plain8": {"block": False}, "flat": {"max_batch_size": 0}})
    assert env.entry("plain8").spec.batching is None and env.entry("flat").spec.batching is None
    assert "dynamic_batching ignored: max_batch_size is 0" in caplog.text
    running, gate = start_busy(env, "plain8")
    queued = [env.infer("plain8", rows_of(float(i)), name=f"q{i}") for i in (1, 2)]
    env.lab.wait_status("plain8", lambda s: s.queued_requests == 2, "two queued")
    gate.release()
    for op in [running, *queued]:
        op.result()
    assert env.controls.batches("plain8") == [1, 1, 1]
    assert env.entry("plain8").statistics.snapshot().execution_count == 3


@cell("BATCH.16")
@pytest.mark.parametrize(
    "block, field",
    [
        ("dynamic_batching { priority_levels: 2 }", "default priority level must be in range [1, 2] for m"),
        (
            "dynamic_batching { priority_levels: 2 default_priority_level: 1\n"
            "priority_queue_policy { key: 3 value { } } }",
            "priority queue policy must have priority level in range [1, 2] for m",
        ),
        (
            'dynamic_batching { }\ninput { name: "R" data_type: TYPE_FP32 dims: -1 allow_ragged_batch: true }',
            "allow_ragged_batch",
        ),
        ("dynamic_batching { preferred_batch_size: 16 }", "preferred_batch_size 16 is outside 1..8"),
        ("model_transaction_policy { decoupled: true }", "model_transaction_policy.decoupled"),
        ("ensemble_scheduling { }", "ensemble_scheduling"),
    ],
)
def test_settings_slotserve_does_not_implement_are_refused_at_load_naming_the_field(tmp_path, block, field):
    from engine.config.repository import ModelRepository

    directory = tmp_path / "m"
    directory.mkdir()
    (directory / "config.pbtxt").write_text(f'name: "m"\nbackend: "fixture"\nmax_batch_size: 8\n{block}\n')
    with pytest.raises(Exception) as refused:
        ModelRepository(tmp_path).read("m")
    assert field in str(refused.value)
    assert describe(refused.value)[0].name == "INVALID_ARGUMENT"


def test_the_queue_policy_maps_onto_the_queue_limit_and_the_admission_timeout(batching):
    env = batching(
        {
            "m": {
                "extra": "default_queue_policy { max_queue_size: 1 "
                "default_timeout_microseconds: 3000000 allow_timeout_override: false }"
            }
        }
    )
    settings = env.entry("m").settings
    assert (settings.max_queue, settings.admission_timeout) == (1, 3.0)
    running, gate = start_busy(env, "m")
    queued = env.infer("m", rows_of(1.0), name="queued", timeout_us=1_000)  # its timeout may not shorten 3 s
    env.wait_queued_requests("m", 1)
    full = env.infer("m", rows_of(2.0)).error()
    assert describe(full)[2] == "server_busy" and "queue" in str(full)
    env.clock.now += 1.0
    env.poke("m")
    assert env.entry("m").admission.statistics().queued_requests == 1  # not expired: override not allowed
    env.clock.now += 2.5
    env.poke("m")
    assert isinstance(queued.error(), AdmissionTimeout)
    gate.release()
    running.result()


def test_opportunistic_batching_never_holds_a_request_that_finds_a_free_slot(batching):
    env = batching({"m": {"parameters": {"capacity": "2"}}}, parallel_jobs=2)
    gate = env.lab.gate("m", "execute").hold()
    ops = [env.infer("m", rows_of(float(i)), name=f"r{i}") for i in range(2)]
    gate.wait_blocked(2)  # both found a free slot and run, each alone, at once: nobody waited for a batch
    assert env.entry("m").admission.statistics().queued == 0
    gate.release()
    for index, op in enumerate(ops):
        np.testing.assert_array_equal(op.result(), rows_of(float(index)))
    assert env.controls.batches("m") == [1, 1]


def test_a_bad_request_for_a_model_not_loaded_yet_fails_alone_in_its_batch(batching):
    """Before the first load the metadata is unknown, so a request can only be checked once its batch runs: a
    bad one (another datatype: another key, so a batch of its own) fails alone and the others are served."""
    env = batching({"m": {}}, load=False)
    load = env.lab.gate("m", "load").hold()
    first = env.infer("m", rows_of(1.0), name="first")
    load.wait_blocked(1)
    bad = env.infer("m", np.ones((1, 2), np.int32), datatype="INT32", name="bad")
    env.lab.wait_status("m", lambda s: s.active_slots == 2, "both admitted before the load ends")
    load.release()
    np.testing.assert_array_equal(first.result(), rows_of(1.0))
    error = bad.error()
    assert describe(error)[2] == "invalid_request_error" and "the model expects FP32" in str(error)
