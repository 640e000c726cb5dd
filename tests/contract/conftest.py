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
def inproc(tmp_path):
    """`inproc(models, **server options) -> InProcess` (a real in-process server); gates released and servers
    stopped at the end."""
    labs: list[InProcess] = []

    def start(models: dict[str, dict], **options) -> InProcess:
        lab = InProcess(tmp_path / f"repository{len(labs)}", models, **options)
        labs.append(lab)
        return lab

    yield start
    for lab in labs:
        lab.close()
