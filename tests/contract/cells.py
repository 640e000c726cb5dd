"""The behaviour cells tests are marked with (`@pytest.mark.cell("<id>")`), read from tests/contract/cells.tsv.

One row per cell, tab-separated, with a header:

    id, where, expected, seed_label   the contract's own columns, verbatim (../shared/contract/cells.tsv)
    origin                            `contract` (one of the contract's 110 cells) or `slotserve` (a cell of
                                      our own, e.g. BATCH.nn for dynamic batching, listed after them)
    mark                              empty: a test marked with the cell must pass for it to count as covered;
                                      `improved`: slotserve deliberately does better than the contract says
                                      (a test marked with it shows what slotserve does); `not-applicable`: the
                                      cell names a feature slotserve does not have, and no test may claim it
    reason                            why, for `improved` and `not-applicable` (required there, empty otherwise)
"""

from __future__ import annotations

import csv
import enum
from dataclasses import dataclass
from pathlib import Path

CELLS_FILE = Path(__file__).resolve().parent / "cells.tsv"
# The contract's own cell list, when the shared folder is beside this checkout (it is not in a user's clone).
SHARED_CELLS_FILE = Path(__file__).resolve().parents[3] / "shared" / "contract" / "cells.tsv"
CONTRACT_COLUMNS = ("id", "where", "expected", "seed_label")
COLUMNS = CONTRACT_COLUMNS + ("origin", "mark", "reason")
CONTRACT_CELL_COUNT = 110


class Origin(enum.Enum):
    CONTRACT = "contract"
    SLOTSERVE = "slotserve"


class Mark(enum.Enum):
    PLAIN = ""
    IMPROVED = "improved"
    NOT_APPLICABLE = "not-applicable"


@dataclass(frozen=True)
class Cell:
    id: str
    where: str
    expected: str
    seed_label: str
    origin: Origin
    mark: Mark
    reason: str

    @property
    def testable(self) -> bool:
        """Whether tests may be marked with this cell (and one must pass for it to count)."""
        return self.mark is not Mark.NOT_APPLICABLE


class CellsFileError(ValueError):
    """cells.tsv is malformed: the message names the row and the problem."""


def read_cells(path: Path | None = None) -> list[Cell]:
    """Every cell of `path` (default CELLS_FILE), in file order. Raises CellsFileError for a bad header, an
    unknown origin or mark, a missing or superfluous reason, or a repeated id."""
    path = path or CELLS_FILE
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t")
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise CellsFileError(f"{path}: columns are {reader.fieldnames}, expected {list(COLUMNS)}")
        cells = [_cell(path, number, row) for number, row in enumerate(reader, start=2)]
    seen: set[str] = set()
    for cell in cells:
        if cell.id in seen:
            raise CellsFileError(f"{path}: cell {cell.id} is listed twice")
        seen.add(cell.id)
    return cells


def _cell(path: Path, line: int, row: dict[str, str]) -> Cell:
    where = f"{path}:{line} ({row['id']})"
    try:
        origin, mark = Origin(row["origin"]), Mark(row["mark"])
    except ValueError as error:
        raise CellsFileError(f"{where}: {error}") from None
    if (mark is Mark.PLAIN) == bool(row["reason"]):
        raise CellsFileError(
            f"{where}: a reason is required for a marked cell and only for one "
            f"(mark {mark.value!r}, reason {row['reason']!r})"
        )
    return Cell(row["id"], row["where"], row["expected"], row["seed_label"], origin, mark, row["reason"])


def read_shared_contract(path: Path = SHARED_CELLS_FILE) -> list[tuple[str, ...]]:
    """The contract's rows (its own four columns), in its order."""
    with path.open(newline="") as handle:
        return [tuple(row[column] for column in CONTRACT_COLUMNS) for row in csv.DictReader(handle, delimiter="\t")]
