"""The inference path, independent of the transport: find the model, reserve the tensors' memory, decode, admit,
run, respond, count.

The wire layer (service/transport/servicers/inference.py with service/transport/tensors.py) hands `Dataplane.infer` /
`Dataplane.infer_stream` an `InferenceRequest`: model name, version, id, the client's deadline, the request's
tensors (decoded here, after their memory is reserved) and `respond`, its encoder, which turns each neutral
`InferenceResponse` (the outputs of a run) into what the transport sends. Both calls go through one path
(`_answers`): decode, look the answer up in the response cache, run the request on its model's path (chosen when the
model's configuration was committed: `entry.path.run(request, deadline, cancel)`, service/core/paths.py: alone on a
slot, in a batch, or in its sequence), respond; unary and stream requests are counted the same way, only a
streaming model's several answers differ. A stream's requests are in flight together, each through
this path on a thread of the stream (service/request_path/stream_requests.py keeps them; `stream_placement` says where
each goes among the others). Everything else (the tensor memory account, FIFO admission, lazy loading, statistics)
happens here and below. A request's tensor memory is reserved before decoding (service/transport/tensor_memory.py) and
given back when it ends, whatever the end. Nothing here imports grpc, protobuf messages or the wire layer
(tests/unit/test_layers.py says so).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import numpy as np

from engine.config.specs import ModelSpec
from engine.interface import CancelToken, ModelMetadata, Outputs
from engine.tensor_codec import BYTES_ELEMENT_COST

from ..core.errors import ModelNotFound, RequestCancelled
from ..core.events import RejectionLog
from ..core.lifecycle import ModelEntry
from ..core.outcomes import REJECTIONS, add_retry_hint, outcome_of
from ..core.registry import ModelRegistry, ModelVersions
from ..core.requests import ModelRequest, RunResult, StreamEnd
from ..core.sequences import ID_MODULUS
from ..core.tracing import (
    CACHE_LOOKUP,
    DECODE,
    ENCODE,
    TENSOR_BACKEND_OUTPUT,
    TENSOR_QUEUE_INPUT,
    RequestTrace,
    TraceContext,
    Tracer,
    tracing_off,
)
from ..transport.shared_memory import Region, RegionSlice
from ..transport.tensor_memory import Reservation, TensorMemory
from .request_info import request_info
from .response_cache import NOT_CACHEABLE, CachedAnswer, CacheLookup, ResponseCache
from .stream_requests import StreamPlacement

_LOG = logging.getLogger(__name__)

R = TypeVar("R")


@dataclass
class DecodedRequest:
    """A request's tensors and parameters, decoded (service/transport/tensors.py decode_request)."""

    inputs: dict[str, np.ndarray]
    signature: dict[str, tuple[str, tuple[int, ...]]]  # name -> (datatype, shape), for ModelMetadata.check_request
    outputs: list[str]  # requested output names; empty = all
    timeout_us: int  # the request's `timeout` parameter; 0 = none
    output_regions: dict[str, RegionSlice] = field(default_factory=dict)  # outputs to write into shared memory
    # sequence_id, sequence_start, sequence_end as sent: name -> (parameter kind, value) (core/sequences.py)
    sequence_parameters: dict[str, tuple[str, object]] = field(default_factory=dict)
    regions: list[Region] = field(default_factory=list)  # one reference per tensor in shared memory

    def rows(self) -> int:
        """The first input's first dimension (1 for scalars): the rows the request brings to a batch."""
        for _, shape in self.signature.values():  # (a loop, not next() over a generator: one call less a request)
            if shape:
                return shape[0]
        return 1

    def batch_size(self, metadata: ModelMetadata) -> int:
        """The batch size the statistics count: its rows for a model that batches, else 1."""
        return self.rows() if metadata.max_batch_size > 0 else 1

    def check_regions(self) -> None:
        """Call when the request is about to run. Raises InvalidRequest if a region it names was unregistered
        since it was decoded (while it waited for a slot): it is refused rather than run on memory its client
        has let go; nothing was written to the region yet."""
        for region in self.regions:
            region.check_current()

    def release(self) -> None:
        """The request is finished (answered or failed): drop its views of shared memory and its region
        references, so an unregistered region can be unmapped. Idempotent; a no-op without shared memory."""
        if self.regions:
            regions, self.regions = self.regions, []
            self.inputs = {}
            self.output_regions = {}
            for region in regions:
                region.release()


class RequestTensors(Protocol):
    """A request's tensors as the transport received them, decoded on demand."""

    def decoded_bytes(self) -> int:
        """About how many bytes decoding takes and holds, read without decoding. Raises InvalidRequest for a
        shape decoding would refuse."""
        ...

    def decode(self) -> DecodedRequest:
        """Decode every input and the parameters (no copy of raw inputs: views of the received bytes). Raises
        InvalidRequest or RegionNotFound, holding nothing then; the caller releases the result."""
        ...

    def answer_key(self, decoded: DecodedRequest, version: str) -> bytes:
        """The response cache's key of this request for `version` (service/request_path/response_cache.py request_key:
        every input's name, datatype, shape and bytes, the requested outputs and the parameters that change the
        answer). Hashes every input; called only for a model that caches."""
        ...


@dataclass
class InferenceResponse:
    """One answer of a run, before the transport encodes it."""

    model: str
    version: str
    id: str
    outputs: Outputs
    metadata: ModelMetadata  # the outputs' declared order and datatypes
    output_regions: dict[str, RegionSlice]  # outputs to write into shared memory instead of the message
    # False only for a streaming model's answer that was not sent with the final flag (more may follow; the stream
    # front end tells the client with Triton's `triton_final_response` parameter).
    final: bool = True


@dataclass
class InferenceRequest(Generic[R]):
    """One inference request as the transport hands it over.

    `respond` encodes an answer for the transport (for ModelInfer: its wire bytes); it runs inside the request's
    accounting, while its regions are held, so a response that cannot be encoded counts as a failure and its
    memory is given back."""

    model: str
    version: str
    id: str
    tensors: RequestTensors
    respond: Callable[[InferenceResponse], R]
    client_deadline: float | None = None  # on the monotonic clock; None: the client set none
    parameters: Mapping[str, object] = field(default_factory=dict)  # the request's own (plain values)
    # A stream's: what ends a streaming model's request, made while its slot is still held, so that it is on its way
    # before another request of the stream takes the slot (as on Triton, where the model's instance sends it before
    # it takes its next request): `respond_end(error, final_sent)` encodes the error the run ended with, or (error
    # None) what follows its last answer (None: nothing). Without it a streaming model's error is raised.
    respond_end: Callable[[BaseException | None, bool], R | None] | None = None
    # The transport's word on the request's trace (its frontend, the client's W3C traceparent/tracestate), given
    # while tracing is on somewhere (Dataplane.tracing_on): only such a request is sampled. None: tracing was off, or
    # a call from inside the server (an ensemble step, a BLS call), traced only as its traced caller's child.
    trace_context: TraceContext | None = None


def output_bytes(outputs: Outputs) -> int:
    """About how much memory the run's outputs hold: nbytes, and for BYTES (object arrays) BYTES_ELEMENT_COST per
    element (their contents are not walked for this)."""
    total = 0
    for array in outputs.values():  # (a loop, not sum() over a generator: no generator frame a request)
        if isinstance(array, np.ndarray):
            total += array.size * BYTES_ELEMENT_COST if array.dtype == object else array.nbytes
    return total


class Dataplane:
    def __init__(
        self,
        registry: ModelRegistry,
        clock: Callable[[], float] = time.monotonic,
        tensor_memory: TensorMemory | None = None,
        response_cache: ResponseCache | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.registry = registry
        # Which requests are traced and where their traces go (service/core/tracing.py); off by default.
        self.tracer = tracer if tracer is not None else tracing_off()
        # ModelInfer answers kept by content (service/request_path/response_cache.py); capacity 0 = off.
        self.response_cache = response_cache if response_cache is not None else ResponseCache(0)
        # Every request's tensors are accounted for from before decoding to its end
        # (service/transport/tensor_memory.py); without limits given, the account only counts.
        self.tensor_memory = tensor_memory if tensor_memory is not None else TensorMemory()
        self._clock = clock
        self.rejections = RejectionLog(_LOG)
        self._unknown_lock = threading.Lock()  # guards: _unknown_model_requests
        self._unknown_model_requests = 0

    @property
    def tracing_on(self) -> bool:
        """Whether some request may be traced now (one attribute read): the transport reads the trace headers only
        then."""
        return self.tracer.any_on

    @property
    def unknown_model_requests(self) -> int:
        """Inference requests naming a model that is not registered (no model to count them under)."""
        with self._unknown_lock:
            return self._unknown_model_requests

    def _request_versions(self, name: str) -> ModelVersions:
        """The versions of the model an inference request names; a request for an unknown name is counted
        server-wide (a per-name count would let clients grow the metrics without bound) and raises
        ModelNotFound."""
        try:
            return self.registry.versions(name)
        except ModelNotFound:
            with self._unknown_lock:
                self._unknown_model_requests += 1
            raise

    def _record_failure(
        self, entry: ModelEntry, error: BaseException, cancel: CancelToken | None, started: int
    ) -> None:
        """Count a request that did not succeed under its outcome; a refusal also gets a (rate-limited) log line
        with the message its client got (never internal details: those are logged where they arise)."""
        outcome = outcome_of(error, cancel)
        add_retry_hint(error, entry)  # a refusal by the model's queue: when to retry (grpc-retry-pushback-ms)
        entry.statistics.record_failure(time.perf_counter_ns() - started, outcome)
        if outcome in REJECTIONS:
            self.rejections.note(entry.name, outcome, str(error))

    def _decode(self, tensors: RequestTensors) -> tuple[Reservation, DecodedRequest]:
        """Reserve the memory the request's tensors take (estimated from the message), then decode them. Raises
        TensorMemoryLimit before anything is decoded, or the decoder's errors (the reservation released).
        On success the caller releases both when the request ends."""
        reservation = self.tensor_memory.reserve(tensors.decoded_bytes())
        try:
            return reservation, tensors.decode()
        except BaseException:
            reservation.release()
            raise

    def resolve(self, name: str, version: str) -> ModelEntry:
        """The entry of `name`'s `version` ("": the highest ready one). Raises as ModelRegistry.get does."""
        return self.registry.get(name, version)

    def admission_deadline(self, entry: ModelEntry, timeout_us: int, client_deadline: float | None) -> float | None:
        """The earliest of: the model's admission timeout, the request's `timeout` parameter (which can only
        shorten it, and only where the model allows it), and the client's own deadline. None: wait without
        limit."""
        now = self._clock()
        deadline = client_deadline
        model_timeout = entry.settings.admission_timeout
        if model_timeout > 0:
            deadline = _earliest(deadline, now + model_timeout)
        if timeout_us > 0 and _timeout_override_allowed(entry):
            deadline = _earliest(deadline, now + timeout_us / 1e6)
        return deadline

    def infer(self, request: InferenceRequest[R], *, cancel: CancelToken | None = None) -> R:
        """Run one request to completion and return its one answer, encoded by `request.respond` before the
        request is counted. Blocks while queued (until the admission deadline), while the model loads, and for
        the run (a batching model: for its batch's run). Raises the core's errors (see status_codes.py for how
        they map); a streaming model is refused (ModelErrorUnsupported, Triton's answer for a decoupled model)."""
        answers = self._answers(request, cancel, stream=False)
        answer = next(answers)  # an error ends the generator (its finally has run) and propagates
        next(answers, None)  # run it to its end (its finally gives the memory back) rather than throw GeneratorExit in
        return answer

    def infer_stream(
        self, request: InferenceRequest[R], *, cancel: CancelToken | None = None
    ) -> Generator[R, None, None]:
        """Answers for one request on a stream: one for an ordinary model, several for a streaming model.

        A streaming model's lease is held until the last answer is taken from this generator, the generator
        is closed, or it raises; closing it (as a cancelled stream does) releases the slot. Any other model
        runs as `infer` does (batching included), and its slot is free before the answer is yielded.
        """
        return self._answers(request, cancel, stream=True)

    def stream_placement(self, request: InferenceRequest[R]) -> StreamPlacement:
        """Where a stream puts `request` among its others (service/request_path/stream_requests.py), read as the request
        arrives: its answers keep their place unless its model is decoupled (Triton's rule, from the model's
        `model_transaction_policy` as Triton reads it); a sequence model's requests of one sequence run one after
        another (its turns are taken in arrival order; requests of other sequences run meanwhile); a model that
        neither batches nor takes sequences runs as many of the stream's requests at once as it has slots, or as it
        runs at once where an instance takes several (the others would only wait in its queue). A batching model's
        requests all go to its queue at once, to batch. Reads the registry only; never raises: a request that is to
        fail keeps its place, and its error is written there."""
        try:
            entry = self.registry.get(request.model, request.version)
        except Exception:  # unknown model or version: refused when it runs, in its place
            return StreamPlacement()
        spec = entry.spec
        in_order = not _decoupled(spec)
        if spec.sequence is not None:
            sequence_id = request.parameters.get("sequence_id")
            if sequence_id in (None, 0, ""):
                return StreamPlacement(in_order)  # refused when it runs
            if isinstance(sequence_id, int) and not isinstance(sequence_id, bool):
                sequence_id %= ID_MODULUS  # one lane per sequence: -1 and 2**64 - 1 are one (core/sequences.py)
            return StreamPlacement(in_order, lane=("sequence", entry.name, spec.version, sequence_id))
        if entry.batches or spec.backend == "ensemble":  # (an ensemble's steps have slots of their own)
            return StreamPlacement(in_order)
        width = max(1, entry.settings.slots, entry.request_slots())
        return StreamPlacement(in_order, lane=("model", entry.name, spec.version), width=width)

    def _answers(
        self, request: InferenceRequest[R], cancel: CancelToken | None, *, stream: bool
    ) -> Generator[R, None, None]:
        """The one path of `infer` and `infer_stream`: decode, look the answer up in the response cache, run the
        request on its model's path (`entry.path`: direct, batched or sequenced, service/core/paths.py), respond. A
        request that answers once is counted before its answer is yielded (a stream cancelled right after it never
        resumes the generator, and the answer was complete); a streaming model's answers are counted after the
        last."""
        started = time.perf_counter_ns()
        versions = self._request_versions(request.model)
        entry = versions.default()  # where a request for a version that is not served is counted
        asked = request.version  # ("": the default, found already)
        recorded = False
        cancel = cancel or CancelToken()
        cancel.request = request_info(request)  # what a backend may show the model (python models do)
        trace: RequestTrace | None = None
        if cancel.trace is not None or request.trace_context is not None:  # (an inner call's token: its caller's)
            trace = self._start_trace(request, cancel, started)
        reservation = decoded = None
        try:
            if asked:
                entry = versions.find(asked)
            reservation, decoded = self._decode(request.tensors)
            if trace is not None:
                trace.span(DECODE, started, time.perf_counter_ns(), inputs=len(decoded.inputs))
                if trace.wants_tensors:
                    datatypes = {name: datatype for name, (datatype, _) in decoded.signature.items()}
                    trace.record_tensors(TENSOR_QUEUE_INPUT, decoded.inputs, datatypes)
            # (the cache off, as by default: two attribute reads, no lookup call)
            cache_on = self.response_cache.capacity_bytes > 0  # (ResponseCache.enabled, inline)
            cached = self._cached(entry, request, decoded, stream) if cache_on else NOT_CACHEABLE
            if trace is not None and cached.key is not None:
                looked = time.perf_counter_ns()
                trace.span(CACHE_LOOKUP, looked - cached.lookup_ns, looked, hit=cached.answer is not None)
            deadline = self.admission_deadline(entry, decoded.timeout_us, request.client_deadline)
            if cached.answer is not None:  # a hit takes no slot
                answer = self._respond(request, _hit(cached.answer), decoded, reservation, trace)
                entry.statistics.record_cache_hit(total_ns=time.perf_counter_ns() - started, hit_ns=cached.lookup_ns)
                recorded = True
                if trace is not None:
                    _traced_end(trace, entry, None, None)
                yield answer
                return
            model_request = self._model_request(entry, request, decoded, stream, started)
            model_request.trace = trace
            results = entry.path.run(model_request, deadline, cancel)
            counted_last: RunResult | None = None  # a streaming run: counted once it ended
            try:  # (contextlib.closing's work without its three calls)
                for result in results:
                    if isinstance(result, StreamEnd):
                        if result.error is not None:  # (only with respond_end: the path raises it otherwise)
                            self._record_failure(entry, result.error, cancel, started)
                            recorded = True
                            if trace is not None:
                                _traced_end(trace, entry, None, result.error, cancel)
                            assert request.respond_end is not None
                            failed = request.respond_end(result.error, result.final)
                            if failed is not None:
                                yield failed
                            return
                        counted_last = result.totals
                        if (
                            request.respond_end is not None
                            and (end := request.respond_end(None, result.final)) is not None
                        ):
                            yield end
                        continue
                    answer = self._respond(request, result, decoded, reservation, trace)
                    if result.streamed:
                        counted_last = result
                    else:
                        if cached.key is not None:
                            self._record_cache_miss(entry, cached, result)
                        self._record_success(entry, result, started)
                        recorded = True
                        if trace is not None:
                            _traced_end(trace, entry, result, None)
                    yield answer
            finally:
                results.close()
            if counted_last is not None:
                self._record_success(entry, counted_last, started, counted_output=False)
            recorded = True
        except BaseException as error:
            if not recorded:
                self._record_failure(entry, error, cancel, started)
            if trace is not None:
                _traced_end(trace, entry, None, error, cancel)
            raise
        finally:  # also when the caller goes away (the generator is closed at a yield)
            try:
                if decoded is not None and decoded.regions:  # (DecodedRequest.release: a no-op without regions)
                    decoded.release()
            finally:
                if reservation is not None:
                    reservation.release()
            if trace is not None:  # (a streaming run's end, or a caller that went away: idempotent)
                _traced_end(trace, entry, None, None, cancel)

    def _start_trace(self, request: InferenceRequest[R], cancel: CancelToken, started: int) -> RequestTrace | None:
        """The request's trace, or None: a child of the trace its token carries (a BLS call of a traced request), else
        sampled (Tracer.start). A traced request's token carries its own trace from here on, for the calls its model
        makes (python models' BLS calls copy it onto theirs)."""
        parent = cancel.trace if isinstance(cancel.trace, RequestTrace) else None
        kind = "ensemble step" if getattr(cancel, "ensembles", None) else "bls"  # (an ensemble's StepToken names them)
        trace = self.tracer.start(request.model, request.id, request.trace_context, parent, started, kind=kind)
        cancel.trace = trace
        return trace

    def _model_request(
        self, entry: ModelEntry, request: InferenceRequest[R], decoded: DecodedRequest, stream: bool, started: int
    ) -> ModelRequest:
        """The request as its model's path takes it (a rescheduled one's next admission deadline: the model's
        timeout and the request's `timeout` from then, and the client's)."""
        return ModelRequest(
            decoded.inputs,
            decoded.signature,
            decoded.outputs,
            decoded.sequence_parameters,
            before_run=decoded.check_regions,
            stream=stream,
            ends_in_band=request.respond_end is not None,
            next_deadline=lambda: self.admission_deadline(entry, decoded.timeout_us, request.client_deadline),
            arrived_ns=started,
            priority=ModelRequest.priority_of(request.parameters),
            timeout_us=decoded.timeout_us,
        )

    def _cached(
        self, entry: ModelEntry, request: InferenceRequest[R], decoded: DecodedRequest, stream: bool
    ) -> CacheLookup:
        """The response cache's answer for a ModelInfer request, or NOT_CACHEABLE (streams are never cached)."""
        if stream:
            return NOT_CACHEABLE
        return self.response_cache.lookup(
            entry, request.version, lambda version: request.tensors.answer_key(decoded, version)
        )

    def _record_cache_miss(self, entry: ModelEntry, cached: CacheLookup, result: RunResult) -> None:
        """A cacheable request's run answered: store its answer in the response cache and count the miss (its
        success is counted by _record_success)."""
        entry.statistics.record_cache_miss(
            self.response_cache.store_answer(cached, result.metadata, result.version, result.outputs)
        )

    @staticmethod
    def _record_success(entry: ModelEntry, result: RunResult, started: int, counted_output: bool = True) -> None:
        finished = time.perf_counter_ns()
        output_ns = finished - result.finished_ns if counted_output else 0
        entry.statistics.record_success(
            queue_ns=result.queue_ns,
            input_ns=result.input_ns,
            infer_ns=result.infer_ns,
            output_ns=output_ns,
            total_ns=finished - started,
            batch_size=result.rows,
            executed=not result.batched,
        )

    @staticmethod
    def _respond(
        request: InferenceRequest[R],
        result: RunResult,
        decoded: DecodedRequest,
        reservation: Reservation,
        trace: RequestTrace | None = None,
    ) -> R:
        """The encoded answer of a run; its outputs are counted in the request's reservation first (they are held
        until the answer is sent)."""
        reservation.count_outputs(output_bytes(result.outputs))
        if trace is not None:
            return _traced_respond(request, result, decoded, trace)
        return request.respond(  # (_response, inline: the untraced request's one call less)
            InferenceResponse(
                request.model,
                result.version,
                request.id,
                result.outputs,
                result.metadata,
                decoded.output_regions,
                result.final,
            )
        )


def _response(request: InferenceRequest[R], result: RunResult, decoded: DecodedRequest) -> InferenceResponse:
    """The neutral answer to `request` that its encoder writes."""
    return InferenceResponse(
        request.model, result.version, request.id, result.outputs, result.metadata, decoded.output_regions, result.final
    )


def _traced_respond(request: InferenceRequest[R], result: RunResult, decoded: DecodedRequest, trace: RequestTrace) -> R:
    """`_respond`'s encoding of a traced request, recorded as its encode span (and its outputs at TENSORS)."""
    if trace.wants_tensors:
        datatypes = {tensor.name: tensor.datatype for tensor in result.metadata.outputs}
        trace.record_tensors(TENSOR_BACKEND_OUTPUT, result.outputs, datatypes)
    began = time.perf_counter_ns()
    try:
        return request.respond(_response(request, result, decoded))
    finally:
        trace.span(ENCODE, began, time.perf_counter_ns(), outputs=len(result.outputs), final=result.final)


def _traced_end(
    trace: RequestTrace,
    entry: ModelEntry,
    result: RunResult | None,
    error: BaseException | None,
    cancel: CancelToken | None = None,
) -> None:
    """A traced request ended: its version, and its outcome (the statistics' word for its error)."""
    if trace.finished:
        return
    trace.set_version(result.version if result is not None else entry.spec.version)
    if error is None:
        trace.finish()
    elif isinstance(error, GeneratorExit):  # its caller went away (a stream's client): what its statistics call it
        trace.finish(outcome_of(RequestCancelled("the caller went away"), cancel), error)
    else:
        trace.finish(outcome_of(error, cancel), error)


def _hit(answer: CachedAnswer) -> RunResult:
    """A response cache hit, answered like a run that took no slot and no time."""
    return RunResult(answer.metadata, answer.version, answer.outputs)


def _decoupled(spec: ModelSpec) -> bool:
    """Whether the model's configuration says `model_transaction_policy { decoupled: true }` (read off the parsed
    configuration by name: the dataplane knows no protobuf types)."""
    policy = getattr(spec.config, "model_transaction_policy", None)
    return bool(getattr(policy, "decoupled", False))


def _timeout_override_allowed(entry: ModelEntry) -> bool:
    """A request's `timeout` shortens the admission timeout, unless the model's dynamic_batching queue policy
    says allow_timeout_override: false."""
    batching = entry.spec.batching
    return batching is None or batching.allow_timeout_override


def _earliest(a: float | None, b: float) -> float:
    return b if a is None or b < a else a


__all__ = ["Dataplane", "DecodedRequest", "InferenceRequest", "InferenceResponse", "RequestTensors"]
