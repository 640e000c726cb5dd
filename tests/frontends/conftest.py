"""Integration tests of `--frontends N` (issue 39): real gRPC servers on real ports, this test process being the
admission process (service.testing.serve; its fixture gates hold runs in place), the front ends its children.
Each test that means something for one front end too takes the `frontends` parameter (tests/conftest.py: 1 and 2);
a test of what only several front-end processes have (one of them killed) runs with 2 alone."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
import numpy as np
import pytest

from engine.testing.fixture import FixtureControls
from tests.shutdown.harness import InProcess, frontends_built, infer_request

from ._support import FrontEnds, OrderedFixture


class Served:
    """An in-process server over fixture models (`lab`: tests/shutdown/harness.py InProcess), each run's first
    input logged in grant order (`runs(model)`), and channels to each front end (`ends`)."""

    def __init__(
        self,
        root: Path,
        models: dict[str, dict],
        frontends: int,
        *,
        open_channel: Callable[[str, list[tuple[str, object]]], grpc.Channel] | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        **options,
    ) -> None:
        controls = FixtureControls()
        self.recorder = OrderedFixture(controls)
        self.lab = InProcess(
            root, models, {"fixture": self.recorder}, frontends=frontends, controls=controls, **options
        )
        self.ends = FrontEnds(self.lab.address, self.lab.frontend_pids, open_channel=open_channel, metadata=metadata)

    def runs(self, model: str) -> list[float]:
        return list(self.recorder.runs.get(model, ()))

    def admission(self, model: str):
        return self.lab.server.registry.get(model).admission.statistics()

    def close(self) -> None:
        self.ends.close()
        self.lab.close()


@pytest.fixture
def served(tmp_path, frontends):
    """`served(models, **server options) -> Served` with `frontends` front ends; closed at the end."""
    started: list[Served] = []

    def start(models: dict[str, dict], **options) -> Served:
        server = Served(tmp_path / f"repository{len(started)}", models, frontends, **options)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


@pytest.fixture
def two_frontends():
    """For the tests of what only several front-end processes have."""
    if not frontends_built():
        pytest.skip("--frontends is not in this tree's server yet (issue 39)")
    return 2


def values(first: float) -> np.ndarray:
    """A request's input whose first value names it in `Served.runs`."""
    return np.array([first, 0.0, 0.0], dtype=np.float32)


def request(model: str, first: float):
    return infer_request(model, values(first))
