"""The request path's two neutral records: what a model's path runs (`ModelRequest`) and what a run gives back
(`RunResult`, and a streaming run's `StreamEnd`).

The dataplane (service/request_path/dataplane.py) makes a `ModelRequest` from a decoded request and hands it to the
model's path (service/core/paths.py: direct, batched or sequenced, chosen when the model's configuration is committed);
every path yields the same records, which the dataplane encodes and counts. Nothing here blocks or takes a lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.interface import ModelMetadata, Outputs

from .errors import InvalidRequest
from .tracing import RequestTrace


def _nothing_to_check() -> None:
    return None


@dataclass
class ModelRequest:
    """One inference request as a model's path runs it: its decoded tensors and what the call allows.

    `before_run` is called just before the request runs (after its wait for a slot): raising refuses it alone (its
    shared-memory regions were unregistered meanwhile). `next_deadline` gives the admission deadline of a request
    its model rescheduled (an iterative sequence), computed when it queues again; None: the first one again."""

    inputs: Mapping[str, np.ndarray]
    signature: Mapping[str, tuple[str, tuple[int, ...]]]  # name -> (datatype, shape), for ModelMetadata.check_request
    outputs: Sequence[str]  # requested output names; empty = all
    # sequence_id, sequence_start, sequence_end as sent: name -> (parameter kind, value) (core/sequences.py)
    sequence_parameters: Mapping[str, tuple[str, object]] = field(default_factory=dict)
    before_run: Callable[[], None] = _nothing_to_check
    stream: bool = False  # on a stream: a decoupled (streaming) model may answer it several times
    # A streaming run ends with a StreamEnd (its error, or its end) yielded while its slot is still held, instead of
    # raising its error: the transport makes what ends the request then (a stream's `respond_end`).
    ends_in_band: bool = False
    next_deadline: Callable[[], float | None] | None = None
    arrived_ns: int = field(default_factory=time.perf_counter_ns)  # when the call began: its queue time's start
    trace: RequestTrace | None = None  # sampled for tracing (service/core/tracing.py); None: every hook skips
    # Its `priority` and `timeout` parameters: on a batching model with priority levels or DELAY, the admission core
    # picks its level and applies that level's queue policy (service/core/admission.py, Priorities).
    priority: int = 0
    timeout_us: int = 0

    @staticmethod
    def priority_of(parameters: Mapping[str, object]) -> int:
        """A request's `priority` parameter (0 when absent), checked as Triton checks it. Raises InvalidRequest
        for a negative value or one that is not an integer."""
        value = parameters.get("priority", 0)
        if type(value) is not int:  # (a bool is an int to Python, not to the protocol)
            raise InvalidRequest("invalid value type for 'priority' parameter, expected int64_param or uint64_param.")
        if value < 0:
            raise InvalidRequest("invalid value for 'priority', expected value >= 0.")
        return value

    def rows(self) -> int:
        """The first input's first dimension (1 for scalars): the rows the request brings to a batch."""
        for _, shape in self.signature.values():  # (a loop, not next() over a generator: one call less a request)
            if shape:
                return shape[0]
        return 1

    def batch_size(self, metadata: ModelMetadata) -> int:
        """The batch size the statistics count: its rows for a model that batches, else 1."""
        return self.rows() if metadata.max_batch_size > 0 else 1


@dataclass
class RunResult:
    """One answer of a run, for its response and its statistics (a response cache hit is one too: no slot, no
    time)."""

    metadata: ModelMetadata  # the outputs' declared order and datatypes
    version: str
    outputs: Outputs
    queue_ns: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    rows: int = 1  # the request's batch size
    batched: bool = False  # it ran in a batch, whose run is counted once by the batch
    final: bool = True  # the request's last answer (a streaming model's: sent with its final flag)
    # A streaming model's answer: the request is counted once, after its last answer (not with this one).
    streamed: bool = False
    finished_ns: int = field(default_factory=time.perf_counter_ns)  # when the run ended: the output time's start


@dataclass
class StreamEnd:
    """How a streaming model's run ended, yielded after its last answer while its slot is still held: `error` (only
    for a request with `ends_in_band`; otherwise the run raises it; None: it ended well), whether its last answer
    carried the final flag, and the run as the statistics count it (`totals`: its outputs empty). A sequence model's
    streaming run yields none: its last answer is counted."""

    error: BaseException | None
    final: bool
    totals: RunResult


# What a path's `run` yields (service/core/paths.py): its answers, then a streaming run's StreamEnd.
RunResults = Generator[RunResult | StreamEnd, None, None]

__all__ = ["ModelRequest", "RunResult", "RunResults", "StreamEnd"]
