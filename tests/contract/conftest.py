import pytest

from tests.contract.harness import Lab


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
