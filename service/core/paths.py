"""A model's request path: how its requests are admitted and run, chosen once, when its configuration is committed
(ModelEntry's `path`, replaced with the configuration), never per request.

Every path has one door, `run(request, deadline, cancel)`: it takes a `ModelRequest` (service/core/requests.py)
and yields `RunResult`s, one per answer, and for a streaming run its `StreamEnd` while the slot is still held. The
dataplane (service/request_path/dataplane.py) encodes and counts them the same way whatever the path:

* `DirectPath`: a slot of the model's own (`ModelEntry.acquire_lease`), the run alone on it; a streaming
  (decoupled) model's answers on a stream, the slot held until the last is taken.
* `BatchedPath` (dynamic_batching): the request queues as a `BatchItem`; its batch's leader runs it with the others
  (service/core/batching.py); a decoupled model's member reads its own stream of answers.
* `SequencedPath` (sequence_batching): its turn in its sequence, then a lease on its sequence's slot or its batch
  (service/core/sequence_path.py).

Ensembles take the direct path (their engine runs the steps, each through its own model's path); the response
cache is looked up before a path is asked (a hit needs none) and fed with what it answered.

A path knows its model only through `ServedModel` (what ModelEntry offers a request), so this module does not
import the lifecycle: the lifecycle imports it. Errors: the admission's, the load's and the run's, as
`ModelEntry.acquire_lease` and `run_batched` say; every path gives back whatever it holds when it raises or is
closed early (the caller closes the generator).
"""

from __future__ import annotations

import time
from typing import Protocol

from engine.config.specs import ModelSpec
from engine.errors import ModelErrorUnsupported
from engine.interface import CancelToken, FinalOutputs, ModelMetadata

from .batching import BatchItem, MemberStream
from .lease import Lease
from .requests import ModelRequest, RunResult, RunResults, StreamEnd
from .sequence_path import DECOUPLED_UNARY, ServedModel, sequence_answers, traced_batch, traced_lease


class RequestPath(Protocol):
    """One model's way of running a request."""

    def run(self, request: ModelRequest, deadline: float | None, cancel: CancelToken) -> RunResults:
        """Admit `request` (queued until `deadline`), run it and yield its answers; see the module docstring."""
        ...


def path_for(model: ServedModel, spec: ModelSpec) -> RequestPath:
    """The path of `model`'s requests under the configuration `spec` (called as it is committed)."""
    if spec.sequence is not None:
        return SequencedPath(model)
    if spec.batching is not None:
        return BatchedPath(model)
    return DirectPath(model)


class DirectPath:
    """A request alone on a slot of its model."""

    __slots__ = ("_model",)

    def __init__(self, model: ServedModel) -> None:
        self._model = model

    def run(self, request: ModelRequest, deadline: float | None, cancel: CancelToken) -> RunResults:
        if request.trace is None:
            lease = self._model.acquire_lease(deadline, cancel)
        else:
            lease = traced_lease(self._model, request.trace, deadline, cancel)
        if request.stream and lease.streaming:
            yield from _streamed(lease, request, cancel)
            return
        yield _run_alone(lease, request, cancel)


def _run_alone(lease: Lease, request: ModelRequest, cancel: CancelToken) -> RunResult:
    """Run a request alone on its leased slot, and free the slot."""
    try:
        request.before_run()  # a region unregistered while the request waited is refused, not used
        pool = lease.pool  # (read once: the lease's metadata, version and streaming are its pool's)
        if pool.primary.streaming:
            raise ModelErrorUnsupported(DECOUPLED_UNARY)
        metadata = pool.metadata
        checked = time.perf_counter_ns()
        metadata.check_request(request.signature, request.outputs)
        ran = time.perf_counter_ns()
        outputs = lease.execute(request.inputs, request.outputs, cancel)
        executed = time.perf_counter_ns()
    finally:
        lease.release()
    if request.trace is not None:
        request.trace.computed(checked, ran, executed, time.perf_counter_ns(), backend=pool.spec.backend)
    rows = request.rows() if metadata.max_batch_size > 0 else 1  # (request.batch_size, inline)
    return RunResult(metadata, pool.spec.version, outputs, lease.queue_ns, ran - checked, executed - ran, rows)


def _streamed(lease: Lease, request: ModelRequest, cancel: CancelToken) -> RunResults:
    """A streaming model's answers, holding its slot until the last one is taken (or the generator is closed), then
    its StreamEnd, still holding it (with `request.ends_in_band`, its error too, instead of raising it)."""
    final = False
    with lease:
        metadata, version, queue_ns = lease.metadata, lease.version, lease.queue_ns
        rows = request.batch_size(metadata)
        totals = RunResult(metadata, version, {}, queue_ns, rows=rows, streamed=True)
        try:
            request.before_run()
            metadata.check_request(request.signature, request.outputs)
            began = time.perf_counter_ns()
            for outputs in lease.execute_stream(request.inputs, request.outputs, cancel):
                final = isinstance(outputs, FinalOutputs)
                yield RunResult(metadata, version, outputs, queue_ns, rows=rows, final=final, streamed=True)
            ended = time.perf_counter_ns()
            totals.infer_ns = ended - began
            if request.trace is not None:  # (its answers were encoded between: inside the execute span)
                request.trace.computed(began, began, ended, ended, backend=lease.pool.spec.backend, streamed=True)
        except Exception as error:
            if not request.ends_in_band:
                raise
            yield StreamEnd(error, final, totals)
            return
        yield StreamEnd(None, final, totals)


class BatchedPath:
    """A request of a batching model: queued as a BatchItem, run by its batch's leader (service/core/batching.py)."""

    __slots__ = ("_model",)

    def __init__(self, model: ServedModel) -> None:
        self._model = model

    def run(self, request: ModelRequest, deadline: float | None, cancel: CancelToken) -> RunResults:
        metadata = self._model.known_metadata()
        if metadata is not None:  # bad input is refused before it can join a batch
            metadata.check_request(request.signature, request.outputs)
        rows = request.rows()
        item = BatchItem(
            request.inputs,
            request.signature,
            request.outputs,
            rows,
            cancel,
            before_run=request.before_run,
            streams=request.stream,
            priority=request.priority,
            timeout_us=request.timeout_us,
        )
        try:
            if request.trace is None:
                self._model.run_batched(item, deadline, cancel)
            else:
                traced_batch(self._model, request.trace, item, deadline, cancel)
            if item.stream is not None and item.error is not None:  # it gave up as its batch started
                raise item.error
        except BaseException:
            answers = item.abandon()  # a decoupled model's answers nobody will read: its batch's slot must not wait
            if answers is not None:
                answers.close()
            raise
        posted = _posted_metadata(item)
        queue_ns = item.started_ns - request.arrived_ns
        if item.stream is not None:  # a decoupled model's member of a batch: its own answers
            yield from _member_answers(item.stream, request, RunResult(posted, item.version, {}, queue_ns, rows=rows))
            return
        outputs = item.outcome()
        yield RunResult(posted, item.version, outputs, queue_ns, item.input_ns, item.infer_ns, rows, batched=True)


def _posted_metadata(item: BatchItem) -> ModelMetadata:
    """The metadata the batch's leader posted with the item's outcome or stream."""
    if item.metadata is None:
        raise RuntimeError("the batch ended without posting its metadata to this request")
    return item.metadata


def _member_answers(answers: MemberStream, request: ModelRequest, totals: RunResult) -> RunResults:
    """A decoupled model's answers to one member of a batch (its stream: the batch's slot is held until every
    member's stream ended), then its StreamEnd, as `_streamed` does; counted as a request that ran in a batch."""
    totals.batched = totals.streamed = True
    metadata, version, queue_ns, rows = totals.metadata, totals.version, totals.queue_ns, totals.rows
    final = False
    try:
        try:
            began = time.perf_counter_ns()
            for outputs in answers:
                final = isinstance(outputs, FinalOutputs)
                yield RunResult(
                    metadata, version, outputs, queue_ns, rows=rows, batched=True, final=final, streamed=True
                )
            totals.infer_ns = time.perf_counter_ns() - began
        except Exception as error:
            if not request.ends_in_band:
                raise
            yield StreamEnd(error, final, totals)
            return
        yield StreamEnd(None, final, totals)
    finally:  # closed early (the client went away): the rest of its answers are dropped
        answers.close()


class SequencedPath:
    """A request of a sequence model: its turn in its sequence, then its run (service/core/sequence_path.py)."""

    __slots__ = ("_model",)

    def __init__(self, model: ServedModel) -> None:
        self._model = model

    def run(self, request: ModelRequest, deadline: float | None, cancel: CancelToken) -> RunResults:
        return sequence_answers(self._model, request, deadline, cancel)


__all__ = ["BatchedPath", "DirectPath", "RequestPath", "SequencedPath", "ServedModel", "path_for"]
