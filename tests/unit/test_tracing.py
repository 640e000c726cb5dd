"""The per-request trace recorder (service/core/tracing.py) and the pure parts of its outputs
(service/process/trace_output.py): W3C traceparent parsing, one emission per trace tree whatever order its traces
end in, sampling (rate, a traced parent, a client context in opentelemetry mode), Triton's record format, the OTLP
endpoint and resource."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np
import pytest

from service.core.trace_settings import Sampled, TraceLevel, TraceMode, TraceSettings, TraceSettingsStore
from service.core.tracing import (
    ACTIVITIES,
    RemoteParent,
    RequestTrace,
    TraceContext,
    Tracer,
    parse_traceparent,
)
from service.process.trace_output import _endpoint, _resource, frontend_timestamps, triton_records, triton_version

ON = TraceSettings(levels=frozenset({TraceLevel.TIMESTAMPS}), rate=1, file="/dev/null")


class Sink:
    def __init__(self) -> None:
        self.emitted: list[RequestTrace] = []

    def emit(self, trace: RequestTrace) -> None:
        self.emitted.append(trace)


def a_trace(sink: Sink, model: str = "m", **kwargs) -> RequestTrace:
    return RequestTrace(model, Sampled(model, ON), sink, **kwargs)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0xF067AA0BA902B7, 1),
        ),
        (
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0xF067AA0BA902B7, 0),
        ),
        (
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later",
            (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0xF067AA0BA902B7, 1),
        ),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),  # all-zero trace id
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", None),  # all-zero span id
        ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),  # version ff is invalid
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", None),  # version 00 has four fields
        ("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", None),  # a digit short
        ("00-xyz92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),
        ("", None),
    ],
)
def test_traceparent_is_read_as_w3c_trace_context_says(header, expected):
    parsed = parse_traceparent(header, " vendor=1 ")
    if expected is None:
        assert parsed is None
    else:
        assert parsed == RemoteParent(*expected, tracestate="vendor=1")


def test_a_tree_is_emitted_once_when_its_last_trace_ends_whatever_the_order():
    sink = Sink()
    root = a_trace(sink, request_id="r")
    first = root.child("step", kind="ensemble step")
    assert first is not None
    grandchild = first.child("callee", kind="bls")
    assert grandchild is not None
    first.finish()
    root.finish()  # the grandchild is still open: nothing is emitted yet
    assert sink.emitted == []
    grandchild.finish("server_busy", RuntimeError("queue full"))
    assert sink.emitted == [root]
    assert [trace.model for trace in root.walk()] == ["m", "step", "callee"]
    assert (grandchild.parent, first.parent) == (first, root)
    assert grandchild.attributes["call"] == "bls" and first.attributes["call"] == "ensemble step"
    assert (grandchild.outcome, grandchild.error_reason, grandchild.error_message) == (
        "server_busy",
        "server_busy",
        "queue full",
    )
    assert root.id < first.id < grandchild.id  # Triton's ids: a child's after its parent's
    # a call made after the tree was handed over is not recorded (and nothing is emitted twice)
    assert root.child("late", kind="bls") is None
    root.finish()
    assert sink.emitted == [root]


def test_finish_stamps_request_end_and_the_outcome_event():
    sink = Sink()
    trace = a_trace(sink, started_ns=100)
    trace.stamp("QUEUE_START", 150)
    trace.finish(ns=300)
    assert trace.timestamps == [("REQUEST_START", 100), ("QUEUE_START", 150), ("REQUEST_END", 300)]
    assert [(event.name, event.ns, dict(event.attributes)) for event in trace.events] == [
        ("outcome", 300, {"outcome": "success"})
    ]


def test_admission_and_compute_record_the_phases():
    trace = a_trace(Sink())
    queued = trace.queued(queue_length=4, model_ready=False)
    granted = trace.admitted(queued, loaded=True)
    trace.computed(granted + 1, granted + 2, granted + 5, granted + 6, backend="python")
    names = [span.name for span in trace.spans]
    assert names == ["admission wait", "initialization", "execute", "slot held"]
    assert trace.attributes["queue.position_at_arrival"] == 4
    execute = trace.spans[2]
    assert (execute.start_ns, execute.end_ns, execute.attributes["backend"]) == (granted + 2, granted + 5, "python")
    assert (trace.spans[3].start_ns, trace.spans[3].end_ns) == (granted, granted + 6)
    assert [name for name, _ in trace.timestamps] == list(ACTIVITIES[:-1])


def test_the_admissions_own_wait_ends_the_admission_span_and_the_load_follows_it():
    trace = a_trace(Sink())
    queued = trace.queued(queue_length=1, model_ready=False)
    now = trace.admitted(queued, loaded=True, admission_ns=0)
    wait, initialization = trace.spans
    assert (wait.name, wait.start_ns, wait.end_ns, wait.attributes["wait_ns"]) == ("admission wait", queued, queued, 0)
    assert (initialization.name, initialization.start_ns, initialization.end_ns) == ("initialization", queued, now)
    later = a_trace(Sink())
    queued = later.queued(queue_length=0, model_ready=True)
    later.admitted(queued, admission_ns=10**15)  # a wait longer than the time that passed: bounded by now
    assert later.spans[0].end_ns <= later.granted_ns


def test_a_refused_admission_records_the_wait_and_no_initialization():
    trace = a_trace(Sink())
    queued = trace.queued(queue_length=0, model_ready=False)
    trace.admitted(queued, TimeoutError("late"), loaded=True)
    assert [span.name for span in trace.spans] == ["admission wait"]
    assert trace.spans[0].attributes["refused"] == "TimeoutError"


def store(settings: TraceSettings) -> TraceSettingsStore:
    return TraceSettingsStore(settings)


def test_sampling_by_rate_and_a_traced_parent_always_traces_its_calls():
    sink = Sink()
    tracer = Tracer(store(TraceSettings(levels=ON.levels, rate=2, file="f")), sink)
    grpc = TraceContext("GRPC")
    sampled = [tracer.start("m", "", grpc, None, 0) is not None for _ in range(4)]
    assert sampled == [False, True, False, True]
    parent = a_trace(sink)
    child = tracer.start("callee", "", None, parent, 7, kind="bls")
    assert child is not None and child.parent is parent and child.timestamps[0] == ("REQUEST_START", 7)


def test_a_client_context_forces_a_trace_in_opentelemetry_mode_only():
    header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    otel = TraceSettings(levels=ON.levels, rate=1000, mode=TraceMode.OPENTELEMETRY)
    traced = Tracer(store(otel)).start("m", "", TraceContext("GRPC", header, "k=v"), None, 0)
    assert traced is not None and traced.remote is not None and traced.remote.tracestate == "k=v"
    assert Tracer(store(otel)).start("m", "", TraceContext("GRPC", "garbage"), None, 0) is None
    triton = TraceSettings(levels=ON.levels, rate=1000, file="f")
    assert Tracer(store(triton)).start("m", "", TraceContext("GRPC", header), None, 0) is None
    off = TraceSettings(mode=TraceMode.OPENTELEMETRY)  # level OFF: nothing, context or not
    assert Tracer(store(off)).start("m", "", TraceContext("GRPC", header), None, 0) is None


def test_tritons_records_head_each_trace_then_its_timestamps_in_time_order():
    sink = Sink()
    root = a_trace(sink, "ens", request_id="r1", frontend="GRPC", started_ns=10)
    root.set_version("2")
    step = root.child("step", kind="ensemble step")
    assert step is not None
    step.set_version("latest")
    step.finish(ns=40)
    root.span("encode", 50, 60)
    root.finish(ns=70)
    records = triton_records(root)
    assert records[0] == {"id": root.id, "model_name": "ens", "model_version": 2, "request_id": "r1"}
    names = [r["timestamps"][0]["name"] for r in records if r["id"] == root.id and "timestamps" in r]
    assert names == [
        "GRPC_WAITREAD_START",
        "GRPC_WAITREAD_END",
        "REQUEST_START",
        "GRPC_SEND_START",
        "GRPC_SEND_END",
        "REQUEST_END",
    ]
    head = next(r for r in records if r["id"] == step.id and "model_name" in r)
    assert head == {"id": step.id, "model_name": "step", "model_version": -1, "parent_id": root.id}
    assert frontend_timestamps(step) == []  # a child came from inside the server
    assert triton_version("") == -1


def test_otlp_endpoint_and_resource_from_tritons_settings():
    assert _endpoint("localhost:4317") == ("localhost:4317", True)
    assert _endpoint("http://collector:4318/v1/traces") == ("collector:4318", True)
    assert _endpoint("https://collector:443") == ("collector:443", False)
    assert _resource(MappingProxyType({"resource": "service.name=triton,deployment=eu"})) == {
        "service.name": "triton",
        "deployment": "eu",
    }
    assert _resource({}) == {"service.name": "slotserve"}


def test_tensor_values_are_written_as_tritons_trace_writes_them():
    from service.core.tracing import tensor_text

    assert tensor_text(np.array([[1, -2], [3, 4]], np.int32), "INT32") == "1,-2,3,4"
    assert tensor_text(np.array([0.5, 1.0, 1e-7], np.float32), "FP32") == "0.5,1,1e-07"
    assert tensor_text(np.array([True, False]), "BOOL") == "1,0"
    assert tensor_text(np.array([b"a b", "c"], dtype=object), "BYTES") == '"a b","c"'
    assert tensor_text(np.array([1.5], np.float16), "FP16") == ""  # Triton writes no FP16/BF16 values
