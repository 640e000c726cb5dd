"""TEST DOUBLE of TensorRT (runtime, builder, ONNX parser) and of cuda-python's `cuda.bindings.runtime` / `.utils`.

Not for serving: it computes on the CPU (numpy, or ONNX Runtime for engines "built" from ONNX) and exists so the
TensorRT backend can be driven end to end, and its use of the APIs checked, on machines without an NVIDIA GPU.
It is strict where the real stack gives undefined behaviour (a crash, corrupt results, a hang) instead of an
error: every broken rule raises DoubleRuleViolation at once and is recorded in `FakeDevice.violations`, so a test
fails even when the backend swallows the exception. Where the real stack returns an error, so does the double.

Where things are:
    device.py            SimulatedDevice: the simulated GPU (memory, streams and deferred work, faults, rule log)
    cuda_runtime.py      the fake cuda.bindings.runtime (FakeCudaRuntime) and cuda.bindings.utils
    tensorrt_runtime.py  the fake TensorRT runtime: Runtime, ICudaEngine, IExecutionContext, IOutputAllocator, Dims
    tensorrt_builder.py  the fake builder side: Builder, OnnxParser, network, builder config, profiles, timing cache
    plans.py             the plan format, I/O formats (layouts) and the functions a fake engine computes
    modules.py           FakeDevice (a SimulatedDevice with the fake modules bound to it), the module objects
                         standing for `tensorrt` / `tensorrt_lean`, and double_backend

Usage:
    device = FakeDevice(total_memory=64 << 20)
    backend = TensorRTBackend(trt_module=device.trt, cudart_module=device.cudart,
                              cuda_utils_module=device.cuda_utils)      # or: backend, device = double_backend()
    device.write_plan(path, inputs=[...], outputs=[...], function="identity")   # a prebuilt model.plan

`device.trt` is a full TensorRT module (with Builder and OnnxParser), `device.trt_lean` a runtime-only one, like
`tensorrt_lean`. Every public name they have exists in the real modules (tests/tensorrt/test_api_conformance.py
checks that), so the double cannot invent API.

Rules enforced (DoubleRuleViolation):
  * a context is used by one thread at a time (each context method takes a non-blocking guard);
  * one enqueue in flight per context: a second execute_async_v3 before its stream drained the first;
  * no default stream: stream 0 in execute_async_v3, cudaMemcpyAsync, set_optimization_profile_async;
  * no buffer reuse while in flight: a pinned host buffer changed between cudaMemcpyAsync (host to device) and
    the copy's execution; a device or pinned buffer touched from a second stream while work on another stream
    still uses it; cudaFree / cudaFreeHost / cudaStreamDestroy with work in flight;
  * async copies only from/to pinned memory (cudaHostAlloc / cudaMallocHost), and only to/from device memory;
  * an I/O address that is not device memory, or too small for the tensor's current shape in its format (memory
    from an IOutputAllocator included); a device address for a host-side shape tensor;
  * CUDA or TensorRT used on a thread that never called cudaSetDevice (stricter than CUDA, which silently picks
    device 0: the backend's rule is to set the device in every thread);
  * a TensorRT Runtime or Builder created without a usable device (the real Runtime segfaults on first use);
  * cudaDeviceReset while a Runtime, engine or context of the old CUDA context is alive;
  * with profile_sharing=False (the TensorRT <= 8.5 rule), two contexts of one engine enqueued on one profile;
  * get_tensor_profile_shape on an output, or any engine/context call with an unknown tensor name.

Real behaviours reproduced (see each file's docstring for the details):
  * no driver, a driver too old for the runtime, no device: cudaGetDeviceCount fails as the real one does and
    every other CUDA call with it; cudaDriverGetVersion / cudaRuntimeGetVersion report the versions;
  * device memory is a budget: cudaMalloc fails with cudaErrorMemoryAllocation, deserialize_cuda_engine and
    create_execution_context return None when weights or activation memory do not fit; cudaMemGetInfo reports it;
    a context also takes `persistent_bytes` that no API reports (as real contexts do);
  * work is deferred: nothing queued on a stream runs before cudaStreamSynchronize, and the host side of a
    device-to-host copy holds garbage (0xA5 bytes) until then, so reading results before synchronizing fails;
  * streams are cudaStream_t objects, whose address cuda.bindings.utils.get_cuda_native_handle gives;
  * scalars (0-d tensors), shape tensors in host memory, non-linear I/O formats, outputs whose shape only the
    data decides (IOutputAllocator), input shapes that do not fit each other (infer_shapes raises, the output
    shape is an invalid Dims, execute_async_v3 returns False);
  * sticky errors (`inject_fault`): the faulting run's stream returns the error, then every CUDA call does and
    TensorRT calls fail, until cudaDeviceReset;
  * plans are tied to the TensorRT version and the compute capability (another GPU name only warns);
  * set_input_shape returns False outside the active profile's [min, max]; set_optimization_profile_async
    raises RuntimeError for a bad index.

Hooks (`device.hooks`) let tests order events without sleeping: `before_drain(stream)` runs in
cudaStreamSynchronize before the queued work, `in_context_call(name)` runs inside a context method while its
guard is held, `after_enqueue()` runs after a successful execute_async_v3.
"""

from .device import POISON, Counters, DoubleRuleViolation, Hooks
from .modules import FakeDevice, double_backend

__all__ = ["POISON", "Counters", "DoubleRuleViolation", "FakeDevice", "Hooks", "double_backend"]
