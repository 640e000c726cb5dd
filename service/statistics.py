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

    _DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards: every counter below
        self._success_count = self._success_ns = 0
        self._fail_count = self._fail_ns = 0
        self._queue_ns = self._input_ns = self._infer_ns = self._output_ns = 0
        self._inference_count = 0
        self._last_inference_ms = 0

    def record_success(self, *, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int, total_ns: int,
                       batch_size: int) -> None:
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            self._success_count += 1
            self._success_ns += total_ns
            self._queue_ns += queue_ns
            self._input_ns += input_ns
            self._infer_ns += infer_ns
            self._output_ns += output_ns
            self._inference_count += batch_size
            self._last_inference_ms = now_ms

    def record_failure(self, total_ns: int) -> None:
        with self._lock:
            self._fail_count += 1
            self._fail_ns += total_ns

    def snapshot(self) -> StatisticsSnapshot:
        with self._lock:
            done = self._success_count  # every successful request was queued, prepared, run and encoded once
            return StatisticsSnapshot(
                success=Duration(done, self._success_ns),
                fail=Duration(self._fail_count, self._fail_ns),
                queue=Duration(done, self._queue_ns),
                compute_input=Duration(done, self._input_ns),
                compute_infer=Duration(done, self._infer_ns),
                compute_output=Duration(done, self._output_ns),
                inference_count=self._inference_count,
                execution_count=done,
                last_inference_ms=self._last_inference_ms,
            )
