"""docs/python-models.md shows a model.py the tests serve, as it is in the repository."""

from __future__ import annotations

from tests.docs.markdown import DOCS, ROOT, fenced_blocks, sections

PAGE = DOCS / "python-models.md"
EXAMPLE = ROOT / "tests" / "python_models" / "repository" / "add_sub" / "1" / "model.py"


def test_the_example_is_the_served_model_file():
    blocks = [code for _language, code in fenced_blocks(sections(PAGE)["Writing one"])]
    assert blocks, "the section shows no model.py"
    assert blocks[0].strip() == EXAMPLE.read_text().strip()
