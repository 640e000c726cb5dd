"""A warmup sample (config.pbtxt `model_warmup`, read into engine.interface.WarmupSample) as the input arrays one
engine call takes, as Triton builds them.

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

import numpy as np

from . import datatypes
from .errors import ModelConfigError
from .interface import WarmupInput, WarmupSample
from .tensor_codec import TensorDecodeError, decode_raw

RANDOM_BYTES_LENGTH = 16  # the longest random BYTES element


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
