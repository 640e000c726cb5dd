"""The TensorRT backend (NVIDIA GPUs): one shared engine per model, one execution context + stream + buffers per
slot. See backend.py for the configuration parameters and failure behaviour.

    backend.py     TensorRTBackend (the engine interface's Backend): modules, device probe, load, plan cache
    model.py       TensorRTModel: one engine, its capacity, its slots
    slot.py        TensorRTContext: one slot (execution context, stream, buffers, output allocator)
    engine_io.py   an engine's I/O tensors, what slotserve serves of them, the model metadata
    health.py      a GPU after a sticky CUDA error: refused, then reset once nothing holds it
    builder.py     ONNX -> plan builds, the plan cache and the timing cache
    profiles.py    optimization profiles from config.pbtxt, the plan cache key
    cuda.py        the CUDA runtime calls (cuda-python), checked
    driver.py      which GPU extra (tensorrt-cu12 / tensorrt-cu13) the NVIDIA driver runs
    protocols.py   the Protocols the adapter is typed against
    api_names.py   every TensorRT / CUDA name used (checked against the real modules by the tests)
    (the GPU-less TEST DOUBLE of TensorRT and the CUDA runtime is engine/testing/tensorrt_double/)
    gpu_check.py   `python -m engine.tensorrt.gpu_check`: the check to run on a real GPU

Importing this package imports neither TensorRT nor cuda-python: they are imported on the first load, after the
CUDA device probe.
"""

from __future__ import annotations

from collections.abc import Mapping

from .backend import TensorRTBackend

__all__ = ["TensorRTBackend", "create_backend"]

_TRUE = ("1", "true", "yes", "on")


def create_backend(options: Mapping[str, str] | None = None) -> TensorRTBackend:
    """The backend the server registers under "tensorrt".

    Options (all optional): `cache_dir` (plan cache directory); `double` = "true" selects the GPU-less test
    double instead of the real TensorRT and CUDA (for tests of the whole server only: it computes on the CPU),
    with `double_memory` (simulated device bytes, default 1 GiB) and `double_device_count` (0 simulates a machine
    without a GPU). The double's FakeDevice is reachable as `backend.double_device`.
    """
    options = dict(options or {})
    cache_dir = options.get("cache_dir") or None
    if options.get("double", "").strip().lower() in _TRUE:
        from engine.testing.tensorrt_double import double_backend

        backend, device = double_backend(
            cache_dir=cache_dir,
            total_memory=int(options.get("double_memory", 1 << 30)),
            device_count=int(options.get("double_device_count", 1)),
        )
        backend.double_device = device  # type: ignore[attr-defined]
        return backend
    return TensorRTBackend(cache_dir=cache_dir)
