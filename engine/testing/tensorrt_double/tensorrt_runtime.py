"""The fake TensorRT runtime: Runtime, ICudaEngine, IExecutionContext, IOutputAllocator, Dims, Logger and enums.

Behaviours reproduced from the library (python/src/infer/pyCore.cpp, include/NvInferRuntime.h):
  * shapes are `Dims`: iterating an invalid one (nbDims -1, what get_tensor_shape returns when the input shapes do
    not fit each other) yields nothing, and `len()` of it raises;
  * engine shapes have -1 for dynamic dimensions; a context's output shape keeps -1 where only the data decides
    (such an output needs an IOutputAllocator: TensorRT synchronizes inside execute_async_v3, asks the allocator
    for memory, then reports the shape through notify_shape, all before execute_async_v3 returns);
  * infer_shapes() lists the inputs still without a shape and raises RuntimeError when the shapes do not fit each
    other; execute_async_v3 then returns False;
  * shape tensors live in host memory (get_tensor_location HOST, is_shape_inference_io True);
  * I/O formats other than LINEAR change the buffer size and layout (plans.py), reported through
    get_tensor_vectorized_dim, get_tensor_components_per_element, get_tensor_format_desc, get_tensor_strides;
  * a plan built for another compute capability or TensorRT version does not deserialize (None); one built on a
    GPU of another name with the same compute capability loads with a warning;
  * after a sticky CUDA error execute_async_v3 returns False, create_execution_context and
    deserialize_cuda_engine return None.
"""

from __future__ import annotations

import enum
import logging
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import plans
from .device import Op

if TYPE_CHECKING:
    from .device import Allocation, SimulatedDevice

_LOG = logging.getLogger(__name__)


class TensorIOMode(enum.Enum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class TensorLocation(enum.Enum):
    DEVICE = 0
    HOST = 1


class DataType(enum.Enum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    FP8 = 6
    BF16 = 7
    INT64 = 8
    INT4 = 9
    FP4 = 10
    E8M0 = 11


class ExecutionContextAllocationStrategy(enum.Enum):
    STATIC = 0
    ON_PROFILE_CHANGE = 1
    USER_MANAGED = 2


class MemoryPoolType(enum.Enum):
    WORKSPACE = 0


class _Severity(enum.IntEnum):
    INTERNAL_ERROR = 0
    ERROR = 1
    WARNING = 2
    INFO = 3
    VERBOSE = 4


def nptype(trt_type: DataType) -> type:
    """numpy type of a DataType; TypeError for types numpy lacks (FP8, INT4, FP4, E8M0), as the real one."""
    return plans.numpy_dtype(trt_type.name).type


class Dims:
    """Stands for tensorrt.Dims: a sequence of ints with `len()` and indexing (no `__iter__`: iteration goes
    through `__getitem__`, as with the pybind11 class). An invalid Dims (nbDims -1) iterates as empty and its
    `len()` raises ValueError."""

    def __init__(self, shape: Sequence[int] = ()) -> None:
        self._dims = tuple(int(d) for d in shape)
        self._valid = True

    @classmethod
    def _invalid(cls) -> Dims:
        dims = cls()
        dims._valid = False
        return dims

    def __len__(self) -> int:
        return len(self._dims) if self._valid else -1

    def __getitem__(self, index: Any) -> Any:
        if not self._valid:
            raise IndexError("Out of bounds")
        return self._dims[index]

    def __eq__(self, other: object) -> bool:
        try:
            values: tuple[object, ...] = tuple(other)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False
        return self._valid and values == self._dims

    def __hash__(self) -> int:
        return hash(self._dims)

    def __repr__(self) -> str:
        return repr(self._dims) if self._valid else "Dims(nbDims=-1)"


class Logger:
    """Stands for tensorrt.Logger: records messages at or above `min_severity` in the device log."""

    Severity = _Severity
    INTERNAL_ERROR = _Severity.INTERNAL_ERROR
    ERROR = _Severity.ERROR
    WARNING = _Severity.WARNING
    INFO = _Severity.INFO
    VERBOSE = _Severity.VERBOSE

    def __init__(self, min_severity: _Severity = _Severity.WARNING) -> None:
        self.min_severity = min_severity

    def log(self, severity: _Severity, msg: str) -> None:
        if severity <= self.min_severity:
            _LOG.warning("[TensorRT double] %s", msg)


class IOutputAllocator:
    """Stands for tensorrt.IOutputAllocator. A subclass implements reallocate_output_async(tensor_name, memory,
    size, alignment, stream) -> int and notify_shape(tensor_name, shape), and must call this __init__ (pybind11
    refuses an instance whose base was not initialized)."""

    def __init__(self) -> None:
        self._trt_initialized = True


class _Bound:
    """Base of the double's classes that belong to one FakeDevice (set on per-device subclasses)."""

    _fake: SimulatedDevice


def log_error(logger: Any, device: SimulatedDevice, message: str, severity: _Severity = _Severity.ERROR) -> None:
    device.log.append(message)
    if logger is not None:
        logger.log(severity, message)


class Runtime(_Bound):
    """Stands for tensorrt.Runtime."""

    def __init__(self, logger: Any) -> None:
        device = self._fake
        if not device.usable:
            raise device.violate(
                "tensorrt.Runtime created without a usable CUDA device: the real one returns an "
                "object that segfaults on first use (probe cudaGetDeviceCount first)"
            )
        device.require_device("tensorrt.Runtime()")
        self.logger = logger
        with device._lock:
            device.stats.runtimes_created += 1
            device.stats.runtimes_live += 1

    def __del__(self) -> None:
        with self._fake._lock:
            self._fake.stats.runtimes_live -= 1

    def deserialize_cuda_engine(self, serialized_engine: Any) -> ICudaEngine | None:
        device = self._fake
        device.require_device("deserialize_cuda_engine")
        if device.sticky_error is not None:
            log_error(self.logger, device, f"deserialize_cuda_engine: CUDA error {device.sticky_error}")
            return None
        plan = plans.Plan.parse(bytes(serialized_engine))
        if plan is None:
            log_error(self.logger, device, "deserialize_cuda_engine: not a plan")
            return None
        if plan.trt_version != device.trt_version:
            log_error(
                self.logger,
                device,
                f"deserialize_cuda_engine: plan built by TensorRT {plan.trt_version}, this is {device.trt_version}",
            )
            return None
        if plan.compute_capability != device.compute_capability:
            log_error(
                self.logger,
                device,
                f"deserialize_cuda_engine: plan built for compute capability "
                f"{plan.compute_capability}, this GPU has {device.compute_capability}",
            )
            return None
        if plan.device_name != device.name:  # TensorRT only warns: same compute capability, another model
            log_error(
                self.logger,
                device,
                f"deserialize_cuda_engine: plan built on {plan.device_name!r}, this is "
                f"{device.name!r}; performance may differ",
                _Severity.WARNING,
            )
        weights = device.allocate(plan.weights_bytes, "weights")
        if weights is None:
            log_error(self.logger, device, "deserialize_cuda_engine: out of device memory")
            return None
        with device._lock:
            device.stats.deserializations += 1
        engine: ICudaEngine = device.trt.ICudaEngine(self, plan, weights)  # the device's subclass of ICudaEngine
        return engine


class ICudaEngine(_Bound):
    """Stands for tensorrt.ICudaEngine. Holds its runtime (as the real binding keeps it alive)."""

    def __init__(self, runtime: Runtime, plan: plans.Plan, weights: Allocation) -> None:
        device = self._fake
        self._runtime = runtime
        self._plan = plan
        self._weights = weights
        self._id = device.new_id()
        self._contexts: weakref.WeakSet[IExecutionContext] = weakref.WeakSet()
        self._session: Any = None
        self._session_lock = threading.Lock()  # guards: _session, _shape_cache
        self._shape_cache: dict[tuple[object, ...], dict[str, tuple[int, ...]]] = {}
        with device._lock:
            device.stats.engines_live += 1
            device.stats.events.append(f"engine {self._id} created")

    def __del__(self) -> None:
        device = self._fake
        device.release(self._weights)
        with device._lock:
            device.stats.engines_live -= 1
            device.stats.events.append(f"engine {self._id} destroyed")

    def _tensor(self, name: str) -> plans.Tensor:
        found = self._plan.tensors.get(name)
        if found is None:
            raise self._fake.violate(f"engine has no tensor named {name!r}")
        return found

    @property
    def num_io_tensors(self) -> int:
        return len(self._plan.order)

    @property
    def num_optimization_profiles(self) -> int:
        return len(self._plan.profiles)

    @property
    def device_memory_size_v2(self) -> int:
        return self._plan.activation_bytes

    def get_device_memory_size_for_profile_v2(self, profile_index: int) -> int:
        return self._plan.activation_bytes

    def get_tensor_name(self, index: int) -> str:
        return self._plan.order[index]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return TensorIOMode.INPUT if self._tensor(name).is_input else TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name: str) -> DataType:
        return DataType[self._tensor(name).type_name]

    def get_tensor_shape(self, name: str) -> Dims:
        return Dims(self._tensor(name).shape)

    def get_tensor_location(self, name: str) -> TensorLocation:
        return TensorLocation.HOST if self._tensor(name).host else TensorLocation.DEVICE

    def is_shape_inference_io(self, name: str) -> bool:
        return self._tensor(name).host

    def get_tensor_vectorized_dim(self, name: str, profile_index: int | None = None) -> int:
        return plans.vectorized_dim(self._tensor(name))

    def get_tensor_components_per_element(self, name: str, profile_index: int | None = None) -> int:
        return plans.components(self._tensor(name))

    def get_tensor_format_desc(self, name: str, profile_index: int | None = None) -> str:
        return plans.format_description(self._tensor(name))

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[Dims]:
        if not self._tensor(name).is_input:
            raise self._fake.violate(f"get_tensor_profile_shape({name!r}): profiles exist for inputs only")
        if not 0 <= profile_index < len(self._plan.profiles):
            raise self._fake.violate(f"get_tensor_profile_shape: no profile {profile_index}")
        return [Dims(shape) for shape in self._plan.profiles[profile_index][name]]

    def create_execution_context(self, strategy: Any = ExecutionContextAllocationStrategy.STATIC) -> Any:
        device = self._fake
        device.require_device("create_execution_context")
        if device.sticky_error is not None:
            return None
        # STATIC: the activation memory (max over profiles) is allocated now, plus persistent memory that no API
        # reports. Out of memory -> None, the way TensorRT reports it.
        activation = device.allocate(self.device_memory_size_v2 + device.persistent_bytes, "activation")
        if activation is None:
            with device._lock:
                device.stats.context_failures += 1
            return None
        context = device.trt.IExecutionContext(self, activation)
        self._contexts.add(context)
        return context

    # -- computation (what the "GPU" does)

    def _run_onnx(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import onnxruntime

        with self._session_lock:
            if self._session is None:
                options = onnxruntime.SessionOptions()
                options.intra_op_num_threads = 1
                options.log_severity_level = 3
                self._session = onnxruntime.InferenceSession(
                    self._plan.onnx, options, providers=["CPUExecutionProvider"]
                )
            session = self._session
        names = [t.name for t in self._plan.outputs]
        return dict(zip(names, session.run(names, arrays), strict=True))

    def _output_shapes(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """Raises plans.ShapeMismatch."""
        key = tuple(sorted(shapes.items()))
        with self._session_lock:
            cached = self._shape_cache.get(key)
        if cached is None:
            cached = plans.output_shapes(self._plan, shapes, self._run_onnx, self._fake.probe_values)
            with self._session_lock:
                self._shape_cache[key] = cached
        return cached

    def _compute(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return plans.compute(self._plan, arrays, self._run_onnx)


class IExecutionContext(_Bound):
    """Stands for tensorrt.IExecutionContext. Keeps its engine alive (as the real binding does)."""

    def __init__(self, engine: ICudaEngine, activation: Allocation) -> None:
        device = self._fake
        self._engine = engine
        self._activation = activation
        self._guard = threading.Lock()  # held by the one thread inside a method; contention is the violation
        self._profile = 0
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._addresses: dict[str, int] = {}
        self._allocators: dict[str, IOutputAllocator] = {}
        self._in_flight = False
        self._id = device.new_id()
        with device._lock:
            device.stats.contexts_created += 1
            device.stats.contexts_live += 1
            device.stats.events.append(f"context {self._id} created")

    def __del__(self) -> None:
        device = self._fake
        if self._in_flight:
            device.record_only(f"context {self._id} destroyed while its enqueue was in flight")
        device.release(self._activation)
        with device._lock:
            device.stats.contexts_live -= 1
            device.stats.events.append(f"context {self._id} destroyed")

    class _Entered:
        def __init__(self, context: IExecutionContext, name: str) -> None:
            self.context, self.name = context, name

        def __enter__(self) -> None:
            if not self.context._guard.acquire(blocking=False):
                raise self.context._fake.violate(
                    f"IExecutionContext.{self.name} while another thread is inside this context (a context is used "
                    "by one thread at a time)"
                )
            hook = self.context._fake.hooks.in_context_call
            if hook is not None:
                try:
                    hook(self.name)
                except BaseException:
                    self.context._guard.release()
                    raise

        def __exit__(self, *exc: object) -> None:
            self.context._guard.release()

    def _enter(self, name: str) -> IExecutionContext._Entered:
        return IExecutionContext._Entered(self, name)

    @property
    def engine(self) -> ICudaEngine:
        return self._engine

    @property
    def active_optimization_profile(self) -> int:
        return self._profile

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        with self._enter("set_optimization_profile_async"):
            device = self._fake
            device.require_device("set_optimization_profile_async")
            if device.stream(stream_handle, "set_optimization_profile_async") is None:
                return False
            if not 0 <= int(profile_index) < self._engine.num_optimization_profiles:
                raise RuntimeError(f"profile index {profile_index} out of range")
            self._profile = int(profile_index)
            self._shapes.clear()  # a profile switch forgets the input shapes
            return True

    def set_input_shape(self, name: str, shape: Sequence[int]) -> bool:
        with self._enter("set_input_shape"):
            tensor = self._engine._tensor(name)
            shape = tuple(int(d) for d in shape)
            if not tensor.is_input or len(shape) != len(tensor.shape):
                log_error(None, self._fake, f"set_input_shape({name!r}, {list(shape)}): rank or mode mismatch")
                return False
            low, _, high = self._engine._plan.profiles[self._profile][name]
            if any(not lo <= d <= hi for d, lo, hi in zip(shape, low, high, strict=True)):
                return False
            self._shapes[name] = shape
            return True

    def _current_shapes(self) -> dict[str, tuple[int, ...]] | None:
        """Every output's shape for the inputs set so far; None while an input has no shape. Raises
        plans.ShapeMismatch."""
        inputs = [t.name for t in self._engine._plan.inputs]
        if any(n not in self._shapes for n in inputs):
            return None
        return self._engine._output_shapes({n: self._shapes[n] for n in inputs})

    def get_tensor_shape(self, name: str) -> Dims:
        with self._enter("get_tensor_shape"):
            tensor = self._engine._tensor(name)
            if tensor.is_input:
                return Dims(self._shapes.get(name, tensor.shape))
            try:
                outputs = self._current_shapes()
            except plans.ShapeMismatch as error:
                log_error(None, self._fake, f"get_tensor_shape({name!r}): shape inference failed: {error}")
                return Dims._invalid()
            return Dims(tensor.shape if outputs is None else outputs[name])

    def get_tensor_strides(self, name: str) -> Dims:
        shape = self.get_tensor_shape(name)
        if not shape._valid or any(d < 0 for d in shape._dims):
            return Dims._invalid()
        return Dims(plans.strides(self._engine._tensor(name), shape._dims))

    def set_tensor_address(self, name: str, memory: int) -> bool:
        with self._enter("set_tensor_address"):
            self._engine._tensor(name)
            self._addresses[name] = int(memory)
            return True

    def set_output_allocator(self, name: str, output_allocator: Any) -> bool:
        with self._enter("set_output_allocator"):
            if output_allocator is not None and not getattr(output_allocator, "_trt_initialized", False):
                raise TypeError(
                    "set_output_allocator(): incompatible function arguments (an IOutputAllocator whose "
                    "__init__ did not call IOutputAllocator.__init__)"
                )
            tensor = self._engine._plan.tensors.get(name)
            if tensor is None or tensor.is_input:
                return False
            if output_allocator is None:
                self._allocators.pop(name, None)
            else:
                self._allocators[name] = output_allocator
            return True

    def get_output_allocator(self, name: str) -> Any:
        return self._allocators.get(name)

    def get_max_output_size(self, name: str) -> int:
        """Upper bound in bytes for output `name` with the inputs set now; -1 when unknown."""
        with self._enter("get_max_output_size"):
            tensor = self._engine._plan.tensors.get(name)
            try:
                outputs = self._current_shapes()
            except plans.ShapeMismatch:
                return -1
            if tensor is None or tensor.is_input or outputs is None:
                return -1
            largest_input = max((int(np.prod(s)) for s in self._shapes.values()), default=1)
            bound = tuple(largest_input if d < 0 else d for d in outputs[name])
            return plans.storage_bytes(tensor, bound)

    def infer_shapes(self) -> list[str]:
        with self._enter("infer_shapes"):
            plan = self._engine._plan
            missing = [
                t.name
                for t in plan.inputs
                if t.name not in self._shapes or (t.host and not self._addresses.get(t.name))
            ]
            if missing:
                return missing
            try:
                self._current_shapes()
            except plans.ShapeMismatch as error:
                log_error(None, self._fake, f"infer_shapes: {error}")
                raise RuntimeError("infer_shapes error code: -1") from None
            return []

    def execute_async_v3(self, stream_handle: int) -> bool:
        with self._enter("execute_async_v3"):
            enqueued = self._enqueue(stream_handle)
        if enqueued and self._fake.hooks.after_enqueue is not None:
            self._fake.hooks.after_enqueue()
        return enqueued

    # -- execute_async_v3's parts

    def _check_rules(self, stream_handle: int) -> Any:
        device = self._fake
        device.require_device("execute_async_v3")
        stream = device.stream(stream_handle, "execute_async_v3")
        if self._in_flight:
            raise device.violate(
                f"execute_async_v3 on context {self._id} while its previous enqueue is still in "
                "flight (synchronize its stream first)"
            )
        if not device.profile_sharing:
            for other in list(self._engine._contexts):
                if other is not self and other._profile == self._profile:
                    raise device.violate(
                        f"contexts {self._id} and {other._id} share optimization profile "
                        f"{self._profile} (not allowed before TensorRT 8.6)"
                    )
        return stream

    def _buffer(self, tensor: plans.Tensor, address: int, shape: tuple[int, ...]) -> Allocation:
        device = self._fake
        nbytes = plans.storage_bytes(tensor, shape)
        allocation = device.find_device(address, nbytes)
        if allocation is None:
            raise device.violate(
                f"execute_async_v3: address 0x{address:x} of {tensor.name!r} is not device memory "
                f"with {nbytes} bytes for shape {list(shape)} in format {tensor.format}"
            )
        return allocation

    def _enqueue(self, stream_handle: int) -> bool:
        device, plan = self._fake, self._engine._plan
        stream = self._check_rules(stream_handle)
        if stream is None or device.sticky_error is not None:
            log_error(None, device, "execute_async_v3: invalid stream, or the CUDA context has a sticky error")
            return False
        try:
            outputs = self._current_shapes()
        except plans.ShapeMismatch as error:
            log_error(None, device, f"execute_async_v3: the input shapes do not fit each other: {error}")
            return False
        if outputs is None:
            log_error(None, device, "execute_async_v3: an input shape is not set")
            return False
        shapes = {**self._shapes, **outputs}
        allocations = [self._activation]
        for tensor in plan.inputs:
            address = self._addresses.get(tensor.name, 0)
            if not address:
                log_error(None, device, f"execute_async_v3: no address for input {tensor.name!r}")
                return False
            if tensor.host:
                if device.find_device(address, 1) is not None:
                    raise device.violate(
                        f"execute_async_v3: shape tensor {tensor.name!r} has a device address; "
                        "TensorRT reads shape tensors in host memory"
                    )
                continue
            allocations.append(self._buffer(tensor, address, shapes[tensor.name]))
        for tensor in plan.outputs:
            if tensor.name in self._allocators:
                continue
            if tensor.data_dependent:
                log_error(
                    None,
                    device,
                    f"execute_async_v3: output {tensor.name!r} has a data-dependent shape and no IOutputAllocator",
                )
                return False
            address = self._addresses.get(tensor.name, 0)
            if not address:
                log_error(None, device, f"execute_async_v3: no address for output {tensor.name!r}")
                return False
            allocations.append(self._buffer(tensor, address, shapes[tensor.name]))
        if plan.data_dependent:
            return self._enqueue_data_dependent(stream, shapes, allocations)
        addresses = dict(self._addresses)
        if not self._allocate_outputs(stream, shapes, addresses, allocations, results=None):
            return False
        self._queue_run(stream, shapes, addresses, allocations, results=None)
        return True

    def _enqueue_data_dependent(
        self, stream: Any, shapes: dict[str, tuple[int, ...]], allocations: list[Allocation]
    ) -> bool:
        """TensorRT synchronizes inside execute_async_v3 to learn the data-dependent sizes: the work queued so far
        (the input copies) runs now, the outputs are computed, then the allocator is asked for memory."""
        device = self._fake
        code = device.drain(stream, hook=False)
        if code is not None:
            return False
        arrays = self._read_inputs(shapes, dict(self._addresses))
        results = self._engine._compute(arrays)
        shapes = {**shapes, **{name: tuple(np.shape(value)) for name, value in results.items()}}
        addresses = dict(self._addresses)
        if not self._allocate_outputs(stream, shapes, addresses, allocations, results=results):
            return False
        self._queue_run(stream, shapes, addresses, allocations, results=results)
        return True

    def _allocate_outputs(
        self,
        stream: Any,
        shapes: dict[str, tuple[int, ...]],
        addresses: dict[str, int],
        allocations: list[Allocation],
        results: dict[str, np.ndarray] | None,
    ) -> bool:
        """Ask each output's allocator for memory (then tell it the shape). Sizes of data-dependent outputs are
        only known when `results` are."""
        device = self._fake
        for tensor in self._engine._plan.outputs:
            allocator = self._allocators.get(tensor.name)
            if allocator is None:
                continue
            shape = shapes[tensor.name]
            if any(d < 0 for d in shape):
                log_error(None, device, f"execute_async_v3: the size of {tensor.name!r} is not known yet")
                return False
            size = max(1, plans.storage_bytes(tensor, shape))
            pointer = _call_allocator(
                device, allocator, tensor.name, addresses.get(tensor.name, 0), size, int(stream.handle)
            )
            if not pointer:
                log_error(None, device, f"execute_async_v3: the output allocator gave no memory for {tensor.name!r}")
                return False
            addresses[tensor.name] = pointer
            allocations.append(self._buffer(tensor, pointer, shape))
            with device._lock:
                device.stats.output_reallocations += 1
            try:
                allocator.notify_shape(tensor.name, Dims(shape))  # type: ignore[attr-defined]  # not in tensorrt-stubs
            except Exception as error:  # the real binding prints it and goes on
                log_error(None, device, f"[ERROR] Exception caught in notifyShape(): {error}")
        return True

    def _read_inputs(self, shapes: dict[str, tuple[int, ...]], addresses: dict[str, int]) -> dict[str, np.ndarray]:
        device, plan = self._fake, self._engine._plan
        arrays = {}
        for tensor in plan.inputs:
            if tensor.host:
                continue
            nbytes = plans.storage_bytes(tensor, shapes[tensor.name])
            arrays[tensor.name] = plans.from_storage(
                tensor, device.read_device(addresses[tensor.name], nbytes), shapes[tensor.name]
            )
        return arrays

    def _queue_run(
        self,
        stream: Any,
        shapes: dict[str, tuple[int, ...]],
        addresses: dict[str, int],
        allocations: list[Allocation],
        results: dict[str, np.ndarray] | None,
    ) -> None:
        device, plan = self._fake, self._engine._plan

        def run() -> None:
            computed = results if results is not None else self._engine._compute(self._read_inputs(shapes, addresses))
            for tensor in plan.outputs:
                value = np.asarray(computed[tensor.name], dtype=plans.numpy_dtype(tensor.type_name))
                device.write_device(addresses[tensor.name], plans.to_storage(tensor, value))

        def done() -> None:
            self._in_flight = False

        device.enqueue(stream, Op(run, allocations, f"execute_async_v3 on context {self._id}", kernel=True, done=done))
        self._in_flight = True
        with device._lock:
            device.stats.enqueues += 1


def _call_allocator(device: SimulatedDevice, allocator: Any, name: str, current: int, size: int, stream: int) -> int:
    """What TensorRT's PyOutputAllocator does: reallocate_output_async if the subclass has it, else the deprecated
    reallocate_output; an exception or a non-int result counts as nullptr."""
    method = getattr(allocator, "reallocate_output_async", None)
    try:
        if method is not None:
            pointer = method(name, current, size, 256, stream)
        else:
            legacy = getattr(allocator, "reallocate_output", None)
            pointer = legacy(name, current, size, 256) if legacy is not None else 0
        return int(pointer) if isinstance(pointer, int) else 0
    except Exception as error:  # the real binding prints it to stderr and returns nullptr
        log_error(None, device, f"[ERROR] Exception caught in reallocateOutputAsync(): {error}")
        return 0
