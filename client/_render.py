"""Text and JSON rendering for the command line: tables, key/value blocks, arrays, statuses, statistics.

Pure functions from values to strings or JSON-ready data; nothing here prints or talks to a server.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import Message

from engine import datatypes
from generated import grpc_service_pb2 as pb

from .management import Batching, ModelStatus

_MISSING = "-"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces; None cells show as '-'."""
    cells = [[str(h) for h in headers]] + [[_MISSING if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def key_values(pairs: Sequence[tuple[str, Any]]) -> str:
    """One 'key  value' line per pair, keys padded to one width; None values are left out."""
    shown = [(key, value) for key, value in pairs if value is not None]
    width = max((len(key) for key, _ in shown), default=0)
    return "\n".join(f"{key.ljust(width)}  {_scalar(value)}" for key, value in shown)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def to_json(data: Any, indent: str = "") -> str:
    """Indented JSON, except that a list holding no objects stays on one line (tensor data and shapes read
    better that way); numpy scalars become plain numbers."""
    inner = indent + "  "
    if isinstance(data, dict) and data:
        items = [f"{inner}{json.dumps(str(key))}: {to_json(value, inner)}" for key, value in data.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(data, list) and any(isinstance(item, dict) for item in data):
        return "[\n" + ",\n".join(f"{inner}{to_json(item, inner)}" for item in data) + f"\n{indent}]"
    return json.dumps(data, default=_json_default)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Message):
        return message_data(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def message_data(message: Message) -> dict[str, Any]:
    """A protobuf message as JSON-ready data with the .proto field names (64-bit integers are strings)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


# ---- statuses --------------------------------------------------------------------------------------------------


def status_data(status: ModelStatus) -> dict[str, Any]:
    return asdict(status)


def status_block(status: ModelStatus) -> str:
    """A ModelStatus as a key/value block for people."""
    state = f"{status.state} ({'loaded' if status.loaded else 'not loaded'})"
    slots = (
        f"{status.slots} (active {status.active_slots}, queued {status.queued_requests}, max parallel "
        f"{_MISSING if status.max_parallel_slots is None else status.max_parallel_slots})"
    )
    admission = "no limit" if status.admission_timeout_seconds == 0 else f"{status.admission_timeout_seconds:g} s"
    return key_values(
        [
            ("model", status.model_id),
            ("state", state),
            ("slots", slots),
            ("backend", status.backend or None),
            ("version", status.version or None),
            ("source", status.source or None),
            ("admission timeout", admission),
            ("memory", None if status.memory_bytes is None else byte_size(status.memory_bytes)),
            ("dynamic batching", batching_words(status.batching)),
            ("last error", status.last_error or None),
        ]
    )


def batching_words(batching: Batching | None) -> str | None:
    """A model's dynamic batching settings in a few words (None without batching)."""
    if batching is None:
        return None
    words = [f"up to {batching.max_batch_size} rows", f"delay {batching.max_queue_delay_microseconds} us"]
    if batching.preferred_batch_sizes:
        words.append("preferred " + "/".join(str(size) for size in batching.preferred_batch_sizes))
    if batching.max_queue_size:
        words.append(f"queue {batching.max_queue_size}")
    return ", ".join(words)


def byte_size(count: int) -> str:
    """1536 -> '1.5 KiB'."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{count} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


# ---- tensors ---------------------------------------------------------------------------------------------------


def tensor_heading(name: str, array: np.ndarray) -> str:
    return f"{name}  {datatypes.from_numpy(array.dtype)}  {list(array.shape)}"


def tensor_text(array: np.ndarray) -> str:
    """The array as numpy prints it; BYTES elements as str where they are UTF-8."""
    return np.array2string(_printable(array), separator=", ", threshold=200)


def tensor_data(array: np.ndarray) -> dict[str, Any]:
    """{"datatype", "shape", "data"} for JSON; BYTES data are strings, or base64 with "encoding" when an
    element is not UTF-8."""
    datatype = datatypes.from_numpy(array.dtype)
    result: dict[str, Any] = {"datatype": datatype, "shape": list(array.shape)}
    if datatype != "BYTES":
        result["data"] = _numeric(array).tolist()
        return result
    elements = [bytes(e) if isinstance(e, (bytes, bytearray)) else str(e).encode() for e in array.reshape(-1)]
    try:
        flat = [element.decode("utf-8") for element in elements]
    except UnicodeDecodeError:
        flat = [base64.b64encode(element).decode("ascii") for element in elements]
        result["encoding"] = "base64"
    result["data"] = np.array(flat, dtype=object).reshape(array.shape).tolist()
    return result


def _numeric(array: np.ndarray) -> np.ndarray:
    # BF16 (ml_dtypes) prints and serializes poorly; FP32 holds every BF16 value exactly.
    return array.astype(np.float32) if array.dtype == datatypes.bfloat16() else array


def _printable(array: np.ndarray) -> np.ndarray:
    if array.dtype != object:
        return _numeric(array)
    printable = np.empty(array.shape, dtype=object)
    for index, element in np.ndenumerate(array):
        printable[index] = _text_or_bytes(element)
    return printable


def _text_or_bytes(element: Any) -> Any:
    if isinstance(element, (bytes, bytearray)):
        try:
            return bytes(element).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(element)
    return element


def saveable(array: np.ndarray) -> np.ndarray:
    """An array np.load reads without pickle: BYTES as fixed-width 'S' unless that would lose trailing NULs
    (numpy strips them), in which case the object array itself (np.load then needs allow_pickle=True)."""
    if array.dtype != object:
        return array
    elements = [bytes(e) if isinstance(e, (bytes, bytearray)) else str(e).encode() for e in array.reshape(-1)]
    if any(element.endswith(b"\x00") for element in elements):
        return array
    return np.array(elements, dtype=bytes).reshape(array.shape)


# ---- statistics ------------------------------------------------------------------------------------------------

STATS_HEADERS = ("MODEL", "VERSION", "INFERENCES", "EXECUTIONS", "SUCCESS", "FAIL", "QUEUE AVG", "INFER AVG")


def stats_row(stats: pb.ModelStatistics) -> list[Any]:
    """One table row of an inference.ModelStatistics message."""
    inference = stats.inference_stats
    return [
        stats.name,
        stats.version or _MISSING,
        stats.inference_count,
        stats.execution_count,
        inference.success.count,
        inference.fail.count,
        _average_ms(inference.queue),
        _average_ms(inference.compute_infer),
    ]


def _average_ms(duration: pb.StatisticDuration) -> str:
    if duration.count == 0:
        return _MISSING
    return f"{duration.ns / duration.count / 1e6:.3f} ms"
