"""Optimization profiles for engines built from ONNX, and the key under which a built plan is cached.

A TensorRT engine with dynamic dimensions needs, for every input, a [min, opt, max] shape range (an optimization
profile). The ranges come from the model's configuration:

* batch dimension (max_batch_size > 0): min 1, opt `trt_opt_batch_size` (default: the largest
  preferred_batch_size of dynamic_batching, else max_batch_size), max max_batch_size. The ONNX input's first
  dimension must be dynamic (or 1 when max_batch_size is 1). With dynamic batching the server hands a slot one
  stacked array per input, whose first dimension is the batch of that run (set per run with set_input_shape).
* other dimensions: fixed if the ONNX model or config.pbtxt fixes them (both fixing them differently is an error).
  A dimension that stays -1 takes its range from the parameters `trt_profile_min`, `trt_profile_opt` and
  `trt_profile_max`, each a list of `NAME:DxDxD` entries separated by `;`, one shape per input, written without
  the batch dimension, like config.pbtxt dims (e.g. `"INPUT0:1x16;INPUT1:1"`). Entries for fixed dimensions must
  repeat the fixed value. Missing min: 1; missing opt: the max. Without a max, the parameter
  `trt_default_dim_max` (one number for every such dimension) applies; without that either, the load fails with a
  message naming the input and dimension.

In profile-per-slot mode (`trt_profile_per_slot: "true"`) the engine gets that profile N times, N = the
configured slot count (instance_group count) or 16, and slot i uses profile i.

Pure functions, no TensorRT: the cache key is computed from the ONNX file and its external data files (read with
the `onnx` package) before any TensorRT call, so a restart with a cached plan neither parses nor builds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx

from ..config.files import hide_paths
from ..config.specs import ModelSpec
from ..errors import ModelConfigError

MAX_PROFILES = 16

PARAM_MIN = "trt_profile_min"
PARAM_OPT = "trt_profile_opt"
PARAM_MAX = "trt_profile_max"
PARAM_DEFAULT_DIM_MAX = "trt_default_dim_max"
PARAM_OPT_BATCH = "trt_opt_batch_size"
PARAM_PROFILE_PER_SLOT = "trt_profile_per_slot"

# Bump when the rule that turns a configuration into profiles changes: plans cached by an older rule must not
# be taken for the new one.
PROFILE_RULE_VERSION = 2


@dataclass(frozen=True)
class InputRange:
    """One input's [min, opt, max] shapes, batch dimension included."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


@dataclass(frozen=True)
class ProfileSpec:
    """The optimization profile (the same ranges) repeated `count` times."""

    inputs: tuple[InputRange, ...]
    count: int = 1

    def describe(self) -> dict[str, object]:
        return {"count": self.count, "inputs": [[r.name, list(r.min), list(r.opt), list(r.max)] for r in self.inputs]}


def _origin(spec: ModelSpec) -> str:
    return f"model '{spec.name}'"


def int_parameter(spec: ModelSpec, key: str, default: int, minimum: int) -> int:
    """An integer parameter of config.pbtxt; ModelConfigError if it is not an integer >= minimum."""
    raw = spec.parameter(key)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ModelConfigError(f"{_origin(spec)}: parameter {key} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ModelConfigError(f"{_origin(spec)}: parameter {key} must be >= {minimum}, got {value}")
    return value


def bool_parameter(spec: ModelSpec, key: str) -> bool:
    raw = (spec.parameter(key) or "").strip().lower()
    if raw in ("", "false", "0", "no", "off"):
        return False
    if raw in ("true", "1", "yes", "on"):
        return True
    raise ModelConfigError(f"{_origin(spec)}: parameter {key} must be true or false, got {raw!r}")


def profile_count(spec: ModelSpec) -> int:
    """How many profiles the engine gets: 1, or one per slot in profile-per-slot mode."""
    if not bool_parameter(spec, PARAM_PROFILE_PER_SLOT):
        return 1
    return min(MAX_PROFILES, spec.instance_count or MAX_PROFILES)


def parse_shapes(spec: ModelSpec, key: str) -> dict[str, tuple[int, ...]]:
    """`NAME:DxD;NAME:D` -> {NAME: (D, D)}. A scalar is `NAME:`. Raises ModelConfigError on bad syntax."""
    raw = spec.parameter(key) or ""
    shapes: dict[str, tuple[int, ...]] = {}
    for entry in filter(None, (part.strip() for part in raw.split(";"))):
        name, colon, dims = entry.rpartition(":")
        try:
            if not colon or not name:
                raise ValueError
            shape = tuple(int(d) for d in dims.lower().split("x")) if dims.strip() else ()
            if any(d < 0 for d in shape):
                raise ValueError
        except ValueError:
            raise ModelConfigError(
                f"{_origin(spec)}: parameter {key}: entry {entry!r} is not NAME:DxD (dims >= 0, no batch dimension)"
            ) from None
        shapes[name.strip()] = shape
    return shapes


def onnx_inputs(path: Path) -> list[tuple[str, tuple[int, ...]]]:
    """The graph inputs of an ONNX file (initializers excluded) with -1 for every dimension that is not a fixed
    number. Reads the graph only (external weight files are not loaded)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # onnx raises DecodeError, OSError, ...: all mean "not a readable model"
        raise ModelConfigError(f"{path.name} is not a readable ONNX model: {hide_paths(str(error))}") from None
    initializers = {init.name for init in model.graph.initializer}
    inputs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in dims)
        inputs.append((value.name, shape))
    return inputs


def _batch_range(spec: ModelSpec, name: str, network_dim: int) -> tuple[int, int, int]:
    batch = spec.max_batch_size
    if network_dim != -1 and not (network_dim == 1 and batch == 1):
        raise ModelConfigError(
            f"{_origin(spec)}: input '{name}' has a fixed first dimension {network_dim} in the ONNX model, but "
            f"max_batch_size is {batch}: export the model with a dynamic batch dimension"
        )
    preferred = spec.batching.largest_preferred if spec.batching is not None else 0
    if preferred > batch:
        raise ModelConfigError(
            f"{_origin(spec)}: dynamic_batching's preferred_batch_size {preferred} exceeds max_batch_size {batch}"
        )
    # The batch size the server forms most often under load: the largest preferred one (it waits for it), else
    # the most it may stack.
    opt = int_parameter(spec, PARAM_OPT_BATCH, preferred or batch, minimum=1)
    if opt > batch:
        raise ModelConfigError(f"{_origin(spec)}: parameter {PARAM_OPT_BATCH} ({opt}) exceeds max_batch_size {batch}")
    return 1, opt, batch


def _fixed_dims(spec: ModelSpec, name: str, network: tuple[int, ...]) -> tuple[int, ...]:
    """Network dims (batch excluded) merged with the config's declared dims."""
    declared = next((t for t in spec.inputs if t.name == name), None)
    if declared is None:
        return network
    if len(declared.shape) != len(network):
        raise ModelConfigError(
            f"{_origin(spec)}: input '{name}' has {len(network)} dimensions in the ONNX model (after the batch "
            f"dimension, if any) but dims {list(declared.shape)} in the config"
        )
    merged = []
    for index, (net, cfg) in enumerate(zip(network, declared.shape, strict=True)):
        if net != -1 and cfg != -1 and net != cfg:
            raise ModelConfigError(
                f"{_origin(spec)}: input '{name}' dimension {index} is {net} in the ONNX model, {cfg} in the config"
            )
        merged.append(net if net != -1 else cfg)
    return tuple(merged)


def _dim_range(
    spec: ModelSpec, name: str, index: int, rest: tuple[int, ...], given: tuple[tuple[int, ...] | None, ...]
) -> tuple[int, int, int]:
    """[min, opt, max] of non-batch dimension `index` of `rest`. `given` holds the parameter shapes (min, opt,
    max) for this input, None where a parameter does not name it."""
    fixed = rest[index]
    picked = [shape[index] if shape is not None else None for shape in given]
    if fixed != -1:
        for key, value in zip((PARAM_MIN, PARAM_OPT, PARAM_MAX), picked, strict=True):
            if value is not None and value != fixed:
                raise ModelConfigError(
                    f"{_origin(spec)}: parameter {key} gives input '{name}' dimension {index} as {value}, but "
                    f"that dimension is fixed at {fixed}"
                )
        return fixed, fixed, fixed
    low, opt, high = picked
    if high is None:
        high = int_parameter(spec, PARAM_DEFAULT_DIM_MAX, 0, minimum=0) or None
    if high is None:
        example = "x".join("64" if d == -1 else str(d) for d in rest)
        raise ModelConfigError(
            f"{_origin(spec)}: input '{name}' dimension {index} is variable (-1), and TensorRT needs its range: set "
            f'parameter {PARAM_MAX} (and optionally {PARAM_MIN}, {PARAM_OPT}), e.g. {PARAM_MAX}: "{name}:{example}" '
            f"(shapes without the batch dimension), or {PARAM_DEFAULT_DIM_MAX} for every variable dimension"
        )
    low = 1 if low is None else low
    opt = high if opt is None else opt
    if not low <= opt <= high:
        raise ModelConfigError(
            f"{_origin(spec)}: input '{name}' dimension {index}: need min <= opt <= max, got {low}, {opt}, {high}"
        )
    return low, opt, high


def profile_for(spec: ModelSpec, network_inputs: list[tuple[str, tuple[int, ...]]]) -> ProfileSpec:
    """The profile for building `spec`'s ONNX model whose inputs are `network_inputs` (batch dim included).

    Raises ModelConfigError naming the input and dimension when a range is missing or inconsistent.
    """
    given = [parse_shapes(spec, key) for key in (PARAM_MIN, PARAM_OPT, PARAM_MAX)]
    network_names = {name for name, _ in network_inputs}
    for key, shapes in zip((PARAM_MIN, PARAM_OPT, PARAM_MAX), given, strict=True):
        unknown = sorted(set(shapes) - network_names)
        if unknown:
            raise ModelConfigError(f"{_origin(spec)}: parameter {key} names unknown inputs {unknown}")
    ranges = []
    for name, shape in network_inputs:
        batching = spec.max_batch_size > 0
        if batching and not shape:
            raise ModelConfigError(
                f"{_origin(spec)}: input '{name}' is a scalar in the ONNX model, but max_batch_size is "
                f"{spec.max_batch_size}"
            )
        rest = _fixed_dims(spec, name, shape[1:] if batching else shape)
        mine = tuple(g.get(name) for g in given)
        for key, value in zip((PARAM_MIN, PARAM_OPT, PARAM_MAX), mine, strict=True):
            if value is not None and len(value) != len(rest):
                raise ModelConfigError(
                    f"{_origin(spec)}: parameter {key} gives input '{name}' {len(value)} dimensions; it has "
                    f"{len(rest)} (without the batch dimension)"
                )
        dims = [_dim_range(spec, name, i, rest, mine) for i in range(len(rest))]
        if batching:
            dims.insert(0, _batch_range(spec, name, shape[0]))
        ranges.append(InputRange(name, *(tuple(d[k] for d in dims) for k in range(3))))
    return ProfileSpec(tuple(ranges), profile_count(spec))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor stored in a graph: initializers and tensor attributes, subgraphs (If, Loop) included."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield attribute.t
            elif attribute.type == onnx.AttributeProto.TENSORS:
                yield from attribute.tensors
            elif attribute.type == onnx.AttributeProto.GRAPH:
                yield from _tensors(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    yield from _tensors(subgraph)


def external_data_sha256(path: Path) -> dict[str, str]:
    """{location: sha256} of the external data files the ONNX model at `path` refers to (its weights, for a model
    over 2 GiB), resolved beside it as TensorRT's parser resolves them. Raises ModelConfigError for a missing
    one or a location outside the model's folder."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # onnx raises DecodeError, OSError, ...: all mean "not a readable model"
        raise ModelConfigError(f"{path.name} is not a readable ONNX model: {hide_paths(str(error))}") from None
    locations: set[str] = set()
    for tensor in _tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            locations.update(entry.value for entry in tensor.external_data if entry.key == "location")
    digests = {}
    folder = path.parent.resolve()
    for location in sorted(locations):
        target = (folder / location).resolve()
        if folder not in target.parents:
            raise ModelConfigError(f"{path.name} refers to external data {location!r} outside its folder")
        if not target.is_file():
            raise ModelConfigError(f"{path.name} refers to external data {location!r}, which is missing")
        digests[location] = file_sha256(target)
    return digests


def cache_key(material: dict[str, object]) -> str:
    """sha256 over everything a plan depends on, given by the caller: the ONNX file and its external data, the
    TensorRT version and the CUDA major it was built for, the GPU (its name, and the compute capability TensorRT
    checks), the profiles and the workspace limit (it changes which tactics the builder may pick)."""
    text = json.dumps({"rule": PROFILE_RULE_VERSION, **material}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()
