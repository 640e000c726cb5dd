"""`simple` at concurrency 1, 4, 16: slotserve (one slot, and --parallel-jobs 4) against the bare server."""

from __future__ import annotations

import contextlib

from ..common import DEMO_REPOSITORY, log
from ..perf_analyzer import PerfAnalyzer, describe, measure
from ..profiling import profile_servers
from ..servers import Launcher
from ..table import Table, column_median, first_error, fmt, fmt_ms, fmt_x, met_if, paired_ratio

SIMPLE_CONCURRENCY = (1, 4, 16)

# The slotserve configurations measured against the bare server on `simple`: the default (one slot per model,
# no --parallel-jobs) and the parallel runtime with 4 slots. With one slot, a tiny model is bound by how fast
# the thread that ran it gets the GIL back after ONNX Runtime (which releases it): the slot stays held meanwhile.
SIMPLE_VARIANTS = (("slotserve", ()), ("slotserve-p4", ("--parallel-jobs", "4")))


def section_simple(args, launcher: Launcher, pa: PerfAnalyzer, table: Table, raw: dict) -> None:
    names = [name for name, _ in SIMPLE_VARIANTS] + ["bare"]
    points: dict[tuple, list] = {(server, c): [] for server in names for c in SIMPLE_CONCURRENCY}
    with contextlib.ExitStack() as stack:
        servers = {
            name: stack.enter_context(launcher.slotserve(f"{name}-simple", DEMO_REPOSITORY, list(flags)))
            for name, flags in SIMPLE_VARIANTS
        }
        servers["bare"] = stack.enter_context(launcher.bare())
        for round_index in range(args.rounds):
            order = names if round_index % 2 == 0 else names[::-1]
            for c in SIMPLE_CONCURRENCY:
                for name in order:
                    point = measure(pa, servers[name], "simple", c)
                    points[(name, c)].append(point)
                    log(f"simple round {round_index + 1}/{args.rounds} c={c} {name}: " + describe(point))
        if args.profile:
            raw["profile"] = profile_servers(args, {"slotserve": servers["slotserve"], "bare": servers["bare"]}, pa)
    raw["simple"] = {f"{server} c={c}": runs for (server, c), runs in points.items()}
    for variant, flags in SIMPLE_VARIANTS:
        label = variant if not flags else f"{variant} ({' '.join(flags)})"
        for c in SIMPLE_CONCURRENCY:
            _simple_rows(table, raw, label, c, points[(variant, c)], points[("bare", c)])


def _simple_rows(table: Table, raw: dict, label: str, c: int, s: list[dict], b: list[dict]) -> None:
    error = first_error(s) or first_error(b)
    tput = paired_ratio(s, b, "infer_per_s")
    p99 = paired_ratio(s, b, "p99_ms")
    table.add(
        "simple",
        f"simple c={c} infer/s, {label} / bare",
        f"{fmt(column_median(s, 'infer_per_s'))} / {fmt(column_median(b, 'infer_per_s'))} "
        f"= {fmt_x(tput)}" + (f" [{error[:100]}]" if error else ""),
        "ratio >= 0.90" if c == 16 else "",
        met_if(tput, lambda v: v >= 0.90) if c == 16 else None,
        ratio=tput,
        slotserve=column_median(s, "infer_per_s"),
        bare=column_median(b, "infer_per_s"),
    )
    table.add(
        "simple",
        f"simple c={c} p50 ms, {label} / bare",
        f"{fmt_ms(column_median(s, 'p50_ms'))} / {fmt_ms(column_median(b, 'p50_ms'))}",
        slotserve=column_median(s, "p50_ms"),
        bare=column_median(b, "p50_ms"),
    )
    table.add(
        "simple",
        f"simple c={c} p99 ms, {label} / bare",
        f"{fmt_ms(column_median(s, 'p99_ms'))} / {fmt_ms(column_median(b, 'p99_ms'))} = {fmt_x(p99)}",
        "ratio <= 1.2" if c == 1 else "",
        met_if(p99, lambda v: v <= 1.2) if c == 1 else None,
        ratio=p99,
        slotserve=column_median(s, "p99_ms"),
        bare=column_median(b, "p99_ms"),
    )
    queue = column_median(s, "server_queue_us")
    infer = column_median(s, "server_compute_infer_us")
    inp, outp = column_median(s, "server_compute_input_us"), column_median(s, "server_compute_output_us")
    raw.setdefault("simple_server_side_us", {})[f"{label} c={c}"] = {
        "queue": queue,
        "compute_input": inp,
        "compute_infer": infer,
        "compute_output": outp,
    }
    if c == max(SIMPLE_CONCURRENCY):
        table.add(
            "simple",
            f"simple c={c} {label}'s own statistics, us per request",
            f"queue {fmt(queue)}, input {fmt(inp)}, infer {fmt(infer)}, output {fmt(outp)} "
            f"(1 / throughput = {fmt(1e6 / column_median(s, 'infer_per_s'))})",
        )
