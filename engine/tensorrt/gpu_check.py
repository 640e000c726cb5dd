"""The TensorRT check for a machine with an NVIDIA GPU: `python -m engine.tensorrt.gpu_check --repository DIR`.

Needs TensorRT and cuda-python (`pip install .[tensorrt]`) and a demo repository (`python -m
demo.build_repository --output DIR`, or `make models`). For each model (default: simple, identity_fp32,
matmul_chain) it builds the TensorRT engine from the model's ONNX file (or takes it from the plan cache), runs the
same random inputs through TensorRT and through ONNX Runtime on the CPU and compares the outputs, then prints
the throughput with 1, 2 and 4 slots (one thread per slot, each with its own execution context and stream) and
the device memory the engine and each slot take.

Exit status: 0 every model matched; 1 an output differed or a model failed; 2 TensorRT cannot run here (no GPU,
no TensorRT, no cuda-python), with the reason.

`--double` runs the same check over the GPU-less test double (engine/tensorrt/double.py): it exercises the code
path on any machine, but its outputs come from ONNX Runtime and its timings are meaningless.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import BackendUnavailableError, EngineError
from ..interface import CancelToken, Context, LoadedModel, ModelSpec
from ..onnxruntime_backend import OnnxRuntimeBackend
from ..repository import ModelRepository
from .backend import TensorRTBackend, TensorRTModel

DEFAULT_MODELS = ("simple", "identity_fp32", "matmul_chain")
MiB = float(1 << 20)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine.tensorrt.gpu_check",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repository", required=True, type=Path, help="model repository (demo.build_repository)")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help="comma-separated model names (default: %(default)s)")
    parser.add_argument("--slots", default="1,2,4", help="slot counts to measure (default: %(default)s)")
    parser.add_argument("--iterations", type=int, default=200, help="requests per slot per measurement")
    parser.add_argument("--batch", type=int, default=1, help="batch size of the requests of batching models")
    parser.add_argument("--dynamic-size", type=int, default=4096,
                        help="size used for variable (-1) dimensions in requests (default: %(default)s)")
    parser.add_argument("--dynamic-max", type=int, default=65536,
                        help="trt_default_dim_max given to models that set no range for a -1 dimension")
    parser.add_argument("--cache-dir", type=Path, default=None, help="plan cache directory (trt_cache_dir)")
    parser.add_argument("--rtol", type=float, default=2e-2, help="relative tolerance for floating-point outputs")
    parser.add_argument("--atol", type=float, default=2e-2,
                        help="absolute tolerance for floating-point outputs (TensorRT may use TF32/FP16 kernels)")
    parser.add_argument("--double", action="store_true", help="use the GPU-less test double (checks the code path)")
    args = parser.parse_args(argv)
    try:
        args.slot_counts = [int(s) for s in args.slots.split(",") if s.strip()]
    except ValueError:
        parser.error("--slots must be comma-separated integers")
    args.model_names = [m.strip() for m in args.models.split(",") if m.strip()]
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
        shape = [min(dynamic_size, top) if want == -1 else want for want, top in zip(tensor.shape, dims)]
        if batching:
            shape.insert(0, min(batch, model.metadata.max_batch_size))
        dtype = numpy_dtype(tensor.datatype)
        if dtype.kind == "f":
            inputs[tensor.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            inputs[tensor.name] = rng.random(shape) > 0.5
        else:
            inputs[tensor.name] = rng.integers(0, 100, shape).astype(dtype)
    return inputs


def compare(expected: dict[str, np.ndarray], actual: dict[str, np.ndarray], rtol: float,
            atol: float) -> tuple[bool, list[str]]:
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


def throughput(model: LoadedModel, inputs: dict[str, np.ndarray], slots: int,
               iterations: int) -> tuple[float, float]:
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


def _spec(repository: ModelRepository, name: str, backend: str, args: argparse.Namespace) -> ModelSpec:
    spec = repository.read(name, backend=backend)
    if backend != "tensorrt":
        return spec
    parameters = dict(spec.parameters)
    parameters.setdefault("trt_default_dim_max", str(args.dynamic_max))
    if args.cache_dir is not None:
        parameters["trt_cache_dir"] = str(args.cache_dir)
    return dataclasses.replace(spec, parameters=parameters)


def check_model(backend: TensorRTBackend, repository: ModelRepository, name: str, args: argparse.Namespace) -> bool:
    """Load, compare, measure one model; print what happened. Returns True when the outputs matched.
    Raises BackendUnavailableError when TensorRT cannot run here."""
    model = backend.load(_spec(repository, name, "tensorrt", args))
    reference = OnnxRuntimeBackend().load(_spec(repository, name, "onnxruntime", args))
    try:
        capacity = model.capacity
        print(f"{name}: engine plan {model.plan_source}; weights {capacity.weights_bytes / MiB:.1f} MiB, "
              f"{capacity.per_slot_bytes / MiB:.1f} MiB device memory per slot, capacity {model.max_parallel_slots} "
              f"({', '.join(capacity.notes)})")
        inputs = sample_inputs(model, args.batch, args.dynamic_size, seed=len(name))
        context, reference_context = model.create_context(), reference.create_context()
        try:
            actual = context.execute(inputs, [], CancelToken())
            expected = reference_context.execute(inputs, [], CancelToken())
        finally:
            context.close()
            reference_context.close()
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


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    repository = ModelRepository(args.repository)
    if args.double:
        from .double import double_backend

        backend, _ = double_backend(cache_dir=args.cache_dir, total_memory=8 << 30)
        print("TEST DOUBLE: no GPU is used; outputs come from ONNX Runtime and the figures are meaningless")
    else:
        backend = TensorRTBackend(cache_dir=args.cache_dir)
    all_matched = True
    for name in args.model_names:
        try:
            all_matched &= check_model(backend, repository, name, args)
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
