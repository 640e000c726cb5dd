"""service/response_cache.py on its own: what the key covers, eviction by bytes, generations, the store's rules."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from engine.config.specs import TensorSpec
from engine.interface import ModelMetadata
from generated import grpc_service_pb2 as pb
from generated import model_config_pb2
from service.core.lifecycle import ModelState
from service.options import ServerOptions
from service.response_cache import (
    ENTRY_OVERHEAD,
    NOT_CACHEABLE,
    CachedAnswer,
    ResponseCache,
    model_enables_cache,
    request_key,
)
from service.tensors import decode_request

METADATA = ModelMetadata(inputs=(TensorSpec("IN", "FP32", (-1,)),), outputs=(TensorSpec("OUT", "FP32", (-1,)),))


def request(
    values=(1.0, 2.0, 3.0), *, name="IN", datatype="FP32", shape=None, model="m", version="", outputs=(), **params
):
    array = np.asarray(values, dtype=np.float32 if datatype == "FP32" else np.int32)
    message = pb.ModelInferRequest(model_name=model, model_version=version)
    message.inputs.add(name=name, datatype=datatype, shape=list(shape or array.shape))
    message.raw_input_contents.append(array.tobytes())
    for output in outputs:
        requested = message.outputs.add(name=output[0])
        for key, value in output[1].items():
            requested.parameters[key].string_param = value
    for key, value in params.items():
        message.parameters[key].int64_param = value
    return message


def key_of(message, version="1") -> bytes:
    return request_key(message, decode_request(message), version)


def test_the_same_request_gives_the_same_key():
    assert key_of(request()) == key_of(request())
    assert key_of(request(), "1") == key_of(request(version="1"), "1")


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param(request(values=(1.0, 2.0, 4.0)), id="input bytes"),
        pytest.param(request(name="OTHER"), id="input name"),
        pytest.param(request(values=(1, 2, 3), datatype="INT32"), id="datatype"),
        pytest.param(request(shape=(3, 1)), id="shape"),
        pytest.param(request(model="n"), id="model"),
        pytest.param(request(outputs=[("OUT", {})]), id="requested outputs"),
        pytest.param(request(outputs=[("OUT", {"answer_format": "x"})]), id="output parameters"),
        pytest.param(request(sequence_id=3), id="request parameters"),
    ],
)
def test_every_component_changes_the_key(changed):
    assert key_of(changed) != key_of(request())


def test_the_version_changes_the_key():
    assert key_of(request(), "1") != key_of(request(), "2")


def test_parameters_that_cannot_change_the_answer_are_left_out():
    assert key_of(request(timeout=5000, priority=1)) == key_of(request())


def test_an_output_placement_in_shared_memory_is_left_out_of_the_key():
    """Where the answer is written is not what it is: each hit writes it into its own request's region."""
    placed = pb.ModelInferRequest(model_name="m")
    placed.CopyFrom(request())
    placed.outputs.add(name="OUT")
    plain = pb.ModelInferRequest()
    plain.CopyFrom(placed)
    placed.outputs[0].parameters["shared_memory_region"].string_param = "r"
    placed.outputs[0].parameters["shared_memory_byte_size"].int64_param = 12
    decoded = decode_request(plain)  # decoding the placed one needs a registry; the key reads the message
    assert request_key(placed, decoded, "1") == request_key(plain, decoded, "1")


def answer(size: int, value: float = 1.0) -> CachedAnswer:
    return CachedAnswer(METADATA, "1", {"OUT": np.full(size, value, dtype=np.float32)})


def entry_bytes(size: int, key_bytes: int = 32) -> int:
    return size * 4 + key_bytes + ENTRY_OVERHEAD  # float32 outputs, the key (a digest is 32 bytes), bookkeeping


def test_entries_are_evicted_least_recently_used_first_by_bytes():
    cache = ResponseCache(3 * entry_bytes(100))
    generation = (object(),)
    cache.get("m", generation, b"")  # a lookup makes the generation current; stores follow lookups
    keys = [bytes([i]) * 32 for i in range(4)]
    for key in keys[:3]:
        assert cache.put("m", generation, key, answer(100))
    assert cache.statistics().bytes == 3 * entry_bytes(100)
    assert cache.get("m", generation, keys[0]) is not None  # 0 is now the most recently used
    assert cache.put("m", generation, keys[3], answer(100))
    assert cache.get("m", generation, keys[1]) is None  # the least recently used went
    assert all(cache.get("m", generation, k) is not None for k in (keys[0], keys[2], keys[3]))
    stats = cache.statistics()
    assert (stats.entries, stats.bytes, stats.evictions) == (3, 3 * entry_bytes(100), 1)


def test_a_large_answer_evicts_as_many_as_it_needs():
    cache = ResponseCache(4 * entry_bytes(100))
    generation = (object(),)
    cache.get("m", generation, b"")
    for i in range(4):
        cache.put("m", generation, bytes([i]) * 32, answer(100))
    assert cache.put("m", generation, b"L" * 32, answer(250))
    # 2 small entries + the large one fit (2 * 688 + 1288 = 2664 <= 2752); 3 small + large would not.
    assert 2 * entry_bytes(100) + entry_bytes(250) <= 4 * entry_bytes(100) < 3 * entry_bytes(100) + entry_bytes(250)
    stats = cache.statistics()
    assert stats.evictions == 2 and stats.entries == 3
    assert stats.bytes == 2 * entry_bytes(100) + entry_bytes(250)
    assert cache.get("m", generation, bytes([0]) * 32) is None and cache.get("m", generation, bytes([1]) * 32) is None


def test_an_answer_bigger_than_the_cache_is_not_kept_and_evicts_nothing():
    cache = ResponseCache(entry_bytes(100))
    generation = (object(),)
    cache.get("m", generation, b"")
    assert cache.put("m", generation, b"a" * 32, answer(100))
    assert not cache.put("m", generation, b"b" * 32, answer(101))
    assert cache.get("m", generation, b"a" * 32) is not None


def test_a_new_generation_drops_the_models_entries_and_no_others():
    cache = ResponseCache(1 << 20)
    old, new, other = (object(), object()), (object(), object()), (object(),)
    cache.get("m", old, b"k")  # the first lookup makes `old` current
    cache.get("n", other, b"k")
    assert cache.put("m", old, b"k", answer(10))
    assert cache.put("n", other, b"k", answer(10))
    assert cache.get("m", new, b"k") is None  # reloaded: new metadata
    assert cache.entries_of("m") == 0 and cache.entries_of("n") == 1
    assert cache.statistics().bytes == entry_bytes(10, key_bytes=1)
    assert not cache.put("m", old, b"k", answer(10))  # a run that began before the reload stores nothing
    assert cache.get("m", old, b"k") is None


def test_a_store_without_a_lookup_of_that_generation_keeps_nothing():
    cache = ResponseCache(1 << 20)
    assert not cache.put("m", (object(),), b"k", answer(10))


def test_drop_forgets_a_model_and_refuses_late_stores():
    cache = ResponseCache(1 << 20)
    generation = (object(),)
    cache.get("m", generation, b"k")
    cache.put("m", generation, b"k", answer(10))
    cache.drop("m")
    assert cache.statistics().entries == 0
    assert not cache.put("m", generation, b"k", answer(10))


@dataclass
class FakeEntry:
    config: object
    ready: bool = True
    name: str = "m"
    metadata: object = field(default_factory=object)

    @property
    def spec(self):
        return self

    version = "1"

    manager_active: bool = False

    def view(self):
        state = ModelState.READY if self.ready else ModelState.UNLOADED
        status = SimpleNamespace(state=state, manager_active=self.manager_active, queued_managers=0)
        return SimpleNamespace(spec=self, metadata=self.metadata, status=status)


def config(enable: bool) -> model_config_pb2.ModelConfig:
    message = model_config_pb2.ModelConfig(name="m")
    if enable:
        message.response_cache.enable = True
    return message


def asked(message, decoded):
    """lookup's arguments for a ModelInferRequest, as the dataplane passes them."""
    return message.model_version, lambda version: request_key(message, decoded, version)


def test_model_enables_cache_reads_the_config():
    assert model_enables_cache(config(True))
    assert not model_enables_cache(config(False))
    assert not model_enables_cache(None)


def test_lookup_is_not_cacheable_when_off_disabled_or_not_ready():
    message = request()
    decoded = decode_request(message)
    assert ResponseCache(0).lookup(FakeEntry(config(True)), *asked(message, decoded)) is NOT_CACHEABLE
    assert ResponseCache(1 << 20).lookup(FakeEntry(config(False)), *asked(message, decoded)) is NOT_CACHEABLE
    cache = ResponseCache(1 << 20)
    entry = FakeEntry(config(True))
    first = cache.lookup(entry, *asked(message, decoded))
    assert first.key is not None and first.answer is None
    assert cache.store_answer(first, METADATA, "1", {"OUT": np.ones(3, np.float32)}) >= first.lookup_ns
    assert cache.lookup(entry, *asked(message, decoded)).answer is not None
    entry.manager_active = True  # an unload or reconfiguration holds the model: later requests wait for it
    assert cache.lookup(entry, *asked(message, decoded)) is NOT_CACHEABLE
    entry.manager_active = False
    assert cache.lookup(entry, *asked(message, decoded)).answer is not None
    entry.ready = False
    assert cache.lookup(entry, *asked(message, decoded)) is NOT_CACHEABLE
    assert cache.statistics().entries == 0  # not READY: its entries went


def test_stored_outputs_are_private_read_only_copies():
    cache = ResponseCache(1 << 20)
    entry = FakeEntry(config(True))
    message = request()
    decoded = decode_request(message)
    lookup = cache.lookup(entry, *asked(message, decoded))
    engine_buffer = np.ones(3, np.float32)
    cache.store_answer(lookup, METADATA, "1", {"OUT": engine_buffer})
    engine_buffer[:] = 7  # the engine reuses its buffer for the next run
    cached = cache.lookup(entry, *asked(message, decoded)).answer.outputs["OUT"]
    assert cached.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError):
        cached[0] = 2


def test_concurrent_puts_and_gets_keep_the_byte_count_exact():
    cache = ResponseCache(10 * entry_bytes(10))
    generation = (object(),)
    cache.get("m", generation, b"")

    def work(offset: int) -> None:
        for i in range(300):
            key = (offset * 1000 + i).to_bytes(32, "little")
            cache.put("m", generation, key, answer(10))
            cache.get("m", generation, key)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = cache.statistics()
    assert stats.entries == 10 and stats.bytes == 10 * entry_bytes(10)
    assert stats.evictions == 4 * 300 - 10


def test_a_negative_response_cache_size_is_refused_naming_the_flag():
    from tests.unit.service.test_flag_ranges import options_from

    with pytest.raises(ValueError, match=r"--response-cache-bytes must be >= 0, got -1"):
        options_from("--response-cache-bytes", "-1")
    with pytest.raises(ValueError, match=r"--response-cache-bytes must be >= 0, got nan"):
        ServerOptions(model_repository=Path("."), response_cache_bytes=float("nan"))


@pytest.mark.parametrize("value", ["nan", "1.5", "lots"])
def test_a_response_cache_size_that_is_not_an_integer_is_refused_naming_the_flag(value, capsys):
    from tests.unit.service.test_flag_ranges import options_from

    with pytest.raises(SystemExit):
        options_from("--response-cache-bytes", value)
    error = capsys.readouterr().err  # argparse names the flag with its Triton alias: "--response-cache-bytes/--..."
    assert "argument --response-cache-bytes" in error and f"invalid int value: '{value}'" in error, error


def test_the_response_cache_is_off_unless_given_bytes():
    from tests.unit.service.test_flag_ranges import options_from

    assert options_from().response_cache_bytes == 0
    assert options_from("--response-cache-bytes", "1048576").response_cache_bytes == 1048576


def test_the_placement_parameters_left_out_of_keys_are_the_shared_memory_ones():
    from service import response_cache, tensors

    assert response_cache._PLACEMENT == {tensors.REGION, tensors.BYTE_SIZE, tensors.OFFSET}
