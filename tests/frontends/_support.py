"""Reaching each front end of a `--frontends N` server (issue 39) on purpose, and watching its processes.

The kernel spreads a port's connections over the front ends (SO_REUSEPORT hashes each connection's addresses),
and every call on one connection reaches the one front end that accepted it. So a test that must call through
a given front end opens connections until one lands there: `FrontEnds.channel(index)`. Which front end took a
connection is read from the processes themselves: the connection shows up among the established sockets on the
server's port that the front end's process holds (/proc/<pid>/fd against /proc/net/tcp), one more than before
it was opened. Each channel has a subchannel pool of its own (`grpc.use_local_subchannel_pool`), since channels
to one address with the same arguments otherwise share one connection.

With one front end (N = 1: the server is this process) every channel is a channel to "front end 0".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engine.interface import CancelToken, Context, LoadedModel
from engine.testing.fixture import FixtureBackend, FixtureControls
from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from tests.shutdown.harness import WAIT

ESTABLISHED = "01"  # /proc/net/tcp's state column
TRIES = 64  # connections opened at most to find one front end: the chance of missing one of two is 2**-64


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for entry in os.scandir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(entry.path)
        except (FileNotFoundError, PermissionError):  # closed since the listing
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    return inodes


def _established_on_port(port: int) -> set[str]:
    """The inodes of the established TCP sockets whose local port is `port` (the server's side of connections)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == ESTABLISHED:
                inodes.add(fields[9])
    return inodes


def connections(pid: int, port: int) -> int:
    """How many accepted connections on `port` the process `pid` holds now."""
    return len(_socket_inodes(pid) & _established_on_port(port))


def exists(pid: int) -> bool:
    """The process is still there: running, or a zombie nobody reaped (a leak too)."""
    return Path(f"/proc/{pid}").exists()


def children(pid: int) -> list[int]:
    """The child processes of `pid` now (every thread's children)."""
    found: list[int] = []
    for task in os.scandir(f"/proc/{pid}/task"):
        try:
            found += [int(child) for child in Path(task.path, "children").read_text().split()]
        except FileNotFoundError:  # the thread ended since the listing
            continue
    return found


def live_call(channel: grpc.Channel, metadata: Sequence[tuple[str, str]] = ()) -> bool:
    """ServerLive on `channel` (waiting for its connection); True when the server says live."""
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    return stub.ServerLive(pb.ServerLiveRequest(), timeout=WAIT, wait_for_ready=True, metadata=metadata).live


def health(channel: grpc.Channel, service: str = "") -> int:
    """grpc.health.v1 Check's status on `channel`."""
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=WAIT).status


def ready(channel: grpc.Channel, metadata: Sequence[tuple[str, str]] = ()) -> bool:
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    return stub.ServerReady(pb.ServerReadyRequest(), timeout=WAIT, metadata=metadata).ready


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class FrontEnds:
    """Channels to chosen front ends of one server. `pids()` gives the front ends' process ids in index order
    (empty for one front end); `open_channel(address, options)` makes a channel (plaintext by default; TLS
    tests pass their own); `metadata` goes with the ServerLive that connects each channel (a token). Every
    channel opened is closed by `close()`."""

    def __init__(
        self,
        address: str,
        pids: Callable[[], list[int]],
        *,
        open_channel: Callable[[str, list[tuple[str, object]]], grpc.Channel] | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.address = address
        self.port = int(address.rsplit(":", 1)[1])
        self._pids = pids
        self._metadata = tuple(metadata)
        self._open = open_channel or (lambda target, options: grpc.insecure_channel(target, options=options))
        self.opened: list[grpc.Channel] = []
        self.landed: dict[int, list[grpc.Channel]] = {}  # front end index -> channels found connected to it

    def pids(self) -> list[int]:
        return list(self._pids())

    def count(self) -> int:
        return max(1, len(self.pids()))

    def new_channel(self) -> grpc.Channel:
        """A channel with a connection of its own, connected (ServerLive answered through it)."""
        options: list[tuple[str, object]] = [
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
        ]
        channel = self._open(self.address, options)
        self.opened.append(channel)
        assert live_call(channel, self._metadata)
        return channel

    def _landing(self, pids: list[int]) -> tuple[grpc.Channel, int | None]:
        """Open one channel; the index of the front end whose connection count it raised, None when unclear."""
        before = [connections(pid, self.port) for pid in pids]
        channel = self.new_channel()
        after = [connections(pid, self.port) for pid in pids]
        grown = [index for index, (was, now) in enumerate(zip(before, after, strict=True)) if now > was]
        return channel, grown[0] if len(grown) == 1 and sum(after) - sum(before) == 1 else None

    def channel(self, index: int) -> grpc.Channel:
        """A connected channel whose calls all go to front end `index` (a new one each call unless one found
        earlier is free to share: the same channel is returned again). Fails after TRIES connections."""
        if self.landed.get(index):
            return self.landed[index][0]
        pids = self.pids()
        if not pids:  # one front end: the server itself
            assert index == 0, f"front end {index} of a server with one"
            self.landed[0] = [self.new_channel()]
            return self.landed[0][0]
        for _ in range(TRIES):
            channel, landed = self._landing(pids)
            if landed is not None:
                self.landed.setdefault(landed, []).append(channel)
                if landed == index:
                    return channel
        raise AssertionError(f"{TRIES} connections and none reached front end {index} (pids {pids})")

    def every(self) -> list[grpc.Channel]:
        """One connected channel per front end, in index order."""
        return [self.channel(index) for index in range(self.count())]

    def close(self) -> None:
        for channel in self.opened:
            channel.close()


def stub(channel: grpc.Channel) -> pb_grpc.GRPCInferenceServiceStub:
    return pb_grpc.GRPCInferenceServiceStub(channel)


# ---- grants in order: a fixture backend that logs each run's first input value ---------------------------------


class OrderedFixture(FixtureBackend):
    """The fixture backend (the test's FixtureControls: gates work as usual) that appends each run's first input
    value to `runs[model]` as the run starts, before its gates. On a model with one slot that is the order in
    which admission granted the slot: the next grant waits for this run's release."""

    def __init__(self, controls: FixtureControls) -> None:
        super().__init__(controls)
        self.runs: dict[str, list[float]] = {}

    def load(self, spec) -> LoadedModel:
        model = super().load(spec)
        runs = self.runs.setdefault(spec.name, [])
        create_context = model.create_context

        def logged_context() -> Context:
            context = create_context()
            execute = context.execute

            def logged_execute(inputs, outputs, cancel: CancelToken):
                runs.append(float(np.asarray(next(iter(inputs.values()))).flat[0]))
                return execute(inputs, outputs, cancel)

            context.execute = logged_execute  # type: ignore[method-assign]  # observation only
            return context

        model.create_context = logged_context  # type: ignore[method-assign]  # observation only
        return model
