"""The inference path, independent of the transport: find the model, decode, admit, run, encode, count.

The gRPC servicer calls `infer` / `infer_stream` with the request message, the client's deadline and a cancel
token; everything else (FIFO admission, lazy loading, statistics) happens here and below. Nothing here
imports grpc.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from engine.interface import CancelToken
from generated import grpc_service_pb2 as pb

from .errors import InvalidRequest, ModelNotFound
from .events import RejectionLog
from .lifecycle import Lease, ModelEntry
from .outcomes import REJECTIONS, outcome_of
from .registry import ModelRegistry
from .shared_memory import SharedMemoryRegistry
from .tensors import DecodedRequest, decode_request, encode_response
from .wire import InferRequest, InferResponse

_LOG = logging.getLogger(__name__)


def check_version(entry: ModelEntry, version: str) -> None:
    """Raise unless `version` is empty or the model's version. Non-numeric versions are malformed."""
    if not version or version == entry.spec.version:
        return
    if not version.isdigit():
        raise InvalidRequest(f"model version must be a number, got '{version}'")
    raise ModelNotFound(entry.name, version)


class Dataplane:
    def __init__(self, registry: ModelRegistry, clock: Callable[[], float] = time.monotonic,
                 shared_memory: SharedMemoryRegistry | None = None) -> None:
        self.registry = registry
        self.shared_memory = shared_memory
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

    def _record_failure(self, entry: ModelEntry, error: BaseException, cancel: CancelToken | None,
                        started: int) -> None:
        """Count a request that did not succeed under its outcome; a refusal also gets a (rate-limited) log line
        with the message its client got (never internal details: those are logged where they arise)."""
        outcome = outcome_of(error, cancel)
        entry.statistics.record_failure(time.perf_counter_ns() - started, outcome)
        if outcome in REJECTIONS:
            self.rejections.note(entry.name, outcome, str(error))

    def resolve(self, name: str, version: str) -> ModelEntry:
        entry = self.registry.get(name)
        check_version(entry, version)
        return entry

    def admission_deadline(self, entry: ModelEntry, timeout_us: int, client_deadline: float | None) -> float | None:
        """The earliest of: the model's admission timeout, the request's `timeout` parameter (which can only
        shorten it), and the client's own deadline. None: wait without limit."""
        now = self._clock()
        deadline = client_deadline
        model_timeout = entry.settings.admission_timeout
        if model_timeout > 0:
            deadline = _earliest(deadline, now + model_timeout)
        if timeout_us > 0:
            deadline = _earliest(deadline, now + timeout_us / 1e6)
        return deadline

    def infer(self, request: pb.ModelInferRequest | InferRequest, *, client_deadline: float | None = None,
              cancel: CancelToken | None = None) -> pb.ModelInferResponse | InferResponse:
        """Run one request to completion. Blocks while queued (until the admission deadline), while the model
        loads, and for the run. Returns the response message, or an InferResponse (large outputs kept out of
        the message for the wire layer). Raises the core's errors (see status_codes.py for how they map)."""
        started = time.perf_counter_ns()
        request, raw_contents = _unwrap(request)
        entry = self._request_entry(request.model_name)
        cancel = cancel or CancelToken()
        decoded = None
        try:
            check_version(entry, request.model_version)
            decoded = decode_request(request, raw_contents, self.shared_memory)
            lease = entry.acquire_lease(
                self.admission_deadline(entry, decoded.timeout_us, client_deadline), cancel)
            try:
                decoded.check_regions()
                if lease.pool.primary.streaming:
                    raise InvalidRequest(
                        f"model '{entry.name}' streams its responses; call ModelStreamInfer")
                checked = time.perf_counter_ns()
                lease.metadata.check_request(decoded.signature, decoded.outputs)
                ran = time.perf_counter_ns()
                outputs = lease.execute(decoded.inputs, decoded.outputs, cancel)
                executed = time.perf_counter_ns()
            finally:
                lease.release()
            response = self._response(request, lease, outputs, decoded)
        except BaseException as error:
            self._record_failure(entry, error, cancel, started)
            raise
        finally:
            if decoded is not None:
                decoded.release()
        finished = time.perf_counter_ns()
        entry.statistics.record_success(
            queue_ns=lease.queue_ns, input_ns=ran - checked, infer_ns=executed - ran, output_ns=finished - executed,
            total_ns=finished - started, batch_size=decoded.batch_size(lease.metadata))
        return response

    def infer_stream(self, request: pb.ModelInferRequest, *, client_deadline: float | None = None,
                     cancel: CancelToken | None = None) -> Iterator[pb.ModelInferResponse]:
        """Responses for one request on a stream: one for an ordinary model, several for a streaming model.

        The lease is held until the last response is taken from this generator, the generator is closed, or
        it raises; closing it (as a cancelled stream does) releases the slot.
        """
        started = time.perf_counter_ns()
        request, raw_contents = _unwrap(request)
        entry = self._request_entry(request.model_name)
        lease = None
        recorded = False
        cancel = cancel or CancelToken()
        decoded = None
        try:
            check_version(entry, request.model_version)
            decoded = decode_request(request, raw_contents, self.shared_memory)
            lease = entry.acquire_lease(
                self.admission_deadline(entry, decoded.timeout_us, client_deadline), cancel)
            decoded.check_regions()
            lease.metadata.check_request(decoded.signature, decoded.outputs)
            ran = time.perf_counter_ns()
            if lease.pool.primary.streaming:
                for outputs in lease.execute_stream(decoded.inputs, decoded.outputs, cancel):
                    yield _as_message(self._response(request, lease, outputs, decoded))
                executed = time.perf_counter_ns()
                lease.release()
                self._record_stream_success(entry, lease, decoded, started, ran, executed)
                recorded = True
            else:
                outputs = lease.execute(decoded.inputs, decoded.outputs, cancel)
                executed = time.perf_counter_ns()
                lease.release()
                response = _as_message(self._response(request, lease, outputs, decoded))
                # Counted before the yield, as ModelInfer counts before returning: a stream cancelled right
                # after this answer never resumes the generator, and the answer was complete.
                self._record_stream_success(entry, lease, decoded, started, ran, executed)
                recorded = True
                yield response
        except BaseException as error:
            if not recorded:
                self._record_failure(entry, error, cancel, started)
            raise
        finally:
            if lease is not None:
                lease.release()
            if decoded is not None:
                decoded.release()

    @staticmethod
    def _record_stream_success(entry, lease: Lease, decoded: DecodedRequest, started: int, ran: int,
                               executed: int) -> None:
        finished = time.perf_counter_ns()
        entry.statistics.record_success(
            queue_ns=lease.queue_ns, input_ns=0, infer_ns=executed - ran, output_ns=finished - executed,
            total_ns=finished - started, batch_size=decoded.batch_size(lease.metadata))

    @staticmethod
    def _response(request: pb.ModelInferRequest, lease: Lease, outputs: dict, decoded: DecodedRequest):
        response = pb.ModelInferResponse(model_name=request.model_name, model_version=lease.version, id=request.id)
        return encode_response(response, outputs, lease.metadata, decoded.output_regions)


def _unwrap(request) -> tuple[pb.ModelInferRequest, list | None]:
    if isinstance(request, InferRequest):
        return request.message, request.raw_contents
    return request, None


def _as_message(response) -> pb.ModelInferResponse:
    """Streams carry a whole ModelInferResponse inside each stream message."""
    return response.to_message() if isinstance(response, InferResponse) else response


def _earliest(a: float | None, b: float) -> float:
    return b if a is None or b < a else a


__all__ = ["Dataplane", "DecodedRequest", "check_version"]
