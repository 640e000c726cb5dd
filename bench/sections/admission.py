"""In-process micro-benchmark of service.core.admission.AdmissionController (no server, no gRPC)."""

from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np

from ..common import log
from ..table import Table, fmt, median, met_if


def section_admission(args, table: Table, raw: dict) -> None:
    sys.path.insert(0, str(args.slotserve_root))
    from service.core.admission import AdmissionController, TicketKind

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
    result["handoff_admission_us"] = {
        "p50": median(handoff_admission),
        "p99": float(np.percentile(handoff_admission, 99)) if handoff_admission else float("nan"),
        "n": len(handoff_admission),
    }
    result["handoff_lock_us"] = {
        "p50": median(handoff_lock),
        "p99": float(np.percentile(handoff_lock, 99)) if handoff_lock else float("nan"),
        "n": len(handoff_lock),
    }
    raw["admission"] = result
    log(f"admission: {json.dumps(result)}")
    table.add(
        "admission",
        "acquire+release, uncontended (us per pair)",
        fmt(uncontended, 2),
        "<= 20 us",
        met_if(uncontended, lambda v: v <= 20),
        us=uncontended,
    )
    table.add(
        "admission",
        "acquire+release, 4 threads on 1 slot (us per pair, wall)",
        fmt(median(result["contended_1slot_us"]), 1),
        us=median(result["contended_1slot_us"]),
    )
    table.add(
        "admission",
        "acquire+release, 4 threads on 4 slots (us per pair, wall)",
        fmt(median(result["contended_4slots_us"]), 2),
        us=median(result["contended_4slots_us"]),
    )
    a, b = result["handoff_admission_us"], result["handoff_lock_us"]
    table.add(
        "admission",
        "hand-off release -> waiter running, p50 / p99 us",
        f"{fmt(a['p50'], 1)} / {fmt(a['p99'], 1)} (bare threading.Lock: {fmt(b['p50'], 1)} / {fmt(b['p99'], 1)})",
        p50=a["p50"],
        p99=a["p99"],
    )
