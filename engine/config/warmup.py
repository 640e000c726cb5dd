"""config.pbtxt's `model_warmup`: read and checked into WarmupSamples when the model is read (`read_warmup_samples`),
then each sample as the input arrays one engine call takes, as Triton builds them (`sample_inputs`).

* `zero`: every element zero (BYTES: empty elements);
* `random`: random values of the datatype (floats in [0, 1), integers over the type's range, random booleans;
  BYTES: elements of 0..16 random bytes);
* `file`: the file's bytes from the model's `warmup/` folder, row-major (BYTES: each element a 4-byte
  little-endian length and its bytes, as on the wire); its size was checked when the model was read.

On a batching model (max_batch_size > 0) every array gets a leading batch dimension of the sample's `batch_size`:
Triton sends `batch_size` requests of one row each, which the engine receives stacked, so every row holds the
same data (a file's, or one random draw). Pure numpy; no lock, no I/O beyond reading a sample's file.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from generated import model_config_pb2

from .. import datatypes
from ..errors import ModelConfigError
from ..tensor_codec import TensorDecodeError, decode_raw
from .files import ModelRoots, read_regular_file
from .specs import TensorSpec, WarmupInput, WarmupSample

RANDOM_BYTES_LENGTH = 16  # the longest random BYTES element
WARMUP_FOLDER = "warmup"  # a model's warmup input files, as in Triton


def read_warmup_samples(
    config: model_config_pb2.ModelConfig,
    inputs: tuple[TensorSpec, ...],
    directory: Path | None,
    roots: ModelRoots,
    origin: str,
) -> tuple[WarmupSample, ...]:
    """config.pbtxt's `model_warmup`, checked: batch size within the model's, every input named, typed and shaped
    as the declared inputs (when the configuration declares them; otherwise the load checks), every required
    declared input given, each data file inside the model's warmup/ folder with the size its shape needs.
    Raises ModelConfigError naming the sample and the input."""
    samples = []
    for index, block in enumerate(config.model_warmup):
        where = f"{origin}: model_warmup[{index}]"
        if not block.name:
            raise ModelConfigError(f"{where} has no name")
        where = f"{where} '{block.name}'"
        batch = int(block.batch_size)
        limit = config.max_batch_size if config.max_batch_size > 0 else 1
        if not 1 <= batch <= limit:
            raise ModelConfigError(f"{where}: batch_size must be 1..{limit} (max_batch_size {config.max_batch_size})")
        if not block.inputs:
            raise ModelConfigError(f"{where} has no inputs")
        given = tuple(
            _warmup_input(key, block.inputs[key], inputs, directory, roots, f"{where}: input '{key}'")
            for key in sorted(block.inputs)
        )
        missing = [t.name for t in inputs if not t.optional and t.name not in block.inputs]
        if missing:
            raise ModelConfigError(f"{where}: no data for the model's inputs {missing}")
        samples.append(WarmupSample(block.name, batch, max(1, int(block.count)), given))
    return tuple(samples)


def _warmup_input(
    name: str,
    block: model_config_pb2.ModelWarmup.Input,
    declared: tuple[TensorSpec, ...],
    directory: Path | None,
    roots: ModelRoots,
    where: str,
) -> WarmupInput:
    config_name = model_config_pb2.DataType.Name(block.data_type)
    datatype = datatypes.BY_CONFIG_NAME.get(config_name)
    if datatype is None:
        raise ModelConfigError(f"{where} has no valid data_type ({config_name})")
    shape = tuple(int(d) for d in block.dims)
    if any(d < 0 for d in shape):
        raise ModelConfigError(f"{where}: dims {list(shape)} must all be given (>= 0)")
    if declared:
        spec = next((t for t in declared if t.name == name), None)
        if spec is None:
            raise ModelConfigError(f"{where}: the model has no such input; it takes {[t.name for t in declared]}")
        if spec.datatype != datatype.name:
            raise ModelConfigError(f"{where} has data_type {config_name}; the input is {spec.datatype}")
        if len(spec.shape) != len(shape) or any(
            want not in (-1, got) for got, want in zip(shape, spec.shape, strict=True)
        ):
            raise ModelConfigError(f"{where} has dims {list(shape)}; the input's dims are {list(spec.shape)}")
    choice = block.WhichOneof("input_data_type")
    if choice is None:
        raise ModelConfigError(f"{where}: set one of zero_data, random_data, input_data_file")
    if choice != "input_data_file":
        return WarmupInput(name, datatype.name, shape, "zero" if choice == "zero_data" else "random")
    if directory is None:
        raise ModelConfigError(f"{where}: input_data_file needs a model directory")
    folder = (directory / WARMUP_FOLDER).resolve()
    path = roots.resolve(block.input_data_file, "input_data_file", origin=where, base=folder)
    if folder not in path.parents:
        raise ModelConfigError(f"{where}: input_data_file '{block.input_data_file}' must be inside {WARMUP_FOLDER}/")
    data = read_regular_file(path, where, roots)  # not found, a folder, a FIFO: named
    _check_warmup_file(data, datatype, shape, f"{where}: input_data_file {roots.shown(path)}")
    return WarmupInput(name, datatype.name, shape, "file", path)


def _check_warmup_file(data: bytes, datatype: datatypes.DataType, shape: tuple[int, ...], where: str) -> None:
    """Raise ModelConfigError unless `data` holds exactly one tensor of `shape`: elements x itemsize bytes, or for
    BYTES that many 4-byte little-endian lengths each followed by its bytes."""
    elements = math.prod(shape)
    if datatype.itemsize:
        if len(data) != elements * datatype.itemsize:
            raise ModelConfigError(
                f"{where} has {len(data)} bytes; {list(shape)} {datatype.name} takes {elements * datatype.itemsize}"
            )
        return
    offset = 0
    for _ in range(elements):
        if offset + 4 > len(data):
            raise ModelConfigError(f"{where} ends before its {elements} BYTES elements do")
        offset += 4 + int.from_bytes(data[offset : offset + 4], "little")
    if offset != len(data):
        raise ModelConfigError(f"{where} does not hold exactly {elements} BYTES elements ({len(data)} bytes)")


def sample_inputs(sample: WarmupSample, max_batch_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """{input name: array} for one run of `sample` on a model with `max_batch_size`. Reads a `file` input's file.

    Raises ModelConfigError naming the sample and the input when a file changed since the model was read (gone,
    or no longer holding one tensor of the input's shape)."""
    arrays = {}
    for given in sample.inputs:
        row = _row(given, rng, sample.name)
        if max_batch_size > 0:
            row = np.broadcast_to(row, (sample.batch_size, *row.shape)).copy()
        arrays[given.name] = row
    return arrays


def _row(given: WarmupInput, rng: np.random.Generator, sample: str) -> np.ndarray:
    """One row (the input's own shape, no batch dimension)."""
    shape = given.shape
    if given.data == "file":
        return _from_file(given, sample)
    if given.datatype == "BYTES":
        return _bytes_elements(shape, rng if given.data == "random" else None)
    dtype = datatypes.numpy_dtype(given.datatype)
    if given.data == "zero":
        return np.zeros(shape, dtype=dtype)
    return _random_values(shape, dtype, rng)


def _random_values(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    if dtype.kind in ("i", "u"):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    # FP16, FP32, FP64, BF16: uniform in [0, 1), finite in every one of them.
    return rng.random(size=shape, dtype=np.float64).astype(dtype)


def _bytes_elements(shape: tuple[int, ...], rng: np.random.Generator | None) -> np.ndarray:
    """An object array of bytes: empty elements, or random ones of 0..RANDOM_BYTES_LENGTH bytes."""
    count = int(np.prod(shape, dtype=np.int64))
    elements = np.empty(count, dtype=object)
    for index in range(count):
        if rng is None:
            elements[index] = b""
        else:
            length = int(rng.integers(0, RANDOM_BYTES_LENGTH, endpoint=True))
            elements[index] = rng.bytes(length)
    return elements.reshape(shape)


def _from_file(given: WarmupInput, sample: str) -> np.ndarray:
    where = f"warmup sample '{sample}': input '{given.name}'"
    try:
        data = given.file.read_bytes()  # type: ignore[union-attr]
    except OSError as error:
        raise ModelConfigError(f"{where}: cannot read its input_data_file ({error.strerror or error})") from None
    try:
        # A copy: decode_raw's view would be read-only, and an engine may expect writable inputs.
        return np.array(decode_raw(data, given.datatype, given.shape, given.name))
    except TensorDecodeError as error:
        raise ModelConfigError(f"{where}: its input_data_file changed since the model was read: {error}") from None
