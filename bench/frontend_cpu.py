"""CPU per request of the admission process and of the front ends under `--frontends N` (issue 39).

Starts `python -m service --frontends N` on demo/model_repository, drives `simple` with perf_analyzer for a fixed
window per round, and reads each process's CPU (utime + stime from /proc) and the model's inference count (the
server's statistics) before and after the window: the figures are CPU microseconds per request, with the load
average beside them (the machine is shared; compare figures from the same run only).

    .venv/bin/python -m bench.frontend_cpu --frontends 2 --clients 16 --rounds 3 --seconds 5
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parent.parent
PERF_ANALYZER = ROOT / "bench" / ".cache" / "perf_analyzer"  # bench/setup.sh's wrapper (its libraries)
TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(child) for child in text)
    return found


def _count(stub: pb_grpc.GRPCInferenceServiceStub, model: str) -> int:
    stats = stub.ModelStatistics(pb.ModelStatisticsRequest(name=model), timeout=10)
    return sum(each.inference_count for each in stats.model_stats)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frontends", type=int, default=2)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--model", default="simple")
    args = parser.parse_args()
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service",
            "--model-repository",
            str(ROOT / "demo" / "model_repository"),
            "--port",
            str(port),
            "--frontends",
            str(args.frontends),
            "--load-model",
            args.model,
            "--model-control-mode",
            "explicit",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        deadline = time.monotonic() + 120
        while True:
            try:
                if stub.ModelReady(pb.ModelReadyRequest(name=args.model), timeout=2).ready:
                    break
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit(f"server did not start: {server.stderr.read().decode() if server.stderr else ''}")
            time.sleep(0.2)  # ordering-free: polls the server's readiness until a deadline
        fronts = [child for child in _children(server.pid) if "service.frontends" in _cmdline(child)]
        print(f"frontends={args.frontends} clients={args.clients} front-end pids={fronts}")
        for round_number in range(1, args.rounds + 1):
            client = subprocess.Popen(
                [
                    str(PERF_ANALYZER),
                    "-i",
                    "grpc",
                    "-u",
                    f"127.0.0.1:{port}",
                    "-m",
                    args.model,
                    "--concurrency-range",
                    f"{args.clients}:{args.clients}",
                    "--measurement-interval",
                    str(int(args.seconds * 4000)),
                    "--stability-percentage",
                    "1000",
                    "--max-trials",
                    "1",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)  # ordering-free: lets the client warm up before the measured window
            count0, admission0 = _count(stub, args.model), _cpu_seconds(server.pid)
            front0 = sum(_cpu_seconds(pid) for pid in fronts)
            time.sleep(args.seconds)  # ordering-free: the measured window
            count1, admission1 = _count(stub, args.model), _cpu_seconds(server.pid)
            front1 = sum(_cpu_seconds(pid) for pid in fronts)
            client.kill()
            client.wait()
            requests = max(1, count1 - count0)
            print(
                f"round {round_number}: {requests / args.seconds:7.0f} req/s  admission "
                f"{(admission1 - admission0) * 1e6 / requests:6.0f} us/req  front ends "
                f"{(front1 - front0) * 1e6 / requests:6.0f} us/req (all of them)  load {os.getloadavg()[0]:.2f}"
            )
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    return 0


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


if __name__ == "__main__":
    sys.exit(main())
