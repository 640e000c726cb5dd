"""A real OTLP/gRPC trace receiver for tests: a gRPC server implementing OpenTelemetry's
`opentelemetry.proto.collector.trace.v1.TraceService` (the opentelemetry-proto package's generated code), keeping
every span it is sent, flattened into `ReceivedSpan`s.

    with OtlpReceiver() as receiver:
        ... a server with --trace-config opentelemetry,url=<receiver.address> ...
        spans = receiver.spans()
"""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _plain(value: AnyValue) -> object:
    choice = value.WhichOneof("value")
    return None if choice is None else getattr(value, choice)


@dataclass(frozen=True)
class ReceivedEvent:
    name: str
    time_ns: int
    attributes: dict[str, object]


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, object]
    events: list[ReceivedEvent]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    trace_state: str
    resource: dict[str, object] = field(default_factory=dict)

    def event_names(self) -> list[str]:
        return [event.name for event in self.events]


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(self, request, context):  # noqa: N802 (the protocol's name)
        self._receiver._keep(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """Listens on 127.0.0.1:<free port> until closed; `spans()` is what arrived so far."""

    def __init__(self) -> None:
        self._lock = threading.Condition()  # guards: _spans, exports
        self._spans: list[ReceivedSpan] = []
        self.exports = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"

    def __enter__(self) -> OtlpReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None)

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def _keep(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: _plain(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            name=span.name,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            attributes={kv.key: _plain(kv.value) for kv in span.attributes},
                            events=[
                                ReceivedEvent(
                                    event.name,
                                    event.time_unix_nano,
                                    {kv.key: _plain(kv.value) for kv in event.attributes},
                                )
                                for event in span.events
                            ],
                            status_code=span.status.code,
                            status_message=span.status.message,
                            trace_state=span.trace_state,
                            resource=resource,
                        )
                    )
        with self._lock:
            self._spans.extend(received)
            self.exports += 1
            self._lock.notify_all()
