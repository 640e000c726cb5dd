"""The repository's copy of the contract cells matches the shared contract (when it is beside the project)."""

import pytest

from tests.conftest import CELLS_FILE, SHARED_CELLS_FILE, contract_cells


def test_there_are_110_unique_cells():
    ids = [cell for cell, _ in contract_cells()]
    assert len(ids) == 110
    assert len(set(ids)) == 110


def test_copy_matches_shared_contract():
    if not SHARED_CELLS_FILE.exists():
        pytest.skip("../shared/contract/cells.tsv is not beside this checkout")
    assert CELLS_FILE.read_text() == SHARED_CELLS_FILE.read_text()
