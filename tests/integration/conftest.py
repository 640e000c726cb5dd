"""Fixtures the integration tests share."""

from __future__ import annotations

import pytest

from engine.testing.fixture import FixtureControls


@pytest.fixture
def controls():
    """The fixture backend's gates and counters for one test; every gate is released at the end, so a failing
    test never leaves a request parked at a gate (and the server's shutdown waiting for it)."""
    controls = FixtureControls()
    yield controls
    controls.release_all()


@pytest.fixture
def no_token_environment(monkeypatch):
    """Clients built with token=None read SLOTSERVE_*_TOKEN: a developer's own tokens must not reach them."""
    monkeypatch.delenv("SLOTSERVE_MANAGEMENT_TOKEN", raising=False)
    monkeypatch.delenv("SLOTSERVE_INFERENCE_TOKEN", raising=False)
