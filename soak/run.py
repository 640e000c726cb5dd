"""Bounded soak: a `python -m service` process under mixed traffic from several client processes, then an audit.

    .venv/bin/python soak/run.py                 # 300 s of traffic (make soak; SOAK_SECONDS=... changes it)
    .venv/bin/python soak/run.py --seconds 30    # a quick pass

What it does:
1. Builds a repository in a work folder (default: a new temporary folder, printed and kept): the demo ONNX models
   `simple`, `simple_identity`, `identity_fp32` (symlinks to demo/model_repository: run `make models` first) and
   fixture models `fx_echo` (plain), `fx_stream` (3 answers per request), `fx_slow` (a file gate at execute that a
   fault thread here opens and shuts: callers block while it is shut, so deadlines and cancellations hit held
   slots), `fx_flaky` (the `ops` clients switch its fail_load option on and off: reconfigurations and loads that
   fail) and `fx_broken` (its load always fails).
2. Starts `python -m service` on 127.0.0.1:0 with the parallel runtime (--parallel-jobs 2), management allowed,
   --max-resident-models 3 (six loadable models: constant evictions), --idle-unload 4, --admission-timeout 2,
   --max-queue 32, --max-workers 32, --no-load-at-startup.
3. Samples the server's VmRSS, Threads and open file descriptors (/proc/<pid>) every 0.25 s.
4. Warm-up (20 % of --seconds, 5..60 s): the client processes (soak/traffic.py, roles infer, infer, stream, ops by
   default, 3 threads each, each with its own log) run the whole mix; then a burst of --max-workers + 8 calls to
   the shut gate fills every handler thread once (so the gRPC handler pool reaches its final size). The figures
   after the warm-up, with traffic stopped, are the baseline.
5. The main phase: the same clients for the rest of --seconds. Then traffic stops, the gate opens, the clients
   exit (killed if they overrun by 60 s).
6. Audit, from the server's own counters (ModelStatistics, ListModels) and the clients' logs:
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
7. SIGTERM: the server must exit 0 within its shutdown bound.
It prints the figures as a table and exits 1 if any assertion failed (2 if it could not run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the project's packages, also when slotserve is not installed in this Python

from client.errors import ClientError  # noqa: E402
from generated import grpc_service_pb2 as pb  # noqa: E402
from generated import grpc_service_pb2_grpc as pb_grpc  # noqa: E402
from generated import management_pb2 as mpb  # noqa: E402
from generated import management_pb2_grpc as mpb_grpc  # noqa: E402

DEMO = ROOT / "demo" / "model_repository"
ONNX_MODELS = ("simple", "simple_identity", "identity_fp32")
FIXTURES = {
    "fx_echo": {},
    "fx_stream": {"stream_responses": "3"},
    "fx_slow": {"gate_dir": None},  # filled in with the work folder's gate folder
    "fx_flaky": {},
    "fx_broken": {"fail_load": "always"},
}
REGISTERED = ONNX_MODELS + tuple(FIXTURES)
STREAMING_MODELS = frozenset(name for name, options in FIXTURES.items() if "stream_responses" in options)
MAX_WORKERS = 32
SHUTDOWN_GRACE = 10.0
SERVER_FLAGS = ["--parallel-jobs", "2", "--allow-management", "--max-resident-models", "3", "--idle-unload", "4",
                "--admission-timeout", "2", "--max-queue", "32", "--max-workers", str(MAX_WORKERS),
                "--no-load-at-startup", "--shutdown-grace", str(SHUTDOWN_GRACE), "--stream-write-timeout", "10"]
DEFAULT_ROLES = ("infer", "infer", "stream", "ops")
FAULT_STATUSES = ("INTERNAL", "UNKNOWN", "MALFORMED_RESPONSE", "NO_ANSWER", "CLIENT_TIMEOUT", "DATA_LOSS",
                  "UNIMPLEMENTED")
THREAD_SLACK = 2
FD_SLACK = 2
WAIT = 30.0  # seconds any wait for a state may take
PLATEAU_MIN_SECONDS = 120.0  # shorter main phases are too short to tell growth from the first minutes' ramp
_LISTENING = re.compile(r"slotserve listening on (\S+)")
_ENV_DROP = ("SLOTSERVE_MANAGEMENT_TOKEN", "SLOTSERVE_INFERENCE_TOKEN")


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _ENV_DROP}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


# ---- the repository ---------------------------------------------------------------------------------------------

def build_repository(work: Path) -> tuple[Path, Path]:
    if not (DEMO / "simple" / "config.pbtxt").exists():
        raise SystemExit(f"soak: the demo repository is missing at {DEMO}: run `make models` first")
    repository, gates = work / "repository", work / "gates"
    repository.mkdir(parents=True)
    gates.mkdir()
    for name in ONNX_MODELS:
        (repository / name).symlink_to(DEMO / name, target_is_directory=True)
    for name, parameters in FIXTURES.items():
        directory = repository / name
        directory.mkdir()
        lines = [f'name: "{name}"', 'backend: "fixture"', "max_batch_size: 0"]
        for key, value in parameters.items():
            value = str(gates) if key == "gate_dir" else value
            lines.append(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}')
        (directory / "config.pbtxt").write_text("\n".join(lines) + "\n")
    (gates / "fx_slow.execute.hold").touch()  # the gate exists; the fault thread opens and shuts it
    (gates / "fx_slow.execute.release").touch()
    return repository, gates


# ---- the server process -----------------------------------------------------------------------------------------

class Server:
    def __init__(self, repository: Path, log_path: Path) -> None:
        command = [sys.executable, "-m", "service", "--model-repository", str(repository), "--host", "127.0.0.1",
                   "--port", "0", *SERVER_FLAGS]
        self.log_path = log_path
        self._log = log_path.open("w")
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                        env=environment())
        self.pid = self.process.pid
        lines: queue.SimpleQueue = queue.SimpleQueue()

        def read() -> None:
            for line in self.process.stdout:
                lines.put(line)
            lines.put(None)
        self._reader = threading.Thread(target=read, name="server-stdout", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + 60
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise SystemExit(f"soak: the server did not start within 60 s; see {log_path}") from None
            if line is None:
                self.process.wait(timeout=10)
                raise SystemExit(f"soak: the server exited ({self.process.returncode}); see {log_path}")
            match = _LISTENING.search(line)
            if match:
                self.address = match.group(1)
                break
        if not self.address.startswith("127.0.0.1:"):
            self.kill()
            raise SystemExit(f"soak: the server listens on {self.address}, not 127.0.0.1")

    def proc(self) -> dict[str, int]:
        """VmRSS (KiB), Threads and open fds of the server now."""
        figures = {}
        with open(f"/proc/{self.pid}/status") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "Threads"):
                    figures[key] = int(value.split()[0])
        figures["fds"] = len(os.listdir(f"/proc/{self.pid}/fd"))
        return figures

    def fd_targets(self) -> Counter:
        """What the open fds are: socket, pipe, anon_inode:[eventfd], file paths."""
        kinds = Counter()
        for fd in os.listdir(f"/proc/{self.pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{self.pid}/fd/{fd}")
                kinds[re.sub(r"\[\d+\]$", "", target)] += 1
        return kinds

    def wait_sockets(self, count: int) -> None:
        """Wait (bounded by WAIT) until the server holds `count` sockets: connections of clients that exited
        close asynchronously on its side."""
        deadline = time.monotonic() + WAIT
        while self.fd_targets()["socket:"] > count and time.monotonic() < deadline:
            time.sleep(0.1)  # ordering-free: re-checks a state predicate

    def thread_names(self) -> Counter:
        names = Counter()
        for task in os.listdir(f"/proc/{self.pid}/task"):
            with contextlib.suppress(OSError):
                names[Path(f"/proc/{self.pid}/task/{task}/comm").read_text().strip()] += 1
        return names

    def terminate(self) -> tuple[int | None, float]:
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=SHUTDOWN_GRACE + 20)
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        return code, time.monotonic() - started

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
        self._log.close()


class Sampler(threading.Thread):
    """Samples the server's /proc figures every 0.25 s until stopped."""

    def __init__(self, server: Server) -> None:
        super().__init__(name="sampler", daemon=True)
        self.server = server
        self.samples: list[tuple[float, str, dict[str, int]]] = []  # (monotonic time, phase, figures)
        self.phase = "start"
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.25):
            with contextlib.suppress(OSError, ValueError):
                self.samples.append((time.monotonic(), self.phase, self.server.proc()))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)

    def peak(self, key: str, phase: str) -> int:
        values = [figures[key] for _, p, figures in self.samples if p == phase]
        return max(values) if values else 0


class GateFlapper(threading.Thread):
    """The fault: shuts fx_slow's execute gate for 0.2..1.5 s, opens it for 0.5..3 s, over and over."""

    def __init__(self, gates: Path, seed: int) -> None:
        super().__init__(name="gate-flapper", daemon=True)
        self.release = gates / "fx_slow.execute.release"
        self.rng = random.Random(seed)
        self._halt = threading.Event()
        self.shut_count = 0

    def run(self) -> None:
        while not self._halt.is_set():
            self.release.unlink(missing_ok=True)
            self.shut_count += 1
            self._halt.wait(self.rng.uniform(0.2, 1.5))
            self.release.touch()
            self._halt.wait(self.rng.uniform(0.5, 3.0))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)
        self.release.touch()


# ---- clients ----------------------------------------------------------------------------------------------------

@dataclass
class ClientRun:
    name: str
    role: str
    log: Path
    process: subprocess.Popen
    stderr: Path
    code: int | None = None


def run_clients(server: Server, work: Path, phase: str, seconds: float, roles: list[str], threads: int,
                seed: int) -> list[ClientRun]:
    """Start one process per role, wait for all (killed 60 s past their time); their exit codes recorded."""
    runs = []
    try:
        for index, role in enumerate(roles):
            name = f"{phase}-c{index}-{role}"
            log, stderr = work / f"{name}.jsonl", work / f"{name}.stderr"
            process = subprocess.Popen(
                [sys.executable, str(ROOT / "soak" / "traffic.py"), "--address", server.address, "--role", role,
                 "--seconds", str(seconds), "--threads", str(threads), "--log", str(log), "--name", name,
                 "--seed", str(seed * 100 + index)],
                cwd=ROOT, env=environment(), stdout=subprocess.DEVNULL, stderr=stderr.open("w"))
            runs.append(ClientRun(name, role, log, process, stderr))
        deadline = time.monotonic() + seconds + 60
        for run in runs:
            try:
                run.code = run.process.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                run.process.kill()
                run.process.wait(timeout=10)
                run.code = None
    finally:
        for run in runs:
            if run.process.poll() is None:
                run.process.kill()
                run.process.wait(timeout=10)
    return runs


class Orchestrator:
    """The soak's own calls (status reads, the saturation burst), on one channel, logged like a client's."""

    def __init__(self, server: Server, log_path: Path) -> None:
        self.channel = grpc.insecure_channel(server.address)
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)
        self.management = mpb_grpc.ModelManagementStub(self.channel)
        self.log_path = log_path
        self._log = log_path.open("w", buffering=1)
        self._next = 0

    def list_models(self):
        return list(self.management.ListModels(mpb.ListModelsRequest(), timeout=10).models)

    def statistics(self) -> dict[str, tuple[int, int]]:
        response = self.stub.ModelStatistics(pb.ModelStatisticsRequest(), timeout=10)
        return {s.name: (s.inference_stats.success.count, s.inference_stats.fail.count) for s in response.model_stats}

    def wait_quiet(self) -> list:
        """ListModels until no slot is leased and nothing is queued (bounded by WAIT); the last statuses."""
        deadline = time.monotonic() + WAIT
        while True:
            models = self.list_models()
            if all(m.active_slots == 0 and m.queued_requests == 0 for m in models) or time.monotonic() > deadline:
                return models
            time.sleep(0.05)  # ordering-free: re-checks a state predicate

    def _write(self, **record) -> None:
        record["t"] = round(time.time(), 4)
        self._log.write(json.dumps(record, separators=(",", ":")) + "\n")

    def saturate(self, gates: Path, calls: int) -> Counter:
        """Shut fx_slow's gate, send `calls` requests to it at once with a 2 s deadline (more than there are
        handler threads), wait for every answer, open the gate."""
        release = gates / "fx_slow.execute.release"
        release.unlink(missing_ok=True)
        outcomes = Counter()
        try:
            pending = []
            for _ in range(calls):
                self._next += 1
                request_id = f"orchestrator-{self._next}"
                request = pb.ModelInferRequest(model_name="fx_slow", id=request_id)
                request.inputs.add(name="INPUT0", datatype="FP32", shape=[2])
                request.raw_input_contents.append(np.zeros(2, "<f4").tobytes())
                self._write(event="sent", id=request_id, kind="infer", model="fx_slow", op="saturate")
                pending.append((request_id, self.stub.ModelInfer.future(request, timeout=2.0)))
            for request_id, future in pending:
                try:
                    future.result(timeout=10)
                    status, reason, message = "OK", None, ""
                except grpc.FutureTimeoutError:
                    future.cancel()
                    status, reason, message = "CLIENT_TIMEOUT", None, "no answer 8 s past the deadline"
                except grpc.RpcError as error:
                    failure = ClientError.from_rpc_error(error)
                    status, reason, message = failure.code, failure.reason, failure.message
                outcomes[status] += 1
                self._write(event="done", id=request_id, status=status, reason=reason,
                            gave_up=status in ("DEADLINE_EXCEEDED", "CANCELLED", "CLIENT_TIMEOUT"),
                            handler_busy="inference handler threads" in message, message=message[:200])
        finally:
            release.touch()
        return outcomes

    def close(self) -> None:
        self._log.close()
        self.channel.close()


# ---- the audit --------------------------------------------------------------------------------------------------

@dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    ok_abandoned: int = 0  # OK stream answers whose stream the client then cancelled (or whose deadline passed)
    gave_up: int = 0
    handler_busy: int = 0
    refused: int = 0  # any other status the server sent


@dataclass
class Audit:
    sent: int = 0
    done: int = 0
    missing: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    odd_events: list[str] = field(default_factory=list)
    statuses: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))  # kind -> status counts
    ops: Counter = field(default_factory=Counter)  # "op status" of management calls
    per_model: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    faults: list[str] = field(default_factory=list)


def audit_logs(paths: list[Path]) -> Audit:
    audit = Audit()
    for path in paths:
        sent: dict[str, dict] = {}
        done: dict[str, list[dict]] = defaultdict(list)
        with path.open() as handle:
            for line in handle:
                record = json.loads(line)
                if record["event"] == "sent":
                    sent[record["id"]] = record
                elif record["event"] == "done":
                    done[record["id"]].append(record)
                else:
                    audit.odd_events.append(f"{path.name}: {line.strip()[:200]}")
        audit.sent += len(sent)
        audit.done += sum(len(v) for v in done.values())
        audit.missing += [i for i in sent if i not in done]
        audit.duplicated += [i for i, v in done.items() if len(v) > 1]
        audit.orphans += [i for i in done if i not in sent]
        for request_id, request in sent.items():
            if request_id not in done:
                continue
            final = done[request_id][0]
            status, kind = final["status"], request["kind"]
            audit.statuses[kind][status] += 1
            if status in FAULT_STATUSES:
                audit.faults.append(f"{request_id} {kind} {request['model']} {request['op']}: {status} "
                                    f"{final.get('message', '')}")
            if kind == "mgmt":
                audit.ops[f"{request['op']} {status}"] += 1
                continue
            if request["model"] not in REGISTERED:
                continue  # unknown model names: counted server-wide, not under a model
            tally = audit.per_model[request["model"]]
            tally.sent += 1
            if status == "OK":
                tally.ok += 1
                # Only a streaming model's last answer can be OK at the client yet uncounted (note 1).
                tally.ok_abandoned += bool(final.get("abandoned_after")) and request["model"] in STREAMING_MODELS
            elif final["gave_up"]:
                tally.gave_up += 1
            elif final["handler_busy"]:
                tally.handler_busy += 1
            else:
                tally.refused += 1
    return audit


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
        lines = [" | ".join(h.ljust(w) for h, w in zip(header, widths)), "-+-".join("-" * w for w in widths)]
        lines += [" | ".join(c.ljust(w) for c, w in zip(row, widths)) for row in self.rows]
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


def trio(start: Counter, baseline: Counter, end: Counter, *, changed: bool = False) -> str:
    """'name a/b/c' for each key (only keys whose count changed, with `changed`)."""
    keys = sorted(set(start) | set(baseline) | set(end))
    parts = [f"{Path(k).name or k} {start[k]}/{baseline[k]}/{end[k]}" for k in keys
             if not changed or len({start[k], baseline[k], end[k]}) > 1]
    return ", ".join(parts) or "none"


def mib(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description="Bounded soak of slotserve (see the module docstring).")
    parser.add_argument("--seconds", type=float, default=300.0, help="traffic time, warm-up included (default 300)")
    parser.add_argument("--roles", default=",".join(DEFAULT_ROLES),
                        help="one client process per role: infer, stream, ops (default %(default)s)")
    parser.add_argument("--threads", type=int, default=3, help="threads per client process (default 3)")
    parser.add_argument("--work-dir", type=Path, help="where the repository and logs go (default: a new temp folder)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rss-growth-mib", type=float, default=64.0,
                        help="VmRSS may exceed the post-warm-up baseline by this much (default 64)")
    parser.add_argument("--rss-plateau-mib", type=float, default=16.0,
                        help="the lower quartile of VmRSS over the main phase's last fifth may exceed that over its "
                             "first fifth by this much (default 16)")
    args = parser.parse_args()
    roles = [r.strip() for r in args.roles.split(",") if r.strip()]
    if args.seconds < 10 or not roles or any(r not in ("infer", "stream", "ops") for r in roles):
        parser.error("--seconds must be >= 10 and --roles a list of infer, stream, ops")
    warmup = min(60.0, max(5.0, args.seconds * 0.2))
    main_seconds = args.seconds - warmup
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="slotserve-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"soak: {args.seconds:.0f} s of traffic ({warmup:.0f} s warm-up), clients {roles} x {args.threads} "
          f"threads; work folder {work}", flush=True)
    repository, gates = build_repository(work)

    server = Server(repository, work / "server.log")
    sampler = flapper = orchestrator = None
    checks = Checks()
    try:
        orchestrator = Orchestrator(server, work / "orchestrator.jsonl")
        orchestrator.list_models()  # the orchestrator's connection is open before the start figures
        start = server.proc()
        start_names, start_fds = server.thread_names(), server.fd_targets()
        sampler = Sampler(server)
        sampler.start()
        flapper = GateFlapper(gates, args.seed)
        flapper.start()

        began = time.monotonic()
        sampler.phase = "warmup"
        runs = run_clients(server, work, "warmup", warmup, roles, args.threads, args.seed)
        saturation = orchestrator.saturate(gates, MAX_WORKERS + 8)
        orchestrator.wait_quiet()
        server.wait_sockets(start_fds["socket:"])  # only the listener and the orchestrator's connection left
        sampler.phase = "baseline"
        baseline = server.proc()
        baseline_names, baseline_fds = server.thread_names(), server.fd_targets()

        sampler.phase = "main"
        runs += run_clients(server, work, "main", main_seconds, roles, args.threads, args.seed + 1)
        traffic_seconds = time.monotonic() - began
        flapper.stop()
        sampler.phase = "end"
        models = orchestrator.wait_quiet()
        statistics = orchestrator.statistics()
        server.wait_sockets(start_fds["socket:"])
        end = server.proc()
        end_names, end_fds = server.thread_names(), server.fd_targets()
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

    # ---- figures and checks ---------------------------------------------------------------------------------
    audit = audit_logs([run.log for run in runs if run.log.exists()] + [work / "orchestrator.jsonl"])
    checks.figure("traffic seconds (warm-up + main)", f"{traffic_seconds:.0f} ({warmup:.0f} + {main_seconds:.0f})")
    checks.figure("client processes (role x threads)", f"{len(roles)} x {args.threads}, twice (warm-up, main)")
    crashed = [f"{run.name}: exit {run.code}" for run in runs if run.code != 0]
    checks.check("client processes that failed or overran", len(crashed), "0", not crashed)
    kinds = {kind: sum(counter.values()) for kind, counter in audit.statuses.items()}
    checks.figure("requests sent (infer / stream / management)",
                  f"{audit.sent} ({kinds.get('infer', 0)} / {kinds.get('stream', 0)} / {kinds.get('mgmt', 0)})")
    checks.figure("requests per second", f"{audit.sent / max(traffic_seconds, 1):.0f}")
    checks.check("final statuses logged", audit.done, f"= sent ({audit.sent})", audit.done == audit.sent)
    checks.check("requests without a final status", len(audit.missing), "0", not audit.missing)
    checks.check("requests with more than one final status", len(audit.duplicated), "0", not audit.duplicated)
    checks.check("final statuses of requests never sent", len(audit.orphans), "0", not audit.orphans)
    checks.check("unexpected events in client logs", len(audit.odd_events), "0", not audit.odd_events)
    checks.check("answers that mean a server fault", len(audit.faults), f"0 ({'/'.join(FAULT_STATUSES[:3])}...)",
                 not audit.faults)
    for kind in ("infer", "stream", "mgmt"):
        counter = audit.statuses.get(kind, Counter())
        checks.figure(f"{kind} statuses", ", ".join(f"{s} {n}" for s, n in counter.most_common()) or "-")
    checks.figure("saturation burst (fx_slow, gate shut)",
                  ", ".join(f"{s} {n}" for s, n in saturation.most_common()))
    checks.figure("fx_slow gate shut (times)", flapper.shut_count)

    miscounted = 0
    per_model = Checks(("model", "server success", "server fail", "sent", "OK", "OK, stream then abandoned",
                        "refused", "gave up", "handler busy", "reconciles"))
    for model in REGISTERED:
        tally = audit.per_model.get(model, Tally())
        success, fail = statistics.get(model, (0, 0))
        reached_max = tally.sent - tally.handler_busy
        ok = (tally.ok - tally.ok_abandoned <= success <= tally.ok + tally.gave_up and fail >= tally.refused
              and reached_max - tally.gave_up <= success + fail <= reached_max)
        miscounted += max(0, tally.ok - success)
        per_model.rows.append((model, str(success), str(fail), str(tally.sent), str(tally.ok),
                               str(tally.ok_abandoned), str(tally.refused), str(tally.gave_up),
                               str(tally.handler_busy), "yes" if ok else "NO"))
        if not ok:
            checks.failed.append(f"{model}: the server's counts do not reconcile with the clients' (see the table)")
    checks.figure("OK answers the server counted as failed (at least)", f"{miscounted} (see note 1)")
    leased = {m.model_id: m.active_slots for m in models if m.active_slots}
    queued = {m.model_id: m.queued_requests for m in models if m.queued_requests}
    states = Counter(mpb.ModelState.Name(m.state).removeprefix("MODEL_STATE_") for m in models)
    stuck = [m.model_id for m in models if m.state not in (mpb.MODEL_STATE_READY, mpb.MODEL_STATE_UNLOADED)]
    checks.check("leased slots at the end (ListModels active_slots)", sum(leased.values()) or 0, "0", not leased)
    checks.check("queued requests at the end (ListModels)", sum(queued.values()) or 0, "0", not queued)
    checks.check("models stuck in a transition", ", ".join(stuck) or 0, "0", not stuck)
    checks.figure("model states at the end", ", ".join(f"{s} {n}" for s, n in sorted(states.items())))
    with server.log_path.open() as handle:
        log_text = handle.read()
    checks.figure("server log: evictions / load failures / ERROR lines",
                  f"{log_text.count('evicted')} / {log_text.count('load failed') + log_text.count('failed to load')}"
                  f" / {sum(1 for line in log_text.splitlines() if ' ERROR ' in line)}")
    internal = log_text.count("internal error (reference")
    checks.check("server log: internal errors", internal, "0", internal == 0)

    thread_bound = min(baseline["Threads"] + THREAD_SLACK, start["Threads"] + MAX_WORKERS + THREAD_SLACK)
    # fds: the baseline holds what the process opens once and keeps (ONNX Runtime's usage database: three fds
    # under ~/.cache/Microsoft, opened with the first session), so the end is compared with it.
    checks.check("threads: start / baseline / end (peak)",
                 f"{start['Threads']} / {baseline['Threads']} / {end['Threads']} "
                 f"({max(sampler.peak('Threads', p) for p in ('warmup', 'main'))})",
                 f"end <= {thread_bound}", end["Threads"] <= thread_bound)
    checks.figure("threads by name: start / baseline / end", trio(start_names, baseline_names, end_names))
    checks.figure("fds that changed: start / baseline / end", trio(start_fds, baseline_fds, end_fds, changed=True))
    fd_bound = baseline["fds"] + FD_SLACK
    checks.check("open fds: start / baseline / end (peak)",
                 f"{start['fds']} / {baseline['fds']} / {end['fds']} "
                 f"({max(sampler.peak('fds', p) for p in ('warmup', 'main'))})", f"end <= {fd_bound}",
                 end["fds"] <= fd_bound)
    rss_bound = baseline["VmRSS"] + args.rss_growth_mib * 1024
    main_peak = sampler.peak("VmRSS", "main")
    checks.figure("VmRSS: start / warm-up peak", f"{mib(start['VmRSS'])} / {mib(sampler.peak('VmRSS', 'warmup'))}")
    checks.check("VmRSS: baseline / main-phase peak / end",
                 f"{mib(baseline['VmRSS'])} / {mib(main_peak)} / {mib(end['VmRSS'])}",
                 f"<= {mib(rss_bound)} (baseline + {args.rss_growth_mib:.0f} MiB)",
                 main_peak <= rss_bound and end["VmRSS"] <= rss_bound)
    with (work / "samples.csv").open("w") as handle:  # the /proc figures over time, for a closer look
        handle.write("seconds,phase,vmrss_kib,threads,fds\n")
        for t, p, f in sampler.samples:
            handle.write(f"{t - began:.2f},{p},{f['VmRSS']},{f['Threads']},{f['fds']}\n")
    main_samples = [(t, f["VmRSS"]) for t, p, f in sampler.samples if p == "main"]
    if len(main_samples) > 10:
        times, values = np.array([s[0] for s in main_samples]), np.array([s[1] for s in main_samples]) / 1024
        slope = float(np.polyfit(times - times[0], values, 1)[0]) * 60
        checks.figure("VmRSS trend over the main phase (least squares)", f"{slope:+.2f} MiB/min")
        fifth = len(values) // 5
        first, last = float(np.percentile(values[:fifth], 25)), float(np.percentile(values[-fifth:], 25))
        if main_seconds >= PLATEAU_MIN_SECONDS:
            checks.check("VmRSS lower quartile: first / last fifth of main", f"{first:.1f} / {last:.1f} MiB",
                         f"last <= first + {args.rss_plateau_mib:.0f} MiB", last <= first + args.rss_plateau_mib)
        else:
            checks.figure("VmRSS lower quartile: first / last fifth of main",
                          f"{first:.1f} / {last:.1f} MiB (checked when the main phase lasts "
                          f">= {PLATEAU_MIN_SECONDS:.0f} s)")
    shutdown_bound = SHUTDOWN_GRACE + 8
    checks.check("SIGTERM: exit code, seconds", f"{exit_code}, {exit_seconds:.1f}",
                 f"0, <= {shutdown_bound:.0f}", exit_code == 0 and exit_seconds <= shutdown_bound)

    print(checks.table())
    print()
    print(per_model.table())
    print(NOTES)
    for problem in (audit.faults[:10] + audit.missing[:10] + audit.duplicated[:10] + audit.odd_events[:10]
                    + crashed[:10]):
        print(f"  detail: {problem}")
    if checks.failed:
        print(f"\nsoak FAILED ({len(checks.failed)}):\n  " + "\n  ".join(checks.failed))
        print(f"logs: {work}")
        return 1
    print(f"\nsoak passed; logs in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
