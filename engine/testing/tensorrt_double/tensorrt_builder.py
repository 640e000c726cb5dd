"""The fake TensorRT builder side: Builder, OnnxParser, INetworkDefinition, ITensor, IBuilderConfig,
IOptimizationProfile, ITimingCache, IHostMemory.

The parser reads the ONNX model's I/O with the `onnx` package (external data files included, resolved next to the
model as TensorRT's parser does) and takes the output shapes from ONNX shape inference; in a graph with an operator
whose output size depends on the data (NonZero, NonMaxSuppression, Unique, Compress), an output dimension that is
neither a number nor a symbol of an input dimension is one only the data decides. The builder checks the
optimization profiles against the network and writes an "onnx" plan that runs the model with ONNX Runtime.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from .tensorrt_runtime import DataType, _Bound, log_error

TIMING_MAGIC = b"SLOTSERVE-TRT-DOUBLE-TIMING\n"

# ONNX TensorProto element types the fake parser accepts.
_DATA_DEPENDENT_OPS = frozenset({"NonZero", "NonMaxSuppression", "Unique", "Compress"})

_ONNX_TYPES = {
    1: DataType.FLOAT,
    10: DataType.HALF,
    16: DataType.BF16,
    3: DataType.INT8,
    6: DataType.INT32,
    7: DataType.INT64,
    9: DataType.BOOL,
    2: DataType.UINT8,
}


class IHostMemory(bytes):
    """Stands for tensorrt.IHostMemory: a buffer (here, bytes)."""

    @property
    def nbytes(self) -> int:
        return len(self)


class ITensor:
    """A network input or output as the parser made it."""

    def __init__(
        self, name: str, dtype: DataType, shape: tuple[int, ...], data_dependent: tuple[int, ...] = ()
    ) -> None:
        self._name, self._dtype, self._shape = name, dtype, shape
        self._data_dependent = data_dependent

    @property
    def name(self) -> str:
        return self._name

    @property
    def dtype(self) -> DataType:
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape


class INetworkDefinition:
    def __init__(self) -> None:
        self._inputs: list[ITensor] = []
        self._outputs: list[ITensor] = []
        self._onnx: bytes | None = None

    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def get_input(self, index: int) -> ITensor:
        return self._inputs[index]

    def get_output(self, index: int) -> ITensor:
        return self._outputs[index]


class _ParserError:
    def __init__(self, message: str) -> None:
        self._message = message

    def desc(self) -> str:
        return self._message

    def __str__(self) -> str:
        return self._message


def _dims(value: Any) -> list[tuple[int | None, str | None]]:
    """(fixed size or None, symbol or None) for each dimension of an ONNX ValueInfo."""
    dims = []
    for dim in value.type.tensor_type.shape.dim:
        fixed = dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else None
        dims.append((fixed, dim.dim_param if dim.HasField("dim_param") else None))
    return dims


class OnnxParser:
    """Stands for tensorrt.OnnxParser."""

    def __init__(self, network: INetworkDefinition, logger: Any) -> None:
        self._network = network
        self._logger = logger
        self._errors: list[_ParserError] = []

    @property
    def num_errors(self) -> int:
        return len(self._errors)

    def get_error(self, index: int) -> _ParserError:
        return self._errors[index]

    def parse_from_file(self, model: str) -> bool:
        import onnx

        try:
            proto = onnx.load(model)  # external data is read from beside the model, as TensorRT's parser does
            bare = onnx.ModelProto()
            bare.CopyFrom(proto)
            for output in bare.graph.output:  # the shapes the graph computes, not the ones it declares
                output.type.tensor_type.ClearField("shape")
            inferred = onnx.shape_inference.infer_shapes(bare)
        except Exception as error:  # any unreadable file is a parse failure, as in TensorRT
            self._errors.append(_ParserError(f"cannot read {model}: {error}"))
            return False
        initializers = {i.name for i in proto.graph.initializer}
        graph = inferred.graph
        symbols = {symbol for value in graph.input for _, symbol in _dims(value) if symbol}
        # Shape inference also loses track of dimensions it cannot relate (broadcasting two symbols): only graphs
        # with an operator whose output size depends on the data get data-dependent dimensions.
        data_dependent_ops = any(node.op_type in _DATA_DEPENDENT_OPS for node in graph.node)
        for values, target, is_input in (
            (graph.input, self._network._inputs, True),
            (graph.output, self._network._outputs, False),
        ):
            for value in values:
                if value.name in initializers:
                    continue
                dtype = _ONNX_TYPES.get(value.type.tensor_type.elem_type)
                if dtype is None:
                    self._errors.append(
                        _ParserError(f"{value.name}: unsupported ONNX type {value.type.tensor_type.elem_type}")
                    )
                    continue
                dims = _dims(value)
                shape = tuple(fixed if fixed is not None else -1 for fixed, _ in dims)
                data_dependent = (
                    ()
                    if is_input or not data_dependent_ops
                    else tuple(i for i, (fixed, symbol) in enumerate(dims) if fixed is None and symbol not in symbols)
                )
                target.append(ITensor(value.name, dtype, shape, data_dependent))
        self._network._onnx = proto.SerializeToString()
        return not self._errors


_Range = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


class IOptimizationProfile:
    def __init__(self) -> None:
        self._shapes: dict[str, _Range] = {}

    def set_shape(self, input: str, min: Sequence[int], opt: Sequence[int], max: Sequence[int]) -> None:  # noqa: A002
        self._shapes[input] = (tuple(min), tuple(opt), tuple(max))

    def get_shape(self, input: str) -> list[tuple[int, ...]]:  # noqa: A002
        return list(self._shapes.get(input, ()))


class ITimingCache:
    """Remembers which networks were timed; `_foreign` when it came from another GPU or TensorRT version."""

    def __init__(self, device: Any, entries: set[str], foreign: bool = False) -> None:
        self._device = device
        self._entries = entries
        self._foreign = foreign

    def serialize(self) -> IHostMemory:
        body = {"device": self._device.name, "trt_version": self._device.trt_version, "entries": sorted(self._entries)}
        return IHostMemory(TIMING_MAGIC + json.dumps(body).encode())


class IBuilderConfig:
    def __init__(self, device: Any) -> None:
        self._device = device
        self._profiles: list[IOptimizationProfile] = []
        self._pools: dict[Any, int] = {}
        self._cache: ITimingCache | None = None

    @property
    def num_optimization_profiles(self) -> int:
        return len(self._profiles)

    def set_memory_pool_limit(self, pool: Any, pool_size: int) -> None:
        self._pools[pool] = int(pool_size)

    def get_memory_pool_limit(self, pool: Any) -> int:
        return self._pools.get(pool, 0)

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        self._profiles.append(profile)
        return len(self._profiles) - 1

    def create_timing_cache(self, serialized_timing_cache: Any) -> ITimingCache:
        data = bytes(serialized_timing_cache)
        if not data.startswith(TIMING_MAGIC):
            return ITimingCache(self._device, set())
        body = json.loads(data[len(TIMING_MAGIC) :])
        foreign = body["device"] != self._device.name or body["trt_version"] != self._device.trt_version
        return ITimingCache(self._device, set(body["entries"]), foreign)

    def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
        if cache._foreign and not ignore_mismatch:
            return False
        self._cache = cache
        return True

    def get_timing_cache(self) -> ITimingCache:
        if self._cache is None:
            self._cache = ITimingCache(self._device, set())
        return self._cache


class Builder(_Bound):
    """Stands for tensorrt.Builder: checks the profiles against the network and writes an "onnx" plan."""

    def __init__(self, logger: Any) -> None:
        device = self._fake
        if not device.usable:
            raise device.violate("tensorrt.Builder created without a usable CUDA device")
        self.logger = logger

    def create_network(self, flags: int = 0) -> INetworkDefinition:
        return INetworkDefinition()

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig(self._fake)

    def create_optimization_profile(self) -> IOptimizationProfile:
        return IOptimizationProfile()

    @staticmethod
    def _profile_error(network: INetworkDefinition, profile: IOptimizationProfile) -> str | None:
        for tensor in network._inputs:
            shapes = profile._shapes.get(tensor.name)
            if shapes is None:
                if any(d < 0 for d in tensor.shape):
                    return f"no profile shape for dynamic input {tensor.name}"
                continue
            for shape in shapes:
                if len(shape) != len(tensor.shape) or any(
                    fixed >= 0 and d != fixed for d, fixed in zip(shape, tensor.shape, strict=True)
                ):
                    return f"profile shape {list(shape)} does not fit {tensor.name} {list(tensor.shape)}"
            low, opt, high = shapes
            if any(not a <= b <= c for a, b, c in zip(low, opt, high, strict=True)):
                return f"profile of {tensor.name} is not min <= opt <= max"
        return None

    def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig) -> IHostMemory | None:
        device = self._fake
        device.require_device("build_serialized_network")
        if network._onnx is None:
            log_error(self.logger, device, "build_serialized_network: empty network")
            return None
        needs_profile = any(d < 0 for t in network._inputs for d in t.shape)
        if needs_profile and not config._profiles:
            log_error(self.logger, device, "build_serialized_network: dynamic inputs need an optimization profile")
            return None
        for profile in config._profiles:
            error = self._profile_error(network, profile)
            if error is not None:
                log_error(self.logger, device, f"build_serialized_network: {error}")
                return None
        digest = hashlib.sha256(network._onnx).hexdigest()
        cache = config.get_timing_cache()
        with device._lock:
            device.stats.builds += 1
            if digest in cache._entries:
                device.stats.timing_cache_hits += 1
        cache._entries.add(digest)
        profiles = [
            {t.name: p._shapes.get(t.name, (t.shape, t.shape, t.shape)) for t in network._inputs}
            for p in (config._profiles or [IOptimizationProfile()])
        ]
        plan = device.make_plan(
            inputs=[(t.name, t.dtype.name, t.shape) for t in network._inputs],
            outputs=[(t.name, t.dtype.name, t.shape) for t in network._outputs],
            function="onnx",
            onnx=network._onnx,
            profiles=profiles,
            weights_bytes=len(network._onnx),
            data_dependent={t.name: t._data_dependent for t in network._outputs if t._data_dependent},
        )
        return IHostMemory(plan)
