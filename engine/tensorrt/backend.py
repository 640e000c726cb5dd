"""TensorRT on an NVIDIA GPU: one deserialized engine per model, one execution context + stream + buffers per slot.

Weights live in the engine and are paid once; each slot pays its context's activation memory, its I/O buffers
(device buffers sized for the profile maximum, pinned host staging buffers) and a non-blocking CUDA stream. That
is where this beats N copies of a model. model.py holds the loaded model and its capacity, slot.py a slot,
engine_io.py what an engine's tensors may be, health.py what happens after a sticky CUDA error.

Selected by `backend: "tensorrt"` or `platform: "tensorrt_plan"` in config.pbtxt. The model file is `1/model.plan`
(a prebuilt engine: it must come from the same TensorRT version and GPU compute capability) or `1/model.onnx`,
from which an engine is built once and cached (builder.py, profiles.py).

Parameters read from config.pbtxt (all optional):
    trt_profile_min / trt_profile_opt / trt_profile_max   ranges of -1 dimensions (see profiles.py)
    trt_default_dim_max      max of every -1 dimension without its own range
    trt_opt_batch_size       the profile's opt batch size (default: the largest preferred_batch_size of
                             dynamic_batching, else max_batch_size)
    trt_profile_per_slot     "true": the engine gets one optimization profile per slot and slot i uses profile
                             i (the pre-TensorRT-8.6 rule for concurrent contexts; off by default, since TensorRT
                             >= 10 lets contexts share a profile)
    trt_workspace_bytes      builder workspace limit (default 1 GiB)
    trt_cache_dir            plan cache directory (default $SLOTSERVE_TRT_CACHE or ~/.cache/slotserve/tensorrt);
                             relative to the model repository, and like every model file inside it or a root
                             allowed with --allow-model-root (the server-wide default is the operator's own)
    trt_memory_reserve_bytes GPU memory kept free when computing capacity (default 256 MiB)
    trt_pinned_memory_limit_bytes  pinned host memory this model's slots may take (default a quarter of RAM)
    trt_device               CUDA device index (default 0)
    max_parallel_slots       cap on the advertised capacity (default 16)

Failure behaviour: without cuda-python, TensorRT or a CUDA device, `load` raises BackendUnavailableError (the
server answers FAILED_PRECONDITION) whose message says how to serve the same directory with ONNX Runtime; with a
driver too old for the installed cuda-python, the message names both CUDA versions and the extra that fits. The
device count is probed *before* any TensorRT Runtime exists: a Runtime made without a driver segfaults on first
use. A context that cannot be allocated raises OutOfDeviceMemoryError (OutOfHostMemoryError for pinned memory)
after freeing what it had allocated. A sticky CUDA error fails every model on that GPU (DeviceFailedError) until
they are all closed; the next load then resets the device and builds on a fresh CUDA context (health.py).

Threads: `load` and `create_context` may run on any thread, concurrently for different models; each CUDA-using
entry point makes the model's device current on its thread first. A context is used by one thread at a time
(the server guarantees it; TensorRT requires it). Work enqueued on the GPU cannot be cancelled: a request is
dropped before enqueue if its caller gave up, and after enqueue the slot waits for its stream to drain before it
returns (`interruptible = False`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import re
import threading
from pathlib import Path
from typing import Any, cast

from ..config.files import shown_path
from ..config.specs import ModelSpec
from ..errors import BackendUnavailableError, ModelConfigError, ModelLoadError
from ..interface import Backend
from .builder import (
    DEFAULT_WORKSPACE,
    PARAM_CACHE_DIR,
    PARAM_WORKSPACE,
    PlanCache,
    build_plan,
    default_cache_dir,
    write_atomic,
)
from .cuda import CudaError, CudaRuntime, real_cuda_utils
from .driver import insufficient_driver_message
from .engine_io import origin
from .health import DeviceHealth
from .model import PlanRejected, TensorRTModel
from .profiles import cache_key, external_data_sha256, file_sha256, int_parameter, onnx_inputs, profile_for
from .protocols import CudaRuntimeModule, TensorRTBuilderModule, TensorRTRuntimeModule, TrtRuntime
from .slot import load_error

_LOG = logging.getLogger(__name__)

PARAM_DEVICE = "trt_device"

FALLBACK_HINT = (
    'To serve this model directory on the CPU with ONNX Runtime instead, set backend: "onnxruntime" '
    "in its config.pbtxt (the directory needs 1/model.onnx)."
)
INSTALL_HINT = (
    "Install the GPU extra that fits the NVIDIA driver: `pip install .[tensorrt-cu12]` (driver 525 or "
    "newer) or `.[tensorrt-cu13]` (driver 580 or newer); `make gpu-check` picks it."
)

__all__ = ["FALLBACK_HINT", "PlanRejected", "TensorRTBackend", "TensorRTModel", "tensorrt_cuda_major"]


def import_cudart() -> CudaRuntimeModule | None:
    try:
        module: CudaRuntimeModule = importlib.import_module("cuda.bindings.runtime")
        return module
    except ImportError:
        return None


def import_tensorrt() -> TensorRTRuntimeModule | None:
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


def tensorrt_cuda_major(module: Any) -> int | None:
    """The CUDA major version the installed TensorRT was built for, from its distribution's name
    (tensorrt-cu12 / tensorrt_lean_cu13_libs, ...); None when the module belongs to no distribution."""
    if getattr(module, "__file__", None) is None:
        return None
    distributions = importlib.metadata.packages_distributions()
    name = module.__name__
    for top in (name, f"{name}_libs", f"{name}_bindings"):
        for distribution in distributions.get(top, ()):
            found = re.search(r"cu(\d+)", distribution)
            if found:
                return int(found[1])
    return None


class TensorRTBackend(Backend):
    """Loads TensorRT engines. `trt_module` / `cudart_module` / `cuda_utils_module` default to the real `tensorrt`
    (or `tensorrt_lean`), `cuda.bindings.runtime` and `cuda.bindings.utils`, imported on first load; tests pass the
    double's (engine/testing/tensorrt_double/). `cache_dir` overrides the default plan cache directory (a model's
    `trt_cache_dir` parameter wins)."""

    name = "tensorrt"

    def __init__(
        self,
        trt_module: Any = None,
        cudart_module: Any = None,
        *,
        cuda_utils_module: Any = None,
        cache_dir: Path | str | None = None,
    ) -> None:
        self._trt_module = trt_module
        self._cudart_module = cudart_module
        self._cuda_utils_module = cuda_utils_module
        self._cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._lock = threading.Lock()  # guards: _logger, _runtimes, _health
        self._logger: Any = None
        self._runtimes: dict[int, TrtRuntime] = {}
        self._health: dict[int, DeviceHealth] = {}
        # Serializes builds and plan-cache lookups: one build per GPU at a time (concurrent builds perturb kernel
        # timings, and Triton holds a global mutex around engine creation), and two loads of one model never
        # build the same plan twice.
        self._build_lock = threading.Lock()

    # -- modules, runtime, device health

    def _cuda(self, where: str) -> CudaRuntime:
        module = self._cudart_module
        if module is None:
            module = import_cudart()
            if module is None:
                raise BackendUnavailableError(
                    f"{where}: the TensorRT backend needs cuda-python (cuda.bindings), which is not installed. "
                    f"{INSTALL_HINT} {FALLBACK_HINT}"
                )
            self._cudart_module = module
            self._cuda_utils_module = real_cuda_utils()
        return CudaRuntime(module, self._cuda_utils_module)

    def _tensorrt(self, where: str) -> TensorRTRuntimeModule:
        module = self._trt_module or import_tensorrt()
        if module is None:
            raise BackendUnavailableError(
                f"{where}: the TensorRT backend needs the tensorrt package, which is not installed. "
                f"{INSTALL_HINT} {FALLBACK_HINT}"
            )
        self._trt_module = module
        return module

    def _runtime(self, trt: TensorRTRuntimeModule, device: int) -> tuple[Any, TrtRuntime]:
        """(logger, runtime) for `device`, made once per CUDA context. Only called after the device probe
        succeeded, and on a thread whose current device is `device` (a Runtime binds to the current device)."""
        with self._lock:
            if self._logger is None:
                self._logger = trt.Logger(trt.Logger.WARNING)
            runtime = self._runtimes.get(device)
            if runtime is None:
                runtime = self._runtimes[device] = trt.Runtime(self._logger)
            return self._logger, runtime

    def health(self, device: int) -> DeviceHealth:
        with self._lock:
            found = self._health.get(device)
            if found is None:
                found = self._health[device] = DeviceHealth(device)
            return found

    def _recover(self, cuda: CudaRuntime, device: int, where: str) -> None:
        """After a sticky error, with nothing left on the device: drop the Runtime made on the broken context,
        reset the device, and check that the fresh context works. Raises ModelLoadError if it does not."""
        with self._lock:
            self._runtimes.pop(device, None)
        try:
            cuda.use_device(device)
            cuda.device_reset()
            cuda.free(cuda.malloc(1))
            cuda.device_synchronize()
        except CudaError as error:
            raise ModelLoadError(
                f"{where}: GPU {device} still fails after a device reset ({error}); restart the server to use it again "
                "(NVIDIA documents that only a new process is sure to clear such an error)"
            ) from None

    def _probe(self, cuda: CudaRuntime, device: int, where: str) -> None:
        """Check the CUDA device before anything touches TensorRT: a Runtime made without a device segfaults."""
        count, reason = cuda.device_count()
        if count == 0:
            if reason == "cudaErrorInsufficientDriver":
                driver, runtime = cuda.versions()
                if driver and runtime and driver // 1000 < runtime // 1000:
                    raise BackendUnavailableError(
                        f"{where}: {insufficient_driver_message(driver, runtime)}. {FALLBACK_HINT}"
                    )
            raise BackendUnavailableError(
                f"{where}: the TensorRT backend needs an NVIDIA GPU and none is usable here ({reason}). {FALLBACK_HINT}"
            )
        if device >= count:
            raise ModelConfigError(
                f"{where}: parameter {PARAM_DEVICE} is {device}, but only {count} CUDA "
                f"device{'s' if count != 1 else ''} found"
            )

    # -- load

    def load(self, spec: ModelSpec) -> TensorRTModel:
        """Deserialize (or build, then cache) the model's engine, check its I/O against the config and measure
        one slot's device memory. Blocks for the whole load, a build included (minutes for large models).

        Raises BackendUnavailableError (no cuda-python, no TensorRT, no CUDA device, a driver too old),
        ModelConfigError, OutOfDeviceMemoryError / OutOfHostMemoryError or ModelLoadError (also while the GPU is
        failed and not yet free to reset); on failure nothing stays allocated.
        """
        where = origin(spec)
        if spec.model_file is None or not spec.model_file.exists():
            raise ModelConfigError(f"{where}: model file not found")
        cuda = self._cuda(where)
        device = int_parameter(spec, PARAM_DEVICE, 0, minimum=0)
        self._probe(cuda, device, where)
        trt = self._tensorrt(where)
        health = self.health(device)
        health.enter(spec.name, lambda: self._recover(cuda, device, where))
        try:
            return self._load(spec, trt, cuda, device, health)
        except BaseException:
            health.leave(spec.name)
            raise

    def _load(
        self, spec: ModelSpec, trt: TensorRTRuntimeModule, cuda: CudaRuntime, device: int, health: DeviceHealth
    ) -> TensorRTModel:
        where = origin(spec)
        try:
            cuda.use_device(device)
            logger, runtime = self._runtime(trt, device)
            plan, source, cached_path = self._plan(spec, trt, logger, cuda, device)
            try:
                return TensorRTModel.open(spec, trt, runtime, cuda, device, health, plan, source)
            except PlanRejected:
                if cached_path is None:
                    raise
            # A cached plan that no longer deserializes (a driver update, a damaged file): rebuild it once.
            _LOG.warning("%s: the cached TensorRT plan %s did not load; rebuilding it", where, cached_path)
            PlanCache.discard(cached_path)
            plan, source, _ = self._plan(spec, trt, logger, cuda, device)
            return TensorRTModel.open(spec, trt, runtime, cuda, device, health, plan, source)
        except CudaError as error:
            if error.sticky:
                health.fail(error.code_name, spec.name)
            raise load_error(where, error) from None
        except OSError as error:  # the model file, or the plan cache, could not be read
            name = shown_path(Path(error.filename), spec.roots) if error.filename else "a model file"
            raise ModelLoadError(f"{where}: cannot read {name}: {error.strerror}") from None

    def cache_dir(self, spec: ModelSpec) -> Path:
        """The plan cache folder of `spec`: its `trt_cache_dir` parameter (a model's setting, from config.pbtxt or
        a management request: it must resolve inside the repository or an allowed root, as model files do;
        relative to the repository), else the backend's own (the operator's: `cache_dir`, $SLOTSERVE_TRT_CACHE or
        the user's cache). Raises ModelConfigError for a parameter outside those roots."""
        explicit = spec.parameter(PARAM_CACHE_DIR)
        if explicit:
            if spec.roots is None:  # a spec read from no repository (tests, tools): its caller chose the folder
                return Path(explicit)
            return spec.roots.resolve(explicit, f"parameter {PARAM_CACHE_DIR}", origin=origin(spec))
        return self._cache_dir or default_cache_dir()

    def _plan_key(
        self, spec: ModelSpec, trt: TensorRTRuntimeModule, cuda: CudaRuntime, device: int, profile: Any, workspace: int
    ) -> str:
        path = spec.model_file
        assert path is not None
        major, minor = cuda.compute_capability(device)
        return cache_key(
            {
                "onnx": file_sha256(path),
                "external_data": external_data_sha256(path),
                "tensorrt": str(trt.__version__),
                "tensorrt_cuda": tensorrt_cuda_major(trt),
                "gpu": cuda.device_name(device),
                "compute_capability": f"{major}.{minor}",
                "profile": profile.describe(),
                "workspace": workspace,
            }
        )

    def _plan(
        self, spec: ModelSpec, trt: TensorRTRuntimeModule, logger: Any, cuda: CudaRuntime, device: int
    ) -> tuple[bytes, str, Path | None]:
        """(plan bytes, "prebuilt" | "cache" | "built", cache path when it came from the cache)."""
        path = spec.model_file
        assert path is not None
        if path.suffix != ".onnx":
            return path.read_bytes(), "prebuilt", None
        where = origin(spec)
        profile = profile_for(spec, onnx_inputs(path))
        workspace = int_parameter(spec, PARAM_WORKSPACE, DEFAULT_WORKSPACE, minimum=1)
        gpu = cuda.device_name(device)
        cache = PlanCache(self.cache_dir(spec))
        plan_path = cache.plan_path(spec.name, self._plan_key(spec, trt, cuda, device, profile, workspace))
        with self._build_lock:
            plan = cache.read(plan_path)
            if plan is not None:
                return plan, "cache", plan_path
            if not hasattr(trt, "Builder"):
                raise BackendUnavailableError(
                    f"{where}: building an engine from {path.name} needs the full tensorrt package (the installed "
                    f"runtime-only tensorrt_lean has no builder). {INSTALL_HINT} Or put a model.plan built for this "
                    f"GPU and TensorRT {trt.__version__} in the version directory. {FALLBACK_HINT}"
                )
            timing_path = cache.timing_path(str(trt.__version__), gpu)
            _LOG.info(
                "%s: building a TensorRT engine from %s (%d profile%s); this can take minutes",
                where,
                path.name,
                profile.count,
                "s" if profile.count != 1 else "",
            )
            plan, timing = build_plan(
                cast(TensorRTBuilderModule, trt), logger, path, profile, workspace, cache.read(timing_path), where
            )
            try:
                write_atomic(plan_path, plan)
                write_atomic(timing_path, timing)
            except OSError as error:  # a read-only cache costs a rebuild on restart, not this load
                _LOG.warning("%s: could not write the TensorRT plan cache in %s: %s", where, cache.directory, error)
            return plan, "built", None
