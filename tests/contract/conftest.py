import pytest

from tests.contract.harness import Lab
from tests.shutdown.harness import InProcess


@pytest.fixture
def lab_factory(tmp_path):
    """`lab_factory(models={...}, **options) -> Lab`; every lab is closed (gates released, work joined)."""
    labs = []

    def make(models=None, **options) -> Lab:
        lab = Lab(tmp_path / f"repo{len(labs)}", models, **options)
        labs.append(lab)
        return lab

    yield make
    for lab in labs:
        lab.close()


@pytest.fixture
def inproc(tmp_path, frontends):
    """`inproc(models, **server options) -> InProcess` (a real in-process server); gates released and servers
    stopped at the end. Every test that takes it runs twice: against one front end (today's server) and against
    two front-end processes (`frontends`, tests/conftest.py; issue 39: every contract cell holds with N > 1).

    Tests on the no-gRPC `Lab` (lab_factory, harness.py) are not parametrized: they drive the admission core
    directly, and that core is the same object in the one admission process whatever N is; the front ends only
    carry calls to it (their own cells: tests/frontends/)."""
    labs: list[InProcess] = []

    def start(models: dict[str, dict], **options) -> InProcess:
        lab = InProcess(tmp_path / f"repository{len(labs)}", models, frontends=frontends, **options)
        labs.append(lab)
        return lab

    yield start
    for lab in labs:
        lab.close()
