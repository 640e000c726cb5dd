"""Dynamic batching: what one request brings to a batch, and how its leader stacks, runs and splits it.

Which queued requests form a batch is a rule of the admission core (service/core/admission.py: the oldest requests
that stack, up to max_batch_size rows, never past one that does not fit or a queued manager). This module runs a
batch once it is granted. The thread of its first request (the leader) holds the batch's slot and calls
`run_batch`; every other member's thread sleeps until the leader has posted its outcome in its `BatchItem`.

* Each request keeps its own contract: its own admission deadline and cancellation (a member that gives up
  leaves, the others get their results; a batch whose every member gave up is terminated as a single run is),
  its own requested outputs and its own rows of them (views of the batch's outputs: encoding a response copies
  them once), its own statistics.
* An engine error fails every member with the same status (each gets its own exception object).
* A batch of one runs on the request's own arrays: no stacking copy, no split.
* A streaming (decoupled) model's batch, on a backend that takes batches as requests (python), is one engine call
  whose answers come per member: each member gets a stream of its own (`BatchItem.stream`, read on its own thread,
  its own final flag and errors), and the slot is held until the last member's stream ended. A member that is not on
  a stream (ModelInfer) is refused as Triton refuses it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np

from engine.config.specs import BatchingSpec, ModelSpec
from engine.errors import DeviceFailedError, EngineError, ExecutionCancelled, ModelErrorUnsupported
from engine.interface import CancelToken, Context, ModelMetadata, Outputs

from .admission import BatchRule, Ticket
from .blocking import blocking_wait
from .errors import InvalidRequest, RequestCancelled, ServiceError, own_copy
from .lease import Lease, LeaseOwner
from .pool import SlotPool
from .request_errors import as_request_error
from .statistics import InferenceStatistics


def batch_rule(spec: BatchingSpec | None, max_batch_size: int) -> BatchRule | None:
    """The admission core's rule for a model's batching settings (None: no batching)."""
    if spec is None or max_batch_size <= 0:
        return None
    return BatchRule(
        max_rows=max_batch_size,
        delay=spec.max_queue_delay_us / 1e6,
        preferred=frozenset(spec.preferred_batch_sizes),
        priorities=spec.priorities,
    )


def describe_batching(spec: ModelSpec) -> str:
    """A model's batching settings in a few words, for its `loaded` event ("" without batching)."""
    batching = spec.batching
    if batching is None:
        return ""
    words = [f"up to {spec.max_batch_size} rows", f"delay {batching.max_queue_delay_us} us"]
    if batching.preferred_batch_sizes:
        words.append("preferred " + "/".join(str(size) for size in batching.preferred_batch_sizes))
    return ", ".join(words)


def batch_key(signature: Mapping[str, tuple[str, tuple[int, ...]]], outputs: Sequence[str]) -> Hashable:
    """What requests must share to be stacked: every input's datatype and shape after the batch dimension, and
    the requested outputs (in any order)."""
    return (
        tuple(sorted((name, datatype, shape[1:]) for name, (datatype, shape) in signature.items())),
        tuple(sorted(outputs)),
    )


@dataclass(eq=False)
class BatchItem:
    """One request's part in a batch. Its own thread fills the first fields before admission; the leader fills
    the rest before it releases the batch, and the request's thread reads them after (the release, under the
    model's lock, orders the two)."""

    inputs: Mapping[str, np.ndarray]
    signature: Mapping[str, tuple[str, tuple[int, ...]]]
    outputs: Sequence[str]  # requested output names; empty: all
    rows: int
    cancel: CancelToken
    # Called just before the batch runs; raising refuses this request alone (its shared-memory regions may have
    # been unregistered while it waited).
    before_run: Callable[[], None] | None = None
    # Outputs the server keeps (a sequence's implicit state, service/core/sequences.py): asked of the engine
    # besides `outputs` (or all the declared ones), not checked against the metadata, split like the others.
    kept_outputs: Sequence[str] = ()
    streams: bool = False  # the request takes a stream of answers (ModelStreamInfer): a decoupled model may batch it
    priority: int = 0  # its `priority` and `timeout` parameters, for a model with priority levels (admission.py)
    timeout_us: int = 0
    result: Outputs | None = None
    stream: MemberStream | None = None  # a decoupled model's answers to it, posted instead of `result`
    error: BaseException | None = None
    metadata: ModelMetadata | None = None
    version: str = ""
    started_ns: int = 0  # perf_counter_ns when its batch began to run: the end of its queueing
    input_ns: int = 0
    infer_ns: int = 0
    batch_rows: int = 0  # rows of the batch it ran in
    batch_members: int = 0  # requests in the batch it ran in (its trace's "batch formed" event says so)
    key: Hashable = field(init=False)
    _abandoned: bool = field(default=False, init=False)  # its thread left: a stream posted later is closed
    _stream_lock: threading.Lock = field(default_factory=threading.Lock, init=False)  # guards: stream, _abandoned

    def __post_init__(self) -> None:
        self.key = batch_key(self.signature, self.outputs)

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None or self.stream is not None

    def outcome(self) -> Outputs:
        """The request's rows of the batch's outputs; raises the error its batch (or its own input) ended in."""
        if self.error is not None:
            raise self.error
        if self.result is None:
            raise RuntimeError("the batch ended without an outcome for this request")
        return self.result

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.error = own_copy(error)

    def post_stream(self, stream: MemberStream) -> bool:
        """The leader hands the request its stream of answers; False (the caller closes it) when the request's
        thread has left already."""
        with self._stream_lock:
            if self._abandoned:
                return False
            self.stream = stream
            return True

    def abandon(self) -> MemberStream | None:
        """The request's thread leaves without reading its answers (it gave up): returns the stream posted to it,
        if any, for the caller to close; one posted later is closed by the leader."""
        with self._stream_lock:
            self._abandoned = True
            return self.stream


class EveryoneGaveUp(CancelToken):
    """The cancel token of a batch's run: cancelled once every member's own token is, so that a run nobody awaits
    any more is terminated, and a run some member still awaits is not."""

    def __init__(self, tokens: Sequence[CancelToken]) -> None:
        super().__init__()
        self._count_lock = threading.Lock()  # guards: _gone
        self._gone: set[int] = set()  # indexes of the members' tokens that fired (a token may fire a callback twice)
        self._tokens = list(tokens)
        self._watchers = [self._watcher(index) for index in range(len(self._tokens))]
        for token, watcher in zip(self._tokens, self._watchers, strict=True):
            token.add_callback(watcher)

    def _watcher(self, index: int) -> Callable[[], None]:
        def gone() -> None:
            with self._count_lock:
                self._gone.add(index)
                everyone = len(self._gone) == len(self._tokens)
            if everyone:
                self.cancel(self._tokens[index].reason)

        return gone

    def detach(self) -> None:
        """Stop watching the members' tokens (the run is over)."""
        for token, watcher in zip(self._tokens, self._watchers, strict=True):
            token.remove_callback(watcher)


class BatchingModel(LeaseOwner, Protocol):
    """What `run_batched` needs of its model (service/core/lifecycle.py ModelEntry)."""

    @property
    def statistics(self) -> InferenceStatistics: ...

    def admit_batch_item(self, item: BatchItem, deadline: float | None, cancel: CancelToken) -> Ticket[BatchItem]: ...

    def lend_context(self, cancel: CancelToken | None) -> tuple[SlotPool, Context]: ...


def run_batched(model: BatchingModel, item: BatchItem, deadline: float | None, cancel: CancelToken) -> BatchItem:
    """Admit a request of a batching model and see it run, alone or in a batch. Returns `item` with its outcome
    posted (`item.outcome()` gives the outputs or raises the error).

    Blocks while queued (bounded by `deadline`), then: the leader of a batch (its first request) makes sure the pool
    exists, takes the rate limiter's resources (waiting until its own `deadline`: ResourcesBusy fails every member),
    runs the batch and releases its slot; any other member waits, without a time limit, for the leader.
    Raises the admission errors (ServerBusy subclasses, RequestCancelled when the caller gives up while queued or
    while its batch runs); on every error the caller holds nothing.
    """
    ticket = model.admit_batch_item(item, deadline, cancel)
    if ticket.is_member:
        return item  # released by its leader: the outcome is posted
    # (No members: the model's batching was reconfigured away while this request arrived; it runs alone.)
    # Every ticket of a batch was acquired here, with its BatchItem as the payload.
    items = [member.payload for member in ticket.members or [ticket]]
    # A batch of one is cancelled with its request (the common case when idle: no extra token).
    run_cancel = cancel if len(items) == 1 else EveryoneGaveUp([member.cancel for member in items])
    try:
        try:
            pool, context = model.lend_context(run_cancel)
        except BaseException as error:
            for member in items:  # failed before the ticket ends: a woken member finds its outcome posted
                member.fail(as_request_error(model.name, error))
            model.end_lease(ticket)
            raise
        lease = Lease(model, ticket, pool, context, 0)  # its release ends every member's lease
        try:  # the rate limiter's resources, until the leader's deadline; the slot stays busy meanwhile
            lease.take_resources(deadline, run_cancel)
        except BaseException as error:
            for member in items:  # posted before the release wakes them
                member.fail(as_request_error(model.name, error))
            lease.release()
            raise
        handed_over = False
        try:
            handed_over = run_batch(lease, items, run_cancel, model.statistics)
            if handed_over:  # each member reads its own stream now; the last one to end releases the lease
                model.admission.post_to_members(ticket)
        finally:
            if not handed_over:  # (a streaming batch's members' streams release it when the last one ends)
                lease.release()
    finally:
        if run_cancel is not cancel:
            assert isinstance(run_cancel, EveryoneGaveUp)  # made above for a batch of several
            run_cancel.detach()
    if cancel.cancelled and item.error is None:
        item.error = RequestCancelled("the caller gave up while its batch ran")
    return item


def run_batch(
    lease: Lease, items: Sequence[BatchItem], run_cancel: CancelToken, statistics: InferenceStatistics
) -> bool:
    """Run `items` (a granted batch, leader first) on `lease`'s slot and post every item's outcome. Never raises
    for a member's sake: every item ends with a result, a stream or an error. Blocks for the run; a streaming
    model's batch only until its call started. Returns True when the lease went to the members' streams (the last
    one to end releases it); False when the caller releases it now."""
    metadata = lease.metadata
    started = time.perf_counter_ns()
    live: list[BatchItem] = []
    as_requests = getattr(lease.pool.primary, "batches_as_requests", False)
    for item in items:
        item.started_ns, item.metadata, item.version = started, metadata, lease.version
        if lease.streaming and not as_requests:
            item.fail(
                InvalidRequest(
                    f"model '{lease.entry.name}' streams its responses, which dynamic batching "
                    "does not support: remove dynamic_batching from its configuration"
                )
            )
        elif lease.streaming and not item.streams:  # Triton's code and words for a decoupled model's ModelInfer
            item.fail(ModelErrorUnsupported("ModelInfer RPC doesn't support models with decoupled transaction policy"))
        elif not item.cancel.cancelled:
            _checked(item, metadata, live)
    if not live:
        for item in items:
            item.fail(ExecutionCancelled("every request of the batch gave up before it ran"))
        return False
    if lease.streaming:
        return _run_as_streams(lease, live, statistics, started)
    if as_requests:
        _run_as_requests(lease, live, run_cancel, statistics, started)
        return False
    inputs = stack(live)
    stacked = time.perf_counter_ns()
    rows = sum(item.rows for item in live)
    try:
        outputs = lease.execute(inputs, _engine_outputs(live[0], metadata), run_cancel)
    except (EngineError, ExecutionCancelled) as error:
        for item in live:
            item.fail(error)
        return False
    except BaseException as error:  # a backend bug: the same status for every member, and the log has it
        for item in live:
            item.fail(error)
        raise
    executed = time.perf_counter_ns()
    split(outputs, live)
    for item in live:
        item.input_ns, item.infer_ns, item.batch_rows = stacked - started, executed - stacked, rows
        item.batch_members = len(live)
    statistics.record_execution(
        batch_size=rows,
        input_ns=stacked - started,
        infer_ns=executed - stacked,
        output_ns=time.perf_counter_ns() - executed,
    )
    return False


def _engine_outputs(item: BatchItem, metadata: ModelMetadata) -> Sequence[str]:
    """The outputs a batch asks of the engine: the requested ones (empty: all), and the kept ones."""
    if not item.kept_outputs:
        return item.outputs
    return [*(item.outputs or [t.name for t in metadata.outputs]), *item.kept_outputs]


def _run_as_requests(
    lease: Lease, live: Sequence[BatchItem], run_cancel: CancelToken, statistics: InferenceStatistics, started: int
) -> None:
    """A backend that takes a batch as its list of requests (python models: Triton's semantics) gets the members
    unstacked (each with its own inputs, outputs and cancel token) and returns one outcome each: its outputs, or
    the error that fails it alone."""
    try:
        # A backend with `batches_as_requests` takes the members themselves and answers one outcome each (its
        # outputs or its error), where other backends take stacked inputs and give stacked outputs.
        members = cast(Any, list(live))
        outcomes = cast(list[Any], lease.execute(members, (), run_cancel))
    except (EngineError, ExecutionCancelled) as error:
        for item in live:
            item.fail(error)
        return
    except BaseException as error:  # a backend bug: the same status for every member, and the log has it
        for item in live:
            item.fail(error)
        raise
    executed = time.perf_counter_ns()
    rows = sum(item.rows for item in live)
    for item, outcome in zip(live, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            item.fail(outcome)
        else:
            item.result = outcome
        item.infer_ns, item.batch_rows, item.batch_members = executed - started, rows, len(live)
    statistics.record_execution(batch_size=rows, input_ns=0, infer_ns=executed - started, output_ns=0)


def _run_as_streams(lease: Lease, live: Sequence[BatchItem], statistics: InferenceStatistics, started: int) -> bool:
    """A streaming (decoupled) model's batch: one engine call of the members, each member's answers posted as a
    stream of its own (read on its own thread by the dataplane). The lease goes to the streams: the last one to end
    releases it, and the batch's execution is counted then. Returns whether it went (False: the call could not
    start, every member failed with its error)."""
    try:
        streams = lease.context.execute_streams(list(live))
    except (EngineError, ExecutionCancelled) as error:
        for item in live:
            item.fail(error)
        return False
    except BaseException as error:  # a backend bug: the same status for every member, and the log has it
        for item in live:
            item.fail(error)
        raise
    rows = sum(item.rows for item in live)
    held = _HeldByStreams(lease, len(streams), statistics, started, rows)
    for item, stream in zip(live, streams, strict=True):
        item.batch_rows, item.batch_members = rows, len(live)
        member = MemberStream(stream, held)
        if not item.post_stream(member):
            member.close()
    return True


class _HeldByStreams:
    """A streaming batch's lease, held until its last member stream ended: then the execution is counted and the
    lease released (and, when the engine's device failed under a stream, the pool retired)."""

    def __init__(self, lease: Lease, streams: int, statistics: InferenceStatistics, started: int, rows: int) -> None:
        self._lease, self._statistics, self._started, self._rows = lease, statistics, started, rows
        self._lock = threading.Lock()  # guards: _open, _failure
        self._open = streams
        self._failure: DeviceFailedError | None = None

    def device_failed(self, error: DeviceFailedError) -> None:
        with self._lock:
            self._failure = self._failure or error

    def stream_ended(self) -> None:
        with self._lock:
            self._open -= 1
            if self._open > 0:
                return
            failure = self._failure
        infer_ns = time.perf_counter_ns() - self._started
        self._statistics.record_execution(batch_size=self._rows, input_ns=0, infer_ns=infer_ns, output_ns=0)
        self._lease.release()
        if failure is not None:
            self._lease.entry.retire_failed_pool(self._lease.pool, failure)


class MemberStream(Iterator[Outputs]):
    """One member's answers in a streaming batch: the engine's, each waited for in `blocking_wait` (a handler pool
    may start another call meanwhile); ended (its last answer read, closed or raised), it ends its part of the
    batch once."""

    def __init__(self, answers: Iterator[Outputs], held: _HeldByStreams) -> None:
        self._answers, self._held = answers, held
        self._ended = False
        self._lock = threading.Lock()  # guards: _ended (closed from any thread)

    def __next__(self) -> Outputs:
        try:
            with blocking_wait:
                return next(self._answers)
        except DeviceFailedError as error:
            self._held.device_failed(error)
            self.close()
            raise
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        with self._lock:
            ended, self._ended = self._ended, True
        if ended:
            return
        try:
            close = getattr(self._answers, "close", None)
            if close is not None:
                close()
        finally:
            self._held.stream_ended()


def _checked(item: BatchItem, metadata: ModelMetadata, live: list[BatchItem]) -> None:
    """Check a request against the pool's metadata (known only once loaded; cached per signature) and let it
    make its own last check."""
    try:
        metadata.check_request(item.signature, item.outputs)
        if item.before_run is not None:
            item.before_run()
    except (EngineError, ServiceError) as error:
        item.fail(error)
        return
    live.append(item)


def stack(items: Sequence[BatchItem]) -> Mapping[str, np.ndarray]:
    """The batch's inputs along dimension 0 (one copy per input; none for a batch of one)."""
    if len(items) == 1:
        return items[0].inputs
    return {name: np.concatenate([item.inputs[name] for item in items]) for name in items[0].inputs}


def split(outputs: Outputs, items: Sequence[BatchItem]) -> None:
    """Hand each item its rows of every output (views, no copy)."""
    if len(items) == 1:
        items[0].result = outputs
        return
    offset = 0
    for item in items:
        end = offset + item.rows
        item.result = {name: array[offset:end] for name, array in outputs.items()}
        offset = end
