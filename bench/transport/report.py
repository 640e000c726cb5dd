"""Markdown tables of a transport run, as docs/speed.md ("Front ends") quotes them.

.venv/bin/python -m bench.transport.report [bench/results/latest.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.sections.transport import ANCHORS, CONCURRENCY, DESIGNS  # noqa: E402
from bench.table import column_median, fmt, fmt_ms, fmt_x, ok, paired_ratio  # noqa: E402


def figures(raw: dict) -> str:
    runs = raw["transport"]
    names = [d for d in DESIGNS if runs.get(f"{d} c=1")]
    lines = [
        "| design | clients | infer/s median (range) | x today | x bare | x triton | p50 / p99 ms | CPU µs / request "
        "| switches / request |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in CONCURRENCY:
        for name in names:
            points = runs[f"{name} c={c}"]
            good = [p["infer_per_s"] for p in points if ok(p)]
            ratios = [
                "-" if anchor == name else fmt_x(paired_ratio(points, runs[f"{anchor} c={c}"], "infer_per_s"))
                for anchor in ANCHORS
            ]
            spread = f"{fmt(min(good))}-{fmt(max(good))}" if good else "n/a"
            lines.append(
                f"| {name} | {c} | {fmt(column_median(points, 'infer_per_s'))} ({spread}) | {' | '.join(ratios)} "
                f"| {fmt_ms(column_median(points, 'p50_ms'))} / {fmt_ms(column_median(points, 'p99_ms'))} "
                f"| {fmt(column_median(points, 'cpu_us_per_request'))} "
                f"| {fmt(column_median(points, 'switches_per_request'), 1)} |"
            )
    return "\n".join(lines)


def profiles(raw: dict) -> str:
    found = raw.get("transport_profile") or {}
    parts = [(name, part, p) for name, s in found.items() if "parts" in s for part, p in s["parts"].items()]
    kinds = sorted({kind for _, _, p in parts for kind in p["buckets"]}, key=lambda k: (k == "other", k))
    lines = [
        "| design | GIL held | " + " | ".join(kinds) + " |",
        "|---|---|" + "---|" * len(kinds),
    ]
    for name, part, found_part in parts:
        label = name if part == "all" else f"{name}: {part}"
        busy, buckets = found_part["gil_busy"], found_part["buckets"]
        cells = [f"{buckets[k]:.0f} %" if k in buckets else "-" for k in kinds]
        lines.append(f"| {label} | {100 * busy:.0f} % | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = (sys.argv[1:] if argv is None else argv) or [str(ROOT / "bench" / "results" / "latest.json")]
    pooled: dict[str, list] = {}
    for path in argv:
        document = json.loads(Path(path).read_text())
        raw = document["raw"]
        machine = document["machine"]
        print(f"{path}: {document['date']}, git {machine['git']}, load {raw.get('loadavg_1min')} -> "
              f"{machine['loadavg_end']}; setup {raw.get('transport_setup')}; IPC {raw.get('transport_ipc')}; "
              f"stall probe (s) {raw.get('transport_stall_probe_s')}")  # fmt: skip
        for key, runs in raw["transport"].items():
            pooled.setdefault(key, []).extend(runs)
    print()
    print(figures({**raw, "transport": pooled}))
    print()
    print(profiles(raw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
