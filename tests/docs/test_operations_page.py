"""docs/operations.md lists every log event with its fields and level (service/core/events.py) and every metric the
collector serves (service/process/metrics.py)."""

from __future__ import annotations

import logging
import re

from service.core import events
from tests.docs.markdown import DOCS, ROOT, sections, table_rows

PAGE = DOCS / "operations.md"


def test_every_event_is_documented_with_its_fields_and_level():
    rows = table_rows(sections(PAGE)["Logs"], "| event | fields | when |")
    documented = {}
    for name_cell, fields_cell, _when in rows:
        names = re.findall(r"`(\w+)`", name_cell)
        assert len(names) == 1, f"one event per row: {name_cell}"
        level = re.search(r"\((WARNING|ERROR)\)", name_cell)
        fields = [f.strip() for f in re.sub(r"\([^)]*\)", "", fields_cell).split(",") if f.strip()]
        documented[names[0]] = (tuple(fields), level.group(1) if level else "INFO")
    expected = {name: (spec.fields, logging.getLevelName(spec.level)) for name, spec in events.EVENTS.items()}
    assert documented == expected


def test_the_fixed_json_keys_are_the_pages():
    sentence = re.search(r"the fixed keys(.*?)followed by", sections(PAGE)["Logs"], flags=re.S).group(1)
    assert tuple(re.findall(r"`(\w+)`", sentence)) == events.FIXED_KEYS


def test_every_metric_is_documented():
    table = table_rows(sections(PAGE)["Metrics"], "| metric | type | meaning |")
    documented = {
        re.sub(r"_total$", "", re.sub(r"\{.*\}", "", name))
        for row in table
        for name in re.findall(r"`(slotserve_[^`]+)`", row[0])
    }
    served = set(re.findall(r'"(slotserve_\w+)"', (ROOT / "service" / "process" / "metrics.py").read_text()))
    assert documented == served
