"""The TensorRT check for a machine with an NVIDIA GPU: `python -m engine.tensorrt.gpu_check --repository DIR`.

Needs TensorRT and cuda-python (`make gpu-check` installs the extra the driver runs: engine/tensorrt/driver.py) and
a demo repository (`make models`). It prints the driver, CUDA and TensorRT versions it runs with, then for each
model (default: simple, identity_fp32, matmul_chain, and silero_vad, whose `sr` is a scalar input) builds the
TensorRT engine from the model's ONNX file (or takes it from the plan cache), runs the same random inputs through
TensorRT and through ONNX Runtime on the CPU and compares the outputs, then prints the throughput with 1, 2 and 4
slots (one thread per slot, each with its own execution context and stream) and the memory the engine and each
slot take. Two more checks follow (`--checks`): `data_dependent` builds a NonZero model (an output whose shape
only the data decides, served through an output allocator) and compares it over inputs of changing density;
`batching` loads `simple` as a dynamically batching model (preferred batch size 4: the profile's opt) and compares
every stacked batch size from 1 to max_batch_size.

Exit status: 0 every model matched; 1 an output differed or a model failed; 2 TensorRT cannot run here (no GPU,
no TensorRT, no cuda-python, a driver too old), with the reason.

`--double` runs the same check over the GPU-less test double (engine/testing/tensorrt_double/): it exercises the code
path on any machine, but its outputs come from ONNX Runtime and its timings are meaningless.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..config.repository import ModelRepository
from ..config.specs import BatchingSpec, ModelSpec
from ..errors import BackendUnavailableError, EngineError
from ..interface import CancelToken, Context, LoadedModel
from ..onnxruntime_backend import OnnxRuntimeBackend
from .backend import TensorRTBackend, TensorRTModel, import_cudart, import_tensorrt, tensorrt_cuda_major
from .cuda import CudaRuntime, cuda_version_text
from .driver import nvidia_smi
from .protocols import CudaRuntimeModule, TensorRTRuntimeModule

DEFAULT_MODELS = ("simple", "identity_fp32", "matmul_chain", "silero_vad")
CHECKS = ("data_dependent", "batching")
MiB = float(1 << 20)


@dataclasses.dataclass(frozen=True)
class Setup:
    """What a model needs beyond its config.pbtxt to be checked: TensorRT ranges for its -1 dimensions, and
    inputs that mean something to it (None: random ones)."""

    parameters: dict[str, str] = dataclasses.field(default_factory=dict)
    inputs: Callable[[np.random.Generator], dict[str, np.ndarray]] | None = None


def _silero_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    # One 32 ms chunk at 16 kHz with the 64-sample context the silero wrapper prepends, a fresh state, and the
    # sample rate: an INT64 scalar (a 0-d tensor end to end).
    return {
        "input": (0.1 * rng.standard_normal((1, 576))).astype(np.float32),
        "state": np.zeros((2, 1, 128), np.float32),
        "sr": np.array(16000, np.int64),
    }


SETUPS = {
    # Silero takes chunks of exactly 512 samples (+64 of context) at 16 kHz, for up to 4 streams at once here.
    "silero_vad": Setup(
        {
            "trt_profile_min": "input:1x576;state:2x1x128",
            "trt_profile_opt": "input:1x576;state:2x1x128",
            "trt_profile_max": "input:4x576;state:2x4x128",
        },
        _silero_inputs,
    ),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m engine.tensorrt.gpu_check", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--repository", required=True, type=Path, help="model repository (demo.build_repository)")
    parser.add_argument(
        "--models", default=",".join(DEFAULT_MODELS), help="comma-separated model names (default: %(default)s)"
    )
    parser.add_argument("--slots", default="1,2,4", help="slot counts to measure (default: %(default)s)")
    parser.add_argument("--iterations", type=int, default=200, help="requests per slot per measurement")
    parser.add_argument("--batch", type=int, default=1, help="batch size of the requests of batching models")
    parser.add_argument(
        "--dynamic-size",
        type=int,
        default=4096,
        help="size used for variable (-1) dimensions in requests (default: %(default)s)",
    )
    parser.add_argument(
        "--dynamic-max",
        type=int,
        default=65536,
        help="trt_default_dim_max given to models that set no range for a -1 dimension",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="plan cache directory (the backend's own, like $SLOTSERVE_TRT_CACHE)",
    )
    parser.add_argument("--rtol", type=float, default=2e-2, help="relative tolerance for floating-point outputs")
    parser.add_argument(
        "--atol",
        type=float,
        default=2e-2,
        help="absolute tolerance for floating-point outputs (TensorRT may use TF32/FP16 kernels)",
    )
    parser.add_argument(
        "--checks",
        default=",".join(CHECKS),
        help="extra checks: data_dependent, batching (default: %(default)s; '' for none)",
    )
    parser.add_argument("--double", action="store_true", help="use the GPU-less test double (checks the code path)")
    args = parser.parse_args(argv)
    try:
        args.slot_counts = [int(s) for s in args.slots.split(",") if s.strip()]
    except ValueError:
        parser.error("--slots must be comma-separated integers")
    args.model_names = [m.strip() for m in args.models.split(",") if m.strip()]
    args.check_names = [c.strip() for c in args.checks.split(",") if c.strip()]
    unknown = sorted(set(args.check_names) - set(CHECKS))
    if unknown:
        parser.error(f"unknown --checks {unknown}; choose from {', '.join(CHECKS)}")
    if args.iterations < 1 or args.batch < 1 or not args.slot_counts or min(args.slot_counts) < 1:
        parser.error("--iterations, --batch and every --slots value must be >= 1")
    return args


def sample_inputs(model: TensorRTModel, batch: int, dynamic_size: int, seed: int) -> dict[str, np.ndarray]:
    """Random inputs that fit the engine's profile: -1 dimensions become min(dynamic_size, the profile max)."""
    from ..datatypes import numpy_dtype

    rng = np.random.default_rng(seed)
    inputs = {}
    batching = model.metadata.max_batch_size > 0
    for tensor in model.metadata.inputs:
        largest = model.profile_shapes(tensor.name)[2]
        dims = list(largest[1:] if batching else largest)
        shape = [min(dynamic_size, top) if want == -1 else want for want, top in zip(tensor.shape, dims, strict=True)]
        if batching:
            shape.insert(0, min(batch, model.metadata.max_batch_size))
        dtype = numpy_dtype(tensor.datatype)
        value: np.ndarray
        if dtype.kind == "f":
            value = rng.standard_normal(shape)
        elif dtype.kind == "b":
            value = rng.random(shape) > 0.5
        else:
            value = rng.integers(0, 100, shape)
        inputs[tensor.name] = np.asarray(value).astype(dtype)  # 0-d stays 0-d
    return inputs


def compare(
    expected: dict[str, np.ndarray], actual: dict[str, np.ndarray], rtol: float, atol: float
) -> tuple[bool, list[str]]:
    """(all outputs match, one line of detail per output)."""
    ok, details = True, []
    for name, want in expected.items():
        got = actual.get(name)
        if got is None or got.shape != want.shape:
            ok = False
            details.append(f"{name}: shape {None if got is None else list(got.shape)}, expected {list(want.shape)}")
            continue
        if want.dtype.kind == "f":
            difference = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0))
            match = bool(np.allclose(got, want, rtol=rtol, atol=atol))
        else:
            difference = float(np.count_nonzero(got != want))
            match = difference == 0
        ok &= match
        details.append(f"{name}: {'ok' if match else 'MISMATCH'} (max |diff| {difference:.3g})")
    return ok, details


def throughput(model: LoadedModel, inputs: dict[str, np.ndarray], slots: int, iterations: int) -> tuple[float, float]:
    """(requests per second, median latency in ms) with `slots` contexts, one thread each, all started
    together. Blocks for the measurement."""
    contexts = [model.create_context() for _ in range(slots)]
    start = threading.Barrier(slots + 1)
    latencies: list[float] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def worker(context: Context) -> None:
        mine = []
        try:
            context.execute(inputs, [], CancelToken())  # warm-up, outside the measurement
            start.wait()
            for _ in range(iterations):
                began = time.perf_counter()
                context.execute(inputs, [], CancelToken())
                mine.append(time.perf_counter() - began)
        except BaseException as error:  # reported by the caller
            failures.append(error)
            start.abort()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker, args=(c,), name=f"gpu-check-slot-{i}") for i, c in enumerate(contexts)]
    try:
        for thread in threads:
            thread.start()
        try:
            start.wait()
        except threading.BrokenBarrierError:
            pass
        began = time.perf_counter()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - began
    finally:
        for context in contexts:
            context.close()
    if failures:
        raise failures[0]
    return slots * iterations / elapsed, 1000.0 * statistics.median(latencies)


def _spec(
    repository: ModelRepository, name: str, backend: str, args: argparse.Namespace, batching: BatchingSpec | None = None
) -> ModelSpec:
    spec = repository.read(name, backend=backend)
    if batching is not None:
        spec = dataclasses.replace(spec, batching=batching)
    if backend != "tensorrt":
        return spec
    parameters = dict(spec.parameters)
    parameters.update(SETUPS.get(name, Setup()).parameters)
    parameters.setdefault("trt_default_dim_max", str(args.dynamic_max))
    # (--cache-dir goes to the backend itself: a model's trt_cache_dir must be inside its repository.)
    return dataclasses.replace(spec, parameters=parameters)


def _run_both(
    model: LoadedModel, reference: LoadedModel, inputs: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(TensorRT's outputs, ONNX Runtime's outputs) for `inputs`, each on a fresh slot."""
    context, reference_context = model.create_context(), reference.create_context()
    try:
        return context.execute(inputs, [], CancelToken()), reference_context.execute(inputs, [], CancelToken())
    finally:
        context.close()
        reference_context.close()


def check_model(backend: TensorRTBackend, repository: ModelRepository, name: str, args: argparse.Namespace) -> bool:
    """Load, compare, measure one model; print what happened. Returns True when the outputs matched.
    Raises BackendUnavailableError when TensorRT cannot run here."""
    model = backend.load(_spec(repository, name, "tensorrt", args))
    reference = OnnxRuntimeBackend().load(_spec(repository, name, "onnxruntime", args))
    try:
        capacity = model.capacity
        print(
            f"{name}: engine plan {model.plan_source}; weights {capacity.weights_bytes / MiB:.1f} MiB, "
            f"{capacity.per_slot_bytes / MiB:.1f} MiB device memory and {capacity.host_bytes_per_slot / MiB:.1f} "
            f"MiB pinned host memory per slot, capacity {model.max_parallel_slots} ({', '.join(capacity.notes)})"
        )
        make_inputs = SETUPS.get(name, Setup()).inputs
        inputs = (
            make_inputs(np.random.default_rng(len(name)))
            if make_inputs is not None
            else sample_inputs(model, args.batch, args.dynamic_size, seed=len(name))
        )
        actual, expected = _run_both(model, reference, inputs)
        matched, details = compare(expected, actual, args.rtol, args.atol)
        print(f"{name}: outputs vs ONNX Runtime: {'; '.join(details)}")
        figures = []
        for slots in args.slot_counts:
            if slots > model.max_parallel_slots:
                figures.append(f"{slots} slots: skipped (capacity {model.max_parallel_slots})")
                continue
            rate, median = throughput(model, inputs, slots, args.iterations)
            figures.append(f"{slots} slot{'s' if slots != 1 else ''}: {rate:.1f} req/s (p50 {median:.2f} ms)")
        print(f"{name}: " + " | ".join(figures))
        return matched
    finally:
        model.close()
        reference.close()


def write_nonzero_model(root: Path) -> str:
    """`root/nonzero/`: OUTPUT0 = NonZero(INPUT0), FP32 [8, 8] -> INT64 [2, -1], the -1 decided by the data."""
    graph = helper.make_graph(
        [helper.make_node("NonZero", ["INPUT0"], ["OUTPUT0"])],
        "nonzero",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [8, 8])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.INT64, [2, "count"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    (root / "nonzero" / "1").mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(root / "nonzero" / "1" / "model.onnx"))
    (root / "nonzero" / "config.pbtxt").write_text('name: "nonzero"\nbackend: "onnxruntime"\nmax_batch_size: 0\n')
    return "nonzero"


def check_data_dependent(backend: TensorRTBackend, args: argparse.Namespace) -> bool:
    """A NonZero model: its output's size changes with every input (empty, sparse, dense), so TensorRT asks the
    slot's output allocator for memory as it goes."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        repository = ModelRepository(Path(scratch))
        name = write_nonzero_model(Path(scratch))
        model = backend.load(_spec(repository, name, "tensorrt", args))
        reference = OnnxRuntimeBackend().load(_spec(repository, name, "onnxruntime", args))
        try:
            rng, matched, details = np.random.default_rng(7), True, []
            for density in (0.0, 0.1, 1.0, 0.5):
                inputs = {"INPUT0": (rng.random((8, 8)) < density).astype(np.float32)}
                tensorrt_outputs, reference_outputs = _run_both(model, reference, inputs)
                ok, detail = compare(reference_outputs, tensorrt_outputs, args.rtol, args.atol)
                matched &= ok
                details.append(f"density {density}: {'; '.join(detail)}")
            print(f"data-dependent output ({name}, plan {model.plan_source}): {' | '.join(details)}")
            return matched
        finally:
            model.close()
            reference.close()


def check_batching(
    backend: TensorRTBackend, repository: ModelRepository, args: argparse.Namespace, name: str = "simple"
) -> bool:
    """`name` as a dynamically batching model (preferred batch size 4): the profile's batch range is 1, 4,
    max_batch_size, and every stacked batch size runs and matches ONNX Runtime."""
    batching = BatchingSpec(preferred_batch_sizes=(4,))
    model = backend.load(_spec(repository, name, "tensorrt", args, batching))
    reference = OnnxRuntimeBackend().load(_spec(repository, name, "onnxruntime", args, batching))
    try:
        first = model.metadata.inputs[0].name
        low, opt, high = (shape[0] for shape in model.profile_shapes(first))
        matched, failed = True, []
        for batch in range(1, model.metadata.max_batch_size + 1):
            inputs = sample_inputs(model, batch, args.dynamic_size, seed=batch)
            tensorrt_outputs, reference_outputs = _run_both(model, reference, inputs)
            ok, detail = compare(reference_outputs, tensorrt_outputs, args.rtol, args.atol)
            matched &= ok
            if not ok:
                failed.append(f"batch {batch}: {'; '.join(detail)}")
        print(
            f"batching ({name}, plan {model.plan_source}): profile batch sizes min {low}, opt {opt}, max {high}; "
            f"stacked batches 1..{model.metadata.max_batch_size}: " + ("ok" if matched else " | ".join(failed))
        )
        return matched and opt == 4
    finally:
        model.close()
        reference.close()


def environment(cudart: Any, trt: Any) -> str:
    """The driver, CUDA and TensorRT this check runs with, on one line."""
    cuda = CudaRuntime(cudart)
    driver_cuda, runtime_cuda = cuda.versions()
    driver_version, _ = nvidia_smi()
    parts = [f"driver {driver_version or '?'} (CUDA {cuda_version_text(driver_cuda)})"]
    try:
        bindings = importlib.metadata.version("cuda-bindings")
    except importlib.metadata.PackageNotFoundError:
        bindings = "?"
    parts.append(f"cuda-python runtime CUDA {cuda_version_text(runtime_cuda)} (cuda-bindings {bindings})")
    if trt is not None:
        built_for = tensorrt_cuda_major(trt)
        parts.append(f"TensorRT {trt.__version__}" + (f" for CUDA {built_for}" if built_for else ""))
    count, _ = cuda.device_count()
    if count:
        cuda.use_device(0)
        major, minor = cuda.compute_capability(0)
        parts.append(f"GPU 0 {cuda.device_name(0)} (compute capability {major}.{minor})")
    return "versions: " + "; ".join(parts)


def _checks(backend: TensorRTBackend, repository: ModelRepository, args: argparse.Namespace) -> list[tuple[str, Any]]:
    """(name, function returning True when it matched) for each model and extra check asked for."""
    found: list[tuple[str, Any]] = [
        (name, lambda name=name: check_model(backend, repository, name, args)) for name in args.model_names
    ]
    if "data_dependent" in args.check_names:
        found.append(("data_dependent", lambda: check_data_dependent(backend, args)))
    if "batching" in args.check_names:
        found.append(("batching", lambda: check_batching(backend, repository, args)))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    repository = ModelRepository(args.repository)
    cudart: CudaRuntimeModule | None
    trt: TensorRTRuntimeModule | None
    if args.double:
        from engine.testing.tensorrt_double import double_backend

        backend, device = double_backend(cache_dir=args.cache_dir, total_memory=8 << 30)
        device.probe_values["sr"] = 16000  # silero_vad branches on its sample rate (see FakeDevice.probe_values)
        print("TEST DOUBLE: no GPU is used; outputs come from ONNX Runtime and the figures are meaningless")
        cudart, trt = device.cudart, device.trt
    else:
        backend = TensorRTBackend(cache_dir=args.cache_dir)
        cudart, trt = import_cudart(), import_tensorrt()
    if cudart is not None:
        print(environment(cudart, trt))
    all_matched = True
    for name, check in _checks(backend, repository, args):
        if name in args.model_names and not (args.repository / name / "config.pbtxt").exists():
            print(f"{name}: skipped: not in {args.repository} (`make models` puts it there)")
            continue
        try:
            all_matched &= check()
        except BackendUnavailableError as error:
            print(f"TensorRT cannot run here: {error}", file=sys.stderr)
            return 2
        except EngineError as error:
            print(f"{name}: FAILED: {error}", file=sys.stderr)
            all_matched = False
    print("gpu-check: all outputs matched" if all_matched else "gpu-check: FAILED")
    return 0 if all_matched else 1


if __name__ == "__main__":
    sys.exit(main())
