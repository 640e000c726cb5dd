"""The generated parts of docs/ are current (`make docs` rewrites them), and the generator says what it refuses."""

from __future__ import annotations

import argparse
import textwrap

import pytest

from tests.contract.cells import read_cells
from tests.docs import generate
from tests.docs.generate import (
    BEHAVIOUR_PAGE,
    COMMAND_LINE_PAGE,
    PageError,
    behaviour_tables,
    flag_tables,
    generated_part,
    read_words,
    with_part,
)
from tests.docs.markdown import table_rows


def all_rows(text: str, header: str) -> list[list[str]]:
    """The rows of every table of `text` whose header starts with `header`."""
    lines = text.splitlines()
    return [
        row
        for i, line in enumerate(lines)
        if line.startswith(header)
        for row in table_rows("\n".join(lines[i:]), header)
    ]


def test_the_command_line_page_is_current():
    text = COMMAND_LINE_PAGE.read_text()
    assert generate.command_line_page(text) == text, "docs/command-line.md is stale: run `make docs`"


def test_the_behaviour_page_is_current():
    """Collects the whole suite's cell marks (a pytest subprocess), as `make docs` does."""
    text = BEHAVIOUR_PAGE.read_text()
    assert generate.behaviour_page(text) == text, "docs/behaviour.md is stale: run `make docs`"


def test_the_command_line_page_lists_every_flag_with_its_default():
    from service.process.cli import build_parser

    part = generated_part(COMMAND_LINE_PAGE.read_text(), "flags", COMMAND_LINE_PAGE)
    shown = {row[0].strip("`").split()[0]: row[1] for row in all_rows(part, "| flag |")}
    flags = {
        action.option_strings[0]: action  # its first name (a Triton alias follows as "also")
        for action in build_parser()._actions
        if action.option_strings and action.dest != "help"
    }
    assert set(shown) == set(flags)
    assert shown["--port"] == "8001" and shown["--parallel-jobs"] == "not set"
    assert shown["--allow-management"] == shown["--no-load-at-startup"] == "off"
    assert shown["--max-message-bytes"] == "1073741824 (1 GiB)"


# ---- the generator -------------------------------------------------------------------------------------------


def test_a_page_without_its_markers_is_refused(tmp_path):
    page = tmp_path / "page.md"
    with pytest.raises(PageError, match="expected one '<!-- generated: flags -->'"):
        generated_part("no markers here\n", "flags", page)
    doubled = "<!-- generated: x -->\n<!-- end generated: x -->\n" * 2
    with pytest.raises(PageError):
        generated_part(doubled, "x", page)


def test_only_the_generated_part_changes():
    text = "before\n<!-- generated: x -->\nold\n<!-- end generated: x -->\nafter\n"
    assert with_part(text, "x", "new\n", BEHAVIOUR_PAGE) == text.replace("old", "new")


def test_flag_tables_expand_the_help_and_show_defaults_apart():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0, metavar="S", help="how long (default: %(default)s)")
    parser.add_argument("--mode", choices=("a", "b"), default="a", help="which one")
    parser.add_argument("--quiet", action="store_true", help="say less")
    parser.add_argument("--bare")
    rows = table_rows(flag_tables(parser), "| flag |")
    assert rows == [
        ["`--seconds S`", "30", "how long"],
        ["`--mode a|b`", "`a`", "which one"],
        ["`--quiet`", "off", "say less"],
        ["`--bare BARE`", "not set", "-"],
    ]


CELLS = read_cells()
WORDS = read_words()
MARKS = {"tests/contract/test_x.py::test_one": [cell.id for cell in CELLS if cell.testable]}


def test_every_cell_needs_our_words_and_words_need_a_cell():
    missing = {k: v for k, v in WORDS.items() if k != "OPS.ready.infer"}
    with pytest.raises(PageError, match=r"missing \['OPS.ready.infer'\]"):
        behaviour_tables(CELLS, missing, MARKS)
    with pytest.raises(PageError, match=r"unknown \['OPS.nowhere'\]"):
        behaviour_tables(CELLS, {**WORDS, "OPS.nowhere": "words"}, MARKS)


def test_a_testable_cell_without_a_test_is_refused():
    marks = {"tests/contract/test_x.py::test_one": [c.id for c in CELLS if c.testable and c.id != "ORDER.01"]}
    with pytest.raises(PageError, match="cell ORDER.01 has no test marked with it"):
        behaviour_tables(CELLS, WORDS, marks)


def test_marked_cells_are_shown_as_improved_or_not_applicable():
    rows = {row[0]: row for row in all_rows(behaviour_tables(CELLS, WORDS, MARKS), "| cell |")}
    assert set(rows) == {cell.id for cell in CELLS}
    assert rows["TIME.09"][2].startswith("**Improved**: ")
    assert rows["FAIL.10"][2].startswith("**Not applicable**: ") and rows["FAIL.10"][3] == "no test may claim it"
    assert rows["OPS.unloaded.infer"][3] == "[test_x.py](../tests/contract/test_x.py): one"


def test_the_words_file_is_well_formed(tmp_path):
    path = tmp_path / "behaviour.tsv"
    path.write_text(
        textwrap.dedent("""\
        id\tslotserve
        A.1\tdoes one thing
        A.1\tdoes another
    """)
    )
    with pytest.raises(PageError, match="A.1 is listed twice"):
        read_words(path)
    path.write_text("id\twords\nA.1\tx\n")
    with pytest.raises(PageError, match="columns are"):
        read_words(path)
