"""Shared test setup: the contract-cell marker and its report (tests/contract/report.py, `make contract`), and
common fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMO_REPOSITORY = ROOT / "demo" / "model_repository"

pytest_plugins = ["service.testing", "tests.contract.report"]


@pytest.fixture
def demo_repository() -> Path:
    if not (DEMO_REPOSITORY / "simple").exists():
        pytest.fail("the demo repository is missing: run `make models` (make test does it)")
    return DEMO_REPOSITORY
