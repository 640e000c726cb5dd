"""README.md is a short front door that lists every docs/ page; every relative link of the documentation
resolves, anchors included; nothing points outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.markdown import DOCS, README, ROOT, anchors, links, name, pages, table_rows

READMES = [ROOT / "bench" / "README.md", ROOT / "soak" / "README.md", ROOT / "deploy" / "README.md"]
MAX_README_LINES = 160  # the docs table grows a row per page; the rest stays an overview


def test_the_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail to docs/"


def test_the_readme_lists_every_docs_page_once():
    rows = table_rows(README.read_text(), "| page | for | what it says |")
    listed = [re.search(r"\]\(docs/([^)#]+)\)", row[0]).group(1) for row in rows]
    assert sorted(listed) == sorted(path.name for path in DOCS.glob("*.md")), listed
    assert all(row[1] and row[2] for row in rows), "every page gets its reader and one line"


@pytest.mark.parametrize("page", pages() + READMES, ids=lambda path: name(path))
def test_every_link_resolves(page: Path):
    problems = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z]+:", target):
            problems.append(f"{target}: an absolute URL (the pages link only inside the repository)")
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.is_relative_to(ROOT):
            problems.append(f"{target}: outside the repository")
        elif not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{target}: no heading with that anchor in {name(resolved)}")
    assert not problems, f"{name(page)}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("page", pages() + READMES, ids=lambda path: name(path))
def test_nothing_refers_outside_the_repository(page: Path):
    text = page.read_text()
    for outside in ("../shared", "shared/contract", "/work/", "DESIGN.md"):
        assert outside not in text, f"{name(page)} refers to {outside!r}, which is not part of the repository"
