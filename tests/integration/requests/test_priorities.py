"""Priority levels through a real server and channel (docs/lifecycle.md, Priorities): the `priority` request
parameter reaches the admission core, levels are served from level 1, a level's full queue is refused with
UNAVAILABLE server_busy while another level queues, and a bad priority is INVALID_ARGUMENT in Triton's words with
nothing lost. Orders come from the fixture's gates and the model's status, never from sleeps."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from client.errors import ClientError
from engine.testing.fixture import FixtureBackend, FixtureControls
from service.testing import serve
from tests.contract.test_batching import write_batching_model

POLICY = "priority_levels: 3 default_priority_level: 2 priority_queue_policy { key: 3 value { max_queue_size: 1 } }"


@pytest.fixture
def running(tmp_path):
    controls = FixtureControls()
    write_batching_model(tmp_path, "m", 8, extra=POLICY)
    with serve(tmp_path, backends={"fixture": FixtureBackend(controls)}) as running:
        running.controls = controls
        yield running
    controls.release_all()


def wait_queued(running, count: int) -> None:
    deadline = time.monotonic() + 30
    while running.management.get("m").queued_requests != count:
        assert time.monotonic() < deadline, f"{count} requests never queued"
        time.sleep(0.01)  # ordering-free: polls a state until a deadline


def rows(count: int, width: int) -> np.ndarray:
    return np.full((count, width), float(count), np.float32)


def test_the_priority_parameter_orders_the_queue_and_bounds_each_level(running):
    execute = running.controls.gate("m", "execute").hold()
    with ThreadPoolExecutor(8) as pool:
        busy = pool.submit(running.client.infer, "m", {"INPUT0": rows(1, 2)})
        execute.wait_blocked(1)
        queued = []
        # (rows, width, priority): widths differ, so nothing stacks and each run's rows name its request.
        for count, width, priority in ((2, 3, 3), (3, 4, 0), (4, 5, 1)):
            inputs = {"INPUT0": rows(count, width)}
            queued.append(pool.submit(running.client.infer, "m", inputs, parameters={"priority": priority}))
            wait_queued(running, len(queued))
        with pytest.raises(ClientError) as full:  # level 3 holds its one place already
            running.client.infer("m", {"INPUT0": rows(5, 6)}, parameters={"priority": 3})
        assert (full.value.code, full.value.reason) == ("UNAVAILABLE", "server_busy")
        execute.release()
        busy.result(timeout=30)
        for future, (count, width) in zip(queued, ((2, 3), (3, 4), (4, 5)), strict=True):
            np.testing.assert_array_equal(future.result(timeout=30)["OUTPUT0"], rows(count, width))
    assert running.controls.batches("m") == [1, 4, 3, 2]  # level 1, the default level (2), level 3


@pytest.mark.parametrize(
    "priority, words",
    [
        (-3, "invalid value for 'priority', expected value >= 0."),
        ("urgent", "invalid value type for 'priority' parameter, expected int64_param or uint64_param."),
        (1.5, "invalid value type for 'priority' parameter, expected int64_param or uint64_param."),
    ],
)
def test_a_bad_priority_is_refused_in_tritons_words_and_nothing_is_lost(running, priority, words):
    with pytest.raises(ClientError) as refused:
        running.client.infer("m", {"INPUT0": rows(1, 2)}, parameters={"priority": priority})
    assert refused.value.code == "INVALID_ARGUMENT" and words in refused.value.message
    answer = running.client.infer("m", {"INPUT0": rows(2, 2)}, parameters={"priority": 1})
    np.testing.assert_array_equal(answer["OUTPUT0"], rows(2, 2))
    assert running.management.get("m").state == "READY"
