"""Per-model inference statistics, as the protocol's ModelStatistics reports them.

Durations are nanoseconds. queue = admission wait plus waiting for the model to load; compute_input = checking
and preparing inputs; compute_infer = the engine run; compute_output = building the response. success and fail
count whole requests with their total duration. inference_count adds the batch size of each request;
execution_count counts engine runs (one per request: slotserve does not merge requests into batches).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Duration:
    count: int = 0
    ns: int = 0


@dataclass(frozen=True)
class StatisticsSnapshot:
    success: Duration
    fail: Duration
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration
    inference_count: int
    execution_count: int
    last_inference_ms: int  # epoch milliseconds; 0 before the first request


class InferenceStatistics:
    """Thread-safe counters. Recording takes one short lock of its own (never the model lock)."""

    __slots__ = ("_lock", "_counts", "_inference_count", "_execution_count", "_last_inference_ms")

    _FIELDS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards: every counter below
        self._counts = {name: [0, 0] for name in self._FIELDS}
        self._inference_count = 0
        self._execution_count = 0
        self._last_inference_ms = 0

    def record_success(self, *, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int, total_ns: int,
                       batch_size: int) -> None:
        now_ms = time.time_ns() // 1_000_000
        counts = self._counts
        with self._lock:
            for name, ns in (("success", total_ns), ("queue", queue_ns), ("compute_input", input_ns),
                             ("compute_infer", infer_ns), ("compute_output", output_ns)):
                entry = counts[name]
                entry[0] += 1
                entry[1] += ns
            self._inference_count += batch_size
            self._execution_count += 1
            self._last_inference_ms = now_ms

    def record_failure(self, total_ns: int) -> None:
        with self._lock:
            entry = self._counts["fail"]
            entry[0] += 1
            entry[1] += total_ns

    def snapshot(self) -> StatisticsSnapshot:
        with self._lock:
            durations = {name: Duration(count, ns) for name, (count, ns) in self._counts.items()}
            return StatisticsSnapshot(
                inference_count=self._inference_count,
                execution_count=self._execution_count,
                last_inference_ms=self._last_inference_ms,
                **durations,
            )
