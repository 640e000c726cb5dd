"""Bulk unload never hangs (issue 12, item 5; the call tokens of that item are in
tests/unit/service/servicers/test_call_tokens.py)."""

from __future__ import annotations

import pytest

from service.core.errors import ShuttingDown
from tests.contract.harness import Lab


@pytest.fixture
def lab(tmp_path):
    lab = Lab(tmp_path, {"a": {}, "b": {}})
    yield lab
    lab.close()


def test_a_bulk_unload_over_closed_admission_is_refused_instead_of_waiting_for_ever(lab):
    """At the end of the shutdown grace every model's admission closes; a bulk unload that starts then has its
    barriers refused on arrival. It must end with shutting_down (no token: nothing else could end it)."""
    for entry in lab.registry.entries():
        entry.admission.close()
    bulk = lab.unload_many(["a", "b"])
    error = bulk.error(timeout=5.0)
    assert isinstance(error, ShuttingDown), error
    assert all(lab.status(model).loaded for model in "ab")
    assert all(not entry.admission.statistics().manager_active for entry in lab.registry.entries())
