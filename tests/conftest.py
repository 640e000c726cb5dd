"""Shared test setup: the contract-cell marker and its report (`make contract`), and common fixtures."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CELLS_FILE = Path(__file__).resolve().parent / "contract" / "cells.tsv"
SHARED_CELLS_FILE = ROOT.parent / "shared" / "contract" / "cells.tsv"
BATCHING_CELLS_FILE = Path(__file__).resolve().parent / "contract" / "batching_cells.tsv"  # slotserve's own
DEMO_REPOSITORY = ROOT / "demo" / "model_repository"

pytest_plugins = ["service.testing"]


def contract_cells(path: Path = CELLS_FILE) -> list[tuple[str, str]]:
    """(id, expected behaviour) of every contract cell, in the contract's order."""
    with path.open(newline="") as handle:
        return [(row["id"], row["expected"]) for row in csv.DictReader(handle, delimiter="\t")]


def batching_cells() -> list[tuple[str, str]]:
    """The dynamic batching cells (BATCH.nn): slotserve's own, beside the contract's 110."""
    return contract_cells(BATCHING_CELLS_FILE)


def pytest_addoption(parser):
    parser.addoption("--contract-report", action="store_true",
                     help="after the run, list every contract cell as covered (a test marked with it passed) or "
                          "not, then 'covered N/110'")


_passed_cells: set[str] = set()
_marked_cells: set[str] = set()


def pytest_collection_modifyitems(config, items):
    known = {cell for cell, _ in contract_cells() + batching_cells()}
    for item in items:
        for mark in item.iter_markers("cell"):
            for cell in mark.args:
                if cell not in known:
                    raise pytest.UsageError(f"{item.nodeid}: unknown contract cell {cell!r}")
                _marked_cells.add(cell)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.passed:
        for mark in item.iter_markers("cell"):
            _passed_cells.update(mark.args)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not config.getoption("--contract-report"):
        return
    write = terminalreporter.write_line
    for title, cells, label in (("contract", contract_cells(), "covered"),
                                ("dynamic batching", batching_cells(), "batching covered")):
        write("")
        write(f"{title} coverage (a cell is covered when a test marked with it passed):")
        for cell, _ in cells:
            if cell in _passed_cells:
                state = "covered"
            elif cell in _marked_cells:
                state = "NOT covered (its test did not pass)"
            else:
                state = "NOT covered (no test)"
            write(f"  {cell:45s} {state}")
        covered = len([c for c, _ in cells if c in _passed_cells])
        _report_total.append((terminalreporter, f"{label} {covered}/{len(cells)}"))


_report_total: list = []  # (terminal reporter, line): written last, after pytest's own summary line


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    for terminalreporter, line in _report_total:
        terminalreporter.write_line(line)


@pytest.fixture
def demo_repository() -> Path:
    if not (DEMO_REPOSITORY / "simple").exists():
        pytest.fail("the demo repository is missing: run `make models` (make test does it)")
    return DEMO_REPOSITORY
