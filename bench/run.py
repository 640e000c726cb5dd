"""`make bench`: measure slotserve against the bare grpcio server and against its targets (issue 7).

    .venv/bin/python bench/run.py [--quick] [--rounds N] [--sections simple,identity,...] [--profile]

Run bench/setup.sh first (it makes bench/.venv-pa and the perf_analyzer wrapper in bench/.cache). Everything
talks to 127.0.0.1 only. Sections, in order (all by default):

  simple     `simple` at concurrency 1, 4, 16 with perf_analyzer (C++ client, sync, one channel), slotserve and
             bench/bare_server.py both running, alternating point by point (the order flips every round);
             infer/s, p50, p99; the ratio is the median of the per-round ratios slotserve/bare.
  identity   `identity_fp32`, [1,262144] (1 MiB) and [1,4194304] (16 MiB) FP32, concurrency 1 and 4, same
             pairing and the same tool (perf_analyzer `--shape INPUT0:N`, random data); MB/s = request
             payload bytes per second (the response carries as many back).
  slots      matmul_chain on slotserve with --parallel-jobs 1, 2, 4 (three servers, alternating), perf_analyzer at
             a fixed concurrency of 8; scaling = infer/s(N slots) / infer/s(1 slot), median of per-round ratios.
             Each round also runs matmul_chain in this process (no server) on 1 and on 2 threads: the scaling the
             cores give at that moment (on a shared machine, other jobs take it down).
  memory     VmRSS of slotserve holding a generated model with ~201 MB of FP32 weights (bench/.cache), started
             with --parallel-jobs 1 and with 8, after a warm-up that keeps 8 requests in flight at once; also a
             server holding only `simple` (onnxruntime imported and warmed up) as the baseline.
  admission  in-process micro-benchmark of service.admission.AdmissionController: uncontended acquire+release,
             4 threads contending (1 slot, and 4 slots), and the hand-off latency from a release to the queued
             waiter running (beside the same hand-off through a bare threading.Lock).
  coldload   each demo model: RepositoryModelUnload, then the time RepositoryModelLoad takes to return (files
             in the page cache: this is engine build time, not disk time); and server start to ready.

Output: one table (figure, value, target, met?) on stdout, the same as JSON in bench/results/latest.json, server
logs in bench/results/logs/. Benchmarks print figures; nothing here fails a test. `--profile` also records
py-spy (samples of the GIL-holding thread; for slotserve also with native frames) on slotserve and on the bare
server, each during its own concurrency-16 `simple` run, and prints the top frames (bench/results/profile-*.txt);
install py-spy with `bench/setup.sh --with-py-spy`.
"""

from __future__ import annotations

import argparse
import contextlib
import collections
import csv
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
CACHE = BENCH / ".cache"
RESULTS = BENCH / "results"
LOGS = RESULTS / "logs"
PERF_ANALYZER = CACHE / "perf_analyzer"
DEMO_REPOSITORY = ROOT / "demo" / "model_repository"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import numpy as np  # noqa: E402

from generated import grpc_service_pb2 as pb  # noqa: E402
from generated import grpc_service_pb2_grpc as pb_grpc  # noqa: E402
from generated import management_pb2 as mpb  # noqa: E402
from generated import management_pb2_grpc as mpb_grpc  # noqa: E402

SECTIONS = ("simple", "identity", "slots", "memory", "admission", "coldload")
SIMPLE_CONCURRENCY = (1, 4, 16)
IDENTITY_SIZES = {"1 MiB": 262144, "16 MiB": 4194304}  # FP32 elements
IDENTITY_CONCURRENCY = (1, 4)
SLOT_COUNTS = (1, 2, 4)
SLOTS_CONCURRENCY = 8
MEMORY_SLOTS = (1, 8)
MEMORY_LAYERS, MEMORY_WIDTH, MEMORY_ROWS = 12, 2048, 64  # 12 x 2048 x 2048 FP32 = 201,326,592 bytes
MEMORY_MODEL = "weights200mb"
RPC_TIMEOUT = 300.0  # every request this script sends itself carries a deadline


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ servers


class ServerProcess:
    """A server subprocess on a free loopback port (it is started with --port 0 and prints its address)."""

    def __init__(self, label: str, argv: list[str], cwd: Path) -> None:
        self.label = label
        self.argv = argv
        self.cwd = cwd
        self.process: subprocess.Popen | None = None
        self.address = ""
        self.startup_s = float("nan")
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", label)
        self.stdout_path = LOGS / f"{slug}.out"
        self.stderr_path = LOGS / f"{slug}.log"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 120.0) -> ServerProcess:
        LOGS.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        started = time.perf_counter()
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(self.argv, cwd=self.cwd, stdout=out, stderr=err,
                                            stdin=subprocess.DEVNULL, env=env)
        deadline = started + timeout
        while time.perf_counter() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.label} exited with {self.process.returncode} before listening; "
                                   f"see {self.stderr_path}")
            match = re.search(r"listening on (\S+):(\d+)", self.stdout_path.read_text(errors="replace"))
            if match:
                host = match.group(1).strip("[]")
                self.address = f"{host}:{match.group(2)}"
                break
            time.sleep(0.02)
        else:
            self.stop()
            raise RuntimeError(f"{self.label} did not print its address within {timeout:.0f} s")
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            while time.perf_counter() < deadline:
                try:
                    if stub.ServerReady(pb.ServerReadyRequest(), timeout=5).ready:
                        break
                except grpc.RpcError:
                    pass
                time.sleep(0.02)
            else:
                self.stop()
                raise RuntimeError(f"{self.label} was not ready within {timeout:.0f} s")
        self.startup_s = time.perf_counter() - started
        log(f"started {self.label} (pid {self.pid}) on {self.address} in {self.startup_s:.2f} s")
        return self

    def explain(self, message: str) -> str:
        """For an "internal error (reference X)" from slotserve: the exception line its log has for X."""
        match = re.search(r"reference ([0-9a-f]+)", message)
        if not match or not self.stderr_path.exists():
            return message
        text = self.stderr_path.read_text(errors="replace")
        start = text.find(f"reference {match.group(1)}")
        if start < 0:
            return message
        for line in text[start:].splitlines()[1:80]:
            if re.match(r"^[A-Za-z_.]+(Error|Exception|Exit|Interrupt)\b", line):
                return f"{line.strip()} (server log {self.stderr_path.relative_to(ROOT)}; perf_analyzer: {message})"
        return message

    def rss_kib(self) -> int:
        return _status_kib(self.pid, "VmRSS")

    def hwm_kib(self) -> int:
        return _status_kib(self.pid, "VmHWM")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            log(f"{self.label} ignored SIGTERM for 20 s: killing it")
            self.process.kill()
            self.process.wait(timeout=10)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {key}")


class Launcher:
    """Builds the command lines of the servers under test."""

    def __init__(self, slotserve_root: Path, slotserve_args: list[str]) -> None:
        self.slotserve_root = slotserve_root
        self.slotserve_args = slotserve_args

    def slotserve(self, label: str, repository: Path, extra: list[str] = (), *, default_args: bool = True):
        argv = [sys.executable, "-m", "service", "--model-repository", str(repository), "--port", "0",
                *(self.slotserve_args if default_args else []), *extra]
        return ServerProcess(label, argv, self.slotserve_root)

    def bare(self, label: str = "bare"):
        argv = [sys.executable, str(BENCH / "bare_server.py"), "--port", "0",
                "--model-repository", str(DEMO_REPOSITORY), "--models", "simple,identity_fp32"]
        return ServerProcess(label, argv, ROOT)


# ------------------------------------------------------------------------------------------- perf_analyzer


def perf_analyzer_version() -> str:
    try:
        result = subprocess.run([str(PERF_ANALYZER), "--version"], capture_output=True, text=True, timeout=30)
    except OSError as error:
        return f"unavailable ({error})"
    return (result.stdout or result.stderr).strip().splitlines()[0] if result.returncode == 0 else "unavailable"


class PerfAnalyzer:
    def __init__(self, interval_ms: int, trials: int, workdir: Path) -> None:
        self.interval_ms = interval_ms
        self.trials = trials
        self.workdir = workdir
        self._runs = 0

    def run(self, address: str, model: str, concurrency: int, shape: str | None = None) -> dict:
        """One perf_analyzer point. Returns the CSV row's figures, or {"error": ...}."""
        self._runs += 1
        out = self.workdir / f"pa-{self._runs}.csv"
        command = [str(PERF_ANALYZER), "-i", "grpc", "-u", address, "-m", model,
                   "--concurrency-range", f"{concurrency}:{concurrency}",
                   "--measurement-interval", str(self.interval_ms), "--stability-percentage", "1000",
                   "--max-trials", str(self.trials), "-f", str(out)]
        if shape:
            command += ["--shape", shape]
        timeout = 60 + 4 * self.trials * self.interval_ms / 1000
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"perf_analyzer ran past {timeout:.0f} s"}
        if result.returncode != 0 or not out.exists():
            LOGS.mkdir(parents=True, exist_ok=True)
            saved = LOGS / f"perf_analyzer-failed-{self._runs}.txt"
            saved.write_text(" ".join(command) + "\n\n" + result.stdout + "\n" + result.stderr)
            lines = [line.strip() for line in (result.stdout + result.stderr).splitlines() if line.strip()]
            errors = [line for line in lines if re.search(r"error|fail|unable|abort", line, re.I)] or lines[-3:]
            return {"error": f"perf_analyzer exit {result.returncode}: " + " | ".join(errors[:3])[:400]
                    + f" (output: {saved.relative_to(ROOT)})"}
        with open(out, newline="") as handle:
            rows = list(csv.DictReader(handle))
        if not rows:
            return {"error": "perf_analyzer wrote no CSV row"}
        row = rows[0]

        def us(column: str) -> float:
            return float(row[column]) if row.get(column) not in (None, "") else float("nan")

        return {
            "infer_per_s": float(row["Inferences/Second"]),
            "p50_ms": us("p50 latency") / 1000, "p90_ms": us("p90 latency") / 1000,
            "p99_ms": us("p99 latency") / 1000,
            "client_send_us": us("Client Send"), "network_server_us": us("Network+Server Send/Recv"),
            "server_queue_us": us("Server Queue"), "server_compute_input_us": us("Server Compute Input"),
            "server_compute_infer_us": us("Server Compute Infer"),
            "server_compute_output_us": us("Server Compute Output"), "client_recv_us": us("Client Recv"),
        }


# ----------------------------------------------------------------------------------------------- helpers


def median(values) -> float:
    values = [v for v in values if v is not None and v == v]
    return statistics.median(values) if values else float("nan")


def ok(point: dict) -> bool:
    return "error" not in point


def paired_ratio(points_a: list[dict], points_b: list[dict], key: str) -> float:
    """Median over rounds of a[key] / b[key] (pairs measured back to back)."""
    return median([a[key] / b[key] for a, b in zip(points_a, points_b) if ok(a) and ok(b) and b[key]])


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

    def add(self, section: str, figure: str, value: str, target: str = "", met: bool | None = None,
            **data) -> None:
        self.rows.append({"section": section, "figure": figure, "value": value, "target": target,
                          "met": met, **data})

    def render(self) -> str:
        headers = ("figure", "value", "target", "met?")
        cells = [(r["figure"], r["value"], r["target"] or "-",
                  "" if r["met"] is None else ("yes" if r["met"] else "NO")) for r in self.rows]
        widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
        line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |"
        rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        body = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
        return "\n".join([line, rule, *body])


def met_if(value: float, predicate) -> bool | None:
    return None if value != value else bool(predicate(value))


def infer_request(model: str, tensors: list[tuple[str, str, np.ndarray]]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    for name, datatype, array in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=array.shape)
        request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    return request


def channel(address: str) -> grpc.Channel:
    limit = 1 << 30
    return grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", limit),
                                                   ("grpc.max_send_message_length", limit)])


# --------------------------------------------------------------------------------------------- sections


# The slotserve configurations measured against the bare server on `simple`: the default (one slot per model,
# no --parallel-jobs) and the parallel runtime with 4 slots. With one slot, a tiny model is bound by how fast
# the thread that ran it gets the GIL back after ONNX Runtime (which releases it): the slot stays held meanwhile.
SIMPLE_VARIANTS = (("slotserve", ()), ("slotserve-p4", ("--parallel-jobs", "4")))


def section_simple(args, launcher: Launcher, pa: PerfAnalyzer, table: Table, raw: dict) -> None:
    names = [name for name, _ in SIMPLE_VARIANTS] + ["bare"]
    points = {(server, c): [] for server in names for c in SIMPLE_CONCURRENCY}
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(launcher.slotserve(f"{name}-simple", DEMO_REPOSITORY, list(flags)))
                   for name, flags in SIMPLE_VARIANTS}
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
    table.add("simple", f"simple c={c} infer/s, {label} / bare",
              f"{fmt(column_median(s, 'infer_per_s'))} / {fmt(column_median(b, 'infer_per_s'))} "
              f"= {fmt_x(tput)}" + (f" [{error[:100]}]" if error else ""),
              "ratio >= 0.90" if c == 16 else "", met_if(tput, lambda v: v >= 0.90) if c == 16 else None,
              ratio=tput, slotserve=column_median(s, "infer_per_s"), bare=column_median(b, "infer_per_s"))
    table.add("simple", f"simple c={c} p50 ms, {label} / bare",
              f"{fmt_ms(column_median(s, 'p50_ms'))} / {fmt_ms(column_median(b, 'p50_ms'))}",
              slotserve=column_median(s, "p50_ms"), bare=column_median(b, "p50_ms"))
    table.add("simple", f"simple c={c} p99 ms, {label} / bare",
              f"{fmt_ms(column_median(s, 'p99_ms'))} / {fmt_ms(column_median(b, 'p99_ms'))} = {fmt_x(p99)}",
              "ratio <= 1.2" if c == 1 else "", met_if(p99, lambda v: v <= 1.2) if c == 1 else None,
              ratio=p99, slotserve=column_median(s, "p99_ms"), bare=column_median(b, "p99_ms"))
    queue = column_median(s, "server_queue_us")
    infer = column_median(s, "server_compute_infer_us")
    inp, outp = column_median(s, "server_compute_input_us"), column_median(s, "server_compute_output_us")
    raw.setdefault("simple_server_side_us", {})[f"{label} c={c}"] = {
        "queue": queue, "compute_input": inp, "compute_infer": infer, "compute_output": outp}
    if c == max(SIMPLE_CONCURRENCY):
        table.add("simple", f"simple c={c} {label}'s own statistics, us per request",
                  f"queue {fmt(queue)}, input {fmt(inp)}, infer {fmt(infer)}, output {fmt(outp)} "
                  f"(1 / throughput = {fmt(1e6 / column_median(s, 'infer_per_s'))})")


def measure(pa: PerfAnalyzer, server: ServerProcess, model: str, concurrency: int, shape: str | None = None):
    point = pa.run(server.address, model, concurrency, shape)
    if not ok(point):
        point["error"] = server.explain(point["error"])
    return point


def describe(point: dict) -> str:
    if not ok(point):
        return "ERROR " + point["error"]
    return (f"{point['infer_per_s']:.1f} infer/s, p50 {point['p50_ms']:.2f} ms, p99 {point['p99_ms']:.2f} ms "
            f"(server queue {point['server_queue_us']:.0f} us, infer {point['server_compute_infer_us']:.0f} us)")


def section_identity(args, launcher: Launcher, pa: PerfAnalyzer, table: Table, raw: dict) -> None:
    points = {(server, size, c): [] for server in ("slotserve", "bare") for size in IDENTITY_SIZES
              for c in IDENTITY_CONCURRENCY}
    with launcher.slotserve("slotserve-identity", DEMO_REPOSITORY) as slot, launcher.bare("bare-identity") as bare:
        servers = {"slotserve": slot, "bare": bare}
        for round_index in range(args.rounds):
            order = ("slotserve", "bare") if round_index % 2 == 0 else ("bare", "slotserve")
            for size, elements in IDENTITY_SIZES.items():
                for c in IDENTITY_CONCURRENCY:
                    for name in order:
                        point = measure(pa, servers[name], "identity_fp32", c, shape=f"INPUT0:{elements}")
                        if ok(point):
                            point["mb_per_s"] = point["infer_per_s"] * elements * 4 / 1e6
                        points[(name, size, c)].append(point)
                        log(f"identity round {round_index + 1}/{args.rounds} {size} c={c} {name}: "
                            + (f"{point['mb_per_s']:.0f} MB/s, " if ok(point) else "") + describe(point))
    raw["identity"] = {f"{server} {size} c={c}": runs for (server, size, c), runs in points.items()}
    for size in IDENTITY_SIZES:
        for c in IDENTITY_CONCURRENCY:
            s, b = points[("slotserve", size, c)], points[("bare", size, c)]
            error = first_error(s) or first_error(b)
            ratio = paired_ratio(s, b, "mb_per_s")
            big = size == "16 MiB"
            table.add("identity", f"identity_fp32 {size} c={c} MB/s, slotserve / bare",
                      f"{fmt(column_median(s, 'mb_per_s'))} / {fmt(column_median(b, 'mb_per_s'))} = {fmt_x(ratio)}"
                      f" (p50 {fmt_ms(column_median(s, 'p50_ms'))} / {fmt_ms(column_median(b, 'p50_ms'))} ms)"
                      + (f" [{error[:100]}]" if error else ""),
                      "ratio >= 1.5" if big else "", met_if(ratio, lambda v: v >= 1.5) if big else None,
                      ratio=ratio, slotserve=column_median(s, "mb_per_s"), bare=column_median(b, "mb_per_s"))


def section_slots(args, launcher: Launcher, pa: PerfAnalyzer, table: Table, raw: dict) -> None:
    points = {n: [] for n in SLOT_COUNTS}
    servers = {}
    try:
        for n in SLOT_COUNTS:
            servers[n] = launcher.slotserve(f"slotserve-slots{n}", DEMO_REPOSITORY,
                                            ["--parallel-jobs", str(n)], default_args=False).start()
        calibration: dict[int, list[float]] = {1: [], 2: []}
        for round_index in range(args.rounds):
            for threads, values in matmul_chain_in_process().items():
                calibration[threads] += values
            log(f"slots round {round_index + 1}/{args.rounds} in-process calls/s, 1 thread "
                f"{calibration[1][-1]:.1f}, 2 threads {calibration[2][-1]:.1f}")
            order = SLOT_COUNTS if round_index % 2 == 0 else tuple(reversed(SLOT_COUNTS))
            for n in order:
                point = measure(pa, servers[n], "matmul_chain", SLOTS_CONCURRENCY)
                points[n].append(point)
                log(f"slots round {round_index + 1}/{args.rounds} {n} slot(s) c={SLOTS_CONCURRENCY}: "
                    + describe(point))
    finally:
        for server in servers.values():
            server.stop()
    raw["slots"] = {f"{n} slots": runs for n, runs in points.items()}
    raw["slots_in_process"] = calibration
    one, two = median(calibration[1]), median(calibration[2])
    table.add("slots", "matmul_chain in-process onnxruntime (no server): /s with 1 thread, 2 threads",
              f"{fmt(one, 1)}, {fmt(two, 1)} ({fmt_x(two / one)}: what this machine gives 2 slots now)",
              one_thread=one, two_threads=two)
    for n in SLOT_COUNTS:
        value = column_median(points[n], "infer_per_s")
        scaling = paired_ratio(points[n], points[1], "infer_per_s")
        error = first_error(points[n])
        target = "2 slots >= 1.8x 1 slot" if n == 2 else ""
        table.add("slots", f"matmul_chain {n} slot(s), c={SLOTS_CONCURRENCY}: infer/s (x 1 slot)",
                  f"{fmt(value, 1)} ({fmt_x(scaling)}, p50 {fmt_ms(column_median(points[n], 'p50_ms'))} ms)"
                  + (f" [{error[:100]}]" if error else ""),
                  target, met_if(scaling, lambda v: v >= 1.8) if n == 2 else None,
                  infer_per_s=value, scaling=scaling)


def matmul_chain_in_process(rounds: int = 1, calls: int = 30) -> dict[int, list[float]]:
    """matmul_chain calls/s in this process, one onnxruntime thread per run, with 1 and with 2 Python threads
    calling one shared session at once (alternating, `rounds` times each): how far the cores scale right now,
    without any server, the client or gRPC."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(DEMO_REPOSITORY / "matmul_chain" / "1" / "model.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    feed = {"INPUT0": np.random.default_rng(0).standard_normal((384, 64), dtype=np.float32)}
    for _ in range(3):
        session.run(None, feed)

    def loop() -> None:
        for _ in range(calls):
            session.run(None, feed)

    result: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(rounds):
        for threads in (1, 2):
            workers = [threading.Thread(target=loop) for _ in range(threads)]
            started = time.perf_counter()
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            result[threads].append(threads * calls / (time.perf_counter() - started))
    return result


def memory_repository() -> tuple[Path, int]:
    """A repository holding one MatMul chain with ~201 MB of FP32 weights (built once, in bench/.cache)."""
    repository = CACHE / "memory_repository"
    directory = repository / MEMORY_MODEL
    model_file = directory / "1" / "model.onnx"
    weights = MEMORY_LAYERS * MEMORY_WIDTH * MEMORY_WIDTH * 4
    if model_file.is_file():
        return repository, weights
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    log(f"building {model_file} ({weights / 1e6:.0f} MB of weights)")
    rng = np.random.default_rng(7)
    scale = 1.0 / np.sqrt(MEMORY_WIDTH)
    nodes, initializers, current = [], [], "INPUT0"
    for layer in range(MEMORY_LAYERS):
        weight = (rng.standard_normal((MEMORY_WIDTH, MEMORY_WIDTH), dtype=np.float32) * scale).astype(np.float32)
        initializers.append(numpy_helper.from_array(weight, f"weight{layer}"))
        result = "OUTPUT0" if layer == MEMORY_LAYERS - 1 else f"activation{layer}"
        nodes.append(helper.make_node("MatMul", [current, f"weight{layer}"], [f"product{layer}"]))
        nodes.append(helper.make_node("Tanh", [f"product{layer}"], [result]))
        current = result
    shape = [MEMORY_ROWS, MEMORY_WIDTH]
    graph = helper.make_graph(nodes, MEMORY_MODEL,
                              [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, shape)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8,
                              producer_name="slotserve-bench")
    (directory / "1").mkdir(parents=True, exist_ok=True)
    temporary = model_file.with_suffix(".tmp")
    temporary.write_bytes(model.SerializeToString())
    dims = "".join(f"  dims: {d}\n" for d in shape)
    (directory / "config.pbtxt").write_text(
        f'# Written by bench/run.py: {MEMORY_LAYERS} MatMul+Tanh layers, {MEMORY_WIDTH}x{MEMORY_WIDTH} FP32 '
        f'weights each ({weights} bytes in all).\n'
        f'name: "{MEMORY_MODEL}"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        f'input {{\n  name: "INPUT0"\n  data_type: TYPE_FP32\n{dims}}}\n'
        f'output {{\n  name: "OUTPUT0"\n  data_type: TYPE_FP32\n{dims}}}\n')
    os.replace(temporary, model_file)
    return repository, weights


def warm_up_concurrently(address: str, model: str, tensors, in_flight: int, requests_each: int) -> int:
    """`in_flight` threads, each sending `requests_each` requests back to back, started together. Returns the
    number of failures."""
    request = infer_request(model, tensors)
    failures = []
    barrier = threading.Barrier(in_flight)

    def worker() -> None:
        with channel(address) as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            barrier.wait(timeout=60)
            for _ in range(requests_each):
                try:
                    stub.ModelInfer(request, timeout=RPC_TIMEOUT)
                except grpc.RpcError as error:
                    failures.append(f"{error.code().name}: {error.details()}")

    threads = [threading.Thread(target=worker) for _ in range(in_flight)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=RPC_TIMEOUT * requests_each)
    if failures:
        log(f"warm-up failures ({len(failures)}): {failures[0]}")
    return len(failures)


def section_memory(args, launcher: Launcher, table: Table, raw: dict) -> None:
    repository, weights = memory_repository()
    # Baseline: the same server holding only `simple` (so onnxruntime is imported and initialised), warmed up.
    baseline = CACHE / "baseline_repository"
    shutil.copytree(DEMO_REPOSITORY / "simple", baseline / "simple", dirs_exist_ok=True)
    result: dict = {"weights_bytes": weights, "model_file_bytes": (repository / MEMORY_MODEL / "1" / "model.onnx")
                    .stat().st_size}
    with launcher.slotserve("slotserve-baseline", baseline, ["--parallel-jobs", "1"], default_args=False) as server:
        warm_up_concurrently(server.address, "simple", [
            ("INPUT0", "INT32", np.ones((1, 16), np.int32)), ("INPUT1", "INT32", np.ones((1, 16), np.int32))],
            max(MEMORY_SLOTS), args.memory_requests)
        time.sleep(0.5)
        result["baseline_rss_kib"] = server.rss_kib()
    tensors = [("INPUT0", "FP32", np.random.default_rng(1).standard_normal(
        (MEMORY_ROWS, MEMORY_WIDTH), dtype=np.float32))]
    in_flight = max(MEMORY_SLOTS)
    for slots in MEMORY_SLOTS:
        with launcher.slotserve(f"slotserve-memory{slots}", repository, ["--parallel-jobs", str(slots)],
                                default_args=False) as server:
            loaded = server.rss_kib()
            failures = warm_up_concurrently(server.address, MEMORY_MODEL, tensors, in_flight,
                                            args.memory_requests)
            time.sleep(0.5)
            reported = None
            try:
                with channel(server.address) as ch:
                    status = mpb_grpc.ModelManagementStub(ch).GetModel(
                        mpb.GetModelRequest(model_id=MEMORY_MODEL), timeout=30)
                    reported = status.memory_bytes if status.HasField("memory_bytes") else None
                    result[f"slots_reported_{slots}"] = status.slots
            except grpc.RpcError as error:
                log(f"GetModel failed: {error.code().name}")
            result[f"slots{slots}"] = {"rss_after_load_kib": loaded, "rss_after_warmup_kib": server.rss_kib(),
                                       "hwm_kib": server.hwm_kib(), "warmup_failures": failures,
                                       "reported_memory_bytes": reported, "startup_s": server.startup_s}
            log(f"memory {slots} slot(s): {result[f'slots{slots}']}")
    raw["memory"] = result
    one, many = result[f"slots{MEMORY_SLOTS[0]}"], result[f"slots{MEMORY_SLOTS[-1]}"]
    extra = MEMORY_SLOTS[-1] - MEMORY_SLOTS[0]
    per_slot = (many["rss_after_warmup_kib"] - one["rss_after_warmup_kib"]) * 1024 / extra
    share = per_slot / weights
    mb = 1024 * 1024
    table.add("memory", "RSS MiB: baseline (only `simple`) / 200 MB model 1 slot / 8 slots",
              f"{result['baseline_rss_kib'] / 1024:.0f} / {one['rss_after_warmup_kib'] / 1024:.0f} / "
              f"{many['rss_after_warmup_kib'] / 1024:.0f} (weights {weights / mb:.0f} MiB)")
    model_x = (one["rss_after_warmup_kib"] - result["baseline_rss_kib"]) * 1024 / weights
    loaded_x = (one["rss_after_load_kib"] - result["baseline_rss_kib"]) * 1024 / weights
    table.add("memory", "RSS of the model at 1 slot (minus baseline), x weights",
              f"{model_x:.2f}x (right after load, before any request: {loaded_x:.2f}x)", x_weights=model_x)
    table.add("memory", "RSS per extra slot (1 -> 8 slots)",
              f"{per_slot / mb:.1f} MiB = {100 * share:.1f} % of weights"
              + (" [warm-up failures]" if one["warmup_failures"] or many["warmup_failures"] else ""),
              "<= 10 % of weights", share <= 0.10, per_slot_bytes=per_slot, share=share)


def section_admission(args, table: Table, raw: dict) -> None:
    sys.path.insert(0, str(args.slotserve_root))
    from service.admission import AdmissionController, TicketKind

    request = TicketKind.REQUEST
    result: dict = {}

    # Uncontended: one thread, one slot, acquire + release back to back.
    controller = AdmissionController("bench", 1)
    pairs = args.admission_pairs
    samples = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(pairs):
            controller.release(controller.acquire(request, None))
        samples.append((time.perf_counter() - started) / pairs * 1e6)
    result["uncontended_us"] = samples
    uncontended = median(samples)

    # Contended: 4 threads loop acquire + release for a fixed time; us per pair = wall time / all pairs.
    def contended(capacity: int, seconds: float) -> float:
        ctl = AdmissionController("bench", capacity)
        stop = threading.Event()
        counts = [0] * 4
        start = threading.Barrier(5)

        def worker(index: int) -> None:
            start.wait(timeout=30)
            n = 0
            while not stop.is_set():
                for _ in range(100):
                    ctl.release(ctl.acquire(request, None))
                n += 100
            counts[index] = n

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        start.wait(timeout=30)
        began = time.perf_counter()
        time.sleep(seconds)
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        elapsed = time.perf_counter() - began
        return elapsed / max(1, sum(counts)) * 1e6

    result["contended_1slot_us"] = [contended(1, args.admission_seconds) for _ in range(3)]
    result["contended_4slots_us"] = [contended(4, args.admission_seconds) for _ in range(3)]

    # Hand-off: the holder stamps the time and releases; the queued waiter stamps when acquire returns.
    def handoff(use_lock: bool, repeats: int) -> list[float]:
        ctl = AdmissionController("bench", 1)
        lock = threading.Lock()
        go, done = threading.Event(), threading.Event()
        stamp = [0.0]
        latencies: list[float] = []
        failed = []

        def waiter() -> None:
            try:
                for _ in range(repeats):
                    if not go.wait(timeout=30):
                        return
                    go.clear()
                    if use_lock:
                        lock.acquire()
                        latencies.append(time.perf_counter() - stamp[0])
                        lock.release()
                    else:
                        ticket = ctl.acquire(request, None)
                        latencies.append(time.perf_counter() - stamp[0])
                        ctl.release(ticket)
                    done.set()
            except Exception as error:  # noqa: BLE001 - reported, not raised
                failed.append(repr(error))
                done.set()

        thread = threading.Thread(target=waiter)
        thread.start()
        for _ in range(repeats):
            if use_lock:
                lock.acquire()
            else:
                held = ctl.acquire(request, None)
            go.set()
            # Give the waiter time to block: until it is queued (admission) or for a fixed 200 us (lock).
            limit = time.perf_counter() + 5
            if use_lock:
                time.sleep(0.0002)
            else:
                while ctl.statistics().queued == 0 and time.perf_counter() < limit:
                    time.sleep(0)
                time.sleep(0.0001)
            stamp[0] = time.perf_counter()
            if use_lock:
                lock.release()
            else:
                ctl.release(held)
            if not done.wait(timeout=30) or failed:
                break
            done.clear()
        thread.join(timeout=60)
        if failed:
            log(f"hand-off benchmark failed: {failed[0]}")
        return [x * 1e6 for x in latencies]

    handoff_admission = handoff(False, args.handoff_repeats)
    handoff_lock = handoff(True, args.handoff_repeats)
    result["handoff_admission_us"] = {"p50": median(handoff_admission),
                                      "p99": float(np.percentile(handoff_admission, 99)) if handoff_admission
                                      else float("nan"), "n": len(handoff_admission)}
    result["handoff_lock_us"] = {"p50": median(handoff_lock),
                                 "p99": float(np.percentile(handoff_lock, 99)) if handoff_lock else float("nan"),
                                 "n": len(handoff_lock)}
    raw["admission"] = result
    log(f"admission: {json.dumps(result)}")
    table.add("admission", "acquire+release, uncontended (us per pair)", fmt(uncontended, 2), "<= 20 us",
              met_if(uncontended, lambda v: v <= 20), us=uncontended)
    table.add("admission", "acquire+release, 4 threads on 1 slot (us per pair, wall)",
              fmt(median(result["contended_1slot_us"]), 1), us=median(result["contended_1slot_us"]))
    table.add("admission", "acquire+release, 4 threads on 4 slots (us per pair, wall)",
              fmt(median(result["contended_4slots_us"]), 2), us=median(result["contended_4slots_us"]))
    a, b = result["handoff_admission_us"], result["handoff_lock_us"]
    table.add("admission", "hand-off release -> waiter running, p50 / p99 us",
              f"{fmt(a['p50'], 1)} / {fmt(a['p99'], 1)} (bare threading.Lock: {fmt(b['p50'], 1)} / {fmt(b['p99'], 1)})",
              p50=a["p50"], p99=a["p99"])


def section_coldload(args, launcher: Launcher, table: Table, raw: dict) -> None:
    models = sorted(p.name for p in DEMO_REPOSITORY.iterdir() if (p / "config.pbtxt").is_file())
    result: dict = {}
    with launcher.slotserve("slotserve-coldload", DEMO_REPOSITORY, ["--allow-management"]) as server:
        result["server_start_to_ready_s"] = server.startup_s
        with channel(server.address) as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            for model in models:
                times = []
                error = None
                for _ in range(args.coldload_repeats):
                    try:
                        stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=model),
                                                   timeout=RPC_TIMEOUT)
                        started = time.perf_counter()
                        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=model),
                                                 timeout=RPC_TIMEOUT)
                        elapsed = time.perf_counter() - started
                        if not stub.ModelReady(pb.ModelReadyRequest(name=model), timeout=30).ready:
                            error = "not ready after RepositoryModelLoad"
                        times.append(elapsed * 1000)
                    except grpc.RpcError as rpc_error:
                        error = f"{rpc_error.code().name}: {rpc_error.details()}"
                        break
                result[model] = {"ms": times, "error": error}
                log(f"cold load {model}: {times} {error or ''}")
    raw["coldload"] = result
    for model in models:
        entry = result[model]
        table.add("coldload", f"cold load {model} (unload, then RepositoryModelLoad) ms",
                  fmt_ms(median(entry["ms"])) + (f" [{entry['error'][:80]}]" if entry["error"] else ""),
                  ms=median(entry["ms"]))
    table.add("coldload", "server start to ready, all demo models loaded (s)",
              f"{result['server_start_to_ready_s']:.2f}", s=result["server_start_to_ready_s"])


# ---------------------------------------------------------------------------------------------- profiling


def find_py_spy(explicit: str | None) -> str | None:
    for candidate in (explicit, str(BENCH / ".venv-pa" / "bin" / "py-spy"), shutil.which("py-spy")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


PROFILE_RATE = 200  # samples per second


def profile_servers(args, servers: dict[str, ServerProcess], pa: PerfAnalyzer) -> dict:
    """py-spy on each server during its own concurrency-16 `simple` run: samples of the thread holding the GIL
    (on a thread-pooled Python server the GIL is the shared resource); slotserve also with native frames. The
    share of samples taken over the samples asked for approximates how busy the GIL was."""
    py_spy = find_py_spy(args.py_spy)
    if py_spy is None:
        log("--profile: py-spy not found (bench/setup.sh --with-py-spy installs it); skipped")
        return {"error": "py-spy not found"}
    profiles = {}
    duration = max(3, int(pa.trials * pa.interval_ms / 1000))
    plan = [("slotserve", "gil", ["--gil"]), ("slotserve", "gil-native", ["--gil", "--native"]),
            ("bare", "gil", ["--gil"])]
    for name, mode, flags in plan:
        label = f"{name} {mode}"
        server = servers[name]
        out = RESULTS / f"profile-simple-c16-{name}-{mode}.raw"
        command = [py_spy, "record", "-p", str(server.pid), "-d", str(duration), "-r", str(PROFILE_RATE),
                   "-f", "raw", "-o", str(out), *flags]
        recorder = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        point = pa.run(server.address, "simple", 16)
        try:
            output, _ = recorder.communicate(timeout=duration + 60)
        except subprocess.TimeoutExpired:
            recorder.kill()
            output, _ = recorder.communicate()
        if not out.exists():
            profiles[label] = {"error": output.strip()[-300:]}
            continue
        summary = summarize_profile(out)
        summary["gil_busy"] = summary["samples"] / (PROFILE_RATE * duration)
        summary["perf_analyzer_while_profiling"] = point
        (RESULTS / f"profile-simple-c16-{name}-{mode}.txt").write_text(render_profile(label, summary))
        profiles[label] = summary
        log(f"profile ({label}) written to {out} and {out.with_suffix('.txt')}")
    return profiles


_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _frame_key(frame: str) -> str:
    if frame.startswith("0x") and frame.endswith(")"):
        return "[" + frame[frame.find("(") + 1:-1] + "]"  # an unsymbolized native frame: keep the library
    match = _FRAME.match(frame)
    if not match:
        return frame
    path = match.group("file")
    for marker in ("site-packages/", str(ROOT) + "/", "/lib/python3"):
        index = path.find(marker)
        if index >= 0:
            path = path[index + len(marker):] if marker != "/lib/python3" else "stdlib:" + path.rsplit("/", 1)[-1]
            break
    return f"{match.group('function')} ({path})"


def summarize_profile(path: Path, top: int = 25) -> dict:
    own: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame_key(f) for f in stack.split(";") if f]
        if not frames:
            continue
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    return {"samples": total,
            "self": [(f, n, 100 * n / total) for f, n in own.most_common(top)] if total else [],
            "inclusive": [(f, n, 100 * n / total) for f, n in inclusive.most_common(top)] if total else []}


def render_profile(label: str, summary: dict) -> str:
    point = summary.get("perf_analyzer_while_profiling") or {}
    lines = [f"py-spy on {label}, simple c=16: {summary['samples']} samples with the GIL held "
             f"(~{100 * summary.get('gil_busy', float('nan')):.0f} % of the time); "
             f"{fmt(point.get('infer_per_s', float('nan')))} infer/s while profiled"]
    for kind in ("self", "inclusive"):
        lines.append(f"\ntop {kind}:")
        lines += [f"  {pct:5.1f} %  {frame}" for frame, _n, pct in summary[kind]]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------- main


def machine_info() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        memory = Path("/proc/meminfo").read_text().splitlines()[0].split(":", 1)[1].strip()
    except (OSError, IndexError):
        pass
    versions = {"python": platform.python_version(), "grpcio": grpc.__version__, "numpy": np.__version__}
    for module in ("onnxruntime", "google.protobuf", "onnx"):
        try:
            versions[module] = __import__(module, fromlist=["__version__"]).__version__
        except ImportError:
            pass
    versions["perf_analyzer"] = perf_analyzer_version()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True)
    return {"nproc": len(os.sched_getaffinity(0)), "cpu": cpu, "memory": memory, "kernel": platform.release(),
            "loadavg_start": list(os.getloadavg()), "versions": versions,
            "git": (commit.stdout.strip() or "unknown") + ("+dirty" if dirty.stdout.strip() else "")}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="slotserve benchmarks (issue 7); see the module docstring.")
    parser.add_argument("--quick", action="store_true",
                        help="one round, 1 s windows, fewer repeats (about 2 minutes)")
    parser.add_argument("--rounds", type=int, help="round-robin rounds per paired figure (default 3, quick 1)")
    parser.add_argument("--interval-ms", type=int, help="perf_analyzer measurement window (default 2000, quick 1000)")
    parser.add_argument("--trials", type=int, default=3, help="perf_analyzer windows per point (default 3)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--slotserve-args", default="",
                        help="extra flags for the slotserve under test in the simple, identity and coldload "
                             "sections (default: none, i.e. what `make run` gives: one slot per model)")
    parser.add_argument("--slotserve-root", type=Path, default=ROOT,
                        help="checkout whose `service` package runs as slotserve (default: this one)")
    parser.add_argument("--profile", action="store_true", help="py-spy both servers during a c=16 simple run")
    parser.add_argument("--py-spy", help="path of the py-spy executable (default: bench/.venv-pa/bin, then PATH)")
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
    args.slotserve_root = args.slotserve_root.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    needs_pa = {"simple", "identity", "slots"} & set(args.sections)
    if needs_pa and not os.access(PERF_ANALYZER, os.X_OK):
        print(f"bench: {PERF_ANALYZER} is missing: run bench/setup.sh first", file=sys.stderr)
        return 2
    if not (DEMO_REPOSITORY / "simple" / "config.pbtxt").is_file():
        print(f"bench: {DEMO_REPOSITORY} is not built: run `make models` first", file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    info = machine_info()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    launcher = Launcher(args.slotserve_root, shlex.split(args.slotserve_args))
    table, raw, errors = Table(), {}, {}
    with tempfile.TemporaryDirectory(prefix="slotserve-bench-") as scratch:
        pa = PerfAnalyzer(args.interval_ms, args.trials, Path(scratch))
        runners = {
            "simple": lambda: section_simple(args, launcher, pa, table, raw),
            "identity": lambda: section_identity(args, launcher, pa, table, raw),
            "slots": lambda: section_slots(args, launcher, pa, table, raw),
            "memory": lambda: section_memory(args, launcher, table, raw),
            "admission": lambda: section_admission(args, table, raw),
            "coldload": lambda: section_coldload(args, launcher, table, raw),
        }
        for section in args.sections:
            raw.setdefault("loadavg_1min", {})[section] = os.getloadavg()[0]
            log(f"section {section} (load average {os.getloadavg()[0]:.2f})")
            try:
                runners[section]()
            except Exception as error:  # a failed section is reported, the others still run
                errors[section] = f"{type(error).__name__}: {error}"
                log(f"section {section} failed: {errors[section]}")
                table.add(section, f"{section} section", f"FAILED: {errors[section][:120]}")
    info["loadavg_end"] = list(os.getloadavg())
    runtime = time.perf_counter() - started
    settings = {"rounds": args.rounds, "interval_ms": args.interval_ms, "trials": args.trials,
                "quick": args.quick, "slotserve_args": args.slotserve_args,
                "slotserve_root": str(args.slotserve_root), "runtime_s": round(runtime, 1)}
    header = (f"slotserve bench, {date}: {info['nproc']} CPU(s) {info['cpu']}, load avg "
              f"{info['loadavg_start'][0]:.2f} -> {info['loadavg_end'][0]:.2f}; git {info['git']}; "
              f"{args.rounds} round(s) x {args.trials} x {args.interval_ms} ms windows, "
              f"{info['versions']['perf_analyzer']}"
              f"; slotserve flags: {args.slotserve_args or '(defaults)'}"
              + (f"; slotserve from {args.slotserve_root}" if args.slotserve_root != ROOT else "")
              + f"; {runtime:.0f} s")
    document = {"date": date, "machine": info, "settings": settings, "rows": table.rows, "raw": raw,
                "errors": errors}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2, default=str) + "\n")
    print(header)
    print(table.render())
    for mode, summary in (raw.get("profile") or {}).items():
        if isinstance(summary, dict) and "self" in summary:
            print()
            print(render_profile(mode, {**summary, "self": summary["self"][:12],
                                        "inclusive": summary["inclusive"][:15]}), end="")
    print(f"(JSON: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
