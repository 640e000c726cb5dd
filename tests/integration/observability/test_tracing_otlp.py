"""Request traces exported over OTLP/gRPC to a real receiver (otlp_receiver.py: opentelemetry-proto's TraceService on a
real port), from real requests on a real server: an ONNX model with the client's W3C traceparent, a python model
whose BLS calls are child spans, an ensemble whose python step makes BLS calls (grandchildren), a batching model's
batch, a refused request with its reason; tracing off sends nothing.

The server is stopped before the spans are read: its shutdown flushes the SDK's batch span processor, so every span
of every finished request has arrived by then (no waiting on timing)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import MappingProxyType

import numpy as np
import pytest

from client import ClientError, InferenceClient
from service.core.trace_settings import TraceLevel, TraceMode, TraceSettings
from service.testing import serve
from tests.integration._support import demo_subset
from tests.integration.ensembles.test_ensembles import write_ensemble
from tests.integration.python_models.test_bls import CHAIN, CHAIN_IO, python_repository
from tests.integration.python_models.test_python_models import write_model

from .otlp_receiver import OtlpReceiver, ReceivedSpan

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
X = np.arange(16, dtype=np.int32).reshape(1, 16)
PHASES = {"decode", "admission wait", "slot held", "execute", "encode"}
ACTIVITIES = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]


def otel_settings(receiver: OtlpReceiver, *, levels=frozenset({TraceLevel.TIMESTAMPS}), rate: int = 1) -> TraceSettings:
    return TraceSettings(
        levels=levels,
        rate=rate,
        mode=TraceMode.OPENTELEMETRY,
        opentelemetry=MappingProxyType({"url": receiver.address, "resource": "service.name=traced-test"}),
    )


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return [span for span in spans if span.parent_span_id == parent.span_id]


def model_spans(spans: list[ReceivedSpan], model: str) -> list[ReceivedSpan]:
    return [span for span in spans if span.name == model and span.attributes.get("model_name") == model]


def activities(span: ReceivedSpan) -> list[str]:
    return [name for name in span.event_names() if name in ACTIVITIES]


def test_an_onnx_request_is_a_child_of_the_clients_traceparent_with_its_phases(receiver, tmp_path):
    repo = demo_subset(tmp_path / "repo", "simple")
    with serve(repo, trace_settings=otel_settings(receiver)) as running:
        metadata = (("traceparent", TRACEPARENT), ("tracestate", "vendor=value"))
        with InferenceClient(running.address, metadata=metadata) as client:
            client.infer("simple", {"INPUT0": X, "INPUT1": X}, request_id="req-1")
    spans = receiver.spans()
    (top,) = [span for span in spans if span.name == "InferRequest"]
    assert (top.trace_id, top.parent_span_id) == (CLIENT_TRACE, CLIENT_SPAN)  # the client's span is the parent
    assert top.trace_state == "vendor=value"
    assert top.resource["service.name"] == "traced-test"
    assert top.event_names()[:2] == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"]
    (model,) = children(spans, top)
    assert model.name == "simple"
    assert model.attributes["model_version"] == 1 and model.attributes["request_id"] == "req-1"
    assert model.attributes["outcome"] == "success" and model.status_code != 2
    assert model.attributes["queue.position_at_arrival"] == 0
    assert activities(model) == ACTIVITIES  # Triton's activities, in order
    phases = {span.name: span for span in children(spans, model)}
    assert PHASES <= set(phases)
    assert phases["execute"].attributes["backend"] == "onnxruntime"
    assert all(span.trace_id == CLIENT_TRACE for span in spans)
    # the phases lie inside the request and in the order the request went through them
    assert top.start_ns <= phases["decode"].start_ns <= phases["admission wait"].start_ns
    assert phases["admission wait"].end_ns <= phases["execute"].start_ns <= phases["execute"].end_ns
    assert phases["execute"].end_ns <= phases["encode"].start_ns <= phases["encode"].end_ns <= top.end_ns


def test_bls_calls_and_an_ensembles_steps_are_child_spans_of_their_caller(receiver, tmp_path):
    root = python_repository(tmp_path, "add_sub")
    demo_subset(root, "simple")
    write_model(root, "chain", CHAIN, CHAIN_IO)
    write_ensemble(
        root,
        "pipeline",
        [("X", "TYPE_INT32", [16])],
        [("Y", "TYPE_INT32", [16])],
        [("chain", {"X": "X"}, {"Y": "Y"})],
        max_batch_size=8,
    )
    with serve(root, trace_settings=otel_settings(receiver)) as running:
        running.client.infer("chain", {"X": X})
        running.client.infer("pipeline", {"X": X})
    spans = receiver.spans()
    tops = [span for span in spans if span.name == "InferRequest"]
    assert len(tops) == 2 and all(top.parent_span_id == "" for top in tops)  # no client context: new traces
    # the python model called directly: its two BLS calls under it
    direct = next(span for span in model_spans(spans, "chain") if span.attributes.get("call") is None)
    calls = children(spans, direct)
    bls = sorted((span for span in calls if span.attributes.get("call") == "bls"), key=lambda span: span.start_ns)
    assert [span.name for span in bls] == ["simple", "add_sub"]  # in the order the model made them
    for call in bls:
        assert call.trace_id == direct.trace_id
        assert call.attributes["parent_id"] == direct.attributes["triton.trace_id"]
        assert activities(call) == ACTIVITIES
        assert direct.start_ns <= call.start_ns <= call.end_ns <= direct.end_ns
    # the model's own execute time, measured in its worker: inside the round trip, around its BLS calls
    (execute,) = [span for span in calls if span.name == "execute"]
    model_ns = execute.attributes["model_ns"]
    assert max(call.end_ns - call.start_ns for call in bls) <= model_ns <= execute.end_ns - execute.start_ns
    assert "model_ns" not in next(span for span in children(spans, bls[0]) if span.name == "execute").attributes
    # the ensemble: its step (the same python model) under it, the step's BLS calls under the step
    (ensemble,) = model_spans(spans, "pipeline")
    (step,) = [span for span in children(spans, ensemble) if span.attributes.get("call") == "ensemble step"]
    assert step.name == "chain" and step.attributes["parent_id"] == ensemble.attributes["triton.trace_id"]
    grandchildren = [span for span in children(spans, step) if span.attributes.get("call") == "bls"]
    assert sorted(span.name for span in grandchildren) == ["add_sub", "simple"]
    assert {span.trace_id for span in [ensemble, step, *grandchildren]} == {ensemble.trace_id}
    assert ensemble.trace_id != direct.trace_id


def test_a_batch_is_an_event_naming_its_rows_and_the_batch_every_member_shares(receiver):
    from tests.python_models import REPOSITORY

    barrier = threading.Barrier(3)
    errors: list[BaseException] = []
    with serve(REPOSITORY, trace_settings=otel_settings(receiver), load_at_startup=False) as running:
        running.client.infer("batched", {"INPUT0": np.ones((1, 4), np.float32)})  # loaded: the batch below is warm

        def one() -> None:
            try:
                barrier.wait(30)
                running.client.infer("batched", {"INPUT0": np.ones((1, 4), np.float32)})
            except BaseException as error:  # noqa: BLE001 (reported below)
                errors.append(error)

        threads = [threading.Thread(target=one) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert errors == []
    members = model_spans(receiver.spans(), "batched")[-3:]
    batches = [next(e for e in span.events if e.name == "batch formed") for span in members]
    # preferred_batch_size 3, a 2 s delay: the three requests sent together ran as one batch of 3 rows
    assert {event.attributes["rows"] for event in batches} == {3}
    assert {event.attributes["members"] for event in batches} == {3}
    assert len({event.attributes["batch_id"] for event in batches}) == 1
    for span in members:
        assert activities(span) == ACTIVITIES


def test_a_refused_request_ends_with_its_reason_and_an_error_status(receiver, tmp_path):
    repo = demo_subset(tmp_path / "repo", "simple")
    with serve(repo, trace_settings=otel_settings(receiver)) as running:
        with pytest.raises(ClientError):
            running.client.infer("simple", {"INPUT0": X, "INPUT1": X.astype(np.float32)})  # INPUT1 is INT32
        running.client.infer("simple", {"INPUT0": X, "INPUT1": X})  # the server serves on
    spans = model_spans(receiver.spans(), "simple")
    refused = next(span for span in spans if span.attributes["outcome"] != "success")
    assert refused.attributes["outcome"] == "invalid_request_error"
    assert refused.attributes["error_reason"] == "invalid_request_error"
    assert "INPUT1" in str(refused.attributes["error_message"])
    assert refused.status_code == 2 and refused.status_message.startswith("invalid_request_error")
    outcome = next(event for event in refused.events if event.name == "outcome")
    assert outcome.attributes == {"outcome": "invalid_request_error", "error_reason": "invalid_request_error"}
    assert "REQUEST_END" in refused.event_names() and "COMPUTE_START" not in refused.event_names()
    assert sum(span.attributes["outcome"] == "success" for span in spans) == 1


def test_rate_samples_one_request_in_rate(receiver, tmp_path):
    repo = demo_subset(tmp_path / "repo", "simple")
    with serve(repo, trace_settings=otel_settings(receiver, rate=3)) as running:
        for _ in range(7):
            running.client.infer("simple", {"INPUT0": X, "INPUT1": X})
    assert len(model_spans(receiver.spans(), "simple")) == 2  # the 3rd and the 6th


def test_a_client_traceparent_is_traced_whatever_the_rate_as_triton_does(receiver, tmp_path):
    repo = demo_subset(tmp_path / "repo", "simple")
    with serve(repo, trace_settings=otel_settings(receiver, rate=1000)) as running:
        with InferenceClient(running.address, metadata=(("traceparent", TRACEPARENT),)) as client:
            client.infer("simple", {"INPUT0": X, "INPUT1": X})
        running.client.infer("simple", {"INPUT0": X, "INPUT1": X})  # no context: sampled by rate, not traced
    (span,) = model_spans(receiver.spans(), "simple")
    assert span.trace_id == CLIENT_TRACE


def test_tracing_off_sends_nothing(receiver, tmp_path):
    repo = demo_subset(tmp_path / "repo", "simple")
    with serve(repo, trace_settings=otel_settings(receiver, levels=frozenset())) as running:
        with InferenceClient(running.address, metadata=(("traceparent", TRACEPARENT),)) as client:
            client.infer("simple", {"INPUT0": X, "INPUT1": X})
        assert running.server.dataplane.tracing_on is False
    assert receiver.spans() == [] and receiver.exports == 0


@pytest.mark.parametrize("strategy", ["direct", "oldest"])
def test_a_sequence_request_records_its_sequence_slot_then_its_run(receiver, tmp_path, strategy):
    from tests.sequence_models import SequenceOptions, write_onnx_echo

    write_onnx_echo(tmp_path / "repo", "seq", SequenceOptions(strategy=strategy))
    with serve(tmp_path / "repo", trace_settings=otel_settings(receiver)) as running:
        for flags in ({"sequence_start": True}, {"sequence_end": True}):
            running.client.infer("seq", {"INPUT": np.array([[1]], np.int32)}, parameters={"sequence_id": 42, **flags})
    spans = receiver.spans()
    requests = sorted(model_spans(spans, "seq"), key=lambda span: span.start_ns)
    assert len(requests) == 2
    for request in requests:
        assert activities(request) == ACTIVITIES
        phases = {span.name: span for span in children(spans, request)}
        assert phases["sequence slot"].attributes["sequence_id"] == "42"
        assert phases["sequence slot"].end_ns <= phases["admission wait"].start_ns  # its turn, then its slot
        assert "execute" in phases
        assert ("batch formed" in request.event_names()) == (strategy == "oldest")


def test_each_request_of_a_stream_is_traced_under_the_streams_traceparent(receiver, tmp_path):
    repo = demo_subset(tmp_path / "repo", "simple")
    with serve(repo, trace_settings=otel_settings(receiver)) as running:
        with InferenceClient(running.address, metadata=(("traceparent", TRACEPARENT),)) as client:
            answers = list(client.stream_infer("simple", [{"INPUT0": X, "INPUT1": X}] * 3))
    assert len(answers) == 3 and not any(isinstance(answer, ClientError) for answer in answers)
    spans = receiver.spans()
    tops = [span for span in spans if span.name == "InferRequest"]
    assert len(tops) == 3 and {(top.trace_id, top.parent_span_id) for top in tops} == {(CLIENT_TRACE, CLIENT_SPAN)}
    for top in tops:
        (model,) = children(spans, top)
        assert activities(model) == ACTIVITIES


def test_a_streaming_models_error_on_a_stream_is_the_requests_outcome(receiver):
    from tests.python_models import REPOSITORY

    with serve(REPOSITORY, trace_settings=otel_settings(receiver), load_at_startup=False) as running:
        (answer,) = list(running.client.stream_infer("repeat", [{"IN": np.array([-1], np.int32)}]))
        assert isinstance(answer, ClientError) and "n must be >= 0" in str(answer)
    (span,) = model_spans(receiver.spans(), "repeat")
    assert span.attributes["outcome"] != "success" and span.status_code == 2
    assert "n must be >= 0" in str(span.attributes["error_message"])


def test_a_request_that_waited_for_its_models_load_records_the_initialization_after_its_admission(receiver, tmp_path):
    repo = demo_subset(tmp_path / "repo", "simple")
    with serve(repo, trace_settings=otel_settings(receiver), load_at_startup=False) as running:
        running.client.infer("simple", {"INPUT0": X, "INPUT1": X})  # loads the model
        running.client.infer("simple", {"INPUT0": X, "INPUT1": X})  # loaded already
    spans = receiver.spans()
    first, second = sorted(model_spans(spans, "simple"), key=lambda span: span.start_ns)
    assert first.attributes["model.ready_at_arrival"] is False and second.attributes["model.ready_at_arrival"] is True
    phases = {span.name: span for span in children(spans, first)}
    initialization = phases["initialization"]
    assert initialization.attributes["waited"] is True
    assert phases["admission wait"].end_ns == initialization.start_ns  # the load follows its grant
    assert initialization.end_ns <= phases["execute"].start_ns
    assert "initialization" not in {span.name for span in children(spans, second)}
