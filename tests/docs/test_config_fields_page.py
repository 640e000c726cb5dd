"""docs/model-repository.md's table of config.pbtxt fields is engine/config/fields.py's FIELDS table, row for row."""

from __future__ import annotations

from engine.config.fields import FIELDS
from tests.docs.generate import MODEL_REPOSITORY_PAGE, generated_part, model_repository_page
from tests.docs.markdown import table_rows


def test_the_config_fields_table_is_current():
    text = MODEL_REPOSITORY_PAGE.read_text()
    assert model_repository_page(text) == text, "docs/model-repository.md is stale: run `make docs`"


def test_every_field_rule_is_one_row_with_its_treatment():
    part = generated_part(MODEL_REPOSITORY_PAGE.read_text(), "config-fields", MODEL_REPOSITORY_PAGE)
    rows = {row[0].strip("`"): row[1] for row in table_rows(part, "| field |")}
    assert rows == {path: rule.treatment.value for path, rule in FIELDS.items()}
    assert {"applied", "refused", "ignored"} == set(rows.values())
