"""Dynamic batching cells that need the whole server (BATCH.11 shutdown, BATCH.12 streams): a real in-process
gRPC server over fixture models whose gates hold the batch; requests from real channels."""

from __future__ import annotations

import numpy as np
import pytest

from generated import grpc_service_pb2 as pb
from tests.shutdown.harness import InProcess, outcome

from .test_batching import request, rows_of, write_batching_model

cell = pytest.mark.cell


@pytest.fixture
def served(tmp_path, frontends):
    """The batching model `m` served by one front end and by two (`frontends`, tests/conftest.py)."""
    write_batching_model(tmp_path, "m")
    running = InProcess(tmp_path, {}, parallel_jobs=1, frontends=frontends)
    yield running
    running.close()


def _decoded(response) -> np.ndarray:
    shape = tuple(response.outputs[0].shape)
    return np.frombuffer(response.raw_output_contents[0], np.float32).reshape(shape)


def _start_batch_of(served: InProcess, count: int, hold_batch: bool):
    """A request running alone (held at prepare), `count` requests queued behind it, then the first released:
    the queued ones form one batch, held at execute when `hold_batch`. Returns (running, members)."""
    prepare = served.gate("m", "prepare").hold()
    running = served.stub.ModelInfer.future(request("m", rows_of(100.0)), timeout=30)
    prepare.wait_blocked(1)
    if hold_batch:
        served.gate("m", "execute").hold_from(2)
    members = []
    for index in range(count):
        members.append(served.stub.ModelInfer.future(request("m", rows_of(float(index))), timeout=30))
        served.wait_core("m", lambda s, n=index + 1: s.queued_requests == n, f"{index + 1} queued")
    prepare.release()
    return running, members


@cell("BATCH.11")
def test_a_batch_running_at_shutdown_finishes_within_the_grace_and_every_member_gets_its_result(served):
    running, members = _start_batch_of(served, 3, hold_batch=True)
    execute = served.gate("m", "execute")
    execute.wait_blocked(1)
    shutdown = served.shutdown(grace=20.0)
    served.wait_core("m", lambda s: s.active_slots == 1, "the batch still running after the signal")
    execute.release()
    assert outcome(running)[0] == "OK"
    for index, member in enumerate(members):
        code, response = outcome(member)
        assert code == "OK", response
        np.testing.assert_array_equal(_decoded(response), rows_of(float(index)))
    report = shutdown.result()
    assert report.abandoned_calls == 0 and report.seconds < 20.0
    assert served.controls.batches("m") == [1, 3]


@cell("BATCH.11")
def test_a_batch_still_running_at_the_end_of_the_grace_is_cancelled_and_every_member_gets_shutting_down(served):
    running, members = _start_batch_of(served, 3, hold_batch=True)
    served.gate("m", "execute").wait_blocked(1)
    report = served.shutdown(grace=0.5).result()
    for member in members:
        code, error = outcome(member)
        assert (code, error.reason) == ("UNAVAILABLE", "shutting_down"), error
    assert report.abandoned_calls == 0 and report.closed_models == ["m"]


@cell("BATCH.12")
def test_a_stream_request_batches_with_unary_ones_and_gets_its_answer_on_its_stream(served):
    prepare = served.gate("m", "prepare").hold()
    running = served.stub.ModelInfer.future(request("m", rows_of(100.0)), timeout=30)
    prepare.wait_blocked(1)
    stream = served.stub.ModelStreamInfer(iter([request("m", rows_of(7.0))]), timeout=30)
    served.wait_core("m", lambda s: s.queued_requests == 1, "the stream's request queued")
    unary = served.stub.ModelInfer.future(request("m", rows_of(8.0)), timeout=30)
    served.wait_core("m", lambda s: s.queued_requests == 2, "the unary request queued behind it")
    prepare.release()
    answers = list(stream)
    assert len(answers) == 1 and not answers[0].error_message
    np.testing.assert_array_equal(_decoded(answers[0].infer_response), rows_of(7.0))
    code, response = outcome(unary)
    assert code == "OK"
    np.testing.assert_array_equal(_decoded(response), rows_of(8.0))
    assert outcome(running)[0] == "OK"
    assert served.controls.batches("m") == [1, 2]
    statistics = served.stub.ModelStatistics(pb.ModelStatisticsRequest(name="m"), timeout=10).model_stats[0]
    assert (statistics.execution_count, statistics.inference_count) == (2, 3)
    assert {(b.batch_size, b.compute_infer.count) for b in statistics.batch_stats} == {(1, 1), (2, 1)}


def test_requests_with_tensors_in_shared_memory_batch_and_each_writes_its_own_rows(tmp_path, frontends):
    """Three queued requests of one batch read their inputs from, and write their outputs to, their own parts
    of one shared-memory region; a fourth, whose input region was unregistered while it waited, is refused alone
    (INVALID_ARGUMENT) and writes nothing."""
    from generated import grpc_service_pb2 as pb_messages
    from tests.integration._shm import ShmObject, in_region, register

    write_batching_model(tmp_path, "m")
    served = InProcess(tmp_path, {}, parallel_jobs=1, shared_memory="system", frontends=frontends)
    region = ShmObject(4096)
    gone = ShmObject(64)
    try:
        register(served.stub, "r", region.key, 4096, timeout=10)
        register(served.stub, "gone", gone.key, 64, timeout=10)
        prepare = served.gate("m", "prepare").hold()
        running = served.stub.ModelInfer.future(request("m", rows_of(100.0)), timeout=30)
        prepare.wait_blocked(1)
        members = []
        for index in range(3):
            values = rows_of(float(index))
            region.write(256 * index, values)
            message = pb_messages.ModelInferRequest(model_name="m")
            tensor = message.inputs.add(name="INPUT0", datatype="FP32", shape=list(values.shape))
            in_region(tensor, "r", values.nbytes, offset=256 * index)
            in_region(message.outputs.add(name="OUTPUT0"), "r", values.nbytes, offset=2048 + 256 * index)
            members.append(served.stub.ModelInfer.future(message, timeout=30))
            served.wait_core("m", lambda s, n=index + 1: s.queued_requests == n, f"{index + 1} queued")
        refused = pb_messages.ModelInferRequest(model_name="m")
        in_region(refused.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2]), "gone", 8)
        lost = served.stub.ModelInfer.future(refused, timeout=30)
        served.wait_core("m", lambda s: s.queued_requests == 4, "the fourth queued")
        served.stub.SystemSharedMemoryUnregister(
            pb_messages.SystemSharedMemoryUnregisterRequest(name="gone"), timeout=10
        )
        prepare.release()
        assert outcome(running)[0] == "OK"
        for index, member in enumerate(members):
            code, response = outcome(member)
            assert code == "OK" and response.raw_output_contents[0] == b"", response
            np.testing.assert_array_equal(region.array(2048 + 256 * index, np.float32, (1, 2)), rows_of(float(index)))
        code, error = outcome(lost)
        assert code == "INVALID_ARGUMENT" and "'gone' was unregistered" in error.message, error
        assert served.controls.batches("m") == [1, 3]  # the refused one was its own batch, and never ran
    finally:
        served.close()
        region.close()
        gone.close()
