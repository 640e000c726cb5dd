"""The path of a sequence model's requests (service/core/paths.py `SequencedPath`): a request's turn in its sequence,
then its run on its sequence's slot (direct) or in a batch (oldest), its control and state inputs added and its state
outputs kept (service/core/sequences.py has the rule and the table). Also `ServedModel`, what every path needs of
its model.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from contextlib import closing
from dataclasses import dataclass
from typing import Protocol

from engine.config.specs import CORRID, OLDEST, ModelSpec, SequenceSpec
from engine.errors import ModelErrorUnsupported, RequestRescheduled
from engine.interface import CancelToken, FinalOutputs, ModelMetadata

from .admission import AdmissionController
from .batching import BatchItem
from .lease import Lease
from .requests import ModelRequest, RunResult, RunResults
from .sequences import SequenceTable, Turn, check_batch_of_one, corrid_input, read_flags
from .tracing import BATCH_FORMED, SEQUENCE_SLOT, RequestTrace

# Triton's code and words for a decoupled model called with ModelInfer (ours answer on a stream too).
DECOUPLED_UNARY = "ModelInfer RPC doesn't support models with decoupled transaction policy"


class ServedModel(Protocol):
    """What a request path needs of its model (service/core/lifecycle.py ModelEntry)."""

    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def sequences(self) -> SequenceTable: ...

    @property
    def admission(self) -> AdmissionController: ...

    def is_ready(self) -> bool: ...

    def known_metadata(self) -> ModelMetadata | None: ...

    def sequence_capacity(self) -> int: ...

    def acquire_lease(
        self, deadline: float | None, cancel: CancelToken | None = None, context_index: int | None = None
    ) -> Lease: ...

    def run_batched(self, item: BatchItem, deadline: float | None, cancel: CancelToken) -> BatchItem: ...


@dataclass
class _Spent:
    """The time a request of a sequence spent, over its executions (several when its model rescheduled it)."""

    arrived: int  # perf_counter_ns
    input_ns: int = 0
    infer_ns: int = 0

    def queue_ns(self, started: int) -> int:
        """The time it waited up to an execution that starts at `started`: not the earlier executions."""
        return max(0, started - self.arrived - self.input_ns - self.infer_ns)


def sequence_answers(
    model: ServedModel, request: ModelRequest, deadline: float | None, cancel: CancelToken
) -> RunResults:
    """Run one request of a sequence model and yield its answers: one, or on a stream (`request.stream`) a streaming
    model's, one per response (the request then holds its turn and its slot until the last is taken; its last answer
    is counted, no StreamEnd follows). Its flags are read, its turn taken (`SequenceTable.enter`), its lease acquired
    on its sequence's slot (`oldest` with a batch dimension: its batch run), the control and state inputs added, the
    state outputs kept. A request its model reschedules (RequestRescheduled: an iterative sequence) goes back into its
    sequence's queue and runs again, each new wait bounded by `request.next_deadline()` (default: `deadline`). Blocks
    for the turns, the admissions and the runs. Raises the sequence errors (service/core/sequences.py), the
    admission's and the run's, and ModelErrorUnsupported for a streaming model outside a stream (Triton's words). Its
    turn is finished and every lease released in every case, also when the generator is closed early; a one-answer
    request's turn is finished before its answer is yielded."""
    arrived = time.perf_counter_ns()
    spec = model.spec.sequence
    assert spec is not None  # the path of sequence models only
    flags = read_flags(model.name, request.sequence_parameters, spec.iterative)
    batched = model.spec.max_batch_size > 0
    check_batch_of_one(model.name, request.signature, batched)
    metadata = model.known_metadata()
    if metadata is not None:  # bad input is refused before it takes a turn
        metadata.check_request(request.signature, request.outputs)
    table = model.sequences
    if flags.id in (0, ""):  # an iterative sequence's request without an id starts a sequence of its own
        flags = table.assign(flags)
    for control in spec.controls:  # an id the CORRID cannot hold, too (it would hold a slot it never uses)
        if control.kind == CORRID:
            corrid_input(control.datatype, flags.id, (1,))
    capacity = model.sequence_capacity()
    pinned = spec.strategy != OLDEST  # oldest: a sequence runs on whichever slot is free
    instances = capacity // max(1, model.spec.max_batch_size) if pinned else None
    turn = table.enter(flags, spec, capacity, deadline, cancel, instances)
    if request.trace is not None:  # its turn in its sequence (the wait for the requests before it, or a free slot)
        request.trace.span(SEQUENCE_SLOT, arrived, time.perf_counter_ns(), sequence_id=str(flags.id))
    run = _Execution(model, table, turn, spec, request, cancel, _Spent(arrived))
    finished = False
    try:
        while True:
            answers = run.in_batch(deadline) if spec.strategy == OLDEST and batched else run.alone(deadline)
            try:
                with closing(answers):
                    for answer in answers:
                        if not answer.streamed:  # the sequence's next request may run while this answer goes out
                            table.finish(turn)
                            finished = True
                        yield answer
                return
            except RequestRescheduled:
                deadline = deadline if request.next_deadline is None else request.next_deadline()
                table.again(turn, spec, deadline, cancel)
    finally:
        if not finished:
            table.finish(turn)


@dataclass
class _Execution:
    """What one request of a sequence needs to run, once per execution (again for each its model reschedules)."""

    model: ServedModel
    table: SequenceTable
    turn: Turn
    spec: SequenceSpec
    request: ModelRequest
    cancel: CancelToken
    spent: _Spent

    def alone(self, deadline: float | None) -> Generator[RunResult, None, None]:
        """One execution on its own (direct: on its sequence's slot; oldest without a batch dimension: on any free
        one): yields its answer once the lease is released, or a streaming model's answers as they come, holding
        the lease. Raises RequestRescheduled when the model handed the request back (after the answers it sent)."""
        model, table, turn, spec, cancel, request = (
            self.model,
            self.table,
            self.turn,
            self.spec,
            self.cancel,
            self.request,
        )
        context = turn.context if spec.strategy != OLDEST else None
        trace = request.trace
        if trace is None:
            lease = model.acquire_lease(deadline, cancel, context_index=context)
        else:
            lease = traced_lease(model, trace, deadline, cancel, context)
        with lease:
            table.bind(turn, lease.pool)
            if lease.streaming and not request.stream:
                raise ModelErrorUnsupported(DECOUPLED_UNARY)
            request.before_run()
            checked = time.perf_counter_ns()
            lease.metadata.check_request(request.signature, request.outputs)
            feed = dict(request.inputs)
            feed.update(table.inputs(turn, spec, model.spec.max_batch_size > 0))
            cancel.request = table.shown_to_model(turn, cancel.request)
            wanted = list(request.outputs) or [tensor.name for tensor in lease.metadata.outputs]
            queue_ns = self.spent.queue_ns(checked)
            ran = time.perf_counter_ns()
            self.spent.input_ns += ran - checked
            metadata, version = lease.metadata, lease.version
            if lease.streaming:
                for produced in lease.execute_stream(feed, list(request.outputs), cancel):
                    infer_ns = time.perf_counter_ns() - ran
                    final = isinstance(produced, FinalOutputs)
                    yield RunResult(
                        metadata, version, produced, queue_ns, ran - checked, infer_ns, final=final, streamed=True
                    )
                self.spent.infer_ns += time.perf_counter_ns() - ran
                return
            try:
                produced = lease.execute(feed, [*wanted, *spec.state_outputs()], cancel)
            finally:
                self.spent.infer_ns += time.perf_counter_ns() - ran
            executed = time.perf_counter_ns()
            answer = table.keep_states(turn, spec, dict(produced))
            spent = self.spent
            result = RunResult(metadata, version, answer, queue_ns, spent.input_ns, spent.infer_ns)
        if trace is not None:
            trace.computed(checked, ran, executed, time.perf_counter_ns(), backend=model.spec.backend)
        yield result

    def in_batch(self, deadline: float | None) -> Generator[RunResult, None, None]:
        """`oldest`: the turn's request, its control and state inputs added, goes through dynamic batching
        (`ModelEntry.run_batched`): it runs with the next requests of other sequences that wait with it, its own
        rows of the outputs (state included) posted back. Its sequence is checked open just before the batch runs.
        Yields its answer; raises RequestRescheduled when the model handed the request back."""
        model, table, turn, spec, request = self.model, self.table, self.turn, self.spec, self.request
        table.begin(turn)
        feed = dict(request.inputs)
        feed.update(table.inputs(turn, spec, batched=True))
        self.cancel.request = table.shown_to_model(turn, self.cancel.request)

        def still_open() -> None:
            table.begin(turn, restart=False)
            request.before_run()

        item = BatchItem(
            feed, request.signature, request.outputs, 1, self.cancel, before_run=still_open,
            kept_outputs=spec.state_outputs(),
        )  # fmt: skip
        if request.trace is None:
            model.run_batched(item, deadline, self.cancel)
        else:
            traced_batch(model, request.trace, item, deadline, self.cancel)
        queue_ns = self.spent.queue_ns(item.started_ns) if item.started_ns else 0
        self.spent.input_ns += item.input_ns
        self.spent.infer_ns += item.infer_ns
        produced = item.outcome()
        answer = table.keep_states(turn, spec, dict(produced))
        assert item.metadata is not None  # posted by the batch's leader with the outcome
        spent = self.spent
        yield RunResult(item.metadata, item.version, answer, queue_ns, spent.input_ns, spent.infer_ns, batched=True)


def traced_lease(
    model: ServedModel,
    trace: RequestTrace,
    deadline: float | None,
    cancel: CancelToken,
    context_index: int | None = None,
) -> Lease:
    """`model.acquire_lease` for a traced request: QUEUE_START with the queue it found, then the admission wait (as
    its ticket measured it) and the initialization it waited for after its grant, when the model was not loaded as
    it arrived. Raises as acquire_lease."""
    ready = model.is_ready()
    queued = trace.queued(model.admission.statistics().queued, ready)
    try:
        lease = model.acquire_lease(deadline, cancel, context_index=context_index)
    except BaseException as error:
        trace.admitted(queued, error)
        raise
    ticket = lease.ticket  # the admission's own times (its clock, seconds): the wait apart from the load after it
    waited = None if ticket.granted_at is None else round((ticket.granted_at - ticket.arrived_at) * 1e9)
    trace.admitted(queued, loaded=not ready, admission_ns=waited)
    return lease


def traced_batch(
    model: ServedModel, trace: RequestTrace, item: BatchItem, deadline: float | None, cancel: CancelToken
) -> BatchItem:
    """`model.run_batched` for a traced request: QUEUE_START, the admission wait up to its batch's start, the batch
    it ran in (its rows, its requests; its id, `model:start`, the same for every member, which is how a batch's
    members are found in the traces), and the compute activities from what the batch's leader posted. Raises as
    run_batched."""
    ready = model.is_ready()
    queued = trace.queued(model.admission.statistics().queued, ready)
    try:
        model.run_batched(item, deadline, cancel)
    except BaseException as error:
        trace.admitted(queued, error)
        raise
    if not item.started_ns:  # its batch never ran (it failed before): the admission answered now
        trace.admitted(queued, loaded=not ready)
        return item
    started = item.started_ns
    trace.span("admission wait", queued, started, wait_ns=started - queued)
    trace.granted_ns = started
    trace.event(
        BATCH_FORMED, started, rows=item.batch_rows, members=item.batch_members, batch_id=f"{model.name}:{started}"
    )
    input_end = started + item.input_ns
    trace.computed(started, input_end, input_end + item.infer_ns, time.perf_counter_ns(), batched=True)
    return item


__all__ = ["DECOUPLED_UNARY", "ServedModel", "sequence_answers", "traced_batch", "traced_lease"]
