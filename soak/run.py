"""Bounded soak: a `python -m service` process under mixed traffic from several client processes, then an audit.

    .venv/bin/python soak/run.py                 # 300 s of traffic (make soak; SOAK_SECONDS=... changes it)
    .venv/bin/python soak/run.py --seconds 30    # a quick pass

The phases (each part in the file named after it, see soak/README.md):
1. Builds a repository in a work folder (default: a new temporary folder, printed and kept): repository.py.
2. Starts `python -m service` on it (server.py).
3. Samples the server's VmRSS, Threads and open file descriptors (/proc/<pid>) every 0.25 s (server.py, Sampler),
   while a fault thread shuts and opens a gated model (faults.py).
4. Warm-up (20 % of --seconds, 5..60 s): the client processes (traffic.py, roles infer, infer, stream, ops by
   default, 3 threads each, each with its own log; started by clients.py) run the whole mix; then a burst of
   --max-workers + 8 calls to the shut gate fills every handler thread once (so the gRPC handler pool reaches its
   final size). The figures after the warm-up, with traffic stopped, are the baseline.
5. The main phase: the same clients for the rest of --seconds. Then traffic stops, the gate opens, the clients
   exit (killed if they overrun by 60 s).
6. Audit, from the server's own counters (ModelStatistics, ListModels) and the clients' logs (audit.py), against
   the bounds listed in checks.py: one final status per request, no fault, counts that reconcile, nothing
   leased, queued or stuck, no thread, file-descriptor or memory growth.
7. SIGTERM: the server must exit 0 within its shutdown bound.
It prints the figures as a table and exits 1 if any assertion failed (2 if it could not run).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

# The project's packages, also when slotserve is not installed in this Python; and not this folder, whose module
# names (server, clients, ...) are too plain to sit first on the path.
sys.path[:] = [str(Path(__file__).resolve().parents[1])] + [
    entry for entry in sys.path if Path(entry or ".").resolve() != Path(__file__).resolve().parent
]

from soak.audit import audit_logs  # noqa: E402
from soak.checks import NOTES, Measured, Snapshot, evaluate  # noqa: E402
from soak.clients import DEFAULT_ROLES, Orchestrator, run_clients  # noqa: E402
from soak.faults import GateFlapper  # noqa: E402
from soak.repository import build_repository  # noqa: E402
from soak.server import MAX_WORKERS, Sampler, Server  # noqa: E402


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Bounded soak of slotserve (see the module docstring).")
    parser.add_argument("--seconds", type=float, default=300.0, help="traffic time, warm-up included (default 300)")
    parser.add_argument(
        "--roles",
        default=",".join(DEFAULT_ROLES),
        help="one client process per role: infer, stream, ops (default %(default)s)",
    )
    parser.add_argument("--threads", type=int, default=3, help="threads per client process (default 3)")
    parser.add_argument("--work-dir", type=Path, help="where the repository and logs go (default: a new temp folder)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--rss-growth-mib",
        type=float,
        default=64.0,
        help="VmRSS may exceed the post-warm-up baseline by this much (default 64)",
    )
    parser.add_argument(
        "--rss-plateau-mib",
        type=float,
        default=16.0,
        help="the lower quartile of VmRSS over the main phase's last fifth may exceed that over its "
        "first fifth by this much (default 16)",
    )
    args = parser.parse_args()
    args.roles = [r.strip() for r in args.roles.split(",") if r.strip()]
    if args.seconds < 10 or not args.roles or any(r not in ("infer", "stream", "ops") for r in args.roles):
        parser.error("--seconds must be >= 10 and --roles a list of infer, stream, ops")
    return args


def snapshot(server: Server) -> Snapshot:
    return Snapshot(server.proc(), server.thread_names(), server.fd_targets())


def soak(args: argparse.Namespace, work: Path) -> Measured:
    """Phases 1-5 and 7 (the module docstring): run the server under traffic and measure it."""
    warmup = min(60.0, max(5.0, args.seconds * 0.2))
    main_seconds = args.seconds - warmup
    print(
        f"soak: {args.seconds:.0f} s of traffic ({warmup:.0f} s warm-up), clients {args.roles} x {args.threads} "
        f"threads; work folder {work}",
        flush=True,
    )
    repository, gates = build_repository(work)

    server = Server(repository, work / "server.log")
    sampler = flapper = orchestrator = None
    try:
        orchestrator = Orchestrator(server, work / "orchestrator.jsonl")
        orchestrator.list_models()  # the orchestrator's connection is open before the start figures
        start = snapshot(server)
        sampler = Sampler(server)
        sampler.start()
        flapper = GateFlapper(gates, args.seed)
        flapper.start()

        began = time.monotonic()
        sampler.phase = "warmup"
        runs = run_clients(server, work, "warmup", warmup, args.roles, args.threads, args.seed)
        saturation = orchestrator.saturate(gates, MAX_WORKERS + 8)
        orchestrator.wait_quiet()
        server.wait_sockets(start.fds["socket:"])  # only the listener and the orchestrator's connection left
        sampler.phase = "baseline"
        baseline = snapshot(server)

        sampler.phase = "main"
        runs += run_clients(server, work, "main", main_seconds, args.roles, args.threads, args.seed + 1)
        traffic_seconds = time.monotonic() - began
        flapper.stop()
        sampler.phase = "end"
        models = orchestrator.wait_quiet()
        statistics = orchestrator.statistics()
        server.wait_sockets(start.fds["socket:"])
        end = snapshot(server)
        sampler.stop()
        orchestrator.close()
        orchestrator = None
        exit_code, exit_seconds = server.terminate()
    finally:
        for thread in (flapper, sampler):
            if thread is not None and thread.is_alive():
                thread.stop()
        if orchestrator is not None:
            orchestrator.close()
        server.kill()

    with (work / "samples.csv").open("w") as handle:  # the /proc figures over time, for a closer look
        handle.write("seconds,phase,vmrss_kib,threads,fds\n")
        for t, p, f in sampler.samples:
            handle.write(f"{t - began:.2f},{p},{f['VmRSS']},{f['Threads']},{f['fds']}\n")
    return Measured(
        roles=args.roles,
        threads=args.threads,
        warmup=warmup,
        main_seconds=main_seconds,
        traffic_seconds=traffic_seconds,
        runs=runs,
        saturation=saturation,
        gate_shut_count=flapper.shut_count,
        models=models,
        statistics=statistics,
        server_log=server.log_path.read_text(),
        start=start,
        baseline=baseline,
        end=end,
        sampler=sampler,
        exit_code=exit_code,
        exit_seconds=exit_seconds,
    )


def main() -> int:
    args = parse_arguments()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="slotserve-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    measured = soak(args, work)
    audit = audit_logs([run.log for run in measured.runs if run.log.exists()] + [work / "orchestrator.jsonl"])
    checks, per_model, details = evaluate(measured, audit, args.rss_growth_mib, args.rss_plateau_mib)
    print(checks.table())
    print()
    print(per_model.table())
    print(NOTES)
    for problem in details:
        print(f"  detail: {problem}")
    if checks.failed:
        print(f"\nsoak FAILED ({len(checks.failed)}):\n  " + "\n  ".join(checks.failed))
        print(f"logs: {work}")
        return 1
    print(f"\nsoak passed; logs in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
