"""The response cache with a real server: hits answer without running the model, and are counted as Triton does.

Fixture-backend models (output = input) count their engine runs (`FixtureControls.count(model, "execute")`), so a
test sees directly whether a request ran or was answered from the cache; ModelStatistics shows how it was counted.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from engine.testing.fixture import FixtureBackend
from generated import grpc_service_pb2 as pb
from service.testing import serve

from .._shm import ShmObject, in_region, register
from .._support import CALL_TIMEOUT, client_error, stub, write_fixture_model

TENSOR = [("INPUT0", "FP32", [-1])]
OUT = [("OUTPUT0", "FP32", [-1])]
CACHED = "response_cache { enable: true }\n"
MEMORY = 'parameters { key: "memory_bytes" value { string_value: "4096" } }\n'
CACHE_BYTES = 1 << 20
PREFIX = "/slotserve-cache-test"


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "repository"
    write_fixture_model(root, "cached", inputs=TENSOR, outputs=OUT, extra=CACHED + MEMORY)
    write_fixture_model(root, "plain", inputs=TENSOR, outputs=OUT)
    return root


@pytest.fixture
def running(repository, controls):
    with serve(
        repository,
        backends={"fixture": FixtureBackend(controls)},
        response_cache_bytes=CACHE_BYTES,
        allow_management=True,
        shared_memory="system",
        shared_memory_prefix=PREFIX,
    ) as server:
        yield server


def values(*numbers: float) -> dict[str, np.ndarray]:
    return {"INPUT0": np.asarray(numbers, dtype=np.float32)}


def stats(running, model: str) -> pb.ModelStatistics:
    (found,) = running.client.statistics(model)
    return found


def test_a_repeated_request_is_answered_from_the_cache_and_counted_as_a_hit(running, controls):
    first = running.client.infer("cached", values(1, 2, 3))
    again = [running.client.infer("cached", values(1, 2, 3)) for _ in range(3)]
    assert controls.count("cached", "execute") == 1  # one run; three answers from the cache
    for answer in again:
        np.testing.assert_array_equal(answer["OUTPUT0"], first["OUTPUT0"])
    inference = stats(running, "cached").inference_stats
    assert (inference.cache_hit.count, inference.cache_miss.count) == (3, 1)
    assert inference.cache_hit.ns > 0 and inference.cache_miss.ns > 0
    assert inference.success.count == 4  # hits are successes
    assert inference.queue.count == 4  # ... and queued (with no wait), as Triton counts them
    assert (inference.compute_input.count, inference.compute_infer.count, inference.compute_output.count) == (1, 1, 1)
    model = stats(running, "cached")
    assert (model.inference_count, model.execution_count) == (1, 1)  # hits are not inferences or executions


def test_a_changed_input_misses(running, controls):
    running.client.infer("cached", values(1, 2, 3))
    changed = running.client.infer("cached", values(1, 2, 4))
    np.testing.assert_array_equal(changed["OUTPUT0"], [1, 2, 4])
    running.client.infer("cached", values(1, 2, 3, 4))  # another shape
    assert controls.count("cached", "execute") == 3
    inference = stats(running, "cached").inference_stats
    assert (inference.cache_hit.count, inference.cache_miss.count) == (0, 3)


def test_a_model_without_response_cache_is_never_cached(running, controls):
    for _ in range(3):
        running.client.infer("plain", values(1, 2, 3))
    assert controls.count("plain", "execute") == 3
    inference = stats(running, "plain").inference_stats
    assert (inference.cache_hit.count, inference.cache_miss.count) == (0, 0)


def test_without_cache_memory_a_model_asking_for_it_runs_every_request(repository, controls):
    with serve(repository, backends={"fixture": FixtureBackend(controls)}) as running:
        for _ in range(2):
            running.client.infer("cached", values(1, 2, 3))
        assert controls.count("cached", "execute") == 2
        inference = stats(running, "cached").inference_stats
        assert (inference.cache_hit.count, inference.cache_miss.count) == (0, 0)


def test_an_error_is_not_cached(running, controls):
    controls.gate("cached", "execute").fail_next(RuntimeError("engine broke"))
    error = client_error(running.client.infer, "cached", values(5, 6))
    assert error.code == "INTERNAL"
    answer = running.client.infer("cached", values(5, 6))  # the same request runs again, and succeeds
    np.testing.assert_array_equal(answer["OUTPUT0"], [5, 6])
    assert controls.count("cached", "execute") == 2
    inference = stats(running, "cached").inference_stats
    assert (inference.fail.count, inference.success.count, inference.cache_hit.count) == (1, 1, 0)
    assert inference.cache_miss.count == 1  # the failed one is not counted as a miss: nothing was to be stored


def test_a_reload_drops_the_models_entries(running, controls):
    running.client.infer("cached", values(1, 2, 3))
    running.client.infer("cached", values(1, 2, 3))
    assert controls.count("cached", "execute") == 1
    running.client.unload("cached")
    running.client.load("cached")
    running.client.infer("cached", values(1, 2, 3))  # not served from before the reload
    assert controls.count("cached", "execute") == 2
    running.client.infer("cached", values(1, 2, 3))
    assert controls.count("cached", "execute") == 2
    assert running.server.dataplane.response_cache.entries_of("cached") == 1


def test_a_load_with_a_new_config_drops_the_entries(running, controls):
    running.client.infer("cached", values(7))
    assert running.server.dataplane.response_cache.entries_of("cached") == 1
    config = {
        "name": "cached",
        "backend": "fixture",
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "response_cache": {"enable": True},
        "parameters": {"memory_bytes": {"string_value": "8192"}},
    }
    running.client.load("cached", config)
    running.client.infer("cached", values(7))
    assert controls.count("cached", "execute") == 2
    assert running.server.dataplane.response_cache.entries_of("cached") == 1


def test_an_unloaded_model_is_not_served_from_the_cache(running, controls):
    running.client.infer("cached", values(1))
    running.client.unload("cached")
    # The seed's lazy load: the next request loads the model again and runs, rather than answering from before.
    running.client.infer("cached", values(1))
    assert controls.count("cached", "execute") == 2
    assert stats(running, "cached").inference_stats.cache_hit.count == 0


def test_a_hit_still_needs_the_token(repository, controls):
    with serve(
        repository,
        backends={"fixture": FixtureBackend(controls)},
        response_cache_bytes=CACHE_BYTES,
        inference_token="t",
    ) as running:
        running.client.infer("cached", values(1, 2))
        raw = stub(running)
        request = pb.ModelInferRequest(model_name="cached")
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[2])
        request.raw_input_contents.append(np.asarray([1, 2], np.float32).tobytes())
        with pytest.raises(Exception) as refused:
            raw.ModelInfer(request, timeout=CALL_TIMEOUT)  # no token
        assert refused.value.code().name == "UNAUTHENTICATED"
        assert stats(running, "cached").inference_stats.cache_hit.count == 0


def shm_request(region: str, size: int, outputs_region: str | None = None) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="cached", id="shm")
    in_region(request.inputs.add(name="INPUT0", datatype="FP32", shape=[size // 4]), region, size)
    if outputs_region is not None:
        in_region(request.outputs.add(name="OUTPUT0"), outputs_region, size)
    return request


def test_inputs_in_shared_memory_are_keyed_by_their_content_and_outputs_written_from_the_cache(running, controls):
    source, target, other = ShmObject(16, PREFIX + "-in"), ShmObject(16, PREFIX + "-out"), ShmObject(16, PREFIX + "-o2")
    try:
        raw = stub(running)
        for name, obj in (("in", source), ("out", target), ("out2", other)):
            register(raw, name, obj.key, obj.size, timeout=CALL_TIMEOUT)
        source.write(0, np.asarray([1, 2, 3, 4], "<f4"))
        raw.ModelInfer(shm_request("in", 16, "out"), timeout=CALL_TIMEOUT)
        assert target.array(0, "<f4", (4,)).tolist() == [1, 2, 3, 4]

        # The same region with other bytes in it: a miss, never the answer cached for the region's name.
        source.write(0, np.asarray([9, 8, 7, 6], "<f4"))
        raw.ModelInfer(shm_request("in", 16, "out"), timeout=CALL_TIMEOUT)
        assert target.array(0, "<f4", (4,)).tolist() == [9, 8, 7, 6]
        assert controls.count("cached", "execute") == 2

        # The same bytes again, answered into another output region: a hit, written from the cached copy.
        response = raw.ModelInfer(shm_request("in", 16, "out2"), timeout=CALL_TIMEOUT)
        assert other.array(0, "<f4", (4,)).tolist() == [9, 8, 7, 6]
        assert list(response.outputs[0].shape) == [4] and response.raw_output_contents[0] == b""
        # ... and the same bytes sent inline (asking for the same output) hit the same entry.
        inline = running.client.infer("cached", values(9, 8, 7, 6), outputs=["OUTPUT0"])
        assert inline["OUTPUT0"].tolist() == [9, 8, 7, 6]
        assert controls.count("cached", "execute") == 2
        assert stats(running, "cached").inference_stats.cache_hit.count == 2
    finally:
        raw.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(), timeout=CALL_TIMEOUT)
        for obj in (source, target, other):
            obj.close()


def test_a_hit_answers_with_the_requests_own_id(running):
    raw = stub(running)
    request = pb.ModelInferRequest(model_name="cached", id="first")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    request.raw_input_contents.append(np.asarray([3], np.float32).tobytes())
    assert raw.ModelInfer(request, timeout=CALL_TIMEOUT).id == "first"
    request.id = "second"
    assert raw.ModelInfer(request, timeout=CALL_TIMEOUT).id == "second"
    assert stats(running, "cached").inference_stats.cache_hit.count == 1


def test_the_cache_stays_within_its_bytes(repository, controls):
    # Each answer holds 1000 floats (4000 bytes) plus the key and bookkeeping: three fit in 13000 bytes, four do not.
    with serve(repository, backends={"fixture": FixtureBackend(controls)}, response_cache_bytes=13000) as running:
        for start in range(5):
            running.client.infer("cached", values(*range(start, start + 1000)))
        cache = running.server.dataplane.response_cache.statistics()
        assert cache.entries == 3 and cache.bytes <= 13000 and cache.evictions == 2
        running.client.infer("cached", values(*range(0, 1000)))  # the oldest went: it runs again
        assert controls.count("cached", "execute") == 6


def test_memory_usage_reports_the_pools_memory_as_getmodel_does(running):
    (usage,) = stats(running, "cached").memory_usage
    assert (usage.type, usage.id, usage.byte_size) == ("CPU", 0, running.management.get("cached").memory_bytes)
    assert usage.byte_size == 4096  # the fixture's memory_bytes parameter, with no per-slot memory
    running.client.unload("cached")
    assert list(stats(running, "cached").memory_usage) == []  # nothing loaded, nothing reported (as Triton)


def wait_for(predicate, what: str, timeout: float = 20.0) -> None:
    """Poll an observable state until it holds (bounded by a generous deadline on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)  # ordering-free: polls an observable state


def test_a_hit_takes_no_slot_and_answers_while_every_slot_is_busy(running, controls):
    running.client.infer("cached", values(1, 2))  # kept
    gate = controls.gate("cached", "execute").hold()
    with ThreadPoolExecutor(2) as pool:
        busy = pool.submit(running.client.infer, "cached", values(3, 4))  # holds the model's only slot
        gate.wait_blocked(1)
        answer = running.client.infer("cached", values(1, 2))  # would queue behind it without the cache
        np.testing.assert_array_equal(answer["OUTPUT0"], [1, 2])
        status = running.management.get("cached")
        assert (status.active_slots, status.queued_requests) == (1, 0)
        gate.release()
        np.testing.assert_array_equal(busy.result(timeout=60)["OUTPUT0"], [3, 4])
    assert stats(running, "cached").inference_stats.cache_hit.count == 1


def test_a_request_after_a_queued_unload_waits_for_it_rather_than_hitting(running, controls):
    """OPS.ready.unload / A manager in the queue: later requests wait behind it, so they are not answered from
    the cache made before it; this one waits, then reloads the model (lazy load) and runs."""
    running.client.infer("cached", values(1, 2))
    gate = controls.gate("cached", "execute").hold()
    with ThreadPoolExecutor(3) as pool:
        busy = pool.submit(running.client.infer, "cached", values(3, 4))
        gate.wait_blocked(1)
        unload = pool.submit(running.client.unload, "cached")
        wait_for(lambda: running.server.registry.get("cached").status().queued_managers == 1, "the unload queued")
        later = pool.submit(running.client.infer, "cached", values(1, 2))
        wait_for(lambda: running.server.registry.get("cached").status().queued_requests == 1, "the request queued")
        assert not later.done()
        gate.release()
        busy.result(timeout=60)
        unload.result(timeout=60)
        np.testing.assert_array_equal(later.result(timeout=60)["OUTPUT0"], [1, 2])
    assert controls.count("cached", "execute") == 3  # the later request ran
    assert stats(running, "cached").inference_stats.cache_hit.count == 0


def test_a_batching_model_and_bytes_tensors_are_cached_too(tmp_path, controls):
    root = tmp_path / "more"
    write_fixture_model(
        root,
        "batched",
        inputs=[("INPUT0", "FP32", [-1])],
        outputs=[("OUTPUT0", "FP32", [-1])],
        max_batch_size=4,
        extra="dynamic_batching { max_queue_delay_microseconds: 100 }\n" + CACHED,
    )
    write_fixture_model(
        root, "text", inputs=[("INPUT0", "BYTES", [-1])], outputs=[("OUTPUT0", "BYTES", [-1])], extra=CACHED
    )
    with serve(root, backends={"fixture": FixtureBackend(controls)}, response_cache_bytes=CACHE_BYTES) as running:
        rows = {"INPUT0": np.asarray([[1, 2], [3, 4]], np.float32)}
        first = running.client.infer("batched", rows)
        again = running.client.infer("batched", rows)
        np.testing.assert_array_equal(again["OUTPUT0"], first["OUTPUT0"])
        assert controls.batches("batched") == [2]  # one run; the repeat was a hit
        assert stats(running, "batched").inference_stats.cache_hit.count == 1

        words = {"INPUT0": np.asarray([b"alpha", b"", b"\x00\xff"], dtype=object)}
        assert running.client.infer("text", words)["OUTPUT0"].tolist() == [b"alpha", b"", b"\x00\xff"]
        assert running.client.infer("text", words)["OUTPUT0"].tolist() == [b"alpha", b"", b"\x00\xff"]
        other = {"INPUT0": np.asarray([b"alpha", b"", b"\x00\xfe"], dtype=object)}
        assert running.client.infer("text", other)["OUTPUT0"].tolist() == [b"alpha", b"", b"\x00\xfe"]
        assert controls.count("text", "execute") == 2
        assert stats(running, "text").inference_stats.cache_hit.count == 1


def test_two_versions_of_a_model_keep_their_answers_apart(tmp_path, controls):
    """Each served version is its own entry with its own generation: answering version 2 must not drop version
    1's answers (nor the reverse), and each version's answer is its own."""
    root = tmp_path / "repository"
    directory = write_fixture_model(
        root, "cached", inputs=TENSOR, outputs=OUT, extra=CACHED + MEMORY + "version_policy { all { } }\n"
    )
    for version in ("1", "2"):
        (directory / version).mkdir(exist_ok=True)
    with serve(root, backends={"fixture": FixtureBackend(controls)}, response_cache_bytes=CACHE_BYTES) as running:
        for _ in range(2):
            for version in ("1", "2"):
                running.client.infer("cached", values(1, 2), version=version)
        rows = {row.version: row.inference_stats for row in running.client.statistics("cached")}
        cache = running.server.dataplane.response_cache
        assert cache.entries_of("cached") == 2
    assert {version: (s.cache_hit.count, s.cache_miss.count) for version, s in rows.items()} == {
        "1": (1, 1),
        "2": (1, 1),
    }
