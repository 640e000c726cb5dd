"""Fixtures for the TensorRT tests: a fresh simulated GPU per test, checked for broken rules at the end."""

from __future__ import annotations

import pytest

from engine.testing.tensorrt_double import FakeDevice


@pytest.fixture
def device(request):
    """A FakeDevice with 64 MiB. A test that breaks rules on purpose marks itself `expect_violations`."""
    fake = FakeDevice(total_memory=64 << 20)
    yield fake
    if request.node.get_closest_marker("expect_violations") is None:
        assert fake.violations == [], f"the code under test broke TensorRT/CUDA rules: {fake.violations}"


def pytest_configure(config):
    config.addinivalue_line("markers", "expect_violations: the test breaks the double's rules on purpose")
