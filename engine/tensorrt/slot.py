"""One slot of a TensorRT model: an IExecutionContext, its own non-blocking CUDA stream and its own buffers.

Buffers: every input and every output whose size the input shapes decide gets a device buffer and a pinned host
staging buffer sized for the largest shape the slot's profile allows, allocated once and bound to the context
(addresses never change). An output whose size only the data decides (NonZero, NMS, ...: -1 left in its shape
after every input is set) gets its device memory from an IOutputAllocator instead: TensorRT synchronizes inside
execute_async_v3, asks the allocator for the bytes it needs, and reports the shape through notify_shape before
execute_async_v3 returns; the allocator keeps the memory and reuses it while it is big enough, and the slot's
pinned buffer for it grows the same way.

A run: check the request, set each input's shape (the batch of a batching model is the stacked array's first
dimension), let TensorRT infer every shape (infer_shapes: input shapes that do not fit each other are the caller's
error), stage the inputs in pinned memory, then queue copy-in, the engine and copy-out on the stream and wait for
it to drain. A sticky CUDA error on the way marks the device failed (health.py) and raises DeviceFailedError.

Costs that stall other slots: cudaMalloc, cudaFree and cudaHostAlloc synchronize the device, and so does TensorRT's
own context allocation, so building a slot (or growing a data-dependent output's buffer) while other slots run
makes them wait for their queued work. Resize pools in quiet periods.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .. import datatypes
from ..errors import (
    ExecutionCancelled,
    ExecutionError,
    InvalidInputError,
    ModelConfigError,
    ModelLoadError,
    OutOfDeviceMemoryError,
    OutOfHostMemoryError,
)
from ..interface import CancelToken, Context, Outputs, missing_inputs_message
from .cuda import CudaError, CudaRuntime, host_view
from .engine_io import LINEAR_ONLY, IoTensor, ProfileRange, dims, origin, row_major_strides, volume
from .health import DeviceHealth
from .protocols import CudaEngine, ExecutionContext, TensorRTRuntimeModule

_LOG = logging.getLogger(__name__)


def load_error(where: str, error: CudaError) -> ModelLoadError:
    """The load error for a CUDA failure: out of GPU memory, out of pinned host memory, or another failure."""
    if error.out_of_memory and error.host_memory:
        return OutOfHostMemoryError(
            f"{where}: out of pinned host memory ({error}): the operating system would not page-lock the staging "
            "buffers of another slot; use fewer slots, or lower trt_pinned_memory_limit_bytes"
        )
    if error.out_of_memory:
        return OutOfDeviceMemoryError(f"{where}: out of GPU memory ({error})")
    return ModelLoadError(f"{where}: CUDA error while loading: {error}")


@functools.lru_cache(maxsize=8)
def output_allocator_class(trt: TensorRTRuntimeModule) -> type:
    """A subclass of `trt.IOutputAllocator` (each TensorRT module has its own base class)."""

    class SlotOutputAllocator(trt.IOutputAllocator):  # type: ignore[name-defined, misc]
        """Device memory for the outputs whose size only the data decides, of one slot. TensorRT calls it on the
        slot's thread inside execute_async_v3 (taking the GIL). Exceptions cannot cross back into TensorRT (it
        would print them and fail the run): a failure is kept in `failure` and 0 (nullptr) returned."""

        def __init__(self, cuda: CudaRuntime) -> None:
            super().__init__()  # pybind11 refuses an instance whose base class was not initialized
            self.cuda = cuda
            self.buffers: dict[str, tuple[int, int]] = {}  # name -> (pointer, bytes)
            self.shapes: dict[str, tuple[int, ...]] = {}
            self.failure: str | None = None

        def reallocate_output_async(self, tensor_name: str, memory: int, size: int, alignment: int, stream: int) -> int:
            current = self.buffers.get(tensor_name)
            if current is not None and current[1] >= size:
                return current[0]
            # Grow geometrically: cudaMalloc/cudaFree synchronize the device, so do it rarely.
            wanted = max(int(size), 2 * current[1] if current is not None else 0)
            try:
                pointer = self.cuda.malloc(wanted)
            except CudaError as error:
                self.failure = f"output '{tensor_name}' needs {size} bytes: {error}"
                return 0
            if current is not None:
                self.release(current[0])
            self.buffers[tensor_name] = (pointer, wanted)
            return pointer

        def notify_shape(self, tensor_name: str, shape: Any) -> None:
            self.shapes[tensor_name] = dims(shape)

        def release(self, pointer: int) -> None:
            try:
                self.cuda.free(pointer)
            except CudaError as error:
                _LOG.error("freeing an output allocation: %s", error)

        def close(self) -> None:
            for pointer, _ in self.buffers.values():
                self.release(pointer)
            self.buffers = {}

    return SlotOutputAllocator


@dataclass
class _Buffer:
    """One I/O tensor's memory in one slot: a device buffer (absent for a data-dependent output, whose device
    memory the output allocator holds) and a pinned host staging buffer."""

    tensor: IoTensor
    device_bytes: int
    host_bytes: int
    device: int = 0
    host: int = 0
    view: np.ndarray | None = None


class SlotOwner(Protocol):
    """What a slot reads of the model that made it (model.py's TensorRTModel). A protocol, so that this module does
    not import model.py, which imports it to make its slots."""

    name: str
    trt: TensorRTRuntimeModule
    cuda: CudaRuntime
    device: int
    health: DeviceHealth
    engine: CudaEngine | None
    io: list[IoTensor]
    profile_per_slot: bool

    def profile_shapes(self, name: str, profile: int = 0) -> ProfileRange:
        """(min, opt, max) shapes of input `name` in `profile`, batch dimension included."""
        ...

    def context_closed(self, slot: TensorRTContext) -> None:
        """Called by the slot's close(): a registered slot gives its profile back."""
        ...


class TensorRTContext(Context):
    """One slot. Nothing is shared with other slots except the engine's weights, so slots run concurrently
    without locks. Used by one thread at a time (the server's guarantee; TensorRT's rule); `close` is never
    concurrent with `execute`."""

    def __init__(self, model: SlotOwner, profile: int) -> None:
        self._model = model
        self.profile = profile
        self._context: ExecutionContext | None = None
        self._stream: Any = None
        self._buffers: dict[str, _Buffer] = {}
        self._allocator: Any = None  # the SlotOutputAllocator, when the engine has data-dependent outputs
        self._data_dependent: set[str] = set()
        self._closed = False
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    @property
    def device_bytes(self) -> int:
        """Device memory of this slot's I/O buffers (data-dependent outputs' memory grows with use, not counted)."""
        return sum(b.device_bytes for b in self._buffers.values())

    @property
    def host_bytes(self) -> int:
        """Pinned host memory of this slot's staging buffers."""
        return sum(b.host_bytes for b in self._buffers.values())

    # -- open

    def _open(self) -> None:
        model, cuda = self._model, self._model.cuda
        where = origin(model.name)
        model.health.check(model.name)
        cuda.use_device(model.device)
        engine = model.engine
        assert engine is not None
        context = engine.create_execution_context()
        if context is None:  # TensorRT's answer to "no device memory for the activations"
            model.health.check(model.name)
            raise OutOfDeviceMemoryError(f"{where}: out of GPU memory for another execution context")
        self._context = context
        self._stream = cuda.stream_create()
        if model.profile_per_slot:
            self._select_profile(context)
        for tensor, shape in self._max_shapes(context):
            self._check_layout(context, tensor, shape)
            if any(d < 0 for d in shape):
                self._data_dependent.add(tensor.name)
                self._buffers[tensor.name] = _Buffer(tensor, 0, 0)
                continue
            nbytes = volume(shape) * tensor.dtype.itemsize
            buffer = self._buffers[tensor.name] = _Buffer(tensor, nbytes, nbytes)
            buffer.device = cuda.malloc(nbytes)
            buffer.host = cuda.host_alloc(nbytes)
            buffer.view = host_view(buffer.host, nbytes)
            # Addresses never change for the slot's life, so they are bound once here, not per request.
            if not context.set_tensor_address(tensor.name, buffer.device):
                raise ModelLoadError(f"{where}: TensorRT refused the address of '{tensor.name}'")
        if self._data_dependent:
            self._allocator = output_allocator_class(model.trt)(cuda)  # type: ignore[arg-type]  # a module: hashable
            for name in sorted(self._data_dependent):
                if not context.set_output_allocator(name, self._allocator):
                    raise ModelLoadError(f"{where}: TensorRT refused an output allocator for '{name}'")

    def _select_profile(self, context: ExecutionContext) -> None:
        """Profile-per-slot mode: switch this context to its own profile. The switch may enqueue copies on the
        stream, so the stream is drained before the context is used."""
        where = origin(self._model.name)
        try:
            ok = context.set_optimization_profile_async(self.profile, self._model.cuda.stream_handle(self._stream))
        except RuntimeError as error:  # TensorRT's Python binding raises on an invalid index
            raise ModelLoadError(f"{where}: cannot select profile {self.profile}: {error}") from None
        if not ok:
            raise ModelLoadError(f"{where}: cannot select optimization profile {self.profile}")
        self._model.cuda.stream_synchronize(self._stream)

    def _max_shapes(self, context: ExecutionContext) -> list[tuple[IoTensor, tuple[int, ...]]]:
        """Every tensor's largest shape in this slot's profile: inputs from the profile's max, outputs as
        TensorRT infers them with every input set to its max (-1 where only the data decides)."""
        model = self._model
        shapes = []
        for tensor in model.io:
            if tensor.is_input:
                largest = model.profile_shapes(tensor.name, self.profile)[2]
                if not context.set_input_shape(tensor.name, largest):
                    raise ModelLoadError(
                        f"{origin(model.name)}: TensorRT refused the profile's max shape "
                        f"{list(largest)} for '{tensor.name}'"
                    )
                shapes.append((tensor, largest))
        for tensor in model.io:
            if not tensor.is_input:
                shapes.append((tensor, dims(context.get_tensor_shape(tensor.name))))
        return shapes

    def _check_layout(self, context: ExecutionContext, tensor: IoTensor, shape: tuple[int, ...]) -> None:
        """A channel-last (HWC) tensor is not vectorized, so only its strides give it away."""
        if any(d < 0 for d in shape):
            return
        strides = dims(context.get_tensor_strides(tensor.name))
        expected = row_major_strides(shape)
        if len(strides) != len(shape) or any(s != e for s, e, d in zip(strides, expected, shape, strict=True) if d > 1):
            engine = self._model.engine
            assert engine is not None
            raise ModelConfigError(
                f"{origin(self._model.name)}: {'input' if tensor.is_input else 'output'} '{tensor.name}' uses the "
                f"I/O format {engine.get_tensor_format_desc(tensor.name)!r} (strides {list(strides)} for shape "
                f"{list(shape)}); {LINEAR_ONLY}"
            )

    # -- execute

    @property
    def _trt(self) -> ExecutionContext:
        """The IExecutionContext. Methods fetch it through this property instead of keeping it in a local:
        a traceback keeps frames alive, and a frame holding the context would keep it (and the engine, and their
        GPU memory) alive after close() for as long as someone holds the exception."""
        context = self._context
        if context is None:
            raise ExecutionError(f"{origin(self._model.name)}: the slot is closed")
        return context

    def execute(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], cancel: CancelToken) -> Outputs:
        """Run one request on this slot's stream and block until the stream drained.

        Raises InvalidInputError (a shape outside the profile, shapes that do not fit each other, a wrong
        datatype), ExecutionCancelled (the caller gave up: before enqueue the request is dropped; after enqueue the
        run finishes and its result is dropped), DeviceFailedError (the GPU's CUDA context is broken: this and
        every later request on it fail), ExecutionError (TensorRT or CUDA failed otherwise, or the slot is closed).
        """
        model = self._model
        model.health.check(model.name)
        if self._closed:
            raise ExecutionError(f"{origin(model.name)}: the slot is closed")
        arrays, names = self._check_request(inputs, outputs)
        model.cuda.use_device(model.device)
        if cancel.cancelled:
            raise ExecutionCancelled("the caller gave up before the run was enqueued")
        self._set_shapes(arrays)
        self._infer_shapes(arrays)
        shapes = {name: dims(self._trt.get_tensor_shape(name)) for name in names}
        # Staging into pinned memory is safe: the previous run on this slot has drained (execute never returns
        # earlier), so no copy is still reading these host buffers.
        for name, array in arrays.items():
            buffer = self._buffers[name]
            assert buffer.view is not None
            buffer.view[: array.nbytes] = array.reshape(-1).view(np.uint8)
        # Last point where a request can be dropped for free: after this the GPU owns the slot until it drains.
        if cancel.cancelled:
            raise ExecutionCancelled("the caller gave up before the run was enqueued")
        failure = self._enqueue(arrays, names, shapes, cancel)
        drained = self._drain()
        error = failure if failure is not None else drained
        if error is not None:
            raise self._failed(error)
        if cancel.cancelled:
            raise ExecutionCancelled("the caller gave up while the run was on the GPU; its result was dropped")
        return {name: self._read_output(name, shapes[name]) for name in names}

    def _check_request(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> tuple[dict[str, np.ndarray], list[str]]:
        model = self._model
        arrays = {}
        declared = [tensor.name for tensor in model.io if tensor.is_input]
        for tensor in model.io:
            if not tensor.is_input:
                continue
            array = inputs.get(tensor.name)
            if array is None:  # every input of a plan is required
                raise InvalidInputError(missing_inputs_message(model.name, inputs, declared, len(declared)))
            if array.dtype != tensor.dtype:
                raise InvalidInputError(
                    f"input '{tensor.name}' has datatype {datatypes.from_numpy(array.dtype)}, the model expects "
                    f"{tensor.datatype}"
                )
            # np.require keeps a 0-d array 0-d (np.ascontiguousarray would make it shape [1]): scalars stay scalars.
            arrays[tensor.name] = np.require(array, requirements="C")
        unknown = sorted(set(inputs) - set(arrays))
        if unknown:
            raise InvalidInputError(f"unknown input(s) {unknown}; the model takes {sorted(arrays)}")
        produced = [t.name for t in model.io if not t.is_input]
        names = list(outputs) if outputs else produced
        for name in names:
            if name not in produced:
                raise InvalidInputError(f"unknown requested output '{name}'; the model produces {sorted(produced)}")
        return arrays, names

    def _set_shapes(self, arrays: dict[str, np.ndarray]) -> None:
        for name, array in arrays.items():
            if not self._trt.set_input_shape(name, array.shape):
                low, _, high = self._model.profile_shapes(name, self.profile)
                raise InvalidInputError(
                    f"input '{name}' has shape {list(array.shape)}; the engine accepts shapes from {list(low)} to "
                    f"{list(high)}"
                )

    def _infer_shapes(self, arrays: dict[str, np.ndarray]) -> None:
        """Each input shape lies in the profile; whether they fit each other (dimensions the model ties together,
        such as a shared sequence length) only TensorRT's shape inference knows."""
        unset: list[str] | None = None
        try:
            unset = self._trt.infer_shapes()
        except RuntimeError:  # TensorRT logged which layer; the caller gets the shapes it sent
            pass
        # Raised outside the except block: the RuntimeError's traceback must not ride along (its frames may hold
        # the execution context).
        if unset is None:
            given = ", ".join(f"'{name}' {list(array.shape)}" for name, array in arrays.items())
            raise InvalidInputError(f"the input shapes do not fit each other: {given}")
        if unset:
            raise ExecutionError(f"{origin(self._model.name)}: TensorRT says inputs {sorted(unset)} are not set")

    def _enqueue(
        self, arrays: dict[str, np.ndarray], names: list[str], shapes: dict[str, tuple[int, ...]], cancel: CancelToken
    ) -> CudaError | str | None:
        """Queue copy-in, inference and copy-out on the slot's stream. Returns what failed, or None. Never raises
        for CUDA/TensorRT failures: the caller must drain the stream whatever happened here. `shapes` gets the
        data-dependent outputs' shapes once TensorRT reported them."""
        cuda, stream = self._model.cuda, self._stream
        try:
            for name, array in arrays.items():
                if array.nbytes:
                    buffer = self._buffers[name]
                    cuda.copy_to_device_async(buffer.device, buffer.host, array.nbytes, stream)
            if not self._trt.execute_async_v3(cuda.stream_handle(stream)):
                allocator_failure = self._allocator.failure if self._allocator is not None else None
                return allocator_failure or "execute_async_v3 returned False"
            # The copy-out is skipped for a caller that already left: it is the only part still skippable.
            if cancel.cancelled:
                return None
            for name in names:
                source, shapes[name] = self._output_memory(name, shapes[name])
                nbytes = volume(shapes[name]) * self._buffers[name].tensor.dtype.itemsize
                if nbytes:
                    cuda.copy_to_host_async(self._buffers[name].host, source, nbytes, stream)
        except CudaError as error:
            return error
        return None

    def _output_memory(self, name: str, shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        """(device address, shape) of output `name` after the enqueue: a data-dependent output's come from the
        allocator, and its pinned staging buffer grows to fit. Raises CudaError."""
        buffer = self._buffers[name]
        if name not in self._data_dependent:
            return buffer.device, shape
        shape = self._allocator.shapes[name]
        pointer, _ = self._allocator.buffers[name]
        nbytes = volume(shape) * buffer.tensor.dtype.itemsize
        if nbytes > buffer.host_bytes:
            self._grow_host(buffer, max(nbytes, 2 * buffer.host_bytes))
        return pointer, shape

    def _grow_host(self, buffer: _Buffer, nbytes: int) -> None:
        """A bigger pinned buffer (the old one is idle: the previous run drained)."""
        cuda = self._model.cuda
        host = cuda.host_alloc(nbytes)
        buffer.view = None
        if buffer.host:
            cuda.free_host(buffer.host)
        buffer.host, buffer.host_bytes = host, nbytes
        buffer.view = host_view(host, nbytes)

    def _drain(self) -> CudaError | None:
        """Wait for everything queued on the stream. Errors of the asynchronous work surface here."""
        try:
            self._model.cuda.stream_synchronize(self._stream)
        except CudaError as error:
            return error
        return None

    def _failed(self, failure: CudaError | str) -> ExecutionError:
        """The error for a failed run: a sticky CUDA error fails the whole device."""
        model = self._model
        if isinstance(failure, CudaError) and failure.sticky:
            return model.health.fail(failure.code_name, model.name)
        if model.health.fault is not None:  # another slot's run broke the device meanwhile
            return model.health.refusal(model.name)
        _LOG.error("%s: TensorRT run failed: %s", origin(model.name), failure)
        return ExecutionError(f"model '{model.name}' failed to execute")

    def _read_output(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        buffer = self._buffers[name]
        nbytes = volume(shape) * buffer.tensor.dtype.itemsize
        if not nbytes:  # nothing was copied (a data-dependent output may be empty before it ever had a buffer)
            return np.empty(shape, buffer.tensor.dtype)
        assert buffer.view is not None
        # A copy: the staging buffer belongs to the slot and is overwritten by its next request.
        return buffer.view[:nbytes].view(buffer.tensor.dtype).reshape(shape).copy()

    # -- close

    def close(self) -> None:
        """Free the slot: wait for its stream, drop the execution context, free the buffers, destroy the
        stream. Idempotent; errors are logged, never raised, so teardown always completes. On a failed device
        nothing is freed through CUDA (every call would fail): the device reset frees it all."""
        if self._closed:
            return
        self._closed = True
        model, cuda = self._model, self._model.cuda
        where = origin(model.name)
        usable = model.health.fault is None

        def attempt(what: str, action: Callable[[], None]) -> None:
            if not usable:
                return
            try:
                action()
            except CudaError as error:
                _LOG.error("%s: %s while closing a slot: %s", where, what, error)

        attempt("setting the device", lambda: cuda.use_device(model.device))
        if self._stream is not None:
            # Never free memory the GPU may still be using: the stream is idle after every execute, but a slot
            # that failed half-way through _open may have queued a profile switch.
            attempt("synchronizing the stream", lambda: cuda.stream_synchronize(self._stream))
        # The context goes first: it holds the buffer addresses (and the output allocator) and was made from the
        # engine.
        self._context = None
        if self._allocator is not None:
            if usable:
                self._allocator.close()
            self._allocator = None
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
        model.context_closed(self)
