"""`identity_fp32` at 1 and 16 MiB, concurrency 1 and 4: MB/s through slotserve against the bare server."""

from __future__ import annotations

from ..common import DEMO_REPOSITORY, log
from ..perf_analyzer import PerfAnalyzer, describe, measure_fp32_bytes
from ..servers import Launcher
from ..table import Table, column_median, first_error, fmt, fmt_ms, fmt_x, met_if, ok, paired_ratio

IDENTITY_SIZES = {"1 MiB": 262144, "16 MiB": 4194304}  # FP32 elements
IDENTITY_CONCURRENCY = (1, 4)


def section_identity(args, launcher: Launcher, pa: PerfAnalyzer, table: Table, raw: dict) -> None:
    points: dict[tuple, list] = {
        (server, size, c): []
        for server in ("slotserve", "bare")
        for size in IDENTITY_SIZES
        for c in IDENTITY_CONCURRENCY
    }
    with launcher.slotserve("slotserve-identity", DEMO_REPOSITORY) as slot, launcher.bare("bare-identity") as bare:
        servers = {"slotserve": slot, "bare": bare}
        for round_index in range(args.rounds):
            order = ("slotserve", "bare") if round_index % 2 == 0 else ("bare", "slotserve")
            for size, elements in IDENTITY_SIZES.items():
                for c in IDENTITY_CONCURRENCY:
                    for name in order:
                        point = measure_fp32_bytes(pa, servers[name], "identity_fp32", c, elements)
                        points[(name, size, c)].append(point)
                        log(
                            f"identity round {round_index + 1}/{args.rounds} {size} c={c} {name}: "
                            + (f"{point['mb_per_s']:.0f} MB/s, " if ok(point) else "")
                            + describe(point)
                        )
    raw["identity"] = {f"{server} {size} c={c}": runs for (server, size, c), runs in points.items()}
    for size in IDENTITY_SIZES:
        for c in IDENTITY_CONCURRENCY:
            s, b = points[("slotserve", size, c)], points[("bare", size, c)]
            error = first_error(s) or first_error(b)
            ratio = paired_ratio(s, b, "mb_per_s")
            big = size == "16 MiB"
            table.add(
                "identity",
                f"identity_fp32 {size} c={c} MB/s, slotserve / bare",
                f"{fmt(column_median(s, 'mb_per_s'))} / {fmt(column_median(b, 'mb_per_s'))} = {fmt_x(ratio)}"
                f" (p50 {fmt_ms(column_median(s, 'p50_ms'))} / {fmt_ms(column_median(b, 'p50_ms'))} ms)"
                + (f" [{error[:100]}]" if error else ""),
                "ratio >= 1.5" if big else "",
                met_if(ratio, lambda v: v >= 1.5) if big else None,
                ratio=ratio,
                slotserve=column_median(s, "mb_per_s"),
                bare=column_median(b, "mb_per_s"),
            )
