"""TensorRT on an NVIDIA GPU: one deserialized engine per model, one execution context + stream + buffers per slot.

Weights live in the engine and are paid once; each slot pays its context's activation memory, its I/O buffers
(device buffers sized for the profile maximum, pinned host staging buffers) and a non-blocking CUDA stream. That
is where this beats N copies of a model.

Selected by `backend: "tensorrt"` or `platform: "tensorrt_plan"` in config.pbtxt. The model file is `1/model.plan`
(a prebuilt engine: it must come from the same TensorRT version and GPU model) or `1/model.onnx`, from which an
engine is built once and cached (builder.py, profiles.py).

Parameters read from config.pbtxt (all optional):
    trt_profile_min / trt_profile_opt / trt_profile_max   ranges of -1 dimensions (see profiles.py)
    trt_default_dim_max      max of every -1 dimension without its own range
    trt_opt_batch_size       the profile's opt batch size (default max_batch_size)
    trt_profile_per_slot     "true": the engine gets one optimization profile per slot and slot i uses profile
                             i (the pre-TensorRT-8.6 rule for concurrent contexts; off by default, since TensorRT
                             >= 10 lets contexts share a profile)
    trt_workspace_bytes      builder workspace limit (default 1 GiB)
    trt_cache_dir            plan cache directory (default $SLOTSERVE_TRT_CACHE or ~/.cache/slotserve/tensorrt)
    trt_memory_reserve_bytes device memory kept free when computing capacity (default 256 MiB)
    trt_device               CUDA device index (default 0)
    max_parallel_slots       cap on the advertised capacity (default 16)

Failure behaviour: without cuda-python, TensorRT or a CUDA device, `load` raises BackendUnavailableError (the
server answers FAILED_PRECONDITION) whose message says how to serve the same directory with ONNX Runtime. The
device count is probed *before* any TensorRT Runtime exists: a Runtime made without a driver segfaults on first
use. A context that cannot be allocated raises OutOfDeviceMemoryError after freeing what it had allocated.

Threads: `load` and `create_context` may run on any thread, concurrently for different models; each CUDA-using
entry point makes the model's device current on its thread first. A context is used by one thread at a time
(the server guarantees it; TensorRT requires it). Work enqueued on the GPU cannot be cancelled: a request is
dropped before enqueue if its caller gave up, and after enqueue the slot waits for its stream to drain before it
returns (`interruptible = False`).
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from .. import datatypes
from ..errors import (BackendUnavailableError, ExecutionCancelled, ExecutionError, InvalidInputError,
                      ModelConfigError, ModelLoadError, OutOfDeviceMemoryError)
from ..interface import Backend, CancelToken, Context, LoadedModel, ModelMetadata, ModelSpec, Outputs, TensorSpec
from .builder import (DEFAULT_WORKSPACE, PARAM_CACHE_DIR, PARAM_WORKSPACE, PlanCache, build_plan,
                      default_cache_dir, write_atomic)
from .cuda import CudaError, CudaRuntime, host_view, real_cuda_utils
from .profiles import bool_parameter, cache_key, file_sha256, int_parameter, onnx_inputs, profile_for
from .protocols import (CudaEngine, CudaRuntimeModule, ExecutionContext, TensorRTBuilderModule,
                        TensorRTRuntimeModule, TrtRuntime)

_LOG = logging.getLogger(__name__)

MAX_SLOTS = 16
DEFAULT_RESERVE = 256 << 20
PARAM_RESERVE = "trt_memory_reserve_bytes"
PARAM_DEVICE = "trt_device"
PARAM_MAX_SLOTS = "max_parallel_slots"
PARAM_PROFILE_PER_SLOT = "trt_profile_per_slot"

FALLBACK_HINT = ('To serve this model directory on the CPU with ONNX Runtime instead, set backend: "onnxruntime" '
                 'in its config.pbtxt (the directory needs 1/model.onnx).')
INSTALL_HINT = "Install the GPU extra with `pip install .[tensorrt]` (TensorRT and cuda-python)."

# TensorRT DataType member name -> KServe datatype. Types without a KServe name (FP8, INT4, FP4, E8M0) are
# refused at load.
_KSERVE_TYPE = {"FLOAT": "FP32", "HALF": "FP16", "BF16": "BF16", "INT8": "INT8", "INT32": "INT32",
                "INT64": "INT64", "BOOL": "BOOL", "UINT8": "UINT8"}


def _origin(spec_or_name: ModelSpec | str) -> str:
    name = spec_or_name if isinstance(spec_or_name, str) else spec_or_name.name
    return f"model '{name}'"


def _volume(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def _import_cudart() -> CudaRuntimeModule | None:
    try:
        module: CudaRuntimeModule = importlib.import_module("cuda.bindings.runtime")
        return module
    except ImportError:
        return None


def _import_tensorrt() -> TensorRTRuntimeModule | None:
    """The full `tensorrt` package if installed, else the runtime-only `tensorrt_lean` (no builder)."""
    for name in ("tensorrt", "tensorrt_lean"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        # An install of only `tensorrt-stubs` leaves an empty namespace package named `tensorrt`: no Runtime.
        if hasattr(module, "Runtime"):
            found: TensorRTRuntimeModule = module
            return found
    return None


class PlanRejected(ModelLoadError):
    """TensorRT refused a plan (another TensorRT version or GPU model, or a damaged file)."""


def _release_frames(error: BaseException) -> None:
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


# (min, opt, max) shapes of one input in one optimization profile, batch dimension included.
ProfileRange = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True)
class IoTensor:
    """One engine I/O tensor. `shape` is the engine's, batch dimension included, -1 where dynamic."""

    name: str
    is_input: bool
    datatype: str  # KServe name
    dtype: np.dtype
    shape: tuple[int, ...]


# ------------------------------------------------------------------------------------------------- the backend


class TensorRTBackend(Backend):
    """Loads TensorRT engines. `trt_module` / `cudart_module` default to the real `tensorrt` (or `tensorrt_lean`)
    and `cuda.bindings.runtime`, imported on first load; tests pass the double's (engine/tensorrt/double.py).
    `cache_dir` overrides the default plan cache directory (a model's `trt_cache_dir` parameter wins)."""

    name = "tensorrt"

    def __init__(self, trt_module: Any = None, cudart_module: Any = None, *, cuda_utils_module: Any = None,
                 cache_dir: Path | str | None = None) -> None:
        self._trt_module = trt_module
        self._cudart_module = cudart_module
        self._cuda_utils_module = cuda_utils_module
        self._cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._lock = threading.Lock()  # guards: _logger, _runtimes
        self._logger: Any = None
        self._runtimes: dict[int, TrtRuntime] = {}
        # Serializes builds and plan-cache lookups: one build per GPU at a time (concurrent builds perturb kernel
        # timings, and Triton holds a global mutex around engine creation), and two loads of one model never
        # build the same plan twice.
        self._build_lock = threading.Lock()

    # -- modules and runtime

    def _cuda(self, origin: str) -> CudaRuntime:
        module = self._cudart_module
        if module is None:
            module = _import_cudart()
            if module is None:
                raise BackendUnavailableError(
                    f"{origin}: the TensorRT backend needs cuda-python (cuda.bindings), which is not installed. "
                    f"{INSTALL_HINT} {FALLBACK_HINT}")
            self._cudart_module = module
            self._cuda_utils_module = real_cuda_utils()
        return CudaRuntime(module, self._cuda_utils_module)

    def _tensorrt(self, origin: str) -> TensorRTRuntimeModule:
        module = self._trt_module or _import_tensorrt()
        if module is None:
            raise BackendUnavailableError(
                f"{origin}: the TensorRT backend needs the tensorrt package, which is not installed. "
                f"{INSTALL_HINT} {FALLBACK_HINT}")
        self._trt_module = module
        return module

    def _runtime(self, trt: TensorRTRuntimeModule, device: int) -> tuple[Any, TrtRuntime]:
        """(logger, runtime) for `device`, made once. Only called after the device probe succeeded, and on a
        thread whose current device is `device` (a Runtime binds to the current device)."""
        with self._lock:
            if self._logger is None:
                self._logger = trt.Logger(trt.Logger.WARNING)
            runtime = self._runtimes.get(device)
            if runtime is None:
                runtime = self._runtimes[device] = trt.Runtime(self._logger)
            return self._logger, runtime

    # -- load

    def load(self, spec: ModelSpec) -> TensorRTModel:
        """Deserialize (or build, then cache) the model's engine, check its I/O against the config and measure
        one slot's device memory. Blocks for the whole load, a build included (minutes for large models).

        Raises BackendUnavailableError (no cuda-python, no TensorRT, no CUDA device), ModelConfigError,
        OutOfDeviceMemoryError or ModelLoadError; on failure nothing stays allocated.
        """
        origin = _origin(spec)
        if spec.model_file is None or not spec.model_file.exists():
            raise ModelConfigError(f"{origin}: model file not found")
        cuda = self._cuda(origin)
        device = int_parameter(spec, PARAM_DEVICE, 0, minimum=0)
        # The probe comes before anything else touches TensorRT: a Runtime made without a device segfaults.
        count, reason = cuda.device_count()
        if count == 0:
            raise BackendUnavailableError(
                f"{origin}: the TensorRT backend needs an NVIDIA GPU and none is usable here ({reason}). "
                f"{FALLBACK_HINT}")
        if device >= count:
            raise ModelConfigError(f"{origin}: parameter {PARAM_DEVICE} is {device}, but only {count} CUDA "
                                   f"device{'s' if count != 1 else ''} found")
        trt = self._tensorrt(origin)
        try:
            cuda.use_device(device)
            logger, runtime = self._runtime(trt, device)
            plan, source, cached_path = self._plan(spec, trt, logger, cuda, device)
            try:
                return TensorRTModel.open(spec, trt, runtime, cuda, device, plan, source)
            except PlanRejected:
                if cached_path is None:
                    raise
            # A cached plan that no longer deserializes (a driver update, a damaged file): rebuild it once.
            _LOG.warning("%s: the cached TensorRT plan %s did not load; rebuilding it", origin, cached_path)
            PlanCache.discard(cached_path)
            plan, source, _ = self._plan(spec, trt, logger, cuda, device)
            return TensorRTModel.open(spec, trt, runtime, cuda, device, plan, source)
        except CudaError as error:
            raise _load_error(origin, error) from None
        except OSError as error:  # the model file, or the plan cache, could not be read
            raise ModelLoadError(
                f"{origin}: cannot read {error.filename or 'a model file'}: {error.strerror}") from None

    def cache_dir(self, spec: ModelSpec) -> Path:
        explicit = spec.parameter(PARAM_CACHE_DIR)
        if explicit:
            return Path(explicit)
        return self._cache_dir or default_cache_dir()

    def _plan(self, spec: ModelSpec, trt: TensorRTRuntimeModule, logger: Any, cuda: CudaRuntime,
              device: int) -> tuple[bytes, str, Path | None]:
        """(plan bytes, "prebuilt" | "cache" | "built", cache path when it came from the cache)."""
        path = spec.model_file
        assert path is not None
        if path.suffix != ".onnx":
            return path.read_bytes(), "prebuilt", None
        origin = _origin(spec)
        profile = profile_for(spec, onnx_inputs(path))
        workspace = int_parameter(spec, PARAM_WORKSPACE, DEFAULT_WORKSPACE, minimum=1)
        gpu = cuda.device_name(device)
        key = cache_key(file_sha256(path), str(trt.__version__), gpu, profile, workspace)
        cache = PlanCache(self.cache_dir(spec))
        plan_path = cache.plan_path(spec.name, key)
        with self._build_lock:
            plan = cache.read(plan_path)
            if plan is not None:
                return plan, "cache", plan_path
            if not hasattr(trt, "Builder"):
                raise BackendUnavailableError(
                    f"{origin}: building an engine from {path.name} needs the full tensorrt package (the installed "
                    f"runtime-only tensorrt_lean has no builder). {INSTALL_HINT} Or put a model.plan built for this "
                    f"GPU and TensorRT {trt.__version__} in the version directory. {FALLBACK_HINT}")
            timing_path = cache.timing_path(str(trt.__version__), gpu)
            _LOG.info("%s: building a TensorRT engine from %s (%d profile%s); this can take minutes",
                      origin, path.name, profile.count, "s" if profile.count != 1 else "")
            plan, timing = build_plan(cast(TensorRTBuilderModule, trt), logger, path, profile, workspace,
                                      cache.read(timing_path), origin)
            try:
                write_atomic(plan_path, plan)
                write_atomic(timing_path, timing)
            except OSError as error:  # a read-only cache costs a rebuild on restart, not this load
                _LOG.warning("%s: could not write the TensorRT plan cache in %s: %s", origin, cache.directory, error)
            return plan, "built", None


def _load_error(origin: str, error: CudaError) -> ModelLoadError:
    """OutOfDeviceMemoryError for cudaErrorMemoryAllocation, ModelLoadError for any other CUDA failure."""
    if error.out_of_memory:
        return OutOfDeviceMemoryError(f"{origin}: out of GPU memory ({error})")
    return ModelLoadError(f"{origin}: CUDA error while loading: {error}")


# ---------------------------------------------------------------------------------------- engine inspection


def _io_tensors(trt: TensorRTRuntimeModule, engine: CudaEngine, origin: str) -> list[IoTensor]:
    """The engine's I/O tensors in engine order, from the name-based API."""
    tensors = []
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        mode = engine.get_tensor_mode(name)
        if mode not in (trt.TensorIOMode.INPUT, trt.TensorIOMode.OUTPUT):
            continue
        if engine.get_tensor_location(name) != trt.TensorLocation.DEVICE:
            raise ModelConfigError(f"{origin}: tensor '{name}' lives in host memory (a shape tensor); slotserve "
                                   "serves engines whose I/O tensors are all on the device")
        type_name = engine.get_tensor_dtype(name).name
        datatype = _KSERVE_TYPE.get(type_name)
        if datatype is None:
            raise ModelConfigError(f"{origin}: tensor '{name}' has TensorRT type {type_name}, which has no KServe "
                                   f"datatype; supported: {', '.join(sorted(_KSERVE_TYPE))}")
        shape = tuple(int(d) for d in engine.get_tensor_shape(name))
        tensors.append(IoTensor(name, mode == trt.TensorIOMode.INPUT, datatype, datatypes.numpy_dtype(datatype),
                                shape))
    if not any(t.is_input for t in tensors) or not any(not t.is_input for t in tensors):
        raise ModelConfigError(f"{origin}: the engine has no inputs or no outputs")
    return tensors


def _profile_ranges(engine: CudaEngine, io: list[IoTensor], profiles: Sequence[int]) -> dict[str, list[ProfileRange]]:
    """{input name: [(min, opt, max) per profile in `profiles`]}."""
    return {t.name: [_profile_range(engine.get_tensor_profile_shape(t.name, p)) for p in profiles]
            for t in io if t.is_input}


def _profile_range(shapes: Sequence[Sequence[int]]) -> ProfileRange:
    low, opt, high = (tuple(int(d) for d in shape) for shape in shapes)
    return low, opt, high


def _served(tensor: IoTensor, max_batch_size: int, origin: str) -> TensorSpec:
    """The tensor as the protocol serves it: without the engine's batch dimension for a batching model."""
    if max_batch_size == 0:
        return TensorSpec(tensor.name, tensor.datatype, tensor.shape)
    if not tensor.shape or tensor.shape[0] not in (-1, 1) or (tensor.shape[0] == 1 and max_batch_size != 1):
        raise ModelConfigError(
            f"{origin}: max_batch_size is {max_batch_size}, but the engine's '{tensor.name}' has shape "
            f"{list(tensor.shape)}, without a dynamic first (batch) dimension")
    return TensorSpec(tensor.name, tensor.datatype, tensor.shape[1:])


def _check_batch_ranges(ranges: dict[str, list[ProfileRange]], max_batch_size: int, origin: str) -> None:
    if max_batch_size == 0:
        return
    for name, per_profile in ranges.items():
        for index, (low, _, high) in enumerate(per_profile):
            if low[0] > 1 or high[0] < max_batch_size:
                raise ModelConfigError(
                    f"{origin}: the engine's profile {index} allows batch sizes {low[0]}..{high[0]} for '{name}', "
                    f"but max_batch_size {max_batch_size} needs 1..{max_batch_size}")


def _reconcile(declared: tuple[TensorSpec, ...], actual: list[TensorSpec], kind: str, origin: str,
               ranges: dict[str, list[ProfileRange]], batching: bool) -> tuple[TensorSpec, ...]:
    """The tensors as served: the config's, checked against the engine, or the engine's when the config
    declares none. A fixed config dimension over a dynamic engine one must lie inside every profile used."""
    by_name = {t.name: t for t in actual}
    if not declared:
        return tuple(actual)
    for spec in declared:
        model = by_name.get(spec.name)
        if model is None:
            raise ModelConfigError(f"{origin}: {kind} '{spec.name}' is not in the engine; it has {sorted(by_name)}")
        if model.datatype != spec.datatype:
            raise ModelConfigError(
                f"{origin}: {kind} '{spec.name}' is {model.datatype} in the engine, {spec.datatype} in the config")
        if len(model.shape) != len(spec.shape) or any(
                m != -1 and d != -1 and m != d for m, d in zip(model.shape, spec.shape)):
            raise ModelConfigError(
                f"{origin}: {kind} '{spec.name}' has dims {list(model.shape)} in the engine "
                f"({'after the batch dimension' if batching else 'no batching'}), {list(spec.shape)} in the config")
        skip = 1 if batching else 0
        for low, _, high in ranges.get(spec.name, ()):
            for index, dim in enumerate(spec.shape):
                if dim != -1 and not low[index + skip] <= dim <= high[index + skip]:
                    raise ModelConfigError(
                        f"{origin}: {kind} '{spec.name}' dimension {index} is {dim} in the config, outside the "
                        f"engine's profile range {low[index + skip]}..{high[index + skip]}")
    if kind == "input":
        missing = sorted(set(by_name) - {s.name for s in declared})
        if missing:
            raise ModelConfigError(f"{origin}: the engine's inputs {missing} are not in the config")
    return declared


def _metadata(spec: ModelSpec, io: list[IoTensor], ranges: dict[str, list[ProfileRange]], origin: str) -> ModelMetadata:
    batching = spec.max_batch_size > 0
    inputs = [_served(t, spec.max_batch_size, origin) for t in io if t.is_input]
    outputs = [_served(t, spec.max_batch_size, origin) for t in io if not t.is_input]
    return ModelMetadata(
        inputs=_reconcile(spec.inputs, inputs, "input", origin, ranges, batching),
        outputs=_reconcile(spec.outputs, outputs, "output", origin, ranges, batching),
        max_batch_size=spec.max_batch_size,
        platform="tensorrt_plan",
    )


# --------------------------------------------------------------------------------------------- loaded model


@dataclass
class _Capacity:
    weights_bytes: int = 0
    per_slot_bytes: int = 0
    max_parallel_slots: int = 1
    notes: list[str] = field(default_factory=list)


class TensorRTModel(LoadedModel):
    """One deserialized engine (weights once) from which slot contexts are made.

    `create_context` may be called from several threads at once (TensorRT allows concurrent context creation
    from one engine). `close` closes any context still open, then drops the engine; it is idempotent.
    """

    interruptible = False  # enqueued GPU work cannot be cancelled

    def __init__(self, spec: ModelSpec, trt: TensorRTRuntimeModule, runtime: TrtRuntime, cuda: CudaRuntime,
                 device: int, engine: CudaEngine, io: list[IoTensor], metadata: ModelMetadata,
                 profiles: list[int], source: str) -> None:
        self.name = spec.name
        self.trt = trt
        self.cuda = cuda
        self.device = device
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
        self.capacity = _Capacity()
        self.max_parallel_slots = 1

    @classmethod
    def open(cls, spec: ModelSpec, trt: TensorRTRuntimeModule, runtime: TrtRuntime, cuda: CudaRuntime,
             device: int, plan: bytes, source: str) -> TensorRTModel:
        """Deserialize `plan`, validate it against `spec`, measure one slot. Frees everything on failure."""
        origin = _origin(spec)
        free_before, _ = cuda.memory_info()
        engine = runtime.deserialize_cuda_engine(plan)
        if engine is None:
            free_now, _ = cuda.memory_info()
            if free_now < len(plan):
                raise OutOfDeviceMemoryError(f"{origin}: not enough GPU memory for the engine's weights")
            raise PlanRejected(
                f"{origin}: TensorRT could not deserialize the engine; a plan only runs on the TensorRT version and "
                f"GPU model that built it (TensorRT {trt.__version__} here; see the server log)")
        free_after, _ = cuda.memory_info()
        try:
            io = _io_tensors(trt, engine, origin)
            profiles = list(range(engine.num_optimization_profiles)) if bool_parameter(
                spec, PARAM_PROFILE_PER_SLOT) else [0]
            ranges = _profile_ranges(engine, io, profiles)
            _check_batch_ranges(ranges, spec.max_batch_size, origin)
            metadata = _metadata(spec, io, ranges, origin)
            model = cls(spec, trt, runtime, cuda, device, engine, io, metadata, profiles, source)
        except BaseException as error:
            engine = None  # this frame lives on in the traceback: it must not keep the engine alive
            _release_frames(error)
            raise
        del engine  # the model owns the only reference now, so close() really frees it
        try:
            model._measure(spec, weights=free_before - free_after, plan_size=len(plan))
        except BaseException as error:
            model.close()
            _release_frames(error)
            raise
        _LOG.info("%s: TensorRT engine ready (plan %s): weights %.1f MiB, %.1f MiB per slot, capacity %d",
                  origin, source, model.capacity.weights_bytes / 2**20, model.capacity.per_slot_bytes / 2**20,
                  model.max_parallel_slots)
        return model

    def _measure(self, spec: ModelSpec, weights: int, plan_size: int) -> None:
        """Advertised capacity from measured memory: build one real slot, take the larger of its measured cost
        (cudaMemGetInfo before/after: includes persistent memory the API does not report) and its known cost
        (activation memory + I/O buffers), then count how many fit in free memory minus the reserve."""
        engine = self.engine
        assert engine is not None
        free_before, _ = self.cuda.memory_info()
        probe = self.create_context()
        try:
            free_with_probe, _ = self.cuda.memory_info()
            known = int(engine.device_memory_size_v2) + probe.device_bytes
        finally:
            probe.close()
        per_slot = max(free_before - free_with_probe, known, 1)
        free, _ = self.cuda.memory_info()
        reserve = int_parameter(spec, PARAM_RESERVE, DEFAULT_RESERVE, minimum=0)
        limits = {"memory": max(1, (free - reserve) // per_slot), "16": MAX_SLOTS,
                  PARAM_MAX_SLOTS: int_parameter(spec, PARAM_MAX_SLOTS, MAX_SLOTS, minimum=1)}
        if spec.instance_count:
            limits["instance_group count"] = spec.instance_count
        if self.profile_per_slot:
            limits["optimization profiles"] = len(self._free_profiles)
        # weights: measured around deserialization, or the plan size when other activity hid the difference.
        self.capacity = _Capacity(weights if weights > 0 else plan_size, per_slot, min(limits.values()),
                                  [f"{k}={v}" for k, v in limits.items()])
        self.max_parallel_slots = self.capacity.max_parallel_slots

    # -- LoadedModel

    def create_context(self) -> TensorRTContext:
        """A new slot: execution context, stream, buffers. Blocks while CUDA allocates.

        Raises OutOfDeviceMemoryError when TensorRT or CUDA runs out of device memory, ModelLoadError otherwise;
        whatever the slot had allocated is freed before raising.
        """
        with self._lock:
            if self._closed:
                raise ModelLoadError(f"{_origin(self.name)}: the engine is closed")
            if not self._free_profiles:
                raise ModelLoadError(f"{_origin(self.name)}: every optimization profile is in use by a slot "
                                     "(profile-per-slot mode allows one slot per profile)")
            profile = self._free_profiles.pop(0) if self.profile_per_slot else self._free_profiles[0]
        try:
            slot = TensorRTContext(self, profile)
        except BaseException:
            self._release_profile(profile)
            raise
        with self._lock:
            self._contexts.append(slot)
        return slot

    def _release_profile(self, profile: int) -> None:
        if self.profile_per_slot:
            with self._lock:
                self._free_profiles.append(profile)
                self._free_profiles.sort()

    def _context_closed(self, slot: TensorRTContext) -> None:
        with self._lock:
            if slot in self._contexts:
                self._contexts.remove(slot)
        self._release_profile(slot.profile)

    def memory_bytes(self, slots: int) -> int:
        return self.capacity.weights_bytes + slots * self.capacity.per_slot_bytes

    def profile_shapes(self, name: str, profile: int = 0) -> ProfileRange:
        """(min, opt, max) shapes of input `name` in `profile`, batch dimension included."""
        engine = self.engine
        if engine is None:
            raise ModelLoadError(f"{_origin(self.name)}: the engine is closed")
        return _profile_range(engine.get_tensor_profile_shape(name, profile))

    def close(self) -> None:
        """Free the engine. Contexts still open are closed first (they hold device memory of the engine's
        making); the server normally closed them already. Idempotent; never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            leftover = list(self._contexts)
        if leftover:
            _LOG.warning("%s: closing %d slot context(s) left open before the engine", _origin(self.name),
                         len(leftover))
        for slot in reversed(leftover):
            slot.close()
        try:
            self.cuda.use_device(self.device)  # the engine's memory is freed on its own device
        except CudaError as error:
            _LOG.error("%s: setting the device while closing the engine: %s", _origin(self.name), error)
        # Dropping the last references destroys the engine (TensorRT's Python objects have no explicit destroy).
        self.engine = None
        self._runtime = None


# ---------------------------------------------------------------------------------------------------- slots


@dataclass
class _Buffer:
    """One I/O tensor's memory in one slot: a device buffer and a pinned host staging buffer, both sized for
    the largest shape the slot's profile allows."""

    tensor: IoTensor
    nbytes: int
    device: int = 0
    host: int = 0
    view: np.ndarray | None = None


class TensorRTContext(Context):
    """One slot: an IExecutionContext, its own non-blocking CUDA stream, and its own buffers.

    Nothing is shared with other slots except the engine's weights, so slots run concurrently without locks.
    Used by one thread at a time (the server's guarantee; TensorRT's rule); `close` is never concurrent with
    `execute`.
    """

    def __init__(self, model: TensorRTModel, profile: int) -> None:
        self._model = model
        self.profile = profile
        self._context: ExecutionContext | None = None
        self._stream: Any = None
        self._buffers: dict[str, _Buffer] = {}
        self._closed = False
        try:
            self._open()
        except BaseException as error:
            self.close()
            # The frames of _open and its helpers hold the context; the traceback must not keep it alive.
            _release_frames(error)
            if isinstance(error, CudaError):
                raise _load_error(_origin(model.name), error) from None
            raise

    @property
    def device_bytes(self) -> int:
        """Device memory of this slot's I/O buffers."""
        return sum(b.nbytes for b in self._buffers.values())

    def _open(self) -> None:
        model, cuda = self._model, self._model.cuda
        origin = _origin(model.name)
        cuda.use_device(model.device)
        engine = model.engine
        assert engine is not None
        context = engine.create_execution_context()
        if context is None:  # TensorRT's answer to "no device memory for the activations"
            raise OutOfDeviceMemoryError(f"{origin}: out of GPU memory for another execution context")
        self._context = context
        self._stream = cuda.stream_create()
        if model.profile_per_slot:
            self._select_profile(context)
        for tensor, shape in self._max_shapes(context):
            if any(d < 0 for d in shape):
                raise ModelConfigError(f"{origin}: output '{tensor.name}' has a data-dependent shape "
                                       f"{list(shape)}; slotserve cannot size its buffer")
            buffer = self._buffers[tensor.name] = _Buffer(tensor, _volume(shape) * tensor.dtype.itemsize)
            buffer.device = cuda.malloc(buffer.nbytes)
            buffer.host = cuda.host_alloc(buffer.nbytes)
            buffer.view = host_view(buffer.host, buffer.nbytes)
            # Addresses never change for the slot's life, so they are bound once here, not per request.
            if not context.set_tensor_address(tensor.name, buffer.device):
                raise ModelLoadError(f"{origin}: TensorRT refused the address of '{tensor.name}'")

    def _select_profile(self, context: ExecutionContext) -> None:
        """Profile-per-slot mode: switch this context to its own profile. The switch may enqueue copies on the
        stream, so the stream is drained before the context is used."""
        try:
            ok = context.set_optimization_profile_async(self.profile, self._model.cuda.stream_handle(self._stream))
        except RuntimeError as error:  # TensorRT's Python binding raises on an invalid index
            raise ModelLoadError(
                f"{_origin(self._model.name)}: cannot select profile {self.profile}: {error}") from None
        if not ok:
            raise ModelLoadError(f"{_origin(self._model.name)}: cannot select optimization profile {self.profile}")
        self._model.cuda.stream_synchronize(self._stream)

    def _max_shapes(self, context: ExecutionContext) -> list[tuple[IoTensor, tuple[int, ...]]]:
        """Every tensor's largest shape in this slot's profile: inputs from the profile's max, outputs as
        TensorRT infers them with every input set to its max."""
        model = self._model
        shapes = []
        for tensor in model.io:
            if tensor.is_input:
                largest = model.profile_shapes(tensor.name, self.profile)[2]
                if not context.set_input_shape(tensor.name, largest):
                    raise ModelLoadError(f"{_origin(model.name)}: TensorRT refused the profile's max shape "
                                         f"{list(largest)} for '{tensor.name}'")
                shapes.append((tensor, largest))
        for tensor in model.io:
            if not tensor.is_input:
                shapes.append((tensor, tuple(int(d) for d in context.get_tensor_shape(tensor.name))))
        return shapes

    # -- execute

    def _check_request(self, inputs: Mapping[str, np.ndarray],
                       outputs: Sequence[str]) -> tuple[dict[str, np.ndarray], list[str]]:
        model = self._model
        arrays = {}
        for tensor in model.io:
            if not tensor.is_input:
                continue
            array = inputs.get(tensor.name)
            if array is None:
                raise InvalidInputError(f"missing input '{tensor.name}'")
            if array.dtype != tensor.dtype:
                raise InvalidInputError(
                    f"input '{tensor.name}' has datatype {datatypes.from_numpy(array.dtype)}, the model expects "
                    f"{tensor.datatype}")
            arrays[tensor.name] = np.ascontiguousarray(array)
        unknown = sorted(set(inputs) - set(arrays))
        if unknown:
            raise InvalidInputError(f"unknown input(s) {unknown}; the model takes {sorted(arrays)}")
        produced = [t.name for t in model.io if not t.is_input]
        names = list(outputs) if outputs else produced
        for name in names:
            if name not in produced:
                raise InvalidInputError(f"unknown requested output '{name}'; the model produces {sorted(produced)}")
        return arrays, names

    @property
    def _trt(self) -> ExecutionContext:
        """The IExecutionContext. Methods fetch it through this property instead of keeping it in a local:
        a traceback keeps frames alive, and a frame holding the context would keep it (and the engine, and their
        GPU memory) alive after close() for as long as someone holds the exception."""
        context = self._context
        if context is None:
            raise ExecutionError(f"{_origin(self._model.name)}: the slot is closed")
        return context

    def _set_shapes(self, arrays: dict[str, np.ndarray]) -> None:
        for name, array in arrays.items():
            if not self._trt.set_input_shape(name, array.shape):
                low, _, high = self._model.profile_shapes(name, self.profile)
                raise InvalidInputError(
                    f"input '{name}' has shape {list(array.shape)}; the engine accepts shapes from {list(low)} to "
                    f"{list(high)}")

    def execute(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], cancel: CancelToken) -> Outputs:
        """Run one request on this slot's stream and block until the stream drained.

        Raises InvalidInputError (shape outside the profile, wrong datatype), ExecutionCancelled (the caller gave
        up: before enqueue the request is dropped; after enqueue the run finishes and its result is dropped),
        ExecutionError (TensorRT or CUDA failed, or the slot is closed).
        """
        if self._closed:
            raise ExecutionError(f"{_origin(self._model.name)}: the slot is closed")
        arrays, names = self._check_request(inputs, outputs)
        cuda = self._model.cuda
        cuda.use_device(self._model.device)
        if cancel.cancelled:
            raise ExecutionCancelled("the caller gave up before the run was enqueued")
        self._set_shapes(arrays)
        shapes = {name: tuple(int(d) for d in self._trt.get_tensor_shape(name)) for name in names}
        # Staging into pinned memory is safe: the previous run on this slot has drained (execute never returns
        # earlier), so no copy is still reading these host buffers.
        for name, array in arrays.items():
            buffer = self._buffers[name]
            assert buffer.view is not None
            buffer.view[:array.nbytes] = array.reshape(-1).view(np.uint8)
        # Last point where a request can be dropped for free: after this the GPU owns the slot until it drains.
        if cancel.cancelled:
            raise ExecutionCancelled("the caller gave up before the run was enqueued")
        failure = self._enqueue(arrays, names, shapes, cancel)
        drain_failure = self._drain()
        if failure or drain_failure:
            _LOG.error("%s: TensorRT run failed: %s", _origin(self._model.name), failure or drain_failure)
            raise ExecutionError(f"model '{self._model.name}' failed to execute")
        if cancel.cancelled:
            raise ExecutionCancelled("the caller gave up while the run was on the GPU; its result was dropped")
        return {name: self._read_output(name, shapes[name]) for name in names}

    def _enqueue(self, arrays: dict[str, np.ndarray], names: list[str], shapes: dict[str, tuple[int, ...]],
                 cancel: CancelToken) -> str | None:
        """Queue copy-in, inference and copy-out on the slot's stream. Returns a failure description or None.
        Never raises for CUDA/TensorRT failures: the caller must drain the stream whatever happened here."""
        cuda, stream = self._model.cuda, self._stream
        try:
            for name, array in arrays.items():
                if array.nbytes:
                    cuda.copy_to_device_async(self._buffers[name].device, self._buffers[name].host, array.nbytes,
                                              stream)
            if not self._trt.execute_async_v3(cuda.stream_handle(stream)):
                return "execute_async_v3 returned False"
            # The copy-out is skipped for a caller that already left: it is the only part still skippable.
            if cancel.cancelled:
                return None
            for name in names:
                nbytes = _volume(shapes[name]) * self._buffers[name].tensor.dtype.itemsize
                if nbytes > self._buffers[name].nbytes:
                    return f"output '{name}' shape {list(shapes[name])} exceeds its buffer"
                if nbytes:
                    cuda.copy_to_host_async(self._buffers[name].host, self._buffers[name].device, nbytes, stream)
        except CudaError as error:
            return str(error)
        return None

    def _drain(self) -> str | None:
        """Wait for everything queued on the stream. Errors of the asynchronous work surface here."""
        try:
            self._model.cuda.stream_synchronize(self._stream)
        except CudaError as error:
            return str(error)
        return None

    def _read_output(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        buffer = self._buffers[name]
        assert buffer.view is not None
        nbytes = _volume(shape) * buffer.tensor.dtype.itemsize
        # A copy: the staging buffer belongs to the slot and is overwritten by its next request.
        return buffer.view[:nbytes].view(buffer.tensor.dtype).reshape(shape).copy()

    # -- close

    def close(self) -> None:
        """Free the slot: wait for its stream, drop the execution context, free the buffers, destroy the
        stream. Idempotent; errors are logged, never raised, so teardown always completes."""
        if self._closed:
            return
        self._closed = True
        model, cuda = self._model, self._model.cuda
        origin = _origin(model.name)

        def attempt(what: str, action: Callable[[], None]) -> None:
            try:
                action()
            except CudaError as error:
                _LOG.error("%s: %s while closing a slot: %s", origin, what, error)

        attempt("setting the device", lambda: cuda.use_device(model.device))
        if self._stream is not None:
            # Never free memory the GPU may still be using: the stream is idle after every execute, but a slot
            # that failed half-way through _open may have queued a profile switch.
            attempt("synchronizing the stream", lambda: cuda.stream_synchronize(self._stream))
        # The context goes first: it holds the buffer addresses and was made from the engine.
        self._context = None
        for buffer in self._buffers.values():
            buffer.view = None  # the numpy view must not outlive the pinned memory under it
            if buffer.host:
                attempt("cudaFreeHost", functools.partial(cuda.free_host, buffer.host))
            if buffer.device:
                attempt("cudaFree", functools.partial(cuda.free, buffer.device))
        self._buffers = {}
        if self._stream is not None:
            attempt("cudaStreamDestroy", lambda: cuda.stream_destroy(self._stream))
            self._stream = None
        model._context_closed(self)
