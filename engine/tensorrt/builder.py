"""Engines built from ONNX: TensorRT's builder behind an on-disk plan cache and a shared timing cache.

A build takes seconds to minutes, so a built plan is written to the cache directory under a key (profiles.py
`cache_key`: sha256 of the ONNX file and its external data files, the TensorRT version and the CUDA major it was
built for, the GPU's name and compute capability, the profiles and the workspace) and a restart deserializes it
instead. The timing cache (kernel timings, valid per TensorRT version and GPU) is shared by every model built on
that GPU, which makes later builds, and the N-profile builds of profile-per-slot mode, much faster.

Files are written atomically (a temporary file, then rename), so a crash mid-write never leaves a truncated plan
under a valid key, and two servers sharing the cache directory never read a half-written file.

Thread rules: TensorRT wants one builder per thread; the backend also serializes builds (one lock per backend),
as Triton does, because concurrent builds on one GPU perturb each other's kernel timings.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from ..config.files import hide_paths
from ..errors import ModelConfigError, ModelLoadError
from .profiles import ProfileSpec
from .protocols import TensorRTBuilderModule

_LOG = logging.getLogger(__name__)

DEFAULT_WORKSPACE = 1 << 30
PARAM_WORKSPACE = "trt_workspace_bytes"
PARAM_CACHE_DIR = "trt_cache_dir"
CACHE_ENV = "SLOTSERVE_TRT_CACHE"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def default_cache_dir() -> Path:
    """$SLOTSERVE_TRT_CACHE, else $XDG_CACHE_HOME/slotserve/tensorrt, else ~/.cache/slotserve/tensorrt."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "slotserve" / "tensorrt"


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` in one step (readers see the old file or the new one, never a partial one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as handle:
        handle.write(data)
    os.chmod(handle.name, 0o644)
    os.replace(handle.name, path)


class PlanCache:
    """The cache directory: `<model>-<key>.plan` files and one `timing-<trt>-<gpu>.cache` per GPU model."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def plan_path(self, model: str, key: str) -> Path:
        return self.directory / f"{_UNSAFE.sub('_', model)}-{key}.plan"

    def timing_path(self, trt_version: str, gpu_name: str) -> Path:
        return self.directory / f"timing-{_UNSAFE.sub('_', trt_version)}-{_UNSAFE.sub('_', gpu_name)}.cache"

    @staticmethod
    def read(path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    @staticmethod
    def discard(path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def _parse(
    trt: TensorRTBuilderModule, builder: Any, logger: Any, onnx_path: Path, profile: ProfileSpec, origin: str
) -> tuple[Any, Any]:
    """Parse the ONNX file into a network; check its inputs are the ones the profile covers."""
    network = builder.create_network(0)  # 0: explicit batch is the only mode in 10.x; EXPLICIT_BATCH is gone in 11
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        # The parser's errors may quote the file's absolute path: the client sees only its name.
        errors = [hide_paths(str(parser.get_error(i))) for i in range(parser.num_errors)]
        raise ModelConfigError(f"{origin}: TensorRT could not parse {onnx_path.name}: " + "; ".join(errors[:5]))
    names = {network.get_input(i).name for i in range(network.num_inputs)}
    expected = {r.name for r in profile.inputs}
    if names != expected:
        raise ModelConfigError(
            f"{origin}: TensorRT's parse of {onnx_path.name} has inputs {sorted(names)}, expected {sorted(expected)}"
        )
    # The parser refers to the network; both must stay alive until the build is done.
    return network, parser


def build_plan(
    trt: TensorRTBuilderModule,
    logger: Any,
    onnx_path: Path,
    profile: ProfileSpec,
    workspace: int,
    timing_cache: bytes | None,
    origin: str,
) -> tuple[bytes, bytes]:
    """Build a serialized engine from `onnx_path` with `profile` (repeated profile.count times).

    Returns (plan, serialized timing cache). Blocks for the whole build (TensorRT releases the GIL meanwhile).
    Raises ModelConfigError when the ONNX model cannot be parsed, ModelLoadError when the build fails.
    The calling thread must have its CUDA device set.
    """
    builder = trt.Builder(logger)
    network, parser = _parse(trt, builder, logger, onnx_path, profile, origin)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace)
    for _ in range(profile.count):
        optimization_profile = builder.create_optimization_profile()
        for entry in profile.inputs:
            optimization_profile.set_shape(entry.name, entry.min, entry.opt, entry.max)
        config.add_optimization_profile(optimization_profile)
    cache = config.create_timing_cache(timing_cache or b"")
    if not config.set_timing_cache(cache, False):
        # A cache from another TensorRT/GPU is refused rather than half-used; start from an empty one.
        _LOG.warning("%s: the TensorRT timing cache does not match this GPU; starting a new one", origin)
        config.set_timing_cache(config.create_timing_cache(b""), False)
    plan = builder.build_serialized_network(network, config)
    del parser
    if plan is None:
        raise ModelLoadError(f"{origin}: TensorRT could not build an engine from {onnx_path.name} (see the log)")
    return bytes(memoryview(plan)), bytes(memoryview(config.get_timing_cache().serialize()))
