"""The soak's callers: the traffic processes (soak/traffic.py, one per role) and the orchestrator's own calls
(status reads and the saturation burst), each logged as soak/audit.py reads it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np

from client.errors import ClientError
from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from generated import management_pb2 as mpb
from generated import management_pb2_grpc as mpb_grpc

from .repository import ROOT
from .server import WAIT, Server, environment

DEFAULT_ROLES = ("infer", "infer", "stream", "ops")


@dataclass
class ClientRun:
    name: str
    role: str
    log: Path
    process: subprocess.Popen
    stderr: Path
    code: int | None = None


def run_clients(
    server: Server, work: Path, phase: str, seconds: float, roles: list[str], threads: int, seed: int
) -> list[ClientRun]:
    """Start one process per role, wait for all (killed 60 s past their time); their exit codes recorded."""
    runs = []
    try:
        for index, role in enumerate(roles):
            name = f"{phase}-c{index}-{role}"
            log, stderr = work / f"{name}.jsonl", work / f"{name}.stderr"
            process = subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "soak" / "traffic.py"),
                    "--address",
                    server.address,
                    "--role",
                    role,
                    "--seconds",
                    str(seconds),
                    "--threads",
                    str(threads),
                    "--log",
                    str(log),
                    "--name",
                    name,
                    "--seed",
                    str(seed * 100 + index),
                ],
                cwd=ROOT,
                env=environment(),
                stdout=subprocess.DEVNULL,
                stderr=stderr.open("w"),
            )
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
        outcomes: Counter[str] = Counter()
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
                self._write(
                    event="done",
                    id=request_id,
                    status=status,
                    reason=reason,
                    gave_up=status in ("DEADLINE_EXCEEDED", "CANCELLED", "CLIENT_TIMEOUT"),
                    handler_busy="inference handler threads" in message,
                    message=message[:200],
                )
        finally:
            release.touch()
        return outcomes

    def close(self) -> None:
        self._log.close()
        self.channel.close()
