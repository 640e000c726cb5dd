"""`inference.GRPCInferenceService`: the KServe v2 / Open Inference Protocol with Triton's extensions.

Each RPC decodes its request, calls one core operation and encodes the answer with `converters.py`; ModelInfer
and ModelStreamInfer go through the dataplane with `tensors.py`'s encoders."""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any, NamedTuple, Protocol

import grpc
from google.protobuf import message_factory

from engine.errors import ExecutionError, OutOfSharedMemoryError
from engine.interface import CancelToken
from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc

from ...core.blocking import blocking_wait
from ...core.errors import ModelConfigFailed, ModelNotFound, ServiceError
from ...core.log_settings import LogControl, LogSettings
from ...core.outcomes import seen_by_client
from ...core.registry import ModelRegistry
from ...core.trace_settings import TraceMode, TraceSettings, TraceSettingsStore, UnknownTraceModel
from ...process.timers import Timer, TimerQueue
from ...request_path import stream_requests
from ...request_path.dataplane import Dataplane, InferenceRequest
from ...request_path.model_control import ModelControl
from ...request_path.stream_requests import StreamPlacement, StreamRequests
from .. import status_codes
from ..auth import Access
from ..shared_memory import CUDA_UNSUPPORTED, SharedMemoryRegistry, SharedMemoryUnsupported, disabled_message
from ..tensors import as_bytes, inference_request, wants_empty_final_response
from ..wire import InferRequest, parse_infer_request, serialize_infer_response
from . import converters
from .common import SHUTDOWN, AccessGate, CallKind, CallTracker, client_deadline, rpc

_LOG = logging.getLogger(__name__)

SERVER_NAME = "slotserve"
# After the shutdown grace, how long a stream may still write (its last responses, a shutting_down error) before
# its call is cancelled; less than service.process.server.SHUTDOWN_MARGIN, so its handler is joined, not abandoned.
SHUTDOWN_STREAM_SECONDS = 1.0
EXTENSIONS = (
    "model_repository",
    "model_configuration",
    "statistics",
    "parameters",
    "trace",  # TraceSetting (Triton's extension name)
    "logging",  # LogSettings (Triton's extension name)
    "slotserve_management",
)
SYSTEM_SHARED_MEMORY = "system_shared_memory"  # listed only when --shared-memory system is on

Context = grpc.ServicerContext
StreamAnswer = pb.ModelStreamInferResponse


class ServerState(Protocol):
    """What the inference service reads of the server (service.process.server.ServerState)."""

    def server_ready(self) -> bool: ...


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self,
        registry: ModelRegistry,
        dataplane: Dataplane,
        calls: CallTracker,
        access: AccessGate,
        server_state: ServerState,
        version: str,
        timers: TimerQueue,
        write_timeout: float,
        shared_memory: SharedMemoryRegistry | None = None,
        *,
        control: ModelControl,
        trace_settings: TraceSettingsStore | None = None,
        log_control: LogControl | None = None,
    ) -> None:
        self._registry = registry
        # Repository load/unload go through the model-control policy (service/request_path/model_control.py).
        self._control = control
        self._shared_memory = shared_memory
        self._extensions = EXTENSIONS + ((SYSTEM_SHARED_MEMORY,) if shared_memory is not None else ())
        self._dataplane = dataplane
        self.calls = calls  # read by `rpc`, as `access`
        self._timers = timers
        self._write_timeout = write_timeout
        self.access = access
        self._server_state = server_state
        self._version = version
        # Triton's trace and log settings (service/core/trace_settings.py, service/core/log_settings.py): off and
        # the process's logging unless the server hands its own.
        self._trace_settings = trace_settings if trace_settings is not None else TraceSettingsStore(TraceSettings())
        self._log_control = log_control if log_control is not None else LogControl()

    # ---- health and metadata --------------------------------------------------------------------------------
    # Liveness and readiness are OPEN: Kubernetes and load balancers probe without credentials. ModelReady is
    # the per-model probe (Triton counts it as health too) and answers only a boolean. Every other method
    # needs the inference token when one is set (rpc's default access, READ).

    @rpc(access=Access.OPEN)
    def ServerLive(self, request: pb.ServerLiveRequest, context: Context, token: CancelToken) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @rpc(access=Access.OPEN)
    def ServerReady(
        self, request: pb.ServerReadyRequest, context: Context, token: CancelToken
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._server_state.server_ready())

    @rpc(access=Access.OPEN)
    def ModelReady(self, request: pb.ModelReadyRequest, context: Context, token: CancelToken) -> pb.ModelReadyResponse:
        try:
            entry = self._registry.get(request.name, request.version)  # no version: the highest ready one
        except (ModelNotFound, ModelConfigFailed):
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=entry.is_ready())

    @rpc
    def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Context, token: CancelToken
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=self._version, extensions=self._extensions)

    @rpc
    def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: Context, token: CancelToken
    ) -> pb.ModelMetadataResponse:
        group = self._registry.versions(request.name)
        entry = group.find(request.version)
        ready = group.ready_versions() if not request.version else []  # read before the view (converters.py)
        return converters.model_metadata(entry.name, entry.view(), ready)

    @rpc
    def ModelConfig(
        self, request: pb.ModelConfigRequest, context: Context, token: CancelToken
    ) -> pb.ModelConfigResponse:
        entry = self._dataplane.resolve(request.name, request.version)
        return pb.ModelConfigResponse(config=converters.model_config(entry.name, entry.view()))

    @rpc
    def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: Context, token: CancelToken
    ) -> pb.ModelStatisticsResponse:
        if request.name and request.version:
            entries = [self._dataplane.resolve(request.name, request.version)]
        elif request.name:
            entries = self._registry.versions(request.name).entries()  # every version, as Triton
        else:
            entries = self._registry.entries()
        return converters.model_statistics(entries)

    # ---- inference ------------------------------------------------------------------------------------------

    @rpc(inference=True)
    def ModelInfer(self, request: InferRequest, context: Context, token: CancelToken) -> bytes:
        # Serialized inside the dataplane's accounting (as_bytes; the handler's serializer passes the bytes on):
        # a response that cannot be serialized is counted as a failure.
        call = inference_request(
            request.message, as_bytes, request.raw_contents, self._shared_memory, client_deadline(context)
        )
        return self._dataplane.infer(call, cancel=token)

    def ModelStreamInfer(
        self, request_iterator: Iterator[pb.ModelInferRequest], context: Context
    ) -> Iterator[StreamAnswer]:
        """Each request is answered on the stream; a failed one gets `error_message` and the stream goes on.

        The requests are read as they arrive and run at once, several at a time (up to
        stream_requests.MAX_IN_FLIGHT; then the stream is read on as they finish), each through the same admission,
        batching and sequence path as a ModelInfer: requests sent together to a batching model run as one batch.
        Their answers are written in Triton's order: a model that is not decoupled answers in the order of the
        requests, a decoupled model as it sends; the requests of one sequence run one after another, and a model
        that does not batch runs as many at once as it has slots (service/request_path/stream_requests.py has the rules,
        the threads and their stop). This handler's thread writes, and runs a request that comes alone.

        A request's next answer is made only after its previous one was written, so a streaming model's lease is
        held until its last response is written. A client that stops reading would block a send forever, so each
        send is bounded by the write timeout, after which the call is cancelled. A cancelled or failed stream
        cancels every request in flight, which releases their leases and memory.

        At the end of the shutdown grace (the token fires with reason "shutdown") the stream gets
        SHUTDOWN_STREAM_SECONDS to deliver what it still sends (a request cut short gets its `shutting_down`
        error_message); then the call is cancelled, so a handler blocked writing to a client that does not read,
        or a stream waiting for the next request of a client that keeps its side open, returns and is joined within
        the shutdown margin instead of being abandoned with its model's engine.

        Triton's `triton_grpc_error: true` header (the value exactly "true", sent when the stream opens): the first
        request whose run fails (`_ends_the_stream`) ends the stream with that error's status and message, and the
        requests still in flight are cancelled; nothing more is written (Triton's stream handler does the same). A
        request refused before it runs is answered with `error_message` as without the header.
        """
        self.access.abort_unless(Access.READ, "ModelStreamInfer", context)
        try:
            token = self.calls.begin(context, CallKind.INFERENCE)
        except ServiceError as error:
            status_codes.abort(context, error)
        stop_timer: list[Timer] = []

        def on_cancel() -> None:  # idempotent: a token may run a callback twice
            if token.reason == SHUTDOWN and not stop_timer:
                stop_timer.append(self._timers.arm(SHUTDOWN_STREAM_SECONDS, context.cancel))

        token.add_callback(on_cancel)
        failure = _StreamFailure(token) if _wants_grpc_errors(context) else None
        messages: Generator[StreamAnswer, None, None] | None = None
        try:
            requests = StreamRequests(
                self._stream_requests(request_iterator, client_deadline(context)),
                functools.partial(self._stream_one, failure=failure),
                token,
                limit=stream_requests.MAX_IN_FLIGHT,
            )
            stream = requests.messages()
            assert isinstance(stream, Generator)  # closing it cancels and joins the requests in flight
            messages = stream
            for message in messages:
                if failure is not None and (ended := failure.error()) is not None:
                    messages.close()  # what is still in flight was cancelled; nothing more is written
                    status_codes.abort(context, ended)
                timer = self._timers.arm(self._write_timeout, context.cancel)
                try:
                    yield message
                finally:  # also when the stream is closed at the yield (GeneratorExit)
                    timer.cancel()
        finally:
            if messages is not None:
                messages.close()
            token.remove_callback(on_cancel)
            for timer in stop_timer:
                timer.cancel()
            self.calls.end(token, CallKind.INFERENCE)

    def _stream_requests(
        self, request_iterator: Iterator[pb.ModelInferRequest], deadline: float | None
    ) -> Iterator[tuple[_StreamRequest, StreamPlacement]]:
        """The stream's requests as they are read (on a thread of the stream), each with its dataplane request and
        its place among the others."""
        for message in _each_message(request_iterator):
            call = inference_request(
                message, converters.stream_answer, shared_memory=self._shared_memory, client_deadline=deadline
            )
            yield _StreamRequest(message, call), self._dataplane.stream_placement(call)

    def _stream_one(
        self, request: _StreamRequest, cancel: CancelToken, *, failure: _StreamFailure | None = None
    ) -> Iterator[tuple[StreamAnswer, bool]]:
        """One request's messages on the stream, each with whether it is the request's last (run on a thread of
        the stream, with the request's own token). Each answer says whether it is the request's last
        (`triton_final_response`: the dataplane gives nothing after a final answer); a streaming model whose final
        flag came alone ends with an empty final answer when the client asked for one
        (`triton_enable_empty_final_response`), as on Triton. A failed request's error is its one last message
        (a streaming model's is made while its slot is held: see InferenceRequest.respond_end); with `failure` (the
        stream's `triton_grpc_error` header) a failed run's error is recorded there too, which ends the stream."""
        message = request.message
        ending: Callable[[BaseException | None, bool], StreamAnswer | None] = functools.partial(
            _stream_end, message, cancel, failure
        )
        responses = self._dataplane.infer_stream(dataclasses.replace(request.call, respond_end=ending), cancel=cancel)
        try:
            for response in responses:
                yield response, converters.is_final(response)
        except Exception as error:  # a failed request must not end the stream
            yield _stream_error(message, error, cancel, failure), True
        finally:
            responses.close()

    # ---- repository control ---------------------------------------------------------------------------------

    @rpc(access=Access.STATUS)
    def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Context, token: CancelToken
    ) -> pb.RepositoryIndexResponse:
        models = [(entry.name, entry.status()) for entry in self._registry.entries()]
        registered = {name for name, _ in models}
        unregistered = [
            (name, self._registry.unregistered_reason(name))
            for name in ([] if request.ready else self._registry.repository.names())
            if name not in registered
        ]
        return converters.repository_index(models, unregistered, ready_only=request.ready)

    @rpc(access=Access.MANAGE)
    def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Context, token: CancelToken
    ) -> pb.RepositoryModelLoadResponse:
        parameters = converters.load_parameters(request)
        self._control.load(request.model_name, parameters, cancel=token)  # its errors are in Triton's words
        return pb.RepositoryModelLoadResponse()

    @rpc(access=Access.MANAGE)
    def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Context, token: CancelToken
    ) -> pb.RepositoryModelUnloadResponse:
        try:
            self._control.unload(request.model_name, cancel=token)
        except ModelNotFound:
            pass  # as Triton: a model that does not exist is unloaded already, as a second unload finds it
        return pb.RepositoryModelUnloadResponse()

    # ---- system shared memory (service/transport/shared_memory.py); CUDA shared memory is not supported
    # ---------------- Like every guarded method these need the inference token when one is set: registering makes the
    # server map host memory, so it is never open.

    @rpc
    def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Context, token: CancelToken
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self._system_shared_memory("SystemSharedMemoryRegister").register(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    @rpc
    def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Context, token: CancelToken
    ) -> pb.SystemSharedMemoryStatusResponse:
        regions = self._system_shared_memory("SystemSharedMemoryStatus").status(request.name)
        return converters.shared_memory_status(regions)

    @rpc
    def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Context, token: CancelToken
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        # OK for an unknown name, and with shared memory off (nothing is registered): clients unregister
        # everything first to start clean, as Triton's examples do.
        if self._shared_memory is not None:
            if request.name:
                self._shared_memory.unregister(request.name)
            else:
                self._shared_memory.unregister_all()
        return pb.SystemSharedMemoryUnregisterResponse()

    @rpc
    def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: Context, token: CancelToken
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        return pb.CudaSharedMemoryUnregisterResponse()  # nothing can be registered

    @rpc
    def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: Context, token: CancelToken
    ) -> pb.CudaSharedMemoryRegisterResponse:
        raise SharedMemoryUnsupported(CUDA_UNSUPPORTED)

    @rpc
    def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: Context, token: CancelToken
    ) -> pb.CudaSharedMemoryStatusResponse:
        raise SharedMemoryUnsupported(CUDA_UNSUPPORTED)

    def _system_shared_memory(self, operation: str) -> SharedMemoryRegistry:
        if self._shared_memory is None:
            raise SharedMemoryUnsupported(disabled_message(operation))
        return self._shared_memory

    # ---- trace and log settings (Triton's extensions) ---------------------------------------------------------
    # Reading needs what every other call needs (READ). An update changes what the server records and logs for
    # everyone, so it needs the management token when one is set (Access.STATUS's rule), though not
    # --allow-management: it changes no model, and Triton lets any caller update (docs/observability.md).

    @rpc
    def TraceSetting(
        self, request: pb.TraceSettingRequest, context: Context, token: CancelToken
    ) -> pb.TraceSettingResponse:
        if request.settings:
            self.access.require(Access.STATUS, "TraceSetting (an update)", context)
        if request.model_name:
            self._known_model(request.model_name)
        if request.settings:
            changes = {name: list(value.value) for name, value in request.settings.items()}
            settings = self._trace_settings.update(request.model_name, changes)
        else:
            settings = self._trace_settings.settings(request.model_name)
        return _trace_setting_response(settings)

    @rpc
    def LogSettings(
        self, request: pb.LogSettingsRequest, context: Context, token: CancelToken
    ) -> pb.LogSettingsResponse:
        if request.settings:
            self.access.require(Access.STATUS, "LogSettings (an update)", context)
            settings = self._log_control.update({name: _log_value(value) for name, value in request.settings.items()})
        else:
            settings = self._log_control.settings()
        return _log_settings_response(settings)

    def _known_model(self, name: str) -> None:
        """Triton's check: TraceSetting for a model it does not serve is INVALID_ARGUMENT with these words."""
        try:
            self._registry.versions(name)
        except (ModelNotFound, ModelConfigFailed):
            raise UnknownTraceModel(name) from None


def _trace_setting_response(settings: TraceSettings) -> pb.TraceSettingResponse:
    """Triton's answer: level, rate, count (traces left), in triton mode log_frequency and trace_file, the mode, and
    in opentelemetry mode its options."""
    answer = pb.TraceSettingResponse()
    answer.settings["trace_level"].value.extend(settings.level_names())
    answer.settings["trace_rate"].value.append(str(settings.rate))
    answer.settings["trace_count"].value.append(str(settings.count))
    if settings.mode is TraceMode.TRITON:
        answer.settings["log_frequency"].value.append(str(settings.log_frequency))
        answer.settings["trace_file"].value.append(settings.file)
    answer.settings["trace_mode"].value.append(settings.mode.value)
    if settings.mode is TraceMode.OPENTELEMETRY:
        for name, value in settings.opentelemetry.items():
            # resource holds its KEY=VALUE pairs joined with ',' (service/process/trace_flags.py): one value each
            answer.settings[name].value.extend(value.split(",") if name == "resource" else [value])
    return answer


def _log_value(value: pb.LogSettingsRequest.SettingValue) -> object:
    """The value of one LogSettings field as Python's bool, int or str (None when the message set none)."""
    choice = value.WhichOneof("parameter_choice")
    return None if choice is None else getattr(value, choice)


def _log_settings_response(settings: LogSettings) -> pb.LogSettingsResponse:
    answer = pb.LogSettingsResponse()
    answer.settings["log_file"].string_param = settings.file
    answer.settings["log_info"].bool_param = settings.info
    answer.settings["log_warning"].bool_param = settings.warning
    answer.settings["log_error"].bool_param = settings.error
    answer.settings["log_verbose_level"].uint32_param = settings.verbose_level
    answer.settings["log_format"].string_param = settings.format
    return answer


_HANDLER_FACTORY: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler[Any, Any]]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def add_inference_servicer(servicer: InferenceServicer, server: grpc.Server) -> None:
    """Register the inference service like the generated `add_GRPCInferenceServiceServicer_to_server`, except
    that ModelInfer (de)serializes through service.transport.wire, which keeps large tensors out of protobuf's
    copies."""
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in service.methods:
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        factory = _HANDLER_FACTORY[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = factory(
            getattr(servicer, method.name),
            request_deserializer=request_class.FromString,
            response_serializer=response_class.SerializeToString,
        )
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        servicer.ModelInfer,
        request_deserializer=parse_infer_request,  # an InferRequest: raw inputs stay views of the received bytes
        response_serializer=serialize_infer_response,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


def _stream_end(
    message: pb.ModelInferRequest,
    cancel: CancelToken,
    failure: _StreamFailure | None,
    error: BaseException | None,
    final_sent: bool,
) -> StreamAnswer | None:
    """What ends a stream request after its answers: its error (see _stream_error), or an empty final answer if its
    last answer was not final and the client asked for one; else None."""
    if error is not None:
        return _stream_error(message, error, cancel, failure)
    if not final_sent and wants_empty_final_response(message):
        return converters.stream_empty_final(message)
    return None


def _stream_error(
    message: pb.ModelInferRequest, error: BaseException, cancel: CancelToken, failure: _StreamFailure | None
) -> StreamAnswer:
    """A failed stream request's one answer (with the request's id, final); a failed run's error is also recorded
    in `failure`, the `triton_grpc_error` stream's end."""
    if failure is not None and _ends_the_stream(error):
        failure.record(seen_by_client(error, cancel))
    _code, text, _reason = status_codes.describe(seen_by_client(error, cancel))
    return converters.stream_error(message, text)


GRPC_ERROR_HEADER = "triton_grpc_error"  # Triton's stream header: end the stream at a request's failed run


def _wants_grpc_errors(context: Context) -> bool:
    """Whether the stream was opened with Triton's `triton_grpc_error: true` (that value exactly, as Triton
    compares it)."""
    return any(key == GRPC_ERROR_HEADER and value == "true" for key, value in context.invocation_metadata() or ())


def _ends_the_stream(error: BaseException) -> bool:
    """Whether a request's error ends a `triton_grpc_error` stream: an error of its run (the model's: raised or
    answered with a TritonError; the engine's or the device's; the request's tensors not fitting a python model's
    shared memory), which Triton's handler gets in the request's response. A refusal before the run (a malformed
    request, an unknown model, a full queue, a sequence refusal) Triton answers as it is issued, on the stream."""
    return isinstance(error, (ExecutionError, OutOfSharedMemoryError))


GRPC_ERROR_CANCEL_REASON = "triton_grpc_error: a request of the stream failed"


class _StreamFailure:
    """The end of a `triton_grpc_error` stream: the first error of a request's run, for the stream's writer, which
    ends the call with its status before it writes anything more. Recording it cancels the call's token, so every
    request in flight is cancelled (as Triton cancels them) and a writer waiting on one of them (a request it runs
    itself, an earlier answer's turn) gets to the end at once."""

    def __init__(self, token: CancelToken) -> None:
        self._token = token
        self._lock = threading.Lock()  # guards: _error
        self._error: BaseException | None = None

    def record(self, error: BaseException) -> None:
        """Keep `error` if it is the first; then cancel the call's requests. Called by the stream's threads."""
        with self._lock:
            if self._error is not None:
                return
            self._error = error
        self._token.cancel(GRPC_ERROR_CANCEL_REASON)

    def error(self) -> BaseException | None:
        with self._lock:
            return self._error


class _StreamRequest(NamedTuple):
    """One request read from a stream: its message (for what the stream writes back) and the dataplane's request."""

    message: pb.ModelInferRequest
    call: InferenceRequest[StreamAnswer]


def _each_message(request_iterator: Iterator[pb.ModelInferRequest]) -> Iterator[pb.ModelInferRequest]:
    """A stream's requests, as they come. The wait for the client's next message is a wait elsewhere
    (blocking_wait: on a gRPC runner thread it steps aside; the stream's own threads read it, which no runner
    counts); it is taken for each read and never across a yield."""
    while True:
        with blocking_wait:
            request = next(request_iterator, None)
        if request is None:
            return
        yield request
