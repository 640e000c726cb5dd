"""Turning command-line words into request values: NAME=VALUE pairs, --input tensors, --parameter values.

Anything that cannot be carried out as written raises UsageError (the CLI's exit status 2). Server calls are
not made here, except through the `model_datatypes` callable that `load_inputs` is given.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from engine import datatypes


class UsageError(Exception):
    """The command line cannot be carried out as written (exit status 2)."""


def split_assignment(text: str, what: str) -> tuple[str, str]:
    """'NAME=VALUE' -> (NAME, VALUE); the value may contain '='. Raises UsageError."""
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise UsageError(f"{what} '{text}' is not NAME=VALUE")
    return name, value


def parse_datatypes(items: Iterable[str]) -> dict[str, str]:
    """--datatype NAME=TYPE values by input name, TYPE upper-cased and checked. Raises UsageError."""
    result = {}
    for item in items:
        name, datatype = split_assignment(item, "--datatype")
        datatype = datatype.upper()
        if datatype not in datatypes.BY_NAME:
            raise UsageError(f"--datatype {item}: unknown datatype; use one of {', '.join(datatypes.NAMES)}")
        result[name] = datatype
    return result


def parse_options(items: Iterable[str]) -> dict[str, str]:
    """--option k=v values as strings. Raises UsageError."""
    return dict(split_assignment(item, "--option") for item in items)


def parse_parameters(items: Iterable[str]) -> dict[str, Any]:
    """--parameter k=v: v as JSON when it is a bool or number (so timeout=5000 is an int), else the text."""
    result: dict[str, Any] = {}
    for item in items:
        key, text = split_assignment(item, "--parameter")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        result[key] = value if isinstance(value, (bool, int, float, str)) else text
    return result


def load_inputs(
    specs: Iterable[str], explicit: Mapping[str, str], model_datatypes: Callable[[], Mapping[str, str]]
) -> dict[str, np.ndarray]:
    """Arrays for --input NAME=PATH.npy / NAME=JSON values.

    A .npy array keeps its dtype unless --datatype names one. A JSON value takes its --datatype, else the
    model's (`model_datatypes`, called at most once and only when needed), else numpy's reading of it.
    Raises UsageError; OSError for an unreadable file.
    """
    arrays: dict[str, np.ndarray] = {}
    known: Mapping[str, str] | None = None
    for spec in specs:
        name, value = split_assignment(spec, "--input")
        if name in arrays:
            raise UsageError(f"--input {name} is given twice")
        if value.endswith(".npy"):
            arrays[name] = _npy_input(name, value, explicit.get(name))
            continue
        datatype = explicit.get(name)
        if datatype is None:
            known = model_datatypes() if known is None else known
            datatype = known.get(name)
        arrays[name] = _json_input(name, value, datatype)
    return arrays


def _npy_input(name: str, path: str, datatype: str | None) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as error:
        raise UsageError(
            f"--input {name}: {path} is not a plain .npy array ({error}); save BYTES as a "
            "fixed-width bytes or str array (dtype 'S' or 'U')"
        ) from None
    if not isinstance(array, np.ndarray):
        raise UsageError(f"--input {name}: {path} holds several arrays; give one .npy file per input")
    return array if datatype is None else _cast(name, array, datatype)


def _cast(name: str, array: np.ndarray, datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return array if array.dtype.kind in ("S", "U", "O") else array.astype(str)
    try:
        return array.astype(datatypes.numpy_dtype(datatype))
    except (TypeError, ValueError) as error:
        raise UsageError(f"--input {name}: cannot convert {array.dtype} to {datatype}: {error}") from None


def _json_input(name: str, text: str, datatype: str | None) -> np.ndarray:
    try:
        value = json.loads(text)
    except ValueError:
        raise UsageError(f"--input {name}: '{text}' is neither JSON nor a .npy path") from None
    try:
        plain = np.array(value)
    except ValueError as error:
        raise UsageError(f"--input {name}: {error}") from None
    if datatype is None:
        return plain
    _check_json_kind(name, plain, datatype)
    if datatype == "BYTES":
        return np.array(value, dtype=object)
    try:
        return np.array(value, dtype=datatypes.numpy_dtype(datatype))
    except (OverflowError, TypeError, ValueError) as error:
        raise UsageError(f"--input {name}: not {datatype} values: {error}") from None


def _check_json_kind(name: str, plain: np.ndarray, datatype: str) -> None:
    """Refuse values that numpy would convert silently but wrongly (1.5 -> 1, "3" -> 3.0)."""
    kind = datatypes.numpy_dtype(datatype).kind
    if datatype != "BYTES" and plain.dtype.kind in ("U", "O"):
        raise UsageError(f"--input {name}: {datatype} needs numbers, got text")
    if kind in ("i", "u") and plain.dtype.kind == "f" and not np.all(np.isfinite(plain) & (plain == np.round(plain))):
        raise UsageError(f"--input {name}: {datatype} needs integers, got fractions")
