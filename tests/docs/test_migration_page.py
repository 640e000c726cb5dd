"""docs/migrating-from-triton.md shows the check's real output: its walkthrough parts are what `make docs` generates
from tests/docs/migration.py today (the check run on the walkthrough's repository at each stage), and
the walkthrough ends where the page says it does: refused at first, served after the edits."""

from __future__ import annotations

from tests.docs import generate
from tests.docs.generate import MIGRATION_PAGE, generated_part
from tests.docs.migration import NOT_YET


def test_the_migration_page_is_current():
    text = MIGRATION_PAGE.read_text()
    assert generate.migration_page(text) == text, "docs/migrating-from-triton.md is stale: run `make docs`"


def test_the_walkthrough_goes_from_refused_to_served():
    text = MIGRATION_PAGE.read_text()
    before = generated_part(text, "walkthrough-before", MIGRATION_PAGE)
    edited = generated_part(text, "walkthrough-edited", MIGRATION_PAGE)
    after = generated_part(text, "walkthrough-after", MIGRATION_PAGE)
    assert before.rstrip("`\n").endswith("$ echo $?\n1") and "1 of 4 models would serve" in before  # the python one
    for name in NOT_YET:
        assert f"model '{name}' version 1: does not serve" in before
    assert "refused: model_repository_agents" in before
    assert "priority_levels" not in before  # served (docs/lifecycle.md, Priorities)
    # The ensemble does not serve while its step does not, as the server refuses it (issue 35).
    assert "model 'classifier'" in block(before, "pipeline").split("  reason: ")[1]
    assert "mismatch: output 'scores' is FP32 in the model, FP16 in the config" in edited
    assert "1 of 3 models would serve" in edited
    assert (
        "ensemble 'pipeline': step 1 (model 'classifier') failed: " in block(edited, "pipeline").split("  reason: ")[1]
    )
    assert after.rstrip("`\n").endswith("$ echo $?\n0") and "3 of 3 models would serve" in after
    assert "  slots: 2" in after


def block(output: str, model: str) -> str:
    """Model `model`'s block of the check's text output, which must say it does not serve."""
    return next(b for b in output.split("\n\n") if b.startswith(f"model '{model}' version 1: does not serve"))
