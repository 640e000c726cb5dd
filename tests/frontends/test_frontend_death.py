"""A front end that dies (issue 39): it fails only its own calls, the admission process releases their slot, queue
place and tensor reservations, the other front ends' calls go on, and the dead front end is replaced. Two front
ends only: with one, the front end is the server."""

from __future__ import annotations

import logging
import os
import signal

import numpy as np
import pytest

from tests.shutdown.harness import WAIT, assert_ok, outcome, output_of, wait_until

from ._support import FrontEnds, exists, stub
from .conftest import Served, request, values

cell = pytest.mark.cell


@cell("TIME.04", "TIME.05")
def test_a_front_end_killed_with_a_call_running_and_one_queued_fails_only_those_and_is_replaced(
    tmp_path, two_frontends, caplog
):
    """Front end 0 carries a call running on m's one slot (held at its execute gate) and one queued behind it;
    front end 1 carries a third, queued behind both. SIGKILL front end 0: its two calls fail, the running one's
    slot and the queued one's place are given back (the third takes the slot; the queued one never runs), their
    tensor reservations are released, and a new front end 0 (another pid) serves a new connection."""
    caplog.set_level(logging.INFO)
    server = Served(tmp_path / "repository", {"m": {}}, two_frontends, parallel_jobs=1)
    try:
        survivor_pid = server.ends.pids()[1]
        victim, other = server.ends.channel(0), server.ends.channel(1)
        victim_pid = server.ends.pids()[0]
        execute = server.lab.gate("m", "execute").hold()
        running = stub(victim).ModelInfer.future(request("m", 1.0), timeout=WAIT)
        execute.wait_blocked(1)
        queued = stub(victim).ModelInfer.future(request("m", 2.0), timeout=WAIT)
        server.lab.wait_core("m", lambda s: s.queued_requests == 1, "front end 0's second call queued")
        behind = stub(other).ModelInfer.future(request("m", 3.0), timeout=WAIT)
        server.lab.wait_core("m", lambda s: s.queued_requests == 2, "front end 1's call queued")
        tensors = server.lab.server.dataplane.tensor_memory
        assert tensors.statistics().requests == 3

        os.kill(victim_pid, signal.SIGKILL)

        for call in (running, queued):
            code, error = outcome(call)
            assert code == "UNAVAILABLE", error  # the connection to the dead front end is gone
        # The running call's slot went to front end 1's call (now held at the gate in its turn); the queued call
        # left the queue without running.
        wait_until(lambda: server.runs("m") == [1.0, 3.0], "front end 1's call granted the slot")
        execute.wait_blocked(1)
        status = server.lab.core_status("m")
        assert (status.active_slots, status.queued_requests) == (1, 0), status
        wait_until(lambda: tensors.statistics().requests == 1, "the dead front end's reservations released")
        assert not behind.done()

        execute.release()
        assert_ok(behind, values(3.0))
        assert server.runs("m") == [1.0, 3.0]  # the queued call of the dead front end never ran
        wait_until(lambda: tensors.statistics().requests == 0, "every reservation released")

        def replaced() -> bool:
            pids = server.ends.pids()
            return len(pids) == 2 and pids[0] != victim_pid

        wait_until(replaced, "front end 0 replaced")
        assert server.ends.pids()[1] == survivor_pid  # the other front end was left alone
        wait_until(lambda: not exists(victim_pid), "the dead front end reaped")
        replacements = [record for record in caplog.records if getattr(record, "event", None) == "frontend_replaced"]
        assert [(r.event_fields["index"], r.event_fields["old_pid"]) for r in replacements] == [(0, victim_pid)]
        assert replacements[0].event_fields["new_pid"] == server.ends.pids()[0]
        fresh = FrontEnds(server.lab.address, server.lab.frontend_pids)
        try:
            response = stub(fresh.channel(0)).ModelInfer(request("m", 4.0), timeout=WAIT)  # the new front end
            np.testing.assert_array_equal(output_of(response), values(4.0))
            assert server.runs("m") == [1.0, 3.0, 4.0]
        finally:
            fresh.close()
    finally:
        server.close()
