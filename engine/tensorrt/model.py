"""A loaded TensorRT model: one deserialized engine (weights once) from which slot contexts are made, and its
advertised capacity, measured by building one slot.
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
from dataclasses import dataclass, field

from ..config.specs import ModelSpec
from ..errors import ModelLoadError, OutOfDeviceMemoryError
from ..interface import LoadedModel, ModelMetadata
from . import engine_io
from .cuda import CudaError, CudaRuntime
from .engine_io import IoTensor, ProfileRange, origin
from .health import DeviceHealth
from .profiles import bool_parameter, int_parameter
from .protocols import CudaEngine, TensorRTRuntimeModule, TrtRuntime
from .slot import TensorRTContext, load_error

_LOG = logging.getLogger(__name__)

MAX_SLOTS = 16
DEFAULT_RESERVE = 256 << 20
PARAM_RESERVE = "trt_memory_reserve_bytes"
PARAM_MAX_SLOTS = "max_parallel_slots"
PARAM_PROFILE_PER_SLOT = "trt_profile_per_slot"
PARAM_PINNED_LIMIT = "trt_pinned_memory_limit_bytes"


class PlanRejected(ModelLoadError):
    """TensorRT refused a plan (another TensorRT version or GPU, or a damaged file)."""


def release_frames(error: BaseException) -> None:
    """Clear the locals of the finished frames in `error`'s traceback and in the errors chained to it.

    A traceback keeps its frames alive, and those frames hold TensorRT objects (an engine, a context). Without
    this, a failed load would keep them, and their GPU memory, for as long as anyone holds the exception, which
    defeats "free what was built before raising".
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
        current = current.__context__


def default_pinned_limit() -> int:
    """A quarter of the machine's physical memory: page-locked memory is taken from the operating system for good
    while it is held, and too much of it starves everything else. 0 where the size is unknown (no limit)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    except (ValueError, OSError, AttributeError):
        return 0


@dataclass
class Capacity:
    """What one slot costs and how many fit. Device bytes: activations, persistent memory and I/O buffers;
    host bytes: the pinned staging buffers."""

    weights_bytes: int = 0
    per_slot_bytes: int = 0
    host_bytes_per_slot: int = 0
    max_parallel_slots: int = 1
    notes: list[str] = field(default_factory=list)


class TensorRTModel(LoadedModel):
    """One deserialized engine (weights once) from which slot contexts are made.

    `create_context` may be called from several threads at once (TensorRT allows concurrent context creation
    from one engine). `close` closes any context still open, then drops the engine; it is idempotent.
    """

    interruptible = False  # enqueued GPU work cannot be cancelled

    def __init__(
        self,
        spec: ModelSpec,
        trt: TensorRTRuntimeModule,
        runtime: TrtRuntime,
        cuda: CudaRuntime,
        device: int,
        health: DeviceHealth,
        engine: CudaEngine,
        io: list[IoTensor],
        metadata: ModelMetadata,
        profiles: list[int],
        source: str,
    ) -> None:
        self.name = spec.name
        self.trt = trt
        self.cuda = cuda
        self.device = device
        self.health = health  # this model holds the device in `health` from its load until close()
        self.io = io
        self.metadata = metadata
        self.plan_source = source
        self.profile_per_slot = bool_parameter(spec, PARAM_PROFILE_PER_SLOT)
        self.engine: CudaEngine | None = engine
        # The engine keeps its runtime alive in TensorRT's bindings; holding it here too makes the order explicit.
        self._runtime: TrtRuntime | None = runtime
        self._lock = threading.Lock()  # guards: _contexts, _free_profiles, _closed
        self._contexts: list[TensorRTContext] = []
        self._free_profiles = sorted(profiles)
        self._closed = False
        self.capacity = Capacity()
        self.max_parallel_slots = 1

    @classmethod
    def open(
        cls,
        spec: ModelSpec,
        trt: TensorRTRuntimeModule,
        runtime: TrtRuntime,
        cuda: CudaRuntime,
        device: int,
        health: DeviceHealth,
        plan: bytes,
        source: str,
    ) -> TensorRTModel:
        """Deserialize `plan`, validate it against `spec`, measure one slot. Frees everything on failure (the
        caller still holds `health` for this model, and releases it then)."""
        where = origin(spec)
        free_before, _ = cuda.memory_info()
        engine = runtime.deserialize_cuda_engine(plan)
        if engine is None:
            free_now, _ = cuda.memory_info()
            if free_now < len(plan):
                raise OutOfDeviceMemoryError(f"{where}: not enough GPU memory for the engine's weights")
            raise PlanRejected(
                f"{where}: TensorRT could not deserialize the engine; a plan only runs on the TensorRT version and "
                f"GPU compute capability that built it (TensorRT {trt.__version__} here; see the server log)"
            )
        free_after, _ = cuda.memory_info()
        try:
            io = engine_io.io_tensors(trt, engine, where)
            profiles = (
                list(range(engine.num_optimization_profiles)) if bool_parameter(spec, PARAM_PROFILE_PER_SLOT) else [0]
            )
            ranges = engine_io.profile_ranges(engine, io, profiles)
            engine_io.check_batch_ranges(ranges, spec.max_batch_size, where)
            metadata = engine_io.metadata(spec, io, ranges)
            model = cls(spec, trt, runtime, cuda, device, health, engine, io, metadata, profiles, source)
        except BaseException as error:
            engine = None  # this frame lives on in the traceback: it must not keep the engine alive
            release_frames(error)
            raise
        del engine  # the model owns the only reference now, so close() really frees it
        try:
            model._measure(spec, weights=free_before - free_after, plan_size=len(plan))
        except BaseException as error:
            model.close(release_device=False)
            release_frames(error)
            raise
        capacity = model.capacity
        _LOG.info(
            "%s: TensorRT engine ready (plan %s): weights %.1f MiB, %.1f MiB GPU memory and %.1f MiB pinned "
            "host memory per slot, capacity %d (%s)",
            where,
            source,
            capacity.weights_bytes / 2**20,
            capacity.per_slot_bytes / 2**20,
            capacity.host_bytes_per_slot / 2**20,
            model.max_parallel_slots,
            ", ".join(capacity.notes),
        )
        return model

    def _measure(self, spec: ModelSpec, weights: int, plan_size: int) -> None:
        """Advertised capacity from measured memory: build one real slot, take the larger of its measured device
        cost (cudaMemGetInfo before/after: includes persistent memory the API does not report) and its known cost
        (activation memory + I/O buffers), then count how many fit in free memory minus the reserve. Pinned host
        memory per slot is counted too, and capped by trt_pinned_memory_limit_bytes."""
        engine = self.engine
        assert engine is not None
        free_before, _ = self.cuda.memory_info()
        probe = self.create_context()
        try:
            free_with_probe, _ = self.cuda.memory_info()
            known = int(engine.device_memory_size_v2) + probe.device_bytes
            host_per_slot = probe.host_bytes
        finally:
            probe.close()
        per_slot = max(free_before - free_with_probe, known, 1)
        free, _ = self.cuda.memory_info()
        reserve = int_parameter(spec, PARAM_RESERVE, DEFAULT_RESERVE, minimum=0)
        limits = {
            "memory": max(1, (free - reserve) // per_slot),
            "16": MAX_SLOTS,
            PARAM_MAX_SLOTS: int_parameter(spec, PARAM_MAX_SLOTS, MAX_SLOTS, minimum=1),
        }
        pinned_limit = int_parameter(spec, PARAM_PINNED_LIMIT, default_pinned_limit(), minimum=0)
        if pinned_limit and host_per_slot:
            limits["pinned host memory"] = max(1, pinned_limit // host_per_slot)
        if spec.instance_count:
            limits["instance_group count"] = spec.instance_count
        if self.profile_per_slot:
            limits["optimization profiles"] = len(self._free_profiles)
        # weights: measured around deserialization, or the plan size when other activity hid the difference.
        self.capacity = Capacity(
            weights if weights > 0 else plan_size,
            per_slot,
            host_per_slot,
            min(limits.values()),
            [f"{k}={v}" for k, v in limits.items()],
        )
        self.max_parallel_slots = self.capacity.max_parallel_slots

    # -- LoadedModel

    def create_context(self) -> TensorRTContext:
        """A new slot: execution context, stream, buffers. Blocks while CUDA allocates.

        Raises OutOfDeviceMemoryError / OutOfHostMemoryError when TensorRT or CUDA runs out of GPU or pinned host
        memory, ModelConfigError for an I/O layout slotserve cannot serve, DeviceFailedError on a failed GPU,
        ModelLoadError otherwise; whatever the slot had allocated is freed before raising.
        """
        with self._lock:
            if self._closed:
                raise ModelLoadError(f"{origin(self.name)}: the engine is closed")
            if not self._free_profiles:
                raise ModelLoadError(
                    f"{origin(self.name)}: every optimization profile is in use by a slot "
                    "(profile-per-slot mode allows one slot per profile)"
                )
            profile = self._free_profiles.pop(0) if self.profile_per_slot else self._free_profiles[0]
        try:
            slot = TensorRTContext(self, profile)
        except BaseException as error:
            # The slot was never registered, so its close() gave nothing back: the profile is released here, once.
            self._release_profile(profile)
            release_frames(error)
            if isinstance(error, CudaError):
                if error.sticky:
                    self.health.fail(error.code_name, self.name)
                raise load_error(origin(self.name), error) from None
            raise
        with self._lock:
            self._contexts.append(slot)
        return slot

    def _release_profile(self, profile: int) -> None:
        if self.profile_per_slot:
            with self._lock:
                self._free_profiles.append(profile)
                self._free_profiles.sort()

    def context_closed(self, slot: TensorRTContext) -> None:
        """Called by a slot's close(): a registered slot gives its profile back."""
        with self._lock:
            registered = slot in self._contexts
            if registered:
                self._contexts.remove(slot)
        if registered:
            self._release_profile(slot.profile)

    def memory_bytes(self, slots: int) -> int:
        """GPU memory of the engine with `slots` slots (what the server's memory budget counts)."""
        return self.capacity.weights_bytes + slots * self.capacity.per_slot_bytes

    def host_memory_bytes(self, slots: int) -> int:
        """Pinned host memory of `slots` slots' staging buffers (data-dependent outputs' buffers grow with use)."""
        return slots * self.capacity.host_bytes_per_slot

    def profile_shapes(self, name: str, profile: int = 0) -> ProfileRange:
        """(min, opt, max) shapes of input `name` in `profile`, batch dimension included."""
        engine = self.engine
        if engine is None:
            raise ModelLoadError(f"{origin(self.name)}: the engine is closed")
        return engine_io.profile_range(engine.get_tensor_profile_shape(name, profile))

    def close(self, release_device: bool = True) -> None:
        """Free the engine. Contexts still open are closed first (they hold device memory of the engine's
        making); the server normally closed them already. Idempotent; never raises. `release_device` False
        leaves the model's hold on the device to the caller (a load that failed releases it itself)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            leftover = list(self._contexts)
        if leftover:
            _LOG.warning("%s: closing %d slot context(s) left open before the engine", origin(self.name), len(leftover))
        for slot in reversed(leftover):
            slot.close()
        if self.health.fault is None:
            try:
                self.cuda.use_device(self.device)  # the engine's memory is freed on its own device
            except CudaError as error:
                _LOG.error("%s: setting the device while closing the engine: %s", origin(self.name), error)
        # Dropping the last references destroys the engine (TensorRT's Python objects have no explicit destroy).
        self.engine = None
        self._runtime = None
        if release_device:
            self.health.leave(self.name)
