"""The one place the transport prototypes touch slotserve's API (keep it small: service/request_path/dataplane.py and
service/transport/wire.py are being reworked, and this module is what would follow them).

It builds slotserve's real core from a slotserve command line (the registry, the dataplane with its tensor
memory account, admission, statistics: `service.process.server.Server` without its gRPC server) and its real
`InferenceServicer`, and lets a front end call any unary method of it with bytes in and bytes out, through
`ShimContext`, a synchronous stand-in for grpc's ServicerContext: the servicer's own checks, CallTracker (its
cancel token), status mapping and ModelInfer's wire (de)serializers (service/transport/wire.py) all run unchanged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc
from google.protobuf import message_factory

from generated import grpc_service_pb2 as pb
from service.process.cli import build_parser, option_fields
from service.process.options import ServerOptions
from service.process.server import VERSION, Server
from service.transport.auth import Authenticator
from service.transport.servicers.common import AccessGate
from service.transport.servicers.inference import InferenceServicer
from service.transport.wire import parse_infer_request, serialize_infer_response

SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
SERVICE_NAME = SERVICE.full_name


class Abort(Exception):
    """The servicer ended the call with a status (ShimContext.abort / abort_with_status)."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata=()) -> None:
        super().__init__(details)
        self.code, self.details, self.trailing_metadata = code, details, tuple(trailing_metadata or ())


class ShimContext:
    """What slotserve's servicer uses of a grpc.ServicerContext, for a call whose transport lives elsewhere.

    `deadline` is on the monotonic clock (None: none). `metadata` is the call's invocation metadata. Callbacks
    added (the CallTracker's cancel token) run when the front end calls `finish()` (the call ended, however),
    or `cancel()` (the client went away)."""

    __slots__ = ("_deadline", "_metadata", "_callbacks", "_done")

    def __init__(self, deadline: float | None = None, metadata=()) -> None:
        self._deadline = deadline
        self._metadata = tuple(metadata or ())
        self._callbacks: list = []
        self._done = False

    def add_callback(self, callback) -> bool:
        if self._done:
            return False
        self._callbacks.append(callback)
        return True

    def finish(self) -> None:
        self._done = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    cancel = finish

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def invocation_metadata(self):
        return self._metadata

    def peer(self) -> str:
        return "transport-prototype"

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Abort(code, details)

    def abort_with_status(self, status) -> None:
        raise Abort(status.code, status.details, status.trailing_metadata)

    def set_trailing_metadata(self, metadata) -> None:
        pass


@dataclass(frozen=True)
class Method:
    """One unary method of the inference service: its servicer function and its (de)serializers."""

    name: str
    handler: object  # servicer method (request, context) -> response
    deserialize: object  # bytes -> request
    serialize: object  # response -> bytes


def core_server(argv: list[str]) -> Server:
    """slotserve's core from a slotserve command line, started (models registered and loaded as the flags say)
    but without a gRPC server."""
    args = build_parser().parse_args(argv)
    server = Server(ServerOptions(**option_fields(args)))
    server.residency.start()
    server.control.start()
    server.state.ready = True
    return server


def inference_servicer(server: Server) -> InferenceServicer:
    """The servicer `Server._build_grpc` would register (the management gate: permission as configured)."""
    options = server.options
    return InferenceServicer(
        server.registry,
        server.dataplane,
        server.calls,
        AccessGate(options.allow_management, Authenticator(options.management_token, options.inference_token)),
        server.state,
        VERSION,
        server.timers,
        options.stream_write_timeout,
        server.shared_memory,
        control=server.control,
    )


def unary_methods(servicer: InferenceServicer) -> dict[str, Method]:
    """Every unary method of the service (ModelStreamInfer is left out: no prototype streams)."""
    methods = {}
    for method in SERVICE.methods:
        if method.client_streaming or method.server_streaming:
            continue
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        methods[method.name] = Method(
            method.name, getattr(servicer, method.name), request_class.FromString, response_class.SerializeToString
        )
    methods["ModelInfer"] = Method("ModelInfer", servicer.ModelInfer, parse_infer_request, serialize_infer_response)
    return methods


def call(method: Method, request, context: ShimContext) -> bytes:
    """Run one call to completion on this thread: bytes of the response, or Abort with its status. Blocks as the
    servicer blocks (for ModelInfer: queueing for a slot, the run)."""
    try:
        return method.serialize(method.handler(request, context))
    finally:
        context.finish()


def model_name(request) -> str:
    """The model a ModelInfer request names (for the inline decision)."""
    message = getattr(request, "message", request)
    return message.model_name


def mean_infer_us(server: Server, name: str) -> tuple[int, float]:
    """(runs counted, mean engine run time in µs) of a model from its statistics; (0, nan) when unknown."""
    try:
        snapshot = server.registry.get(name).statistics.snapshot()
    except Exception:
        return 0, float("nan")
    infer = snapshot.compute_infer
    return infer.count, (infer.ns / infer.count / 1000 if infer.count else float("nan"))


def split_argv(argv: list[str] | None) -> tuple[list[str], list[str]]:
    """A prototype's own flags, and slotserve's (everything after `--`)."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]
