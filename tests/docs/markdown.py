"""Reading the documentation pages: their `## ` sections, fenced blocks, tables and links.

Kept small on purpose: the pages use plain GitHub Markdown (ATX headings, ``` fences, pipe tables, inline links).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TOP = "(top)"  # the section before a page's first `## ` heading


def pages() -> list[Path]:
    """README.md, then docs/*.md in name order."""
    return [README, *sorted(DOCS.glob("*.md"))]


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def sections(page: Path) -> dict[str, str]:
    """`## ` title -> its text (up to the next `## `), TOP for the text before the first one. Headings inside
    fenced blocks do not count."""
    found: dict[str, list[str]] = {TOP: []}
    current, fenced = TOP, False
    for line in page.read_text().splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            current = line[3:].strip()
            if current in found:
                raise ValueError(f"{name(page)}: two sections titled {current!r}")
            found[current] = []
            continue
        found[current].append(line)
    return {title: "".join(lines) for title, lines in found.items()}


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block of `text`, in order ("" for a block without a language)."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.S | re.M)


def section_blocks(page: Path, title: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block in section `title` of `page`."""
    found = sections(page)
    if title not in found:
        raise KeyError(f"{name(page)} has no section '## {title}' (it has {sorted(found)})")
    return fenced_blocks(found[title])


def table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the pipe table whose header line starts with `header` (the separator line
    skipped). A `\\|` inside a cell is a literal bar."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = re.split(r"(?<!\\)\|", line.strip()[1:-1])
        rows.append([c.strip().replace("\\|", "|") for c in cells])
    return rows


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def links(text: str) -> list[str]:
    """The targets of the inline links of `text`, outside fenced blocks and code spans."""
    prose = re.sub(r"^```.*?^```$", "", text, flags=re.S | re.M)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    return _LINK.findall(prose)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub makes for the headings of `page`: lower case, punctuation other than `-` and `_`
    dropped, spaces made `-`."""
    result = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            result.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return result
