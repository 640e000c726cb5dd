"""DLPack for `pb_utils.Tensor.to_dlpack` / `from_dlpack` / `__dlpack__`, CPU tensors only (Triton's python
backend API; BF16 tensors, which numpy cannot hold natively, go through it).

numpy makes and reads the capsules (`ndarray.__dlpack__`, `np.from_dlpack`), so memory and deleters are its own;
this module adds what numpy lacks: BF16, which numpy's DLPack refuses (its arrays are ml_dtypes' bfloat16 here). A
BF16 array is exported as its 16-bit integers and the capsule's dtype is then marked bfloat16 (DLPack code
kDLBfloat); a bfloat16 capsule is read back the other way. Capsules are unversioned ("dltensor"), as Triton 2.51
makes and takes them.

Raises TypeError for an object that is neither a capsule nor has `__dlpack__`/`__dlpack_device__`, ValueError for
a tensor that is not on the CPU, not C-contiguous, or of a type numpy has no dtype for. Imports only numpy (and
ml_dtypes for BF16, which the worker has).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

CPU, CUDA_HOST = 1, 3  # DLDeviceType values numpy can read
_BFLOAT = 4  # DLDataTypeCode kDLBfloat
_UINT = 1  # DLDataTypeCode kDLUInt


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _ManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_NAME = b"dltensor"
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _bfloat16() -> np.dtype[Any]:
    import ml_dtypes

    bfloat16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
    return bfloat16


def is_capsule(value: object) -> bool:
    """Whether `value` is a PyCapsule (a DLPack tensor, used or not)."""
    return type(value).__name__ == "PyCapsule"


def _managed(capsule: object) -> _ManagedTensor:
    """The capsule's DLManagedTensor (it stays the capsule's). Raises ValueError for a used or foreign capsule."""
    if not _is_valid(capsule, _NAME):
        raise ValueError("the capsule is not an unused DLPack tensor (its name is not 'dltensor')")
    return _ManagedTensor.from_address(_get_pointer(capsule, _NAME))


def export(array: np.ndarray) -> object:
    """A DLPack capsule of `array`'s data (C-contiguous; a read-only or strided array is copied first, as DLPack
    has no read-only flag before its versioned form)."""
    if not array.flags.c_contiguous or not array.flags.writeable:
        array = np.array(array, order="C")
    if array.dtype == _bfloat16():
        capsule = array.view(np.uint16).__dlpack__()
        _managed(capsule).dl_tensor.dtype.code = _BFLOAT
        return capsule
    return array.__dlpack__()


class _Capsule:
    """What np.from_dlpack reads: a capsule behind the protocol's two methods."""

    def __init__(self, capsule: object, device: tuple[int, int]) -> None:
        self._capsule, self._device = capsule, device

    def __dlpack__(self, *args: object, **kwargs: object) -> Any:  # a capsule
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device


def import_(value: Any) -> np.ndarray:
    """A numpy array over the memory of a DLPack capsule, or of an object with `__dlpack__` (no copy; the array
    keeps the producer's memory alive). Raises TypeError or ValueError (see the module's docstring)."""
    if not is_capsule(value):
        if not (hasattr(value, "__dlpack__") and hasattr(value, "__dlpack_device__")):
            raise TypeError(
                "Provided tensor is not supported. Tensor must be a DLPack capsule or have `__dlpack__` and "
                "`__dlpack_device__` attributes"
            )
        device = tuple(value.__dlpack_device__())
        if device[0] not in (CPU, CUDA_HOST):
            raise ValueError(f"DLDevice type {device[0]} is not supported: slotserve's python models are on the CPU")
        value = value.__dlpack__(stream=None)
    managed = _managed(value)
    tensor = managed.dl_tensor
    if tensor.device.device_type not in (CPU, CUDA_HOST):
        raise ValueError(
            f"DLDevice type {tensor.device.device_type} is not supported: slotserve's python models are on the CPU"
        )
    _check_c_order(tensor)
    bf16 = tensor.dtype.code == _BFLOAT and tensor.dtype.bits == 16
    if bf16:
        tensor.dtype.code = _UINT  # numpy reads 16-bit integers; viewed as bfloat16 below
    try:
        array = np.from_dlpack(_Capsule(value, (CPU, 0)))
    except (BufferError, TypeError) as error:
        raise ValueError(f"the DLPack tensor cannot be read: {error}") from None
    return array.view(_bfloat16()) if bf16 else array


def _check_c_order(tensor: _Tensor) -> None:
    """Triton's rule: only C-contiguous tensors (dimensions of 1 may have any stride; an empty tensor has no data
    to lay out)."""
    if not tensor.strides or any(tensor.shape[axis] == 0 for axis in range(tensor.ndim)):
        return
    expected = 1
    for axis in range(tensor.ndim - 1, -1, -1):
        if tensor.shape[axis] != 1:
            if tensor.strides[axis] != expected:
                raise ValueError(
                    "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in C-Order are "
                    "supported."
                )
            expected *= tensor.shape[axis]
