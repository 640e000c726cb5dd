"""pytest plugin for `--collect-only`: writes, as JSON to the path in $SLOTSERVE_CELL_MARKS, which collected test
functions are marked with which contract cells (`@pytest.mark.cell`), as tests/contract/report.py reads them.

    {"tests/contract/test_ops_ready.py::test_inference_on_ready_model_uses_spare_slots_then_queues":
        ["OPS.ready.infer"], ...}

Parametrized tests count once, under their function's id.
"""

from __future__ import annotations

import json
import os

ENVIRONMENT = "SLOTSERVE_CELL_MARKS"


def pytest_collection_modifyitems(config, items):
    marks: dict[str, list[str]] = {}
    for item in items:
        cells = [cell for mark in item.iter_markers("cell") for cell in mark.args]
        if cells:
            function = item.nodeid.split("[", 1)[0]
            marks[function] = sorted(set(marks.get(function, [])) | set(cells))
    with open(os.environ[ENVIRONMENT], "w") as handle:
        json.dump(marks, handle, indent=1, sort_keys=True)
