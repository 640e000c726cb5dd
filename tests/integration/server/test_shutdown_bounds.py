"""Server.shutdown keeps its bound and runs once (issue 12, items 6 and 11): an idle reaper stuck in a slow
teardown does not hold it up, and two callers at once get one shutdown. In-process servers over fixture models;
gates order the events."""

from __future__ import annotations

import logging
import threading

from engine.testing.fixture import FixtureBackend, FixtureControls
from service.core.lifecycle import ModelState
from service.testing import serve
from tests.contract.harness import write_fixture_model
from tests.shutdown.harness import Background

WAIT = 20.0


def test_a_reaper_stuck_in_a_teardown_does_not_hold_the_shutdown_past_its_bound(tmp_path, caplog):
    write_fixture_model(tmp_path, "idle")
    controls = FixtureControls()
    teardown = controls.gate("idle", "teardown").hold()
    grace, margin = 0.5, 0.5
    with serve(tmp_path, backends={"fixture": FixtureBackend(controls)}, idle_unload=0.01) as running:
        try:
            teardown.wait_blocked(1)  # the reaper retires the idle model; its teardown does not return
            entry = running.server.registry.get("idle")
            assert entry.state is ModelState.UNLOADING
            with caplog.at_level(logging.INFO, logger="service.server"):
                shutdown = Background(running.server.shutdown, drain_seconds=0.0, grace=grace, margin=margin)
                report = shutdown.result(timeout=grace + 2 * margin + 5.0)
            assert report.seconds < grace + 2 * margin + 0.5, report
            assert "the idle reaper is still tearing a model down" in caplog.text
        finally:
            teardown.release()  # (also what lets a failing run of this test end)
        running.server.residency.stop(timeout=WAIT)
        assert entry.state is ModelState.UNLOADED and controls.live_engines("idle") == 0


class _MeetingEvent(threading.Event):
    """An Event whose is_set() lets two callers through together (or the first after a second alone): it forces
    the interleaving of a check-then-act on it."""

    def __init__(self) -> None:
        super().__init__()
        self._barrier = threading.Barrier(2)

    def is_set(self) -> bool:
        answer = super().is_set()
        try:
            self._barrier.wait(timeout=1.0)
        except threading.BrokenBarrierError:
            pass
        return answer


def test_two_callers_at_once_get_one_shutdown_and_the_same_report(tmp_path, caplog):
    write_fixture_model(tmp_path, "m")
    with serve(tmp_path, backends={"fixture": FixtureBackend(FixtureControls())}) as running:
        server = running.server
        server._shutdown_started = _MeetingEvent()  # what a check-then-act decision would read
        with caplog.at_level(logging.INFO, logger="service.server"):
            calls = [Background(server.shutdown, drain_seconds=0.0, grace=1.0) for _ in range(2)]
            reports = [call.result(timeout=WAIT) for call in calls]
        assert reports[0] is reports[1]
        assert caplog.text.count("shutdown: health NOT_SERVING") == 1
        assert caplog.text.count("shutdown: done in") == 1
