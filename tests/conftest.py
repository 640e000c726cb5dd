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


FRONTENDS = (1, 2)  # front-end processes a gRPC-reaching contract test runs against (issue 39)


@pytest.fixture(params=FRONTENDS, ids=[f"frontends{n}" for n in FRONTENDS])
def frontends(request) -> int:
    """How many front-end processes serve the port: 1 (today's server, the default) and 2 (`--frontends 2`: the
    test process is the admission process, the front ends its children). A test or fixture that starts a server
    takes this parameter and passes it on (InProcess(frontends=...), harness.frontend_options/frontend_flags),
    so each such test runs against both servers from one body. Skipped for N > 1 on a tree without the flag."""
    from tests.shutdown.harness import frontends_built

    if request.param > 1 and not frontends_built():
        pytest.skip("--frontends is not in this tree's server yet (issue 39)")
    return request.param
