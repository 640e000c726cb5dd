"""What the transport section counts beside perf_analyzer's figures: a server's process tree's CPU time and
thread switches, its request count (ModelStatistics), an IPC round trip, and real Triton as a server object."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from generated import model_config_pb2

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc/PID/task/TID/children), those alive now."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(child) for child in task.read_text().split()]
    return found


@dataclass(frozen=True)
class Counters:
    cpu_s: float  # user + system time of every process in the tree
    switches: int  # voluntary + involuntary context switches of every live thread in the tree

    def __sub__(self, other: Counters) -> Counters:
        return Counters(self.cpu_s - other.cpu_s, self.switches - other.switches)


def stat_cpu_ticks(stat: str) -> int:
    """utime + stime (fields 14 and 15) of a /proc/PID/stat line, in clock ticks: the process's threads, those
    that ended included. The command name (field 2, in parentheses) may itself hold spaces and parentheses, so
    the fields are counted from its last closing parenthesis."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def process_cpu_s(pid: int) -> float:
    """The process's user + system CPU seconds so far. Raises OSError when it is gone."""
    return stat_cpu_ticks(Path(f"/proc/{pid}/stat").read_text()) * _TICK_S


def command_line(pid: int) -> str:
    """The process's argv joined by spaces ("" when it is gone or a zombie)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def tree_cpu_s(pid: int) -> dict[int, tuple[str, float]]:
    """Each live process of `pid`'s tree: (its command line, its CPU seconds so far)."""
    found = {}
    for process in tree(pid):
        with contextlib.suppress(OSError):
            found[process] = (command_line(process), process_cpu_s(process))
    return found


def counters(pid: int) -> Counters:
    """The tree's CPU time and thread switches now (threads that ended are not counted: the servers measured keep
    their threads; the sync server's thread per call retires idle threads only after 5 s)."""
    cpu = 0.0
    switches = 0
    for process in tree(pid):
        with contextlib.suppress(OSError):
            cpu += process_cpu_s(process)
        for status in Path(f"/proc/{process}/task").glob("*/status"):
            with contextlib.suppress(OSError):
                for line in status.read_text().splitlines():
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        switches += int(line.split()[1])
    return Counters(cpu, switches)


def inference_count(address: str, model: str) -> int:
    """The model's successful inference count from ModelStatistics (-1 when it cannot be read)."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelStatistics(
                pb.ModelStatisticsRequest(name=model), timeout=30
            )
        except grpc.RpcError:
            return -1
    return sum(stats.inference_stats.success.count for stats in reply.model_stats)


def ipc_round_trip_us(payload_bytes: int = 200, repeats: int = 5000) -> dict:
    """A frame of `payload_bytes` there and back over a Unix socketpair between this process and a forked echo
    child (blocking send/recv on both sides): the floor of design 3b's per-call IPC, without the event loops.
    Returns p50/mean µs."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    frame = struct.pack("<I", payload_bytes) + b"x" * payload_bytes
    pid = os.fork()
    if pid == 0:  # the echo child: no Python-level cleanup, no exit handlers
        parent.close()
        try:
            while True:
                data = child.recv(65536)
                if not data:
                    break
                child.sendall(data)
        finally:
            os._exit(0)
    child.close()
    times = []
    try:
        for _ in range(repeats):
            started = time.perf_counter_ns()
            parent.sendall(frame)
            received = 0
            while received < len(frame):
                received += len(parent.recv(65536))
            times.append(time.perf_counter_ns() - started)
    finally:
        parent.close()
        os.waitpid(pid, 0)
    times.sort()
    return {"p50_us": times[len(times) // 2] / 1000, "mean_us": sum(times) / len(times) / 1000}


class TritonServer:
    """Real tritonserver 2.51 (tests/differential/reference.py starts it) on a python-backend `simple`, or on
    `repository` when given (`model`: the one whose instance groups it reports), shaped as
    bench.servers.ServerProcess is for the section (label, address, pid, explain)."""

    def __init__(self, label: str, folder: Path, repository: Path | None = None, model: str = "simple") -> None:
        self.label = label
        self.folder = folder
        self.repository = repository
        self.model = model
        self.address = ""
        self.pid = -1
        self._stack = contextlib.ExitStack()
        self.instances = "?"

    def __enter__(self) -> TritonServer:
        from tests.differential.reference import find_installation, run_triton
        from tests.differential.repositories import write_add_sub_repositories

        installation, reason = find_installation()
        if installation is None:
            raise RuntimeError(reason)
        repository = self.repository
        if repository is None:
            repository = write_add_sub_repositories(self.folder / "repositories", ("simple",)).triton
        self.folder.mkdir(parents=True, exist_ok=True)
        running = self._stack.enter_context(run_triton(installation, repository, self.folder))
        self.address, self.pid = running.address, running.process.pid
        config = running.stub.ModelConfig(pb.ModelConfigRequest(name=self.model), timeout=30).config
        kinds = model_config_pb2.ModelInstanceGroup.Kind
        self.instances = ", ".join(f"{g.count} x {kinds.Name(g.kind)}" for g in config.instance_group) or "default"
        return self

    def explain(self, message: str) -> str:
        return message

    def stop(self) -> None:
        self._stack.close()

    def __exit__(self, *exc) -> None:
        self.stop()


def probe_behind_stalled_calls(address: str, stalled: int = 4, timeout: float = 3.0) -> float | None:
    """Seconds a ServerReady call takes while `stalled` ModelInfer calls have sent their headers and never their
    message (what service/process/handler_threads.py guards against); None when it did not answer within `timeout`."""
    import threading

    release = threading.Event()

    def never_sends():
        release.wait()
        return
        yield  # a generator that ends without sending a message

    with grpc.insecure_channel(address) as stall_channel, grpc.insecure_channel(address) as probe_channel:
        infer = stall_channel.stream_unary(
            "/inference.GRPCInferenceService/ModelInfer", request_serializer=None, response_deserializer=None
        )
        calls = [infer.future(never_sends(), timeout=timeout + 5) for _ in range(stalled)]
        time.sleep(0.5)  # let the calls reach the server and take what they take (headers only)
        stub = pb_grpc.GRPCInferenceServiceStub(probe_channel)
        started = time.perf_counter()
        try:
            stub.ServerReady(pb.ServerReadyRequest(), timeout=timeout)
            answered = time.perf_counter() - started
        except grpc.RpcError:
            answered = None
        release.set()
        for call in calls:
            call.cancel()
    return answered
