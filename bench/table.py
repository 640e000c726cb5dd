"""Figures: medians and paired ratios over rounds, number formats, and the table `make bench` prints."""

from __future__ import annotations

import statistics


def median(values) -> float:
    values = [v for v in values if v is not None and v == v]
    return statistics.median(values) if values else float("nan")


def ok(point: dict) -> bool:
    return "error" not in point


def paired_ratio(points_a: list[dict], points_b: list[dict], key: str) -> float:
    """Median over rounds of a[key] / b[key] (pairs measured back to back)."""
    return median([a[key] / b[key] for a, b in zip(points_a, points_b, strict=False) if ok(a) and ok(b) and b[key]])


def column_median(points: list[dict], key: str) -> float:
    return median([p[key] for p in points if ok(p)])


def first_error(points: list[dict]) -> str | None:
    for point in points:
        if not ok(point):
            return point["error"]
    return None


def fmt(value: float, digits: int = 0) -> str:
    if value is None or value != value:
        return "n/a"
    return f"{value:,.{digits}f}"


def fmt_x(value: float) -> str:
    return "n/a" if value != value else f"{value:.2f}x"


def fmt_ms(value: float) -> str:
    if value != value:
        return "n/a"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


class Table:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, section: str, figure: str, value: str, target: str = "", met: bool | None = None, **data) -> None:
        self.rows.append({"section": section, "figure": figure, "value": value, "target": target, "met": met, **data})

    def render(self) -> str:
        headers = ("figure", "value", "target", "met?")
        cells = [
            (r["figure"], r["value"], r["target"] or "-", "" if r["met"] is None else ("yes" if r["met"] else "NO"))
            for r in self.rows
        ]
        widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
        line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
        rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        body = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in cells]
        return "\n".join([line, rule, *body])


def met_if(value: float, predicate) -> bool | None:
    return None if value != value else bool(predicate(value))
