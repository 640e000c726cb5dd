"""Triton's error codes (TRITONSERVER_Error_Code, as the python backend's `TritonError` numbers them): one named
table for both sides of a python model's pipe.

The model reads and sets them through `pb_utils.TritonError` (its class attributes are these members); a worker
sends them in its error results (engine/python/messages.py ErrorResult, a plain int on the wire); the server turns
a code into the error its client gets (engine/python/backend.py) and a BLS call's failure, a gRPC status, into the
code the calling model sees (`for_status`).

Imports nothing but the standard library: the model-facing module imports it.
"""

from __future__ import annotations

import enum


class TritonCode(enum.IntEnum):
    """A TritonError's code. An IntEnum: a model may compare `error.code()` with a plain number, as on Triton."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


# The code a BLS caller sees for the gRPC status a client of the server would get (Triton's own mapping: the
# statuses it has no code for are UNAVAILABLE, an unknown one INTERNAL).
_BY_STATUS: dict[str, TritonCode] = {
    "UNKNOWN": TritonCode.UNKNOWN,
    "INTERNAL": TritonCode.INTERNAL,
    "NOT_FOUND": TritonCode.NOT_FOUND,
    "INVALID_ARGUMENT": TritonCode.INVALID_ARG,
    "UNAVAILABLE": TritonCode.UNAVAILABLE,
    "RESOURCE_EXHAUSTED": TritonCode.UNAVAILABLE,
    "FAILED_PRECONDITION": TritonCode.UNAVAILABLE,
    "DEADLINE_EXCEEDED": TritonCode.UNAVAILABLE,
    "UNIMPLEMENTED": TritonCode.UNSUPPORTED,
    "ALREADY_EXISTS": TritonCode.ALREADY_EXISTS,
    "CANCELLED": TritonCode.CANCELLED,
}


def for_status(status: str) -> TritonCode:
    """The code for a gRPC status name ("NOT_FOUND" -> NOT_FOUND); INTERNAL for one Triton has no code for. Never
    raises."""
    return _BY_STATUS.get(status, TritonCode.INTERNAL)
