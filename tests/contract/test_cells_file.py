"""tests/contract/cells.tsv: the contract's 110 cells verbatim (checked against the shared contract when it is
beside the project), then slotserve's own cells; marks and reasons well formed; the report counts them apart."""

import textwrap

import pytest

from tests.contract import cells as cells_module
from tests.contract.cells import (
    CONTRACT_CELL_COUNT,
    SHARED_CELLS_FILE,
    CellsFileError,
    Mark,
    Origin,
    read_cells,
    read_shared_contract,
)

pytest_plugins = ["pytester"]


def test_the_110_contract_cells_come_first_then_slotserve_cells_with_ids_of_their_own():
    cells = read_cells()
    origins = [cell.origin for cell in cells]
    assert origins[:CONTRACT_CELL_COUNT] == [Origin.CONTRACT] * CONTRACT_CELL_COUNT
    assert set(origins[CONTRACT_CELL_COUNT:]) <= {Origin.SLOTSERVE}


def test_contract_columns_match_the_shared_contract():
    if not SHARED_CELLS_FILE.exists():
        pytest.skip("../shared/contract/cells.tsv is not beside this checkout")
    ours = [(c.id, c.where, c.expected, c.seed_label) for c in read_cells() if c.origin is Origin.CONTRACT]
    assert ours == read_shared_contract()


def test_deliberate_improvements_and_cells_that_do_not_apply_are_marked_with_their_reason():
    marked = {cell.id: (cell.mark, cell.reason) for cell in read_cells() if cell.mark is not Mark.PLAIN}
    assert {cell: mark for cell, (mark, _) in marked.items()} == {
        "TIME.09": Mark.IMPROVED,
        "FAIL.10": Mark.NOT_APPLICABLE,
        "TIME.10": Mark.NOT_APPLICABLE,
    }
    assert all(len(reason) > 40 for _, reason in marked.values())


HEADER = "id\twhere\texpected\tseed_label\torigin\tmark\treason\n"


@pytest.mark.parametrize(
    "row, problem",
    [
        ("X.1\tw\te\tD\tcontract\timproved\t\n", "a reason is required"),
        ("X.1\tw\te\tD\tcontract\t\twhy\n", "a reason is required"),
        ("X.1\tw\te\tD\telsewhere\t\t\n", "'elsewhere' is not a valid Origin"),
        ("X.1\tw\te\tD\tcontract\tbetter\twhy\n", "'better' is not a valid Mark"),
        ("X.1\tw\te\tD\tcontract\t\t\nX.1\tw\te\tD\tslotserve\t\t\n", "X.1 is listed twice"),
    ],
)
def test_malformed_rows_are_refused_with_the_row_and_the_problem(tmp_path, row, problem):
    path = tmp_path / "cells.tsv"
    path.write_text(HEADER + row)
    with pytest.raises(CellsFileError, match=problem):
        read_cells(path)


def test_a_file_with_other_columns_is_refused(tmp_path):
    path = tmp_path / "cells.tsv"
    path.write_text("id\twhere\texpected\tseed_label\nX.1\tw\te\tD\n")
    with pytest.raises(CellsFileError, match="expected .*'origin', 'mark', 'reason'"):
        read_cells(path)


# ---- the report, on a small cells file -------------------------------------------------------------------------

SMALL = HEADER + "".join(
    [
        "A.1\tw\te\tD\tcontract\t\t\n",
        "A.2\tw\te\tD\tcontract\timproved\tdoes better\n",
        "A.3\tw\te\tD\tcontract\tnot-applicable\tno such feature\n",
        "A.4\tw\te\tD\tcontract\t\t\n",
        "A.5\tw\te\tD\tcontract\t\t\n",
        "B.1\tw\te\tD\tslotserve\t\t\n",
    ]
)


@pytest.fixture
def small_cells(pytester, monkeypatch):
    path = pytester.path / "cells.tsv"
    path.write_text(SMALL)
    monkeypatch.setattr(cells_module, "CELLS_FILE", path)
    pytester.makeini("[pytest]\nmarkers =\n    cell(id): a contract cell\n")
    return pytester


def test_report_counts_covered_improved_not_applicable_and_not_covered_apart_per_origin(small_cells):
    small_cells.makepyfile(
        textwrap.dedent("""
        import pytest

        @pytest.mark.cell("A.1", "B.1")
        def test_passes(): pass

        @pytest.mark.cell("A.2")
        def test_improvement(): pass

        @pytest.mark.cell("A.4")
        def test_fails(): assert False
    """)
    )
    result = small_cells.runpytest_inprocess("-p", "tests.contract.report", "--contract-report")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.re_match_lines(
        [
            r"  A\.1  covered$",
            r"  A\.2  improved: does better$",
            r"  A\.3  not applicable: no such feature$",
            r"  A\.4  NOT covered \(its test did not pass\)$",
            r"  A\.5  NOT covered \(no test\)$",
            r"  B\.1  covered$",
        ]
    )
    lines = result.stdout.lines
    assert lines[-2:] == [
        "contract: covered 1, improved 1, not applicable 1, NOT covered 2 (of 5)",
        "slotserve: covered 1, improved 0, not applicable 0, NOT covered 0 (of 1)",
    ]


def test_a_test_claiming_a_cell_that_does_not_apply_is_refused_at_collection(small_cells):
    small_cells.makepyfile(
        textwrap.dedent("""
        import pytest

        @pytest.mark.cell("A.3")
        def test_stand_in(): pass
    """)
    )
    result = small_cells.runpytest_inprocess("-p", "tests.contract.report")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cell A.3 is marked not applicable in cells.tsv (no such feature)*"])


def test_an_unknown_cell_is_refused_at_collection(small_cells):
    small_cells.makepyfile("import pytest\n\n@pytest.mark.cell('Z.9')\ndef test_x(): pass\n")
    result = small_cells.runpytest_inprocess("-p", "tests.contract.report")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown contract cell 'Z.9'*"])
