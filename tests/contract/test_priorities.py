"""Priority cells (PRIO.nn, tests/contract/cells.tsv): Triton's priority levels and queue policies on a batching
model, through the real request path (decode, the `priority` and `timeout` parameters, admission, batch run).

Requests of different widths never stack, and each brings its own number of rows, so the rows of each engine run
(`FixtureControls.batches`) say which request ran when. Orders come from gates and the admission's statistics,
never from sleeps; timeouts run on a fake clock the tests move."""

from __future__ import annotations

import numpy as np
import pytest

from engine.interface import CancelToken
from generated import grpc_service_pb2 as pb
from service.core.errors import AdmissionTimeout, InvalidRequest, QueueFull
from service.core.lifecycle import ModelState
from service.transport.status_codes import describe
from service.transport.tensors import as_message, inference_request

from .test_batching import Batching, batching, output, rows_of, start_busy

__all__ = ["batching"]  # the fixture, shared with the batching cells

cell = pytest.mark.cell

LEVELS = "priority_levels: 3 default_priority_level: 2"


def send(env: Batching, model: str, rows: int, width: int, *, priority=None, timeout_us: int = 0, name: str = ""):
    """A request of `rows` rows of `width` (value = rows), with a `priority` parameter (an int goes as int64; a
    tuple (kind, value) names the parameter's kind) and a `timeout`."""
    array = rows_of(float(rows), rows, width)
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name="INPUT0", datatype="FP32", shape=list(array.shape))
    message.raw_input_contents.append(array.tobytes())
    if priority is not None:
        kind, value = priority if isinstance(priority, tuple) else ("int64_param", priority)
        setattr(message.parameters["priority"], kind, value)
    if timeout_us:
        message.parameters["timeout"].int64_param = timeout_us
    return env.lab.start(
        name or f"{model}:{rows}x{width}",
        lambda: output(env.dataplane.infer(inference_request(message, as_message), cancel=CancelToken())),
    )


def queue_in_order(env: Batching, model: str, requests: list[tuple[int, int, object]], queued: int = 0) -> list:
    """Send (rows, width, priority) requests one at a time, each queued before the next is sent (behind `queued`
    requests already queued)."""
    ops = []
    for rows, width, priority in requests:
        ops.append(send(env, model, rows, width, priority=priority))
        env.wait_queued_requests(model, queued + len(ops))
    return ops


def check_results(ops, requests) -> None:
    for op, (rows, width, _) in zip(ops, requests, strict=True):
        np.testing.assert_array_equal(op.result(), rows_of(float(rows), rows, width))


@cell("PRIO.01")
def test_levels_are_served_from_level_1_and_each_level_in_arrival_order(batching):
    env = batching({"p": {"extra": LEVELS}})
    running, gate = start_busy(env, "p")
    requests = [(1, 2, 3), (2, 3, 1), (3, 4, 2), (4, 5, 1), (5, 6, 3), (6, 7, 2)]  # (rows, width, priority)
    ops = queue_in_order(env, "p", requests)
    gate.release()
    running.result()
    check_results(ops, requests)
    assert env.controls.batches("p") == [1, 2, 4, 3, 6, 1, 5]  # level 1, then 2, then 3; FIFO in each


@cell("PRIO.02")
def test_priority_0_or_above_the_levels_takes_the_default_level_and_a_bad_priority_is_refused(batching):
    env = batching({"p": {"extra": LEVELS}})
    running, gate = start_busy(env, "p")
    requests = [(1, 2, 2), (2, 3, 0), (3, 4, ("uint64_param", 2**64 - 1)), (4, 5, 3), (5, 6, 1)]
    ops = queue_in_order(env, "p", requests)
    for priority, words in (
        (-1, "invalid value for 'priority', expected value >= 0."),
        (("string_param", "high"), "invalid value type for 'priority' parameter, expected int64_param or uint64_param"),
        (("bool_param", True), "expected int64_param or uint64_param"),
    ):
        error = send(env, "p", 1, 2, priority=priority).error()
        assert isinstance(error, InvalidRequest) and words in str(error)
        assert describe(error)[0].name == "INVALID_ARGUMENT"
    assert env.entry("p").admission.statistics().queued_requests == 5  # nothing else lost its place
    gate.release()
    running.result()
    check_results(ops, requests)
    assert env.controls.batches("p") == [1, 5, 1, 2, 3, 4]


@cell("PRIO.03")
def test_a_batch_takes_the_compatible_requests_in_priority_order(batching):
    # Triton's test_priority_levels: 2 rows and 1 row at the default level, then 2 rows at level 1: the batch of 4
    # is the level-1 request and the first default one; the 1-row request runs next.
    env = batching({"p": {"max_batch_size": 4, "extra": "priority_levels: 2 default_priority_level: 2"}})
    running, gate = start_busy(env, "p")
    requests = [(2, 2, 0), (1, 2, 0), (2, 2, 1)]
    ops = queue_in_order(env, "p", requests)
    gate.release()
    running.result()
    check_results(ops, requests)
    assert env.controls.batches("p") == [1, 4, 1]


@cell("PRIO.04")
def test_each_level_has_its_own_queue_limit(batching):
    policy = "priority_queue_policy { key: 1 value { max_queue_size: 1 } }"
    env = batching({"p": {"extra": f"priority_levels: 2 default_priority_level: 2 {policy}"}})
    running, gate = start_busy(env, "p")
    requests = [(1, 2, 1), (2, 3, 2), (3, 4, 2), (4, 5, 2)]
    ops = queue_in_order(env, "p", requests)
    refused = send(env, "p", 5, 6, priority=1).error()  # level 1 holds one already
    assert isinstance(refused, QueueFull) and describe(refused)[2] == "server_busy"
    assert "the queue of priority level 1 of model 'p' is full" in str(refused)
    assert env.entry("p").admission.queued_per_level() == {1: 1, 2: 3}
    gate.release()
    running.result()
    check_results(ops, requests)
    assert env.controls.batches("p") == [1, 1, 2, 3, 4]


@cell("PRIO.05")
def test_each_level_has_its_own_queue_timeout_which_a_request_shortens_only_where_allowed(batching):
    policies = (
        "default_queue_policy { default_timeout_microseconds: 10000000 allow_timeout_override: false } "
        "priority_queue_policy { key: 1 value { default_timeout_microseconds: 2000000 allow_timeout_override: true } }"
    )
    env = batching({"p": {"extra": f"priority_levels: 2 default_priority_level: 2 {policies}"}})
    running, gate = start_busy(env, "p")
    patient = send(env, "p", 1, 2, priority=1)  # level 1: 2 s
    env.wait_queued_requests("p", 1)
    hasty = send(env, "p", 2, 3, priority=1, timeout_us=500_000)  # level 1 allows 0.5 s
    env.wait_queued_requests("p", 2)
    low = send(env, "p", 3, 4, priority=2, timeout_us=500_000)  # level 2: 10 s, its own timeout not allowed
    env.wait_queued_requests("p", 3)
    env.clock.now += 1.0
    env.poke("p")
    assert isinstance(hasty.error(), AdmissionTimeout)
    env.clock.now += 1.5
    env.poke("p")
    error = patient.error()
    assert isinstance(error, AdmissionTimeout) and describe(error)[2] == "server_busy"
    gate.release()
    running.result()
    np.testing.assert_array_equal(low.result(), rows_of(3.0, 3, 4))
    assert env.controls.batches("p") == [1, 3]


@cell("PRIO.06")
def test_delay_moves_a_timed_out_request_behind_its_level_and_never_refuses_it(batching):
    delay = (
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 2000000 "
        "allow_timeout_override: true }"
    )
    env = batching({"p": {"extra": f"priority_levels: 2 default_priority_level: 2 {delay}"}})
    running, gate = start_busy(env, "p")
    early = send(env, "p", 1, 2, priority=1, timeout_us=500_000)
    env.wait_queued_requests("p", 1)
    requests = [(2, 3, 1), (3, 4, 2)]
    later = queue_in_order(env, "p", requests, queued=1)
    env.clock.now += 1.0  # early's queue timeout passed; the others' have not
    gate.release()
    running.result()
    np.testing.assert_array_equal(early.result(), rows_of(1.0, 1, 2))
    check_results(later, requests)
    assert env.controls.batches("p") == [1, 2, 1, 3]  # behind level 1's other request, ahead of level 2
    assert env.entry("p").statistics.snapshot().failures == {}


@cell("PRIO.07")
def test_a_manager_is_a_barrier_for_every_level(batching):
    env = batching({"p": {"extra": LEVELS}})
    running, gate = start_busy(env, "p")
    requests = [(1, 2, 3), (2, 3, 2)]  # older than the manager: served before it, level 2 first
    ops = queue_in_order(env, "p", requests)
    manager = env.lab.unload("p")
    env.lab.wait_status("p", lambda s: s.queued_managers == 1, "the manager queued")
    newer = send(env, "p", 3, 4, priority=1)  # level 1, but after the manager
    env.wait_queued_requests("p", 3)
    gate.release()
    running.result()
    check_results(ops, requests)
    manager.result()
    np.testing.assert_array_equal(newer.result(), rows_of(3.0, 3, 4))
    assert env.controls.batches("p") == [1, 2, 1, 3]
    # The level-1 request ran after the unload: it had to load the model again.
    assert env.controls.count("p", "load") == 2
    assert env.entry("p").state is ModelState.READY


@cell("PRIO.08")
def test_a_low_level_waits_as_long_as_a_higher_level_keeps_the_slot_busy(batching):
    # The documented choice, as Triton: strict priority. While a level-1 request is always queued when the slot
    # frees, the level-2 request waits (its level's timeout, or its caller's deadline, bounds that wait).
    env = batching({"p": {"extra": "priority_levels: 2 default_priority_level: 2"}})
    execute = env.lab.gate("p", "execute").hold_from(1)
    busy = send(env, "p", 1, 2, priority=1)
    execute.wait_blocked(1)
    low = send(env, "p", 2, 3, priority=2)
    env.wait_queued_requests("p", 1)
    previous = busy
    for run in range(1, 6):
        high = send(env, "p", 1, 2, priority=1)
        env.wait_queued_requests("p", 2)
        execute.hold_from(run + 1)  # the held run goes; the next one is held
        execute.wait_arrivals(run + 1)
        execute.wait_blocked(1)
        previous.result()
        assert env.entry("p").admission.queued_per_level() == {2: 1}  # the high one runs, the low one waits
        previous = high
    execute.release()
    previous.result()
    np.testing.assert_array_equal(low.result(), rows_of(2.0, 2, 3))
    assert env.controls.batches("p") == [1] * 6 + [2]


@cell("PRIO.09")
def test_a_model_without_priority_levels_serves_every_priority_in_arrival_order(batching):
    env = batching({"p": {}, "direct": {"block": False}})
    for model in ("p", "direct"):
        running, gate = start_busy(env, model)
        requests = [(1, 2, 3), (2, 3, 1), (3, 4, 2)]
        ops = queue_in_order(env, model, requests)
        gate.release()
        running.result()
        check_results(ops, requests)
        assert env.controls.batches(model) == [1, 1, 2, 3]  # the running one, then arrival order
        stats = env.entry(model).statistics.snapshot()
        assert stats.success.count == 4
