"""A server in a process of its own, for tests that measure its peak memory (test_bytes_memory_peak.py).

    python -m tests.integration._memory_peak_server REPOSITORY

Serves REPOSITORY on a free port (service.testing.serve) and prints `{"port": N}`; then answers each line read
from stdin with one JSON line: "reset" first resets the peak resident size (VmHWM) of this process and of its
children (python models' workers) to their current size (/proc/PID/clear_refs), "read" just reads. The answer:
`rss` and `hwm` (this process), `workers_rss` and `workers_hwm` (its children together), and the tensor memory
account's `peak` and `in_flight` (service/transport/tensor_memory.py). End of input stops the server.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _children() -> list[str]:
    found: list[str] = []
    for task in Path("/proc/self/task").iterdir():
        try:
            found += (task / "children").read_text().split()
        except OSError:
            continue
    return found


def _sizes(pid: str) -> tuple[int, int]:
    """(VmRSS, VmHWM) of `pid` in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def _reset_peaks() -> None:
    for pid in ("self", *_children()):
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        except OSError:
            continue  # a worker that ended meanwhile


def _report(running) -> dict:
    rss, hwm = _sizes("self")
    workers_rss = workers_hwm = 0
    for pid in _children():
        try:
            child_rss, child_hwm = _sizes(pid)
        except (OSError, KeyError):
            continue
        workers_rss += child_rss
        workers_hwm += child_hwm
    account = running.server.dataplane.tensor_memory.statistics()
    return {
        "rss": rss,
        "hwm": hwm,
        "workers_rss": workers_rss,
        "workers_hwm": workers_hwm,
        "peak": account.peak_bytes,
        "in_flight": account.in_flight_bytes,
    }


def main() -> None:
    from service.testing import serve

    with serve(Path(sys.argv[1])) as running:
        print(json.dumps({"port": running.port}), flush=True)
        for line in sys.stdin:
            if line.strip() == "reset":
                _reset_peaks()
            print(json.dumps(_report(running)), flush=True)


if __name__ == "__main__":
    main()
