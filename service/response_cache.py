"""The response cache: a successful ModelInfer answer kept by the request's content, served again without a slot.

On only when both the server gives it memory (`--response-cache-bytes N`, N > 0) and the model asks for it
(`response_cache { enable: true }` in its config.pbtxt), as in Triton. What is kept is the run's output arrays
(copied, read-only) with the model metadata and version that produced them; a hit encodes them again for the
request in hand, so its own `id` is answered and outputs it asks for in shared memory are written into its own
regions from the cached copy.

The key (`request_key`) is a SHA-256 digest (2.5 times faster than BLAKE2b here: the CPU has SHA instructions)
over: the model name and version; every input's name, datatype, shape and bytes (inputs in shared memory are
hashed by their content, read when the request was decoded, never by region name); the requested output names
and each output's parameters other than its shared-memory placement (a placement says where to write the answer,
not what it is); and the request's parameters other than those that cannot change the answer
(`NEUTRAL_PARAMETERS`: timeout, priority, binary output encoding). Every part is length-prefixed and every
group counted, so two different requests never feed the digest the same bytes.

What is never cached: failed requests (an entry is stored only after the run and its encoding succeeded), a
model that is not READY (lookup drops its entries and the request takes the ordinary path: admission, lazy
load), ModelStreamInfer (streaming models answer several times; the cache is consulted by ModelInfer only).

Entries of a model are dropped when its generation changes: the cache remembers, per model, the committed spec
and the published metadata objects its entries were made from; a reload publishes new metadata and a
reconfiguration commits a new spec, so the next lookup finds other objects and drops everything of that model
before answering. A run that began before the change stores nothing (its generation is no longer current).

Bounded by bytes (outputs plus the key plus ENTRY_OVERHEAD each), least recently used entries evicted first; an
answer bigger than the whole cache is not stored. Locking: `ResponseCache._lock` is a leaf: dictionary and
arithmetic work only (hashing and copying happen outside it); it is never held across inference or while any
other lock is taken.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from engine.interface import ModelMetadata
from engine.tensor_codec import encode_raw

from .core.lifecycle import ModelState

if TYPE_CHECKING:
    from .core.lifecycle import ModelEntry


class DecodedTensors(Protocol):
    """What a key reads of a decoded request (service/dataplane.py DecodedRequest), named here so that this module
    does not import the dataplane, which imports it."""

    @property
    def inputs(self) -> Mapping[str, np.ndarray]: ...

    @property
    def signature(self) -> Mapping[str, tuple[str, tuple[int, ...]]]: ...


ENTRY_OVERHEAD = 256  # bytes counted per entry for its bookkeeping (key tuple, dict slots, metadata reference)
NEUTRAL_PARAMETERS = frozenset({"timeout", "priority", "binary_data_output"})  # request parameters left out of keys
# tensors.REGION, BYTE_SIZE and OFFSET, written out: tensors.py imports the dataplane, which imports this module
# (tests/unit/test_response_cache.py checks they are the same).
_PLACEMENT = frozenset({"shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"})


@dataclass(frozen=True)
class CachedAnswer:
    """What a hit answers with: the outputs of an earlier run and what produced them."""

    metadata: ModelMetadata
    version: str
    outputs: dict[str, np.ndarray]


@dataclass
class CacheLookup:
    """The outcome of one lookup. `key` None: the request is not cacheable (cache off, model not asking for it,
    model not READY); `answer` set: a hit."""

    model: str = ""
    key: bytes | None = None
    generation: tuple[object, ...] = ()
    answer: CachedAnswer | None = None
    lookup_ns: int = 0


NOT_CACHEABLE = CacheLookup()


@dataclass(frozen=True)
class CacheStatistics:
    entries: int
    bytes: int
    capacity_bytes: int
    evictions: int


def model_enables_cache(config: Any) -> bool:  # a ModelConfig message (or None)
    """True when a model's ModelConfig message says `response_cache { enable: true }`."""
    return config is not None and config.HasField("response_cache") and config.response_cache.enable


def served_name(model: str, version: str) -> str:
    """The cache's name for one served version of a model: versions are entries of their own (their own
    generation, dropped apart), so two versions of a model never drop each other's answers."""
    return f"{model}\x00{version}"  # NUL: never part of a model name (engine/config/repository.py check_model_name)


def request_key(request: Any, decoded: DecodedTensors, version: str) -> bytes:  # a ModelInferRequest
    """The digest that identifies a request's answer (see the module docstring for what it covers). Reads every
    input's bytes once; no lock."""
    digest = hashlib.sha256()

    def part(value: bytes | str) -> None:
        data = value.encode() if isinstance(value, str) else value
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)

    def parameters(
        message: Any, left_out: frozenset[str]
    ) -> None:  # counted first, so groups cannot run into each other
        kept = sorted(key for key in message.parameters if key not in left_out)
        part(str(len(kept)))
        for key in kept:
            part(key)
            part(message.parameters[key].SerializeToString(deterministic=True))

    part(request.model_name)
    part(version)
    part(str(len(decoded.inputs)))
    for name in sorted(decoded.inputs):
        datatype, shape = decoded.signature[name]
        part(name)
        part(datatype)
        part(",".join(str(d) for d in shape))
        array = decoded.inputs[name]
        if array.dtype == object:
            part(encode_raw(array))
        else:  # hashed in place, no copy of the tensor
            contiguous = np.ascontiguousarray(array)
            digest.update(contiguous.nbytes.to_bytes(8, "little"))
            digest.update(contiguous.data)
    part(str(len(request.outputs)))
    for output in sorted(request.outputs, key=lambda o: o.name):
        part(output.name)
        parameters(output, _PLACEMENT)
    parameters(request, NEUTRAL_PARAMETERS)
    return digest.digest()


def answer_bytes(outputs: dict[str, np.ndarray]) -> int:
    """Bytes the outputs hold: nbytes, or for BYTES their serialized length plus 8 per element."""
    return sum(
        len(encode_raw(array)) + 8 * array.size if array.dtype == object else array.nbytes for array in outputs.values()
    )


def _frozen_copy(outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Copies the cache owns: an engine may reuse its output buffers for the next run."""
    copies = {}
    for name, array in outputs.items():
        copy = np.array(array, copy=True)
        copy.setflags(write=False)
        copies[name] = copy
    return copies


@dataclass
class _Entry:
    answer: CachedAnswer
    nbytes: int


class ResponseCache:
    """Answers by request key, bounded by bytes, LRU. Thread-safe; every method returns without waiting on
    anything but the cache's own short lock."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()  # guards: _entries, _generations, _bytes, _evictions
        self._entries: OrderedDict[tuple[str, bytes], _Entry] = OrderedDict()  # least recently used first
        self._generations: dict[
            str, tuple[object, ...]
        ] = {}  # model -> the (spec, metadata) objects its entries came from
        self._keys: dict[str, set[bytes]] = {}  # model -> its keys, to drop them without a scan
        self._bytes = 0
        self._evictions = 0

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    # ---- the request path (service/dataplane.py) ------------------------------------------------------------

    def lookup(self, entry: ModelEntry, version_asked: str, key_of: Callable[[str], bytes]) -> CacheLookup:
        """The cached answer on model `entry` for the request that asked for `version_asked` ("" for the model's)
        and whose key `key_of(version)` makes (the transport's request_key; called only when the request is
        cacheable, as it hashes every input), if any. NOT_CACHEABLE when the cache is off, the
        model does not enable it, is not READY (then its entries are dropped), or has a manager (unload,
        reconfigure) holding or waiting for it: requests after a manager wait for it in the FIFO, as the contract
        says, rather than being answered from before it. Takes the model lock once, briefly (`entry.view()`);
        never blocks otherwise."""
        if not self.enabled or not model_enables_cache(entry.spec.config):
            return NOT_CACHEABLE
        began = time.perf_counter_ns()
        view = entry.view()  # spec, metadata and state from one reading
        status = view.status
        served = served_name(entry.name, entry.spec.version)  # each served version is its own model here
        if status.state is not ModelState.READY:
            self.drop(served)
            return NOT_CACHEABLE
        if status.manager_active or status.queued_managers:
            return NOT_CACHEABLE
        generation = (view.spec, view.metadata)
        key = key_of(version_asked or entry.spec.version)
        answer = self.get(served, generation, key)
        return CacheLookup(served, key, generation, answer, time.perf_counter_ns() - began)

    def store_answer(
        self, lookup: CacheLookup, metadata: ModelMetadata, version: str, outputs: Mapping[str, np.ndarray]
    ) -> int:
        """After a successful run that missed: keep its answer. Returns the nanoseconds the lookup and the
        insertion took (Triton's cache_miss duration); 0 for a request that was not cacheable."""
        if lookup.key is None or lookup.answer is not None:
            return 0
        began = time.perf_counter_ns()
        copies = _frozen_copy(outputs or {})
        self.put(lookup.model, lookup.generation, lookup.key, CachedAnswer(metadata, version, copies))
        return lookup.lookup_ns + time.perf_counter_ns() - began

    # ---- the store --------------------------------------------------------------------------------------------

    def get(self, model: str, generation: tuple[object, ...], key: bytes) -> CachedAnswer | None:
        """The answer kept under `key`, made by `generation` of `model`; a different generation drops every
        entry of the model first (it was reloaded or reconfigured)."""
        with self._lock:
            if not _same(self._generations.get(model), generation):
                self._drop_locked(model)
                self._generations[model] = generation
                return None
            found = self._entries.get((model, key))
            if found is None:
                return None
            self._entries.move_to_end((model, key))
            return found.answer

    def put(self, model: str, generation: tuple[object, ...], key: bytes, answer: CachedAnswer) -> bool:
        """Keep `answer`, evicting least recently used entries to fit. False (nothing kept) when `generation`
        is no longer the model's current one or the answer alone exceeds the capacity."""
        nbytes = answer_bytes(answer.outputs) + len(key) + ENTRY_OVERHEAD
        if nbytes > self.capacity_bytes:
            return False
        with self._lock:
            if not _same(self._generations.get(model), generation):
                return False
            old = self._entries.pop((model, key), None)
            if old is not None:
                self._bytes -= old.nbytes
            while self._entries and self._bytes + nbytes > self.capacity_bytes:
                (victim_model, victim_key), victim = self._entries.popitem(last=False)
                self._keys[victim_model].discard(victim_key)
                self._bytes -= victim.nbytes
                self._evictions += 1
            self._entries[(model, key)] = _Entry(answer, nbytes)
            self._keys.setdefault(model, set()).add(key)
            self._bytes += nbytes
            return True

    def drop(self, model: str) -> None:
        """Forget every entry of `model` and its generation (it is not READY, or was unloaded)."""
        with self._lock:
            self._drop_locked(model)
            self._generations.pop(model, None)

    def _drop_locked(self, model: str) -> None:
        for key in self._keys.pop(model, ()):
            dropped = self._entries.pop((model, key))
            self._bytes -= dropped.nbytes

    def entries_of(self, model: str) -> int:
        """Entries kept for `model`: under that name, and under each of its served versions."""
        prefix = served_name(model, "")
        with self._lock:
            return sum(len(keys) for name, keys in self._keys.items() if name == model or name.startswith(prefix))

    def statistics(self) -> CacheStatistics:
        with self._lock:
            return CacheStatistics(len(self._entries), self._bytes, self.capacity_bytes, self._evictions)


def _same(a: tuple[object, ...] | None, b: tuple[object, ...]) -> bool:
    """The same generation: the very same objects (identity: the cache holds them, so no id is reused)."""
    return a is not None and len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


__all__ = [
    "NOT_CACHEABLE",
    "CacheLookup",
    "CachedAnswer",
    "ResponseCache",
    "model_enables_cache",
    "request_key",
]
