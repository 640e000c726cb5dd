"""The inference path, independent of the transport: find the model, reserve the tensors' memory, decode, admit,
run, encode (for ModelInfer: serialize), count.

The gRPC servicer calls `infer` / `infer_stream` with the request message, the client's deadline and a cancel
token; everything else (the tensor memory account, FIFO admission, lazy loading, statistics) happens here and
below. A request's tensor memory is reserved before decoding (service/tensor_memory.py) and given back when it
ends, whatever the end. Nothing here imports grpc.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from engine.interface import CancelToken, ModelMetadata
from generated import grpc_service_pb2 as pb

from . import wire
from .core.batching import BatchItem
from .core.errors import InvalidRequest, ModelNotFound
from .core.events import RejectionLog
from .core.lifecycle import Lease, ModelEntry
from .core.outcomes import REJECTIONS, outcome_of
from .core.registry import ModelRegistry
from .shared_memory import SharedMemoryRegistry
from .tensor_memory import Reservation, TensorMemory
from .tensors import DecodedRequest, decode_request, decoded_bytes, encode_response, output_bytes
from .wire import InferRequest, InferResponse

_LOG = logging.getLogger(__name__)


def check_version(entry: ModelEntry, version: str) -> None:
    """Raise unless `version` is empty or the model's version. Non-numeric versions are malformed."""
    if not version or version == entry.spec.version:
        return
    if not version.isdigit():
        # Triton's wording: tritonclient's explicit int8 example recognises the refusal by it.
        raise InvalidRequest(
            f"failed to get model version from specified version string '{version}': a model version is a number"
        )
    raise ModelNotFound(entry.name, version)


class Dataplane:
    def __init__(
        self,
        registry: ModelRegistry,
        clock: Callable[[], float] = time.monotonic,
        shared_memory: SharedMemoryRegistry | None = None,
        tensor_memory: TensorMemory | None = None,
    ) -> None:
        self.registry = registry
        self.shared_memory = shared_memory
        # Every request's tensors are accounted for from before decoding to its end (service/tensor_memory.py);
        # without limits given, the account only counts.
        self.tensor_memory = tensor_memory if tensor_memory is not None else TensorMemory()
        self._clock = clock
        self.rejections = RejectionLog(_LOG)
        self._unknown_lock = threading.Lock()  # guards: _unknown_model_requests
        self._unknown_model_requests = 0

    @property
    def unknown_model_requests(self) -> int:
        """Inference requests naming a model that is not registered (no model to count them under)."""
        with self._unknown_lock:
            return self._unknown_model_requests

    def _request_entry(self, name: str) -> ModelEntry:
        """The entry an inference request names; a request for an unknown name is counted server-wide (a
        per-name count would let clients grow the metrics without bound) and raises ModelNotFound."""
        try:
            return self.registry.get(name)
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
        entry.statistics.record_failure(time.perf_counter_ns() - started, outcome)
        if outcome in REJECTIONS:
            self.rejections.note(entry.name, outcome, str(error))

    def _decode(self, request: pb.ModelInferRequest, raw_contents) -> tuple[Reservation, DecodedRequest]:
        """Reserve the memory the request's tensors take (estimated from the message), then decode them. Raises
        TensorMemoryLimit before anything is decoded, or decode_request's errors (the reservation released).
        On success the caller releases both when the request ends."""
        reservation = self.tensor_memory.reserve(decoded_bytes(request, raw_contents, self.shared_memory))
        try:
            return reservation, decode_request(request, raw_contents, self.shared_memory)
        except BaseException:
            reservation.release()
            raise

    def resolve(self, name: str, version: str) -> ModelEntry:
        entry = self.registry.get(name)
        check_version(entry, version)
        return entry

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

    def infer(
        self,
        request: pb.ModelInferRequest | InferRequest,
        *,
        client_deadline: float | None = None,
        cancel: CancelToken | None = None,
        serialize: bool = False,
    ) -> pb.ModelInferResponse | InferResponse | bytes:
        """Run one request to completion. Blocks while queued (until the admission deadline), while the model
        loads, and for the run (a batching model: for its batch's run). Returns the response message, or an
        InferResponse (large outputs kept out of the message for the wire layer); with `serialize`, the
        response's wire bytes (wire.serialize_infer_response), made before the request is counted, so that a
        response that cannot be serialized is counted as failed rather than as a success. Raises the core's
        errors (see status_codes.py for how they map)."""
        started = time.perf_counter_ns()
        request, raw_contents = _unwrap(request)
        entry = self._request_entry(request.model_name)
        cancel = cancel or CancelToken()
        reservation = decoded = None
        try:
            check_version(entry, request.model_version)
            reservation, decoded = self._decode(request, raw_contents)
            ran = self._run(entry, decoded, client_deadline, cancel, started)
            response = self._response(request, ran, decoded, reservation)
            if serialize:
                response = wire.serialize_infer_response(response)
        except BaseException as error:
            self._record_failure(entry, error, cancel, started)
            raise
        finally:
            _finish(reservation, decoded)
        self._record_success(entry, ran, started)
        return response

    def infer_stream(
        self, request: pb.ModelInferRequest, *, client_deadline: float | None = None, cancel: CancelToken | None = None
    ) -> Iterator[pb.ModelInferResponse]:
        """Responses for one request on a stream: one for an ordinary model, several for a streaming model.

        A streaming model's lease is held until the last response is taken from this generator, the generator
        is closed, or it raises; closing it (as a cancelled stream does) releases the slot. Any other model
        runs as ModelInfer does (batching included), and its slot is free before the answer is yielded.
        """
        started = time.perf_counter_ns()
        request, raw_contents = _unwrap(request)
        entry = self._request_entry(request.model_name)
        recorded = False
        cancel = cancel or CancelToken()
        reservation = decoded = None
        try:
            check_version(entry, request.model_version)
            reservation, decoded = self._decode(request, raw_contents)
            if not entry.batches:
                lease = entry.acquire_lease(self.admission_deadline(entry, decoded.timeout_us, client_deadline), cancel)
                if lease.streaming:
                    yield from self._stream_from(entry, request, decoded, reservation, lease, cancel, started)
                    recorded = True
                    return
                ran = self._run_on(lease, decoded, cancel)
            else:
                ran = self._run(entry, decoded, client_deadline, cancel, started)
            response = _as_message(self._response(request, ran, decoded, reservation))
            # Counted before the yield, as ModelInfer counts before returning: a stream cancelled right after
            # this answer never resumes the generator, and the answer was complete.
            self._record_success(entry, ran, started)
            recorded = True
            yield response
        except BaseException as error:
            if not recorded:
                self._record_failure(entry, error, cancel, started)
            raise
        finally:  # also when the stream goes away (the generator is closed at a yield)
            _finish(reservation, decoded)

    def _stream_from(
        self,
        entry: ModelEntry,
        request,
        decoded: DecodedRequest,
        reservation: Reservation,
        lease: Lease,
        cancel: CancelToken,
        started: int,
    ) -> Iterator[pb.ModelInferResponse]:
        """A streaming model's responses, holding its slot until the last one is taken (or the generator is
        closed), then counted."""
        with lease:
            decoded.check_regions()
            lease.metadata.check_request(decoded.signature, decoded.outputs)
            ran = _Ran(lease.metadata, lease.version, lease.queue_ns, rows=decoded.batch_size(lease.metadata))
            began = time.perf_counter_ns()
            for outputs in lease.execute_stream(decoded.inputs, decoded.outputs, cancel):
                ran.outputs = outputs
                yield _as_message(self._response(request, ran, decoded, reservation))
            ran.infer_ns = time.perf_counter_ns() - began
        self._record_success(entry, ran, started, counted_output=False)

    def _run(
        self,
        entry: ModelEntry,
        decoded: DecodedRequest,
        client_deadline: float | None,
        cancel: CancelToken,
        started: int,
    ) -> _Ran:
        """Admit and run a request that answers once: alone on a slot, or in a batch (a batching model)."""
        deadline = self.admission_deadline(entry, decoded.timeout_us, client_deadline)
        if not entry.batches:
            return self._run_on(entry.acquire_lease(deadline, cancel), decoded, cancel)
        metadata = entry.known_metadata()
        if metadata is not None:  # bad input is refused before it can join a batch
            metadata.check_request(decoded.signature, decoded.outputs)
        rows = next((shape[0] for _, shape in decoded.signature.values() if shape), 1)
        item = entry.run_batched(
            BatchItem(
                decoded.inputs, decoded.signature, decoded.outputs, rows, cancel, before_run=decoded.check_regions
            ),
            deadline,
            cancel,
        )
        outputs = item.outcome()
        return _Ran(
            item.metadata,
            item.version,
            item.started_ns - started,
            item.input_ns,
            item.infer_ns,
            rows,
            batched=True,
            outputs=outputs,
        )

    @staticmethod
    def _run_on(lease: Lease, decoded: DecodedRequest, cancel: CancelToken) -> _Ran:
        """Run a request alone on its leased slot, and free the slot."""
        try:
            decoded.check_regions()  # a region unregistered while the request waited is refused, not used
            if lease.streaming:
                raise InvalidRequest(f"model '{lease.entry.name}' streams its responses; call ModelStreamInfer")
            checked = time.perf_counter_ns()
            lease.metadata.check_request(decoded.signature, decoded.outputs)
            ran = time.perf_counter_ns()
            outputs = lease.execute(decoded.inputs, decoded.outputs, cancel)
            executed = time.perf_counter_ns()
        finally:
            lease.release()
        return _Ran(
            lease.metadata,
            lease.version,
            lease.queue_ns,
            ran - checked,
            executed - ran,
            decoded.batch_size(lease.metadata),
            outputs=outputs,
        )

    @staticmethod
    def _record_success(entry: ModelEntry, ran: _Ran, started: int, counted_output: bool = True) -> None:
        finished = time.perf_counter_ns()
        output_ns = finished - ran.finished_ns if counted_output else 0
        entry.statistics.record_success(
            queue_ns=ran.queue_ns,
            input_ns=ran.input_ns,
            infer_ns=ran.infer_ns,
            output_ns=output_ns,
            total_ns=finished - started,
            batch_size=ran.rows,
            executed=not ran.batched,
        )

    @staticmethod
    def _response(request: pb.ModelInferRequest, ran: _Ran, decoded: DecodedRequest, reservation: Reservation):
        """The response of a run; its outputs are counted in the request's reservation first (they are held
        until the response is sent)."""
        reservation.count_outputs(output_bytes(ran.outputs))
        response = pb.ModelInferResponse(model_name=request.model_name, model_version=ran.version, id=request.id)
        return encode_response(response, ran.outputs, ran.metadata, decoded.output_regions)


@dataclass
class _Ran:
    """What running one request gave, for its response and its statistics."""

    metadata: ModelMetadata
    version: str
    queue_ns: int
    input_ns: int = 0
    infer_ns: int = 0
    rows: int = 1  # the request's batch size
    batched: bool = False  # it ran in a batch, whose run is counted once by the batch
    outputs: dict | None = None
    finished_ns: int = field(default_factory=time.perf_counter_ns)  # when the run ended: the output time's start


def _finish(reservation: Reservation | None, decoded: DecodedRequest | None) -> None:
    """The request has ended: let go of its regions and give its tensor memory back."""
    try:
        if decoded is not None:
            decoded.release()
    finally:
        if reservation is not None:
            reservation.release()


def _unwrap(request) -> tuple[pb.ModelInferRequest, list | None]:
    if isinstance(request, InferRequest):
        return request.message, request.raw_contents
    return request, None


def _as_message(response) -> pb.ModelInferResponse:
    """Streams carry a whole ModelInferResponse inside each stream message."""
    return response.to_message() if isinstance(response, InferResponse) else response


def _timeout_override_allowed(entry: ModelEntry) -> bool:
    """A request's `timeout` shortens the admission timeout, unless the model's dynamic_batching queue policy
    says allow_timeout_override: false."""
    batching = entry.spec.batching
    return batching is None or batching.allow_timeout_override


def _earliest(a: float | None, b: float) -> float:
    return b if a is None or b < a else a


__all__ = ["Dataplane", "DecodedRequest", "check_version"]
