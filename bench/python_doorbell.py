"""The python worker's wake-up, measured (issue 39): what one request-and-answer costs between two processes for each
way of waking the other side, and the round trip of a real python model's call (engine/python/backend.py).

    .venv/bin/python -m bench.python_doorbell                 every doorbell, then the add_sub round trip
    .venv/bin/python -m bench.python_doorbell --doorbell      the doorbells only
    .venv/bin/python -m bench.python_doorbell --roundtrip     the add_sub round trip only
    .venv/bin/python -m bench.python_doorbell --floor         the least a round trip can cost in Python: add_sub's
                                                    work alone over a shared mapping and a pipe doorbell
    .venv/bin/python -m bench.python_doorbell --roundtrip --compare DIR
                                                    the round trip of this tree and of the tree at DIR (another
                                                    commit's, e.g. `git archive <commit> engine tests/python_models
                                                    bench | tar -x -C DIR`), one repeat of each in turn

Each doorbell is a ping-pong between this process and a child: one side rings, the other wakes, rings back, and the
first wakes. Each is run REPEATS times of TRIPS round trips, interleaved (one repeat of each in turn, so a load that
comes and goes touches each alike); printed: the median of the repeats' medians and their range, in microseconds.

    connection   today's pipe: multiprocessing Connection, a small pickled tuple each way (the floor the
                 round trip was measured against)
    pipe-byte    the same socketpair as a doorbell only: one byte written, one read (os.write / os.read), after
                 poll() as a waiting side with a timeout does
    eventfd      os.eventfd (write 1 / read), after poll()
    futex        a word of a shared mapping: FUTEX_WAKE through ctypes' syscall, FUTEX_WAIT (with a timeout) to sleep
    semaphore    a POSIX semaphore in shared memory (multiprocessing's SemLock: sem_post / sem_timedwait)
    spin+futex   the futex, after a spin of SPIN_US on the word before sleeping

The round trip: PythonBackend loads tests/python_models' add_sub and `context.execute` runs it CALLS times on INT32
[16] inputs (the server's side of a request without gRPC: the layout, the message, the worker's execute, the answer
read back), as docs/speed.md's "The worker round trip" measured it.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import mmap
import multiprocessing
import os
import pickle
import select
import socket
import statistics
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 7
TRIPS = 2000
CALLS = 3000
SPIN_US = 20.0

_SYS_FUTEX = 202  # x86_64
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
# syscall() is variadic and reads each argument as a long: ctypes' default int would leave a register's upper half
# undefined.
_SYSCALL_FUTEX, _WAIT, _WAKE = ctypes.c_long(_SYS_FUTEX), ctypes.c_long(_FUTEX_WAIT), ctypes.c_long(_FUTEX_WAKE)
_ONE, _ZERO = ctypes.c_long(1), ctypes.c_long(0)


class Futex:
    """A 32-bit word at `offset` of a shared mapping: `ring` adds one and wakes a sleeper, `wait_past(seen)` sleeps
    while the word is still `seen` (at most `timeout` seconds)."""

    def __init__(self, mapping: mmap.mmap, offset: int) -> None:
        self.word = ctypes.c_uint32.from_buffer(mapping, offset)
        self.address = ctypes.c_void_p(ctypes.addressof(self.word))
        self.timeout = _Timespec(0, 100_000_000)

    def ring(self) -> None:
        self.word.value = (self.word.value + 1) & 0xFFFFFFFF
        _syscall(_SYSCALL_FUTEX, self.address, _WAKE, _ONE, None, None, _ZERO)

    def wait_past(self, seen: int, spin_us: float = 0.0) -> int:
        if spin_us:
            end = time.perf_counter() + spin_us / 1e6
            while self.word.value == seen and time.perf_counter() < end:
                pass
        while self.word.value == seen:
            _syscall(_SYSCALL_FUTEX, self.address, _WAIT, ctypes.c_long(seen), ctypes.byref(self.timeout), None, _ZERO)
        return self.word.value


# ---- each doorbell: (parent side, child side), both given what `setup` made -------------------------------------


def _connection_pair():
    return multiprocessing.Pipe()


def _connection_parent(state, trips: int) -> list[int]:
    ours, _ = state
    times = []
    message: tuple[object, ...] = (4, 1, 0, [([("INPUT0", "INT32", (1, 16), 0, 64)], (), "", 0, 0, {})], {})
    for _ in range(trips):
        began = time.perf_counter_ns()
        ours.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
        ours.poll(0.1) or ours.poll(None)
        pickle.loads(ours.recv_bytes())
        times.append(time.perf_counter_ns() - began)
    return times


def _connection_child(state, trips: int) -> None:
    _, theirs = state
    answer = (5, 1, [(14, [("OUTPUT0", "INT32", (1, 16), 0, 64)])], 1000)
    for _ in range(trips):
        theirs.poll(0.1) or theirs.poll(None)
        pickle.loads(theirs.recv_bytes())
        theirs.send_bytes(pickle.dumps(answer, pickle.HIGHEST_PROTOCOL))


def _fd_pair_socket():
    a, b = socket.socketpair()
    return a.detach(), b.detach()


def _fd_parent(fd: int, peer: int, trips: int, ring: Callable[[int], None], take: Callable[[int], None]) -> list[int]:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    times = []
    for _ in range(trips):
        began = time.perf_counter_ns()
        ring(peer)
        while not poller.poll(100):
            pass
        take(fd)
        times.append(time.perf_counter_ns() - began)
    return times


def _fd_child(fd: int, peer: int, trips: int, ring: Callable[[int], None], take: Callable[[int], None]) -> None:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    for _ in range(trips):
        while not poller.poll(100):
            pass
        take(fd)
        ring(peer)


def _byte_ring(fd: int) -> None:
    os.write(fd, b"\x01")


def _byte_take(fd: int) -> None:
    os.read(fd, 1)


def _eventfd_ring(fd: int) -> None:
    os.eventfd_write(fd, 1)


def _eventfd_take(fd: int) -> None:
    os.eventfd_read(fd)


def _mapping() -> mmap.mmap:
    return mmap.mmap(-1, 4096, flags=mmap.MAP_SHARED)


def _futex_parent(mapping: mmap.mmap, trips: int, spin_us: float) -> list[int]:
    to_child, to_parent = Futex(mapping, 0), Futex(mapping, 64)
    times = []
    seen = 0  # both words start at 0 (a fresh mapping): read after the fork, the other side may have rung already
    for _ in range(trips):
        began = time.perf_counter_ns()
        to_child.ring()
        seen = to_parent.wait_past(seen, spin_us)
        times.append(time.perf_counter_ns() - began)
    return times


def _futex_child(mapping: mmap.mmap, trips: int, spin_us: float) -> None:
    to_child, to_parent = Futex(mapping, 0), Futex(mapping, 64)
    seen = 0
    for _ in range(trips):
        seen = to_child.wait_past(seen, spin_us)
        to_parent.ring()


def _semaphore_parent(pair, trips: int) -> list[int]:
    to_child, to_parent = pair
    times = []
    for _ in range(trips):
        began = time.perf_counter_ns()
        to_child.release()
        while not to_parent.acquire(timeout=0.1):
            pass
        times.append(time.perf_counter_ns() - began)
    return times


def _semaphore_child(pair, trips: int) -> None:
    to_child, to_parent = pair
    for _ in range(trips):
        while not to_child.acquire(timeout=0.1):
            pass
        to_parent.release()


def _run_forked(parent: Callable[[], list[int]], child: Callable[[], None]) -> list[int]:
    """Fork, run `child` in the child, `parent` here; the child's end is awaited."""
    pid = os.fork()
    if pid == 0:
        try:
            child()
        finally:
            os._exit(0)
    try:
        return parent()
    finally:
        os.waitpid(pid, 0)


def one_repeat(name: str, trips: int) -> list[int]:
    """The round trips (ns) of one repeat of doorbell `name`."""
    if name == "connection":
        state = _connection_pair()
        return _run_forked(lambda: _connection_parent(state, trips), lambda: _connection_child(state, trips))
    if name in ("pipe-byte", "eventfd"):
        if name == "pipe-byte":
            mine, theirs = _fd_pair_socket()
            parent_in, parent_out, child_in, child_out = mine, mine, theirs, theirs
            ring, take = _byte_ring, _byte_take
        else:
            parent_in, child_in = os.eventfd(0), os.eventfd(0)
            parent_out, child_out = child_in, parent_in
            ring, take = _eventfd_ring, _eventfd_take
        try:
            return _run_forked(
                lambda: _fd_parent(parent_in, parent_out, trips, ring, take),
                lambda: _fd_child(child_in, child_out, trips, ring, take),
            )
        finally:
            for fd in {parent_in, parent_out, child_in, child_out}:
                os.close(fd)
    if name in ("futex", "spin+futex"):
        mapping = _mapping()
        spin = SPIN_US if name == "spin+futex" else 0.0
        return _run_forked(lambda: _futex_parent(mapping, trips, spin), lambda: _futex_child(mapping, trips, spin))
    if name == "semaphore":
        context = multiprocessing.get_context("fork")
        pair = (context.Semaphore(0), context.Semaphore(0))
        return _run_forked(lambda: _semaphore_parent(pair, trips), lambda: _semaphore_child(pair, trips))
    raise ValueError(name)


DOORBELLS = ("connection", "pipe-byte", "eventfd", "futex", "semaphore", "spin+futex")


def _summary(medians: list[float]) -> str:
    return f"median {statistics.median(medians):6.1f} us (repeats {min(medians):.1f}-{max(medians):.1f})"


def doorbells(repeats: int, trips: int) -> dict[str, list[float]]:
    """Each doorbell's per-repeat median round trip (us), the repeats interleaved."""
    medians: dict[str, list[float]] = {name: [] for name in DOORBELLS}
    for _ in range(repeats):
        for name in DOORBELLS:
            medians[name].append(statistics.median(one_repeat(name, trips)) / 1000)
    return medians


def roundtrip(repeats: int, calls: int) -> list[float]:
    """The per-repeat median of `context.execute` of add_sub (us)."""
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from engine.config.repository import ModelRepository
    from engine.interface import CancelToken
    from engine.python.backend import PythonBackend

    spec = ModelRepository(ROOT / "tests" / "python_models" / "repository").read("add_sub")
    model = PythonBackend().load(spec)
    context = model.create_context()
    inputs = {"INPUT0": np.arange(16, dtype=np.int32), "INPUT1": np.ones(16, dtype=np.int32)}
    medians = []
    try:
        for _ in range(200):  # warm: the first calls import and allocate
            context.execute(inputs, [], CancelToken())
        for _ in range(repeats):
            times = []
            for _ in range(calls):
                began = time.perf_counter_ns()
                context.execute(inputs, [], CancelToken())
                times.append(time.perf_counter_ns() - began)
            medians.append(statistics.median(times) / 1000)
    finally:
        context.close()
        model.close()
    return medians


def _floor_parent(mapping: mmap.mmap, fd: int, trips: int) -> list[int]:
    import numpy as np

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    first, second = np.arange(16, dtype=np.int32), np.ones(16, dtype=np.int32)
    inputs = np.frombuffer(mapping, dtype=np.int32, count=32, offset=4096)
    outputs = np.frombuffer(mapping, dtype=np.int32, count=32, offset=8192)
    head = struct.Struct("<qHH")
    times = []
    for run in range(trips):
        began = time.perf_counter_ns()
        inputs[:16] = first
        inputs[16:] = second
        head.pack_into(mapping, 0, run, 0, 2)
        os.write(fd, b"\x01")
        while not poller.poll(100):
            pass
        os.read(fd, 1)
        head.unpack_from(mapping, 2048)
        answer = {"OUTPUT0": outputs[:16].copy(), "OUTPUT1": outputs[16:].copy()}
        del answer
        times.append(time.perf_counter_ns() - began)
    return times


def _floor_child(mapping: mmap.mmap, fd: int, trips: int) -> None:
    import numpy as np

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    inputs = np.frombuffer(mapping, dtype=np.int32, count=32, offset=4096)
    outputs = np.frombuffer(mapping, dtype=np.int32, count=32, offset=8192)
    head = struct.Struct("<qHH")
    for _ in range(trips):
        while not poller.poll(100):
            pass
        os.read(fd, 1)
        run, _, _ = head.unpack_from(mapping, 0)
        outputs[:16] = inputs[:16] + inputs[16:]
        outputs[16:] = inputs[:16] - inputs[16:]
        head.pack_into(mapping, 2048, run, 0, 2)
        os.write(fd, b"\x01")


def floor(repeats: int, trips: int) -> list[float]:
    """The per-repeat median (us) of add_sub's work alone between two processes: the inputs copied into a shared
    mapping, a small struct record, a byte on a socketpair each way, the sums and differences, the outputs copied
    out; none of the server's or the worker's bookkeeping."""
    medians = []
    for _ in range(repeats):
        mapping = mmap.mmap(-1, 16384, flags=mmap.MAP_SHARED)
        mine, theirs = _fd_pair_socket()
        try:
            times = _run_forked(
                functools.partial(_floor_parent, mapping, mine, trips),
                functools.partial(_floor_child, mapping, theirs, trips),
            )
        finally:
            os.close(mine)
            os.close(theirs)
        medians.append(statistics.median(times) / 1000)
    return medians


def compare(other: Path, repeats: int) -> dict[str, list[float]]:
    """The round trip of this tree and of the tree at `other`, each repeat a process of its own, in turn."""
    import subprocess

    medians: dict[str, list[float]] = {"this tree": [], str(other): []}
    for _ in range(repeats):
        for name, root in (("this tree", ROOT), (str(other), other)):
            shown = subprocess.run(
                [sys.executable, "-m", "bench.python_doorbell", "--roundtrip", "--repeats", "1", "--json"],
                cwd=root,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            medians[name].append(float(shown.strip().splitlines()[-1]))
    return medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--doorbell", action="store_true", help="the doorbells only")
    parser.add_argument("--roundtrip", action="store_true", help="the add_sub round trip only")
    parser.add_argument("--floor", action="store_true", help="add_sub's work alone over shared memory and a doorbell")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--trips", type=int, default=TRIPS)
    parser.add_argument("--compare", type=Path, help="another tree's round trip beside this one's, in turn")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the round trip's median alone
    args = parser.parse_args(argv)
    if args.json:
        print(statistics.median(roundtrip(args.repeats, CALLS)))
        return 0
    if args.compare is not None:
        for name, medians in compare(args.compare, args.repeats).items():
            print(f"add_sub round trip, {name:<20} {_summary(medians)}")
        return 0
    if args.floor:
        print(f"add_sub's work alone (floor)  {_summary(floor(args.repeats, args.trips))}")
        return 0
    both = not (args.doorbell or args.roundtrip)
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores")
    if args.doorbell or both:
        for name, medians in doorbells(args.repeats, args.trips).items():
            print(f"doorbell {name:<11} {_summary(medians)}")
    if args.roundtrip or both:
        print(f"add_sub round trip (context.execute)  {_summary(roundtrip(args.repeats, CALLS))}")
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
