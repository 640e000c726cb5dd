"""One failed cold load, one exception per waiter (issue 12, item 8): every request admitted while the load ran
gets the load's error as its own object, whose traceback holds only its own thread's frames."""

from __future__ import annotations

import traceback

from service.core.errors import ModelLoadFailed
from tests.contract.harness import Lab


def test_every_waiter_of_a_failed_cold_load_raises_its_own_exception(tmp_path):
    lab = Lab(tmp_path, {"a": {"fail_load": "bad weights", "capacity": 4}}, parallel_jobs=4, load=False)
    try:
        load = lab.gate("a", "load").hold()
        requests = [lab.infer("a") for _ in range(4)]
        load.wait_blocked(1)
        lab.wait_status("a", lambda s: s.active_slots == 4, "all four admitted, three waiting on the load")

        # The three that wait for the initializer's outcome block in its wait; that is where they must be.
        def waiting() -> int:
            return sum(
                any(frame.name == "wait" and "lifecycle" in frame.filename for frame in traceback.extract_stack(stack))
                for stack in _stacks(requests)
            )

        lab.wait_until(lambda: waiting() == 3, "three waiters in the initializer's wait")
        load.release()
        errors = [op.error() for op in requests]
    finally:
        lab.close()
    assert all(isinstance(error, ModelLoadFailed) for error in errors), errors
    assert all("bad weights" in str(error) for error in errors)
    assert len({id(error) for error in errors}) == 4
    for error in errors:
        frames = traceback.extract_tb(error.__traceback__)
        assert sum(frame.name == "acquire_lease" for frame in frames) == 1, traceback.format_tb(error.__traceback__)
    assert lab.status("a").active_slots == 0 and not lab.status("a").loaded


def _stacks(ops):
    from tests.thread_frames import current_frames

    frames = current_frames()
    return [frames[op.thread.ident] for op in ops if op.thread.ident in frames]
