"""`make bench`: measure slotserve against the bare grpcio server and against its targets (issue 7).

    .venv/bin/python bench/run.py [--quick] [--rounds N] [--sections simple,identity,...] [--profile]

Run bench/setup.sh first (it makes bench/.venv-pa and the perf_analyzer wrapper in bench/.cache). Everything
talks to 127.0.0.1 only. Sections, in order (all but transport by default):

  simple     `simple` at concurrency 1, 4, 16 with perf_analyzer (C++ client, sync, one channel), slotserve and
             bench/bare_server.py both running, alternating point by point (the order flips every round);
             infer/s, p50, p99; the ratio is the median of the per-round ratios slotserve/bare.
  identity   `identity_fp32`, [1,262144] (1 MiB) and [1,4194304] (16 MiB) FP32, concurrency 1 and 4, same
             pairing and the same tool (perf_analyzer `--shape INPUT0:N`, random data); MB/s = request
             payload bytes per second (the response carries as many back).
  shared_memory
             `identity_fp32` at 64 KiB, 1, 16 and 64 MiB, concurrency 1 and 4, on one slotserve started with
             `--shared-memory system`: perf_analyzer `--shared-memory system` (input and output in regions)
             against the gRPC path, alternating point by point; MB/s as above; ratio = median of the per-round
             ratios shared memory / gRPC; beside them this machine's single-thread memcpy rate (64 MiB, warm)
             and the preadv / pwrite rates of a /dev/shm object (the server's two copies through a region) and
             the page size /dev/shm is mounted with (its huge= option).
  batching   the demo's weight-bound `mlp` (one row per request), perf_analyzer at concurrency 16 and 1: slotserve
             with `dynamic_batching { }` against the same weights without it (one server, --parallel-jobs 2)
             and against PyTriton (Triton's dynamic batcher, 2 instances, one onnxruntime session with the same
             settings; bench/pytriton/serve.py in bench/.venv-pytriton); `simple` with the block against the
             bare server at concurrency 16; the batch sizes slotserve ran (ModelStatistics batch_stats); each
             round also the mlp in this process (no server), two threads with 1-row and with 16-row runs: what
             the memory and the cores give the unbatched and the batched model at that moment.
  slots      matmul_chain on slotserve with --parallel-jobs 1, 2, 4 (three servers, alternating), perf_analyzer at
             a fixed concurrency of 8; scaling = infer/s(N slots) / infer/s(1 slot), median of per-round ratios.
             Each round also runs matmul_chain in this process (no server) on 1 and on 2 threads: the scaling the
             cores give at that moment (on a shared machine, other jobs take it down).
  memory     VmRSS of slotserve holding a generated model with ~201 MB of FP32 weights (bench/.cache), started
             with --parallel-jobs 1 and with 8, after a warm-up that keeps 8 requests in flight at once; also a
             server holding only `simple` (onnxruntime imported and warmed up) as the baseline.
  admission  in-process micro-benchmark of service.core.admission.AdmissionController: uncontended acquire+release,
             4 threads contending (1 slot, and 4 slots), and the hand-off latency from a release to the queued
             waiter running (beside the same hand-off through a bare threading.Lock).
  coldload   each demo model: RepositoryModelUnload, then the time RepositoryModelLoad takes to return (files
             in the page cache: this is engine build time, not disk time); and server start to ready.
  python     the same model.py files on slotserve (--parallel-jobs 2) and on real Triton 2.51 (bench/.venv-pytriton,
             started as tests/differential/reference.py starts it), alternating point by point: a GIL-holding
             pure-Python loop (~3 ms) on 1 and 2 slots / instances at 4 clients, and the add/sub model.py at 1
             and 16 clients against slotserve's ONNX `simple` in the same server, with its ratio to Triton beside it.
  ensemble   a chain of three light python steps as one ensemble against the same three calls made by the
             client one after another, on slotserve and on real Triton 2.51 (python backend), same run, alternating;
             pipelines/s and p50 at 1 and 4 clients (this process's gRPC client: perf_analyzer cannot chain calls).
  sequences  16 concurrent sequences (perf_analyzer --sequence-length 20 at concurrency 16) on a python accumulator
             configured `direct` and `oldest`, on slotserve and on real Triton 2.51, alternating point by point;
             infer/s, p50 / p99, oldest / direct, requests per execution; a server that refuses the config is
             "skipped: sequence batching not supported by this server" (see bench/sections/sequences.py).
  priorities a trickle of high-priority requests (one every 20 ms) on a python model with priority levels, alone and
             under an overload of 16 low-priority clients (and with the trickle at the default level: FIFO), on
             slotserve and on real Triton 2.51, same run, alternating; p50 / p99 and p99 loaded / unloaded (goal
             within 2x); a server that refuses the config is "skipped: priorities not supported by this server".
  transport  (only when named) issue 24's front-end designs on `simple` at 1, 4, 16 clients beside the bare
             server and real Triton's python backend; see bench/sections/transport.py.
  frontends  (only when named; ~8 min, --quick ~1.5) issue 39's one-GIL part: slotserve with one front end and with
             `--frontends N` (when the checkout has it) beside real Triton 2.51, `simple` and add_sub at 1, 4, 16
             clients and the GIL-holding model on 1 and 2 slots: infer/s, p50/p99, the admission process's and
             the whole tree's CPU per request, N / 1, and the PROJECTED ceiling per core count (a projection,
             not a measurement: its formula is in bench/sections/frontends.py).
  bytes_memory
             the peak RSS (VmHWM) rise of a fresh slotserve for one BYTES request to `simple_identity` of 2-byte
             elements, about 11 and 34 MiB on the wire, and one past --max-request-tensor-bytes (refused).

`--cores N` pins the transport, python and frontends sections (this process, so every server, worker and
perf_analyzer they start) to the first N CPUs the bench may use and sizes their front ends from N; a machine with
fewer CPUs skips those sections and says so in the table.

Output: one table (figure, value, target, met?) on stdout, the same as JSON in bench/results/latest.json, server
logs in bench/results/logs/. Benchmarks print figures; nothing here fails a test. `--profile` also records
py-spy (samples of the GIL-holding thread; for slotserve also with native frames) on slotserve and on the bare
server, each during its own concurrency-16 `simple` run, and prints the top frames (bench/results/profile-*.txt);
install py-spy with `bench/setup.sh --with-py-spy`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

# This folder's modules are imported as `bench.*` (never bare: `table` or `machine` could shadow another module), so
# the repository root takes the script folder's place on sys.path.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from bench.common import DEMO_REPOSITORY, RESULTS, ROOT, log  # noqa: E402
from bench.cores import CORE_SECTIONS, first_cpus, pinned  # noqa: E402
from bench.machine import machine_info  # noqa: E402
from bench.perf_analyzer import PERF_ANALYZER, PerfAnalyzer  # noqa: E402
from bench.profiling import render_profile  # noqa: E402
from bench.sections.admission import section_admission  # noqa: E402
from bench.sections.batching import section_batching  # noqa: E402
from bench.sections.bytes_memory import section_bytes_memory  # noqa: E402
from bench.sections.coldload import section_coldload  # noqa: E402
from bench.sections.ensemble import section_ensemble  # noqa: E402
from bench.sections.frontends import section_frontends  # noqa: E402
from bench.sections.identity import section_identity  # noqa: E402
from bench.sections.memory import section_memory  # noqa: E402
from bench.sections.priorities import section_priorities  # noqa: E402
from bench.sections.python import section_python  # noqa: E402
from bench.sections.sequences import section_sequences  # noqa: E402
from bench.sections.shared_memory import section_shared_memory  # noqa: E402
from bench.sections.simple import section_simple  # noqa: E402
from bench.sections.slots import section_slots  # noqa: E402
from bench.sections.transport import section_transport  # noqa: E402
from bench.servers import Launcher  # noqa: E402
from bench.table import Table  # noqa: E402

SECTIONS = (
    "simple",
    "identity",
    "shared_memory",
    "batching",
    "slots",
    "memory",
    "admission",
    "coldload",
    "bytes_memory",
    "python",
    "ensemble",
    "sequences",
    "priorities",
    "transport",
    "frontends",
)
# transport (~10 min, real Triton) and frontends (~8 min, real Triton): on request
DEFAULT_SECTIONS = tuple(s for s in SECTIONS if s not in ("transport", "frontends"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="slotserve benchmarks (issue 7); see the module docstring.")
    parser.add_argument("--quick", action="store_true", help="one round, 1 s windows, fewer repeats (about 2 minutes)")
    parser.add_argument("--rounds", type=int, help="round-robin rounds per paired figure (default 3, quick 1)")
    parser.add_argument("--interval-ms", type=int, help="perf_analyzer measurement window (default 2000, quick 1000)")
    parser.add_argument("--trials", type=int, default=3, help="perf_analyzer windows per point (default 3)")
    parser.add_argument(
        "--sections",
        default=",".join(DEFAULT_SECTIONS),
        help=f"comma-separated subset of {SECTIONS} (default: all but transport and frontends)",
    )
    parser.add_argument(
        "--slotserve-args",
        default="",
        help="extra flags for the slotserve under test in the simple, identity, shared_memory and "
        "coldload sections (default: none, i.e. what `make run` gives: one slot per model)",
    )
    parser.add_argument(
        "--slotserve-root",
        type=Path,
        default=ROOT,
        help="checkout whose `service` package runs as slotserve (default: this one)",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy both servers during a c=16 simple run")
    parser.add_argument("--py-spy", help="path of the py-spy executable (default: bench/.venv-pa/bin, then PATH)")
    parser.add_argument(
        "--cores",
        type=int,
        help="transport, python, frontends: pin servers and clients to the first N CPUs, size front ends by N "
        "(a machine with fewer CPUs skips those sections)",
    )
    parser.add_argument("--json", type=Path, default=RESULTS / "latest.json")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.interval_ms = args.interval_ms or (1000 if args.quick else 2000)
    args.admission_pairs = 20000 if args.quick else 50000
    args.admission_seconds = 0.3 if args.quick else 1.0
    args.handoff_repeats = 300 if args.quick else 1000
    args.coldload_repeats = 1 if args.quick else 3
    args.memory_requests = 2 if args.quick else 3
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    if args.cores is not None and args.cores < 1:
        parser.error(f"--cores must be at least 1, not {args.cores}")
    args.slotserve_root = args.slotserve_root.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    needs_pa = {
        "simple", "identity", "shared_memory", "batching", "slots", "python", "sequences", "transport", "frontends"
    } & set(args.sections)  # fmt: skip
    if needs_pa and not os.access(PERF_ANALYZER, os.X_OK):
        print(f"bench: {PERF_ANALYZER} is missing: run bench/setup.sh first", file=sys.stderr)
        return 2
    if not (DEMO_REPOSITORY / "simple" / "config.pbtxt").is_file():
        print(f"bench: {DEMO_REPOSITORY} is not built: run `make models` first", file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    info = machine_info()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    launcher = Launcher(args.slotserve_root, shlex.split(args.slotserve_args))
    table = Table()
    raw: dict = {}
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="slotserve-bench-") as scratch:
        pa = PerfAnalyzer(args.interval_ms, args.trials, Path(scratch))
        runners = {
            "simple": lambda: section_simple(args, launcher, pa, table, raw),
            "identity": lambda: section_identity(args, launcher, pa, table, raw),
            "shared_memory": lambda: section_shared_memory(args, launcher, pa, table, raw),
            "batching": lambda: section_batching(args, launcher, pa, table, raw, Path(scratch)),
            "slots": lambda: section_slots(args, launcher, pa, table, raw),
            "memory": lambda: section_memory(args, launcher, table, raw),
            "admission": lambda: section_admission(args, table, raw),
            "coldload": lambda: section_coldload(args, launcher, table, raw),
            "bytes_memory": lambda: section_bytes_memory(args, launcher, table, raw),
            "python": lambda: section_python(args, launcher, pa, table, raw, Path(scratch)),
            "ensemble": lambda: section_ensemble(args, launcher, table, raw, Path(scratch)),
            "sequences": lambda: section_sequences(args, launcher, pa, table, raw, Path(scratch)),
            "priorities": lambda: section_priorities(args, launcher, table, raw, Path(scratch)),
            "transport": lambda: section_transport(args, launcher, pa, table, raw),
            "frontends": lambda: section_frontends(args, launcher, pa, table, raw, Path(scratch)),
        }
        for section in args.sections:
            raw.setdefault("loadavg_1min", {})[section] = os.getloadavg()[0]
            cpus = first_cpus(os.sched_getaffinity(0), args.cores if section in CORE_SECTIONS else None)
            if cpus is None:
                skipped = (
                    f"skipped: --cores {args.cores} asked, this machine lets the bench use "
                    f"{len(os.sched_getaffinity(0))} CPU(s)"
                )
                log(f"section {section} {skipped}")
                raw.setdefault("skipped", {})[section] = skipped
                table.add(section, f"{section} section", skipped)
                continue
            log(f"section {section} on CPUs {cpus} (load average {os.getloadavg()[0]:.2f})")
            try:
                with pinned(cpus):
                    runners[section]()
            except Exception as error:  # a failed section is reported, the others still run
                errors[section] = f"{type(error).__name__}: {error}"
                log(f"section {section} failed: {errors[section]}")
                table.add(section, f"{section} section", f"FAILED: {errors[section][:120]}")
    info["loadavg_end"] = list(os.getloadavg())
    runtime = time.perf_counter() - started
    settings = {
        "rounds": args.rounds,
        "interval_ms": args.interval_ms,
        "trials": args.trials,
        "quick": args.quick,
        "slotserve_args": args.slotserve_args,
        "slotserve_root": str(args.slotserve_root),
        "cores": args.cores,
        "runtime_s": round(runtime, 1),
    }
    header = (
        f"slotserve bench, {date}: {info['nproc']} CPU(s) {info['cpu']}, load avg "
        f"{info['loadavg_start'][0]:.2f} -> {info['loadavg_end'][0]:.2f}; git {info['git']}; "
        f"{args.rounds} round(s) x {args.trials} x {args.interval_ms} ms windows, "
        f"{info['versions']['perf_analyzer']}"
        f"; slotserve flags: {args.slotserve_args or '(defaults)'}"
        + (f"; slotserve from {args.slotserve_root}" if args.slotserve_root != ROOT else "")
        + f"; {runtime:.0f} s"
    )
    document = {"date": date, "machine": info, "settings": settings, "rows": table.rows, "raw": raw, "errors": errors}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2, default=str) + "\n")
    print(header)
    print(table.render())
    for mode, summary in (raw.get("profile") or {}).items():
        if isinstance(summary, dict) and "self" in summary:
            print()
            print(
                render_profile(mode, {**summary, "self": summary["self"][:12], "inclusive": summary["inclusive"][:15]}),
                end="",
            )
    print(f"(JSON: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
