"""The fixture backend's controls: tests get an ordered event list; a served process keeps only counters, so
a long run does not grow memory by one event per request (found by the soak)."""

from engine.testing.fixture import FixtureBackend, FixtureControls


def test_controls_given_by_a_test_keep_every_event_in_order():
    controls = FixtureControls()
    controls.record("a", "load")
    controls.record("a", "execute")
    assert controls.events == [("a", "load"), ("a", "execute")] and controls.count("a", "execute") == 1


def test_the_default_controls_of_a_served_backend_keep_counters_but_no_event_list():
    controls = FixtureBackend().controls
    for _ in range(3):
        controls.record("a", "execute")
    assert controls.count("a", "execute") == 3 and controls.events == []
