"""The soak's verdict: what a run measured, turned into figures and checks (a bound each), printed as tables.

The checks, from the server's own counters (ModelStatistics, ListModels) and the clients' logs (soak/audit.py):

* every request got exactly one final status: each "sent" line has exactly one "done" line;
* no status that means a server fault (INTERNAL, UNKNOWN, a malformed response, a stream that ended without
  answering, a call that outlived its deadline) and no client crashed;
* per model, the server's counts agree with what clients saw: every request counted once, as success or
  failure, except that a request the client gave up on (deadline, cancel) may not have been counted at all:
  sent - handler_busy - gave_up <= success + fail <= sent - handler_busy
  (handler_busy: refused before reaching the model because every inference handler thread was taken);
  failures >= refusals the server sent; OK - ok_abandoned <= success <= OK + gave_up, where ok_abandoned
  are stream requests answered in full whose stream the client cancelled right after (or whose deadline
  then passed), for the streaming model only: the server counts those as successes only if its stream handler
  resumed before the cancel (see the figure "OK answers the server counted as failed");
* no slot is leased, no request is queued, no model is stuck LOADING/UNLOADING/RECONFIGURING;
* no thread leak: at the end Threads <= baseline + 2, and <= start + --max-workers + 2 (the gRPC handler pool
  grows to at most --max-workers threads and keeps them; nothing else may grow);
* no file-descriptor leak: at the end (clients gone, their connections closed) fds <= baseline + 2 (the
  baseline, not the start: ONNX Runtime opens its usage database, three fds, with the first session and
  keeps them; the table lists every kind of fd whose count changed);
* memory, two bounds (sampled every 0.25 s):
  - peak: VmRSS during the main phase and at its end stays <= baseline + --rss-growth-mib (default 64 MiB).
    The baseline is taken after the warm-up, when every model has been loaded and evicted many times, the
    handler pool is full and the largest requests (identity_fp32, 4 x 50,000 FP32 = 800 KB, about a dozen at
    once) have been seen, so the main phase adds no state, only fluctuation: buffers of large tensors and
    glibc's per-thread arenas. Peaks of 23 to 42 MiB above the baseline were measured over 5 minutes;
    64 MiB leaves half again as much.
  - plateau (main phase >= 120 s): the lower quartile of VmRSS over the main phase's last fifth stays <= that
    over its first fifth + --rss-plateau-mib (default 16 MiB). The lower quartile rides over the spikes of
    large tensors in flight. Measured on 2 cores, 300 s (2026-11-30): baseline 139 MiB, main-phase peak +23 MiB,
    lower quartile 144 -> 150 MiB (+6), least-squares trend +1.2 MiB/min (short runs show a steeper trend:
    their main phase still includes the ramp). The soak found one real leak, fixed since: the fixture backend
    kept an event (about 64 bytes) per request in a served process. A leak of a few hundred bytes per request
    (about 600 requests/s here) exceeds the plateau bound within 5 minutes; longer runs
    (SOAK_SECONDS=3600) catch smaller ones.
* SIGTERM: the server exits 0 within its shutdown bound.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from generated import management_pb2 as mpb

from .audit import FAULT_STATUSES, Audit, Tally
from .clients import ClientRun
from .repository import REGISTERED
from .server import MAX_WORKERS, SHUTDOWN_GRACE, Sampler

THREAD_SLACK = 2
FD_SLACK = 2
PLATEAU_MIN_SECONDS = 120.0  # shorter main phases are too short to tell growth from the first minutes' ramp


@dataclass
class Snapshot:
    """The server process at one moment: /proc figures (VmRSS KiB, Threads, fds), threads by name, fds by kind."""

    figures: dict[str, int]
    threads: Counter
    fds: Counter


@dataclass
class Measured:
    """What one soak run measured (soak/run.py fills it in)."""

    roles: list[str]
    threads: int  # per client process
    warmup: float
    main_seconds: float
    traffic_seconds: float
    runs: list[ClientRun]
    saturation: Counter  # statuses of the saturation burst
    gate_shut_count: int
    models: list  # ListModels at the end
    statistics: dict[str, tuple[int, int]]  # model -> (success, fail) from ModelStatistics
    server_log: str
    start: Snapshot
    baseline: Snapshot
    end: Snapshot
    sampler: Sampler
    exit_code: int | None
    exit_seconds: float


class Checks:
    def __init__(self, header: tuple[str, ...] = ("figure", "value", "bound", "ok")) -> None:
        self.header = header
        self.rows: list[tuple[str, ...]] = []
        self.failed: list[str] = []

    def figure(self, name: str, value) -> None:
        self.rows.append((name, str(value), "", ""))

    def check(self, name: str, value, bound: str, ok: bool) -> None:
        self.rows.append((name, str(value), bound, "yes" if ok else "NO"))
        if not ok:
            self.failed.append(f"{name}: {value} (bound {bound})")

    def table(self) -> str:
        header = self.header
        widths = [max(len(row[i]) for row in self.rows + [header]) for i in range(len(header))]
        lines = [
            " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
            "-+-".join("-" * w for w in widths),
        ]
        lines += [" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in self.rows]
        return "\n".join(lines)


NOTES = """
The server's counts reconcile when, per model: OK - (OK, stream then abandoned) <= success <= OK + gave up;
fail >= refused; sent - handler busy - gave up <= success + fail <= sent - handler busy. "gave up": the client's
deadline passed or it cancelled, so the server may or may not have counted the request. "handler busy": refused
before reaching the model (every inference handler thread taken), never counted under a model.
Note 1: a request to a streaming model (fx_stream) answered in full whose stream the client cancelled right after
(or whose deadline then passed) is counted by the server as a failure unless its stream handler resumed first:
the server knows the engine's answers are complete only when it asks for the next one, after the last `yield`,
which a cancelled stream never returns from. Other models' stream answers are counted before they are sent."""


def evaluate(
    measured: Measured, audit: Audit, rss_growth_mib: float, rss_plateau_mib: float
) -> tuple[Checks, Checks, list[str]]:
    """(the figures and checks, the per-model reconciliation table, details of the problems found)."""
    checks = Checks()
    crashed = _requests(checks, measured, audit)
    per_model = _reconciliation(checks, measured, audit)
    _end_state(checks, measured)
    _resources(checks, measured, rss_growth_mib, rss_plateau_mib)
    shutdown_bound = SHUTDOWN_GRACE + 8
    checks.check(
        "SIGTERM: exit code, seconds",
        f"{measured.exit_code}, {measured.exit_seconds:.1f}",
        f"0, <= {shutdown_bound:.0f}",
        measured.exit_code == 0 and measured.exit_seconds <= shutdown_bound,
    )
    details = audit.faults[:10] + audit.missing[:10] + audit.duplicated[:10] + audit.odd_events[:10] + crashed[:10]
    return checks, per_model, details


def _requests(checks: Checks, m: Measured, audit: Audit) -> list[str]:
    """Every request got exactly one final status and none meant a server fault. Returns the crashed clients."""
    checks.figure(
        "traffic seconds (warm-up + main)", f"{m.traffic_seconds:.0f} ({m.warmup:.0f} + {m.main_seconds:.0f})"
    )
    checks.figure("client processes (role x threads)", f"{len(m.roles)} x {m.threads}, twice (warm-up, main)")
    crashed = [f"{run.name}: exit {run.code}" for run in m.runs if run.code != 0]
    checks.check("client processes that failed or overran", len(crashed), "0", not crashed)
    kinds = {kind: sum(counter.values()) for kind, counter in audit.statuses.items()}
    checks.figure(
        "requests sent (infer / stream / management)",
        f"{audit.sent} ({kinds.get('infer', 0)} / {kinds.get('stream', 0)} / {kinds.get('mgmt', 0)})",
    )
    checks.figure("requests per second", f"{audit.sent / max(m.traffic_seconds, 1):.0f}")
    checks.check("final statuses logged", audit.done, f"= sent ({audit.sent})", audit.done == audit.sent)
    checks.check("requests without a final status", len(audit.missing), "0", not audit.missing)
    checks.check("requests with more than one final status", len(audit.duplicated), "0", not audit.duplicated)
    checks.check("final statuses of requests never sent", len(audit.orphans), "0", not audit.orphans)
    checks.check("unexpected events in client logs", len(audit.odd_events), "0", not audit.odd_events)
    checks.check(
        "answers that mean a server fault",
        len(audit.faults),
        f"0 ({'/'.join(FAULT_STATUSES[:3])}...)",
        not audit.faults,
    )
    for kind in ("infer", "stream", "mgmt"):
        counter = audit.statuses.get(kind, Counter())
        checks.figure(f"{kind} statuses", ", ".join(f"{s} {n}" for s, n in counter.most_common()) or "-")
    checks.figure("saturation burst (fx_slow, gate shut)", ", ".join(f"{s} {n}" for s, n in m.saturation.most_common()))
    checks.figure("fx_slow gate shut (times)", m.gate_shut_count)
    return crashed


def _reconciliation(checks: Checks, m: Measured, audit: Audit) -> Checks:
    """Per model, the server's success and failure counts against what the clients saw (the module docstring)."""
    miscounted = 0
    per_model = Checks(
        (
            "model",
            "server success",
            "server fail",
            "sent",
            "OK",
            "OK, stream then abandoned",
            "refused",
            "gave up",
            "handler busy",
            "reconciles",
        )
    )
    for model in REGISTERED:
        tally = audit.per_model.get(model, Tally())
        success, fail = m.statistics.get(model, (0, 0))
        reached_max = tally.sent - tally.handler_busy
        ok = (
            tally.ok - tally.ok_abandoned <= success <= tally.ok + tally.gave_up
            and fail >= tally.refused
            and reached_max - tally.gave_up <= success + fail <= reached_max
        )
        miscounted += max(0, tally.ok - success)
        per_model.rows.append(
            (
                model,
                str(success),
                str(fail),
                str(tally.sent),
                str(tally.ok),
                str(tally.ok_abandoned),
                str(tally.refused),
                str(tally.gave_up),
                str(tally.handler_busy),
                "yes" if ok else "NO",
            )
        )
        if not ok:
            checks.failed.append(f"{model}: the server's counts do not reconcile with the clients' (see the table)")
    checks.figure("OK answers the server counted as failed (at least)", f"{miscounted} (see note 1)")
    return per_model


def _end_state(checks: Checks, m: Measured) -> None:
    """Nothing leased, queued or stuck at the end; no internal error in the server's log."""
    leased = {s.model_id: s.active_slots for s in m.models if s.active_slots}
    queued = {s.model_id: s.queued_requests for s in m.models if s.queued_requests}
    states = Counter(mpb.ModelState.Name(s.state).removeprefix("MODEL_STATE_") for s in m.models)
    stuck = [s.model_id for s in m.models if s.state not in (mpb.MODEL_STATE_READY, mpb.MODEL_STATE_UNLOADED)]
    checks.check("leased slots at the end (ListModels active_slots)", sum(leased.values()) or 0, "0", not leased)
    checks.check("queued requests at the end (ListModels)", sum(queued.values()) or 0, "0", not queued)
    checks.check("models stuck in a transition", ", ".join(stuck) or 0, "0", not stuck)
    checks.figure("model states at the end", ", ".join(f"{s} {n}" for s, n in sorted(states.items())))
    log_text = m.server_log
    checks.figure(
        "server log: evictions / load failures / ERROR lines",
        f"{log_text.count('evicted')} / {log_text.count('load failed') + log_text.count('failed to load')}"
        f" / {sum(1 for line in log_text.splitlines() if ' ERROR ' in line)}",
    )
    internal = log_text.count("internal error (reference")
    checks.check("server log: internal errors", internal, "0", internal == 0)


def _resources(checks: Checks, m: Measured, rss_growth_mib: float, rss_plateau_mib: float) -> None:
    """Threads, file descriptors and memory against their bounds (the module docstring)."""
    start, baseline, end, sampler = m.start.figures, m.baseline.figures, m.end.figures, m.sampler
    thread_bound = min(baseline["Threads"] + THREAD_SLACK, start["Threads"] + MAX_WORKERS + THREAD_SLACK)
    # fds: the baseline holds what the process opens once and keeps (ONNX Runtime's usage database: three fds
    # under ~/.cache/Microsoft, opened with the first session), so the end is compared with it.
    checks.check(
        "threads: start / baseline / end (peak)",
        f"{start['Threads']} / {baseline['Threads']} / {end['Threads']} "
        f"({max(sampler.peak('Threads', p) for p in ('warmup', 'main'))})",
        f"end <= {thread_bound}",
        end["Threads"] <= thread_bound,
    )
    checks.figure("threads by name: start / baseline / end", trio(m.start.threads, m.baseline.threads, m.end.threads))
    checks.figure(
        "fds that changed: start / baseline / end", trio(m.start.fds, m.baseline.fds, m.end.fds, changed=True)
    )
    fd_bound = baseline["fds"] + FD_SLACK
    checks.check(
        "open fds: start / baseline / end (peak)",
        f"{start['fds']} / {baseline['fds']} / {end['fds']} "
        f"({max(sampler.peak('fds', p) for p in ('warmup', 'main'))})",
        f"end <= {fd_bound}",
        end["fds"] <= fd_bound,
    )
    rss_bound = baseline["VmRSS"] + rss_growth_mib * 1024
    main_peak = sampler.peak("VmRSS", "main")
    checks.figure("VmRSS: start / warm-up peak", f"{mib(start['VmRSS'])} / {mib(sampler.peak('VmRSS', 'warmup'))}")
    checks.check(
        "VmRSS: baseline / main-phase peak / end",
        f"{mib(baseline['VmRSS'])} / {mib(main_peak)} / {mib(end['VmRSS'])}",
        f"<= {mib(rss_bound)} (baseline + {rss_growth_mib:.0f} MiB)",
        main_peak <= rss_bound and end["VmRSS"] <= rss_bound,
    )
    main_samples = [(t, f["VmRSS"]) for t, p, f in sampler.samples if p == "main"]
    if len(main_samples) > 10:
        times, values = np.array([s[0] for s in main_samples]), np.array([s[1] for s in main_samples]) / 1024
        slope = float(np.polyfit(times - times[0], values, 1)[0]) * 60
        checks.figure("VmRSS trend over the main phase (least squares)", f"{slope:+.2f} MiB/min")
        fifth = len(values) // 5
        first, last = float(np.percentile(values[:fifth], 25)), float(np.percentile(values[-fifth:], 25))
        if m.main_seconds >= PLATEAU_MIN_SECONDS:
            checks.check(
                "VmRSS lower quartile: first / last fifth of main",
                f"{first:.1f} / {last:.1f} MiB",
                f"last <= first + {rss_plateau_mib:.0f} MiB",
                last <= first + rss_plateau_mib,
            )
        else:
            checks.figure(
                "VmRSS lower quartile: first / last fifth of main",
                f"{first:.1f} / {last:.1f} MiB (checked when the main phase lasts >= {PLATEAU_MIN_SECONDS:.0f} s)",
            )


def trio(start: Counter, baseline: Counter, end: Counter, *, changed: bool = False) -> str:
    """'name a/b/c' for each key (only keys whose count changed, with `changed`)."""
    keys = sorted(set(start) | set(baseline) | set(end))
    parts = [
        f"{Path(k).name or k} {start[k]}/{baseline[k]}/{end[k]}"
        for k in keys
        if not changed or len({start[k], baseline[k], end[k]}) > 1
    ]
    return ", ".join(parts) or "none"


def mib(kib: float) -> str:
    return f"{kib / 1024:.1f} MiB"
