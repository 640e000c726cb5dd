"""A batch's members each keep their own outcome (issue 26: bugs a mutation run planted in batching.py and no test
saw). Fixture models whose gates hold a batch; requests through the real request path (Dataplane) or, where a
member's own last check must be steered, through `ModelEntry.run_batched` with hand-made BatchItems.

* A batch whose every member but one gave up still runs for that one.
* A member that gave up before its batch ran, or failed its own last check, is not computed, and its rows count
  neither in the other members' `batch_rows` nor in the batch-size statistics.
* Requests asking for the same outputs in another order stack together; other output sets do not.
* After a backend fault (an error outside the engine's own), every member gets that error, not "the batch
  ended without an outcome".
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.interface import CancelToken
from generated import grpc_service_pb2 as pb
from service.core.batching import BatchItem, EveryoneGaveUp, batch_key
from service.core.errors import InvalidRequest, RequestCancelled
from service.status_codes import describe

from .harness import WAIT
from .test_batching import Batching, rows_of, run_a_held_batch, start_busy


@pytest.fixture
def batching(tmp_path):
    made = []

    def make(models: dict, **options) -> Batching:
        made.append(Batching(tmp_path / str(len(made)), models, **options))
        return made[-1]

    yield make
    for item in made:
        item.close()


# ---- the small parts -----------------------------------------------------------------------------------------


def test_describe_batching_names_the_rows_the_delay_and_the_preferred_sizes():
    from types import SimpleNamespace

    from engine.config.specs import BatchingSpec
    from service.core.batching import describe_batching

    spec = SimpleNamespace(
        max_batch_size=8, batching=BatchingSpec(max_queue_delay_us=2500, preferred_batch_sizes=(2, 4))
    )
    assert describe_batching(spec) == "up to 8 rows, delay 2500 us, preferred 2/4"
    assert describe_batching(SimpleNamespace(max_batch_size=4, batching=BatchingSpec())) == "up to 4 rows, delay 0 us"
    assert describe_batching(SimpleNamespace(max_batch_size=0, batching=None)) == ""


def test_an_item_without_an_outcome_says_so_instead_of_answering_nothing():
    item = _item(1.0, 1, CancelToken())
    with pytest.raises(RuntimeError, match="the batch ended without an outcome"):
        item.outcome()


def test_a_detached_run_token_no_longer_follows_the_members():
    tokens = [CancelToken() for _ in range(2)]
    run = EveryoneGaveUp(tokens)
    run.detach()
    for token in tokens:
        token.cancel("client")
    assert not run.cancelled


# ---- all but one gave up ------------------------------------------------------------------------------------


def test_the_run_is_cancelled_only_once_every_member_gave_up():
    tokens = [CancelToken() for _ in range(3)]
    run = EveryoneGaveUp(tokens)
    tokens[0].cancel("client")
    tokens[2].cancel("client")
    tokens[2].cancel("again")  # a token that fires twice counts once
    assert not run.cancelled  # tokens[1]'s caller still waits for its result
    tokens[1].cancel("deadline")
    assert run.cancelled and run.reason == "deadline"
    run.detach()


def test_a_batch_whose_every_member_but_one_gave_up_still_runs_for_that_one(batching):
    env = batching({"m": {}})
    execute, tokens, members = run_a_held_batch(env, 3)
    tokens[0].cancel("client")  # the leader's caller: its thread still runs the batch for the others
    tokens[1].cancel("client")
    assert isinstance(members[1].error(), RequestCancelled)
    execute.release()
    np.testing.assert_array_equal(members[2].result(), rows_of(2.0))  # the last one gets its rows
    assert isinstance(members[0].error(), RequestCancelled)
    stats = env.entry("m").statistics.snapshot()
    assert stats.execution_count == 2 and stats.success.count == 2  # the busy request and the last member
    assert env.lab.status("m").active_slots == 0


def test_a_member_that_wakes_at_its_admission_deadline_while_its_batch_runs_waits_on_for_its_result(batching):
    """A member's deadline bounds its queueing only. Its timed wait (0.3 s, on a fake clock that stands still, so
    it is never due) ends while its batch runs: it must go back to waiting for its leader, not give up."""
    import time

    env = batching({"m": {}})
    running, prepare = start_busy(env, "m")
    execute = env.lab.gate("m", "execute").hold_from(2)
    members = [env.infer("m", rows_of(float(i)), timeout_us=300_000, name=f"member{i}") for i in range(3)]
    env.wait_queued_requests("m", 3)
    prepare.release()
    running.result()
    execute.wait_blocked(1)  # granted as one batch, running
    woke = time.monotonic() + 1.0  # each member's 0.3 s wait has ended at least once by then
    env.lab.wait_until(lambda: time.monotonic() > woke, "a second of the members' timed waits")
    execute.release()
    for index, member in enumerate(members):
        np.testing.assert_array_equal(member.result(), rows_of(float(index)))
    assert env.controls.batches("m") == [1, 3]


# ---- members that left before the run, or failed their own check ------------------------------------------


def _item(value: float, rows: int, token: CancelToken, before_run=None) -> BatchItem:
    array = rows_of(value, rows)
    return BatchItem({"INPUT0": array}, {"INPUT0": ("FP32", array.shape)}, [], rows, token, before_run)


def _queue_items(env: Batching, items: list[BatchItem]):
    """Run each item through `run_batched` on its own thread, queued one after the other behind a busy slot."""
    entry = env.entry("m")
    ops = []
    for index, item in enumerate(items):
        ops.append(env.lab.start(f"item{index}", lambda item=item: entry.run_batched(item, None, item.cancel)))
        env.wait_queued_requests("m", index + 1)
    return ops


@pytest.mark.parametrize("how", ["gave-up-before-the-run", "failed-its-own-check"])
def test_a_member_that_does_not_run_is_not_computed_and_its_rows_are_not_counted(batching, how):
    env = batching({"m": {}})
    running, prepare = start_busy(env, "m")
    checking, go = threading.Event(), threading.Event()

    def leader_checks() -> None:  # the leader's own last check, the first of its batch: held until `go`
        checking.set()
        assert go.wait(WAIT), "the test never let the batch go on"

    def region_gone() -> None:
        raise InvalidRequest("invalid_request_error: the member's input region was unregistered")

    tokens = [CancelToken() for _ in range(3)]
    items = [
        _item(0.0, 1, tokens[0], leader_checks),
        _item(1.0, 2, tokens[1], region_gone if how == "failed-its-own-check" else None),
        _item(2.0, 1, tokens[2]),
    ]
    ops = _queue_items(env, items)
    prepare.release()
    running.result()
    assert checking.wait(WAIT), "the batch never started its checks"  # granted as one batch; not run yet
    if how == "gave-up-before-the-run":
        tokens[1].cancel("client")
        assert isinstance(ops[1].error(), RequestCancelled)
    go.set()
    for index in (0, 2):
        assert ops[index].result() is items[index]
        np.testing.assert_array_equal(items[index].outcome()["OUTPUT0"], rows_of(float(index)))
        assert items[index].batch_rows == 2
    if how == "failed-its-own-check":
        ops[1].result()
        with pytest.raises(InvalidRequest, match="region was unregistered"):
            items[1].outcome()
    else:
        assert items[1].result is None  # never computed
    assert env.controls.batches("m") == [1, 2]  # the engine ran the two live members' rows only
    stats = env.entry("m").statistics.snapshot()
    assert [(size.batch_size, size.count) for size in stats.batch_stats] == [(1, 1), (2, 1)]


# ---- requested outputs ----------------------------------------------------------------------------------------


def _write_two_output_model(root) -> None:
    directory = root / "two"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.pbtxt").write_text(
        "\n".join(
            [
                'name: "two"',
                'backend: "fixture"',
                "max_batch_size: 8",
                'input { name: "INPUT0" data_type: TYPE_FP32 dims: -1 }',
                'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: -1 }',
                'output { name: "OUTPUT1" data_type: TYPE_FP32 dims: -1 }',
                'parameters { key: "capacity" value { string_value: "1" } }',
                "dynamic_batching { }",
            ]
        )
        + "\n"
    )


def _asking(array: np.ndarray, outputs: list[str]) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="two")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=list(array.shape))
    message.raw_input_contents.append(array.tobytes())
    for name in outputs:
        message.outputs.add(name=name)
    return message


def _decoded(response) -> dict[str, np.ndarray]:
    return {
        tensor.name: np.frombuffer(raw, np.float32).reshape(tuple(tensor.shape))
        for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True)
    }


def test_the_batch_key_ignores_the_order_of_the_requested_outputs():
    signature = {"INPUT0": ("FP32", (1, 2))}
    assert batch_key(signature, ["OUTPUT0", "OUTPUT1"]) == batch_key(signature, ["OUTPUT1", "OUTPUT0"])
    assert batch_key(signature, ["OUTPUT0"]) != batch_key(signature, ["OUTPUT1"])


def test_the_same_outputs_asked_in_another_order_batch_together_and_other_outputs_do_not(tmp_path):
    root = tmp_path / "repository"
    _write_two_output_model(root)
    from service.dataplane import Dataplane
    from service.tensors import as_message, inference_request

    from .harness import Lab

    lab = Lab(root, {"plain": {}})
    try:
        dataplane = Dataplane(lab.registry)
        prepare = lab.gate("two", "prepare").hold()
        busy = lab.start(
            "busy",
            lambda: dataplane.infer(inference_request(_asking(rows_of(100.0), []), as_message), cancel=CancelToken()),
        )
        prepare.wait_blocked(1)
        asks = [["OUTPUT0", "OUTPUT1"], ["OUTPUT1", "OUTPUT0"], ["OUTPUT1"]]
        ops = []
        for index, outputs in enumerate(asks):
            message = _asking(rows_of(float(index)), outputs)
            ops.append(
                lab.start(
                    f"ask{index}",
                    lambda m=message: dataplane.infer(inference_request(m, as_message), cancel=CancelToken()),
                )
            )
            lab.wait_until(
                lambda n=index + 1: lab.registry.get("two").admission.statistics().queued == n, f"{index + 1} queued"
            )
        prepare.release()
        busy.result()
        for index, (op, outputs) in enumerate(zip(ops, asks, strict=True)):
            got = _decoded(op.result())
            assert sorted(got) == sorted(outputs)
            for name in outputs:
                np.testing.assert_array_equal(got[name], rows_of(float(index)))
        assert lab.controls.batches("two") == [1, 2, 1]  # [busy], [both orders], [OUTPUT1 alone]
    finally:
        lab.close()


# ---- a backend fault, and a run nobody awaits any more -----------------------------------------------------


class _Interrupt(BaseException):
    """Stands in for KeyboardInterrupt or another asynchronous exception raised inside the backend's run."""


@pytest.mark.parametrize("fault", [RuntimeError, _Interrupt], ids=["a-backend-bug", "an-asynchronous-exception"])
def test_after_a_backend_fault_every_member_gets_the_fault_itself(batching, fault):
    env = batching({"m": {}})
    running, prepare = start_busy(env, "m")
    members = [env.infer("m", rows_of(float(i)), name=f"member{i}") for i in range(3)]
    env.wait_queued_requests("m", 3)
    env.lab.gate("m", "execute").fail_arrival(2, fault("the backend broke"))  # the batch's run
    prepare.release()
    running.result()
    errors = [member.error() for member in members]
    assert all(isinstance(error, fault) and "the backend broke" in str(error) for error in errors), errors
    if fault is RuntimeError:
        assert {describe(error)[0].name for error in errors} == {"INTERNAL"}
    assert env.lab.status("m").active_slots == 0


def test_a_batch_whose_every_member_gave_up_before_it_ran_is_not_run_and_its_leader_is_told_so(batching):
    """Every member gives up between the batch's grant and its run (forced through the leader's pool lookup):
    nothing runs, the leader's caller (the only one still waiting) gets CANCELLED naming it, the slot comes back."""
    env = batching({"m": {}})
    running, prepare = start_busy(env, "m")
    tokens = [CancelToken() for _ in range(2)]
    members = [env.infer("m", rows_of(float(i)), cancel=tokens[i], name=f"member{i}") for i in range(2)]
    env.wait_queued_requests("m", 2)
    entry = env.entry("m")
    ensure_pool = entry._ensure_pool

    def everyone_gives_up_first(cancel):
        for token in tokens:
            token.cancel("client")
        return ensure_pool(cancel)

    entry._ensure_pool = everyone_gives_up_first
    prepare.release()
    running.result()
    leader, other = (member.error() for member in members)
    assert describe(other)[0].name == "CANCELLED"  # it left by itself, or was told by its leader first
    assert describe(leader)[0].name == "CANCELLED" and "every request of the batch gave up before it ran" in str(
        leader
    ), leader
    assert env.controls.batches("m") == [1]  # only the busy request ran
    env.lab.wait_status("m", lambda s: s.active_slots == 0, "the slot back")


# ---- the run's timings -----------------------------------------------------------------------------------------


def test_a_batch_records_its_stacking_and_run_times_once_and_within_the_wall_clock(batching):
    import time

    env = batching({"m": {}})
    started = time.perf_counter_ns()
    execute, tokens, members = run_a_held_batch(env, 2)
    execute.release()
    for member in members:
        member.result()
    wall = time.perf_counter_ns() - started
    stats = env.entry("m").statistics.snapshot()
    two = [size for size in stats.batch_stats if size.batch_size == 2]
    assert len(two) == 1 and two[0].count == 1
    for total in (two[0].compute_input_ns, two[0].compute_infer_ns, two[0].compute_output_ns):
        assert 0 <= total <= wall, (total, wall)
    assert two[0].compute_infer_ns > 0  # the run itself was held at its gate
    # Each member's own record (ModelStatistics' compute_input / compute_infer, from its BatchItem) too.
    assert stats.success.count == 3  # the busy request and the two members
    for duration in (stats.compute_input, stats.compute_infer, stats.queue):
        assert duration.count == 3 and 0 <= duration.ns <= 3 * wall, (duration, wall)


# ---- a streaming model cannot batch -------------------------------------------------------------------------------


def test_a_request_to_a_streaming_model_with_dynamic_batching_is_refused_naming_why(batching):
    env = batching({"s": {"parameters": {"capacity": "1", "stream_responses": "2"}}})
    error = env.infer("s", rows_of(1.0)).error()
    assert isinstance(error, InvalidRequest), error
    assert "streams its responses, which dynamic batching does not support" in str(error)
    assert env.controls.batches("s") == []  # nothing ran
