"""The generated parts of docs/: `make docs` (`python -m tests.docs.generate`) rewrites them, and
tests/docs/test_generated_pages.py fails when one is stale.

A generated part sits between `<!-- generated: NAME -->` and `<!-- end generated: NAME -->` in its page; the rest
of the page is written by hand.

* docs/command-line.md, `flags`: every flag of `service.process.cli.build_parser()`, group by group, with its default
and
  its help as `--help` prints it.
* docs/behaviour.md, `cells`: every cell of tests/contract/cells.tsv, with the contract's situation, what slotserve
  does (tests/contract/behaviour.tsv, our words) and the tests marked with the cell (`@pytest.mark.cell`, as
  pytest collects them: tests/docs/cell_marks.py), cells marked improved or not applicable shown as such.
* docs/model-repository.md, `config-fields`: every entry of engine/config/fields.py's FIELDS table (each config.pbtxt
  field applied, refused or ignored, and why).
* docs/migrating-from-triton.md, `walkthrough-*`: the walkthrough's configurations and the real output of
  `python -m service check` at each stage (tests/docs/migration.py).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from tests.contract.cells import Cell, Mark, Origin, read_cells

from .cell_marks import ENVIRONMENT

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
COMMAND_LINE_PAGE = DOCS / "command-line.md"
BEHAVIOUR_PAGE = DOCS / "behaviour.md"
MODEL_REPOSITORY_PAGE = DOCS / "model-repository.md"
BEHAVIOUR_WORDS = ROOT / "tests" / "contract" / "behaviour.tsv"


class PageError(ValueError):
    """A page or a source of a generated part is malformed: the message says which and how."""


# ---- generated parts inside hand-written pages ------------------------------------------------------------------


def markers(name: str) -> tuple[str, str]:
    return f"<!-- generated: {name} -->\n", f"<!-- end generated: {name} -->\n"


def generated_part(text: str, name: str, where: Path) -> str:
    """The text between the markers of part `name`. Raises PageError when they are missing or repeated."""
    start, end = markers(name)
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise PageError(f"{where}: expected one '{start.strip()}' ... '{end.strip()}' pair")
    return text.split(start, 1)[1].split(end, 1)[0]


def with_part(text: str, name: str, content: str, where: Path) -> str:
    old = generated_part(text, name, where)
    start, end = markers(name)
    return text.replace(start + old + end, start + content + end)


def cell(text: str) -> str:
    """Text for a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


# ---- docs/command-line.md: the flags ----------------------------------------------------------------------------

_DEFAULT_IN_HELP = re.compile(r"\s*\(default:? [^()]*\)$")


def flag_tables(parser: argparse.ArgumentParser) -> str:
    """One table per argument group of `parser`: flag, default, help."""
    formatter = parser._get_formatter()
    sections = []
    for group in parser._action_groups:
        rows = [action for action in group._group_actions if not isinstance(action, argparse._HelpAction)]
        if not rows:
            continue
        title = "serving" if group.title == "options" else str(group.title)  # argparse's name for its main group
        lines = [f"### {title[0].upper()}{title[1:]}\n", "| flag | default | meaning |", "|---|---|---|"]
        for action in rows:
            meaning = _DEFAULT_IN_HELP.sub("", formatter._expand_help(action)) if action.help else ""
            lines.append(f"| {cell(usage(action))} | {cell(default(action))} | {cell(meaning) or '-'} |")
        sections.append("\n".join(lines) + "\n")
    return "\n".join(sections)


def usage(action: argparse.Action) -> str:
    """The flag with its value, then its other names (Triton's, for an alias: `--port PORT` (also `--grpc-port`))."""
    flag, *others = action.option_strings
    also = f" (also {', '.join(f'`{other}`' for other in others)})" if others else ""
    if action.nargs == 0:
        return f"`{flag}`{also}"
    if action.choices:
        return f"`{flag} {'|'.join(action.choices)}`{also}"
    metavar = action.metavar or action.dest.upper()
    return f"`{flag} {metavar}`{also}"


def default(action: argparse.Action) -> str:
    if action.nargs == 0:  # a switch (store_true, store_false): off unless given
        return "off"
    value = action.default
    if value is None:
        return "not set"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and value >= 1 << 20 and value & (value - 1) == 0:
        for unit, shift in (("GiB", 30), ("MiB", 20)):
            if value >= 1 << shift:
                return f"{value} ({value >> shift} {unit})"
    return f"`{value}`" if isinstance(value, (str, Path)) else str(value)


def command_line_page(text: str) -> str:
    from service.process.cli import build_parser

    return with_part(text, "flags", flag_tables(build_parser()), COMMAND_LINE_PAGE)


# ---- docs/behaviour.md: the cells -------------------------------------------------------------------------------

GROUPS = {  # id prefix -> (heading, what the cells of that group are about)
    "OPS": ("One model, by state", "A model M in each lifecycle state, and each operation that can reach it."),
    "TWO": ("Two models", "Models A and B in two situations at once, and an operation on one or both."),
    "ORDER": ("Ordering", "Two operations one after the other: who goes first, who waits for whom."),
    "FAIL": ("Failures", "Loads, reconfigurations, runs and teardowns that fail or are slow."),
    "TIME": ("Timeouts, disconnects and shutdown", "Deadlines, clients that go away, and stopping the server."),
    "BATCH": ("Dynamic batching (slotserve's own cells)", "Queued requests run together as one engine call."),
    "VERSION": ("Model versions (slotserve's own cells)", "A model serving several versions, each its own model."),
    "ENSEMBLE": (
        "Ensembles (slotserve's own cells)",
        "Running ensemble requests meeting managers, eviction, idle retirement and shutdown (docs/ensembles.md).",
    ),
    "SEQUENCE": (
        "Sequences (slotserve's own cells)",
        "Stateful sequences: sequence slots as Triton counts them, each sequence's requests in order on one slot.",
    ),
    "PRIO": (
        "Priorities (slotserve's own cells)",
        "Triton's priority levels and per-level queue policies on a batching model (docs/lifecycle.md#priorities).",
    ),
}


def read_words(path: Path = BEHAVIOUR_WORDS) -> dict[str, str]:
    """Cell id -> what slotserve does, from behaviour.tsv (columns `id`, `slotserve`)."""
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        if tuple(reader.fieldnames or ()) != ("id", "slotserve"):
            raise PageError(f"{path}: columns are {reader.fieldnames}, expected ['id', 'slotserve']")
        words = {}
        for row in reader:
            if row["id"] in words:
                raise PageError(f"{path}: cell {row['id']} is listed twice")
            words[row["id"]] = row["slotserve"].strip()
    return words


def collect_cell_marks() -> dict[str, list[str]]:
    """Test function id -> the cells it is marked with, as pytest collects the suite (a subprocess)."""
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "marks.json"
        completed = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "--collect-only",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "tests.docs.cell_marks",
            ],
            cwd=ROOT,
            env={**os.environ, ENVIRONMENT: str(output)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        if completed.returncode != 0 or not output.exists():
            raise PageError(
                f"collecting the tests failed (exit {completed.returncode}):\n"
                f"{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
            )
        return json.loads(output.read_text())


def behaviour_tables(cells: list[Cell], words: dict[str, str], marks: dict[str, list[str]]) -> str:
    """The generated part of docs/behaviour.md. Raises PageError when a cell has no words, words name no cell,
    a cell belongs to no group, or a testable cell has no test. (A test claiming a cell that does not apply is
    refused by pytest itself, at collection: tests/contract/report.py.)"""
    ids = [c.id for c in cells]
    if set(words) != set(ids):
        raise PageError(
            f"{BEHAVIOUR_WORDS.name} must describe exactly the cells of cells.tsv: missing "
            f"{sorted(set(ids) - set(words))}, unknown {sorted(set(words) - set(ids))}"
        )
    ungrouped = [cell_id for cell_id in ids if cell_id.split(".", 1)[0] not in GROUPS]
    if ungrouped:
        raise PageError(f"cells outside the groups {list(GROUPS)}: {ungrouped}")
    tests: dict[str, list[str]] = {cell_id: [] for cell_id in ids}
    for test, cell_ids in sorted(marks.items()):
        for cell_id in cell_ids:
            tests[cell_id].append(test)
    for c in cells:
        if c.testable and not tests[c.id]:
            raise PageError(f"cell {c.id} has no test marked with it")
    counts = Counter((c.origin, _state(c)) for c in cells)
    lines = []
    for origin in Origin:
        of_origin = [c for c in cells if c.origin is origin]
        summary = ", ".join(
            f"{counts[origin, state]} {state}"
            for state in ("covered", "improved", "not applicable")
            if counts[origin, state]
        )
        lines.append(
            f"* {'The contract' if origin is Origin.CONTRACT else 'slotserve'}'s cells: {len(of_origin)} ({summary})."
        )
    for prefix, (heading, about) in GROUPS.items():
        group = [c for c in cells if c.id.split(".", 1)[0] == prefix]
        lines += [
            "",
            f"## {heading}",
            "",
            about,
            "",
            "| cell | situation | what slotserve does | shown by |",
            "|---|---|---|---|",
        ]
        for c in group:
            lines.append(
                f"| {c.id} | {cell(c.where.replace(' x ', ' × '))} | {cell(_does(c, words[c.id]))} | "
                f"{_shown_by(c, tests[c.id])} |"
            )
    return "\n".join(lines) + "\n"


def _state(c: Cell) -> str:
    return {Mark.PLAIN: "covered", Mark.IMPROVED: "improved", Mark.NOT_APPLICABLE: "not applicable"}[c.mark]


def _does(c: Cell, words: str) -> str:
    if c.mark is Mark.IMPROVED:
        return f"**Improved**: {words}"
    if c.mark is Mark.NOT_APPLICABLE:
        return f"**Not applicable**: {words}"
    return words


def _shown_by(c: Cell, tests: list[str]) -> str:
    if c.mark is Mark.NOT_APPLICABLE:
        return "no test may claim it"
    shown = []
    for test in tests:
        path, function = test.split("::", 1)
        name = function.split("::")[-1].removeprefix("test_").replace("_", " ")
        shown.append(f"[{Path(path).name}](../{path}): {name}")
    return "<br>".join(shown)


def behaviour_page(text: str, marks: dict[str, list[str]] | None = None) -> str:
    content = behaviour_tables(read_cells(), read_words(), collect_cell_marks() if marks is None else marks)
    return with_part(text, "cells", content, BEHAVIOUR_PAGE)


# ---- make docs --------------------------------------------------------------------------------------------------

# ---- docs/model-repository.md: every config.pbtxt field (engine/config/fields.py FIELDS) ------------------------


def config_fields_table() -> str:
    """One row per entry of engine.config.fields.FIELDS, in its order: the field, applied/refused/ignored, why."""
    from engine.config.fields import FIELDS

    rows = ["| field | slotserve | what happens |", "|---|---|---|"]
    rows += [f"| `{path}` | {rule.treatment.value} | {cell(rule.reason)} |" for path, rule in FIELDS.items()]
    return "\n".join(rows) + "\n"


def model_repository_page(text: str) -> str:
    return with_part(text, "config-fields", config_fields_table(), MODEL_REPOSITORY_PAGE)


# ---- docs/migrating-from-triton.md: the walkthrough's files and the check's real output ---------------------------

MIGRATION_PAGE = DOCS / "migrating-from-triton.md"


def migration_page(text: str) -> str:
    from .migration import parts

    for name, content in parts().items():
        text = with_part(text, name, content, MIGRATION_PAGE)
    return text


PAGES = {
    COMMAND_LINE_PAGE: command_line_page,
    BEHAVIOUR_PAGE: behaviour_page,
    MODEL_REPOSITORY_PAGE: model_repository_page,
    MIGRATION_PAGE: migration_page,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rewrite the generated parts of docs/.")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page is stale")
    args = parser.parse_args(argv)
    stale = []
    for page, generate in PAGES.items():
        text = page.read_text()
        new = generate(text)
        if new != text:
            stale.append(page.relative_to(ROOT))
            if not args.check:
                page.write_text(new)
    verb = "stale" if args.check else "rewritten"
    print(f"{verb}: {', '.join(map(str, stale))}" if stale else "docs: every generated part is current")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
