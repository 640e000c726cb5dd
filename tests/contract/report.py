"""pytest plugin: the `cell` marker's checks and the contract report (`make contract`, `--contract-report`).

At collection, every `@pytest.mark.cell(...)` id must be a cell of tests/contract/cells.tsv that tests may claim
(a `not-applicable` cell may not: no stand-in test counts as its coverage). After the run, `--contract-report`
lists every cell with its state and ends with one line per origin, printed last:

    contract: covered 107, improved 1, not applicable 2, NOT covered 0 (of 110)
    slotserve: covered 3, improved 0, not applicable 0, NOT covered 0 (of 3)

covered: a test marked with the cell passed; improved: the same, for a cell where slotserve deliberately does
better than the contract; not applicable: the cell names a feature slotserve does not have.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.contract.cells import Cell, Mark, Origin, read_cells

COVERED, IMPROVED, NOT_APPLICABLE = "covered", "improved", "not applicable"
NO_PASS, NO_TEST = "NOT covered (its test did not pass)", "NOT covered (no test)"
_TOTALS = (COVERED, IMPROVED, NOT_APPLICABLE, "NOT covered")


class _Run:
    """What one pytest session learnt about cells."""

    def __init__(self) -> None:
        self.cells: list[Cell] = read_cells()
        self.marked: set[str] = set()
        self.passed: set[str] = set()
        self.totals: list[str] = []  # the closing lines, written after pytest's own summary
        self.reporter = None  # the terminal reporter that writes them

    def state(self, cell: Cell) -> str:
        if cell.mark is Mark.NOT_APPLICABLE:
            return NOT_APPLICABLE
        if cell.id in self.passed:
            return IMPROVED if cell.mark is Mark.IMPROVED else COVERED
        return NO_PASS if cell.id in self.marked else NO_TEST


_run_key = pytest.StashKey[_Run]()


def pytest_addoption(parser):
    parser.addoption(
        "--contract-report",
        action="store_true",
        help="after the run, list every contract cell as covered, improved, not applicable or NOT "
        "covered, then the totals per origin (contract, slotserve)",
    )


def pytest_configure(config):
    config.stash[_run_key] = _Run()


def pytest_collection_modifyitems(config, items):
    run = config.stash[_run_key]
    cells = {cell.id: cell for cell in run.cells}
    for item in items:
        for mark in item.iter_markers("cell"):
            for cell_id in mark.args:
                cell = cells.get(cell_id)
                if cell is None:
                    raise pytest.UsageError(f"{item.nodeid}: unknown contract cell {cell_id!r}")
                if not cell.testable:
                    raise pytest.UsageError(
                        f"{item.nodeid}: cell {cell_id} is marked not applicable in "
                        f"cells.tsv ({cell.reason}); no test can cover it"
                    )
                run.marked.add(cell_id)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.passed:
        for mark in item.iter_markers("cell"):
            item.config.stash[_run_key].passed.update(mark.args)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not config.getoption("--contract-report"):
        return
    run = config.stash[_run_key]
    run.reporter = terminalreporter
    write = terminalreporter.write_line
    write("")
    write(
        "contract coverage (covered or improved: a test marked with the cell passed; improved: slotserve does "
        "better than the contract; not applicable: slotserve does not have the feature):"
    )
    width = max(len(cell.id) for cell in run.cells)
    for cell in run.cells:
        state = run.state(cell)
        reason = f": {cell.reason}" if cell.mark is not Mark.PLAIN else ""
        write(f"  {cell.id:{width}s}  {state}{reason}")
    for origin in Origin:
        cells = [cell for cell in run.cells if cell.origin is origin]
        if cells:
            run.totals.append(f"{origin.value}: {totals(run, cells)}")


def totals(run: _Run, cells: list[Cell]) -> str:
    counts = Counter(run.state(cell).split(" (")[0] for cell in cells)
    return ", ".join(f"{name} {counts[name]}" for name in _TOTALS) + f" (of {len(cells)})"


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    run = config.stash.get(_run_key, None)
    if run is not None and run.reporter is not None:
        for line in run.totals:
            run.reporter.write_line(line)
