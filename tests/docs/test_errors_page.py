"""docs/errors.md says what service/transport/status_codes.py does: one row per (status, reason), naming every exception
class that names that reason, and the internal errors apart."""

from __future__ import annotations

import re

from service.transport import status_codes
from tests.docs.markdown import DOCS, table_rows

PAGE = DOCS / "errors.md"
ANY_OTHER = "any other exception"


def documented() -> list[tuple[str, str, set[str]]]:
    """(status, reason, exception class names) of each row of the page's status table."""
    rows = table_rows(PAGE.read_text(), "| situation | status | reason | raised as |")
    return [
        (status, reason.strip("`"), set(re.findall(r"`(\w+)`", raised)) or {ANY_OTHER})
        for _situation, status, reason, raised in rows
    ]


def test_every_class_of_the_table_is_documented_with_its_status_and_reason():
    rows = documented()
    for cls, reason in status_codes.reasoned_classes().items():
        code = status_codes.TABLE[reason]
        where = [(status, why) for status, why, classes in rows if cls.__name__ in classes]
        assert where == [(code.name, reason)], f"{cls.__name__}: the table says {code.name} {reason}, the page {where}"


def test_every_documented_class_is_in_the_table_or_an_internal_error():
    mapped = {cls.__name__ for cls in status_codes.reasoned_classes()}
    generic = {cls.__name__ for cls in status_codes._GENERIC}
    for status, reason, classes in documented():
        if reason == "internal":
            assert status == "INTERNAL" and classes <= generic | {ANY_OTHER}, (status, reason, classes)
        else:
            assert classes <= mapped, f"{classes - mapped} are not in service/transport/status_codes.py"
    assert {ANY_OTHER} | generic <= set().union(*(classes for *_, classes in documented()))


def test_internal_errors_get_the_messages_the_page_quotes():
    from engine.errors import ExecutionError

    text = PAGE.read_text()
    code, message, reason = status_codes.describe(ExecutionError("secret detail"))
    assert (code.name, reason) == ("INTERNAL", "internal") and f'"{message}"' in text
    code, message, reason = status_codes.describe(RuntimeError("secret detail"))
    assert (code.name, reason) == ("INTERNAL", "internal")
    assert re.sub(r"reference \w+", "reference …", message) in text
