"""What an inference request says about itself beyond its tensors, as a model sees it (engine.interface
RequestInfo): its id, its parameters, its client's deadline, Triton's correlation id and flags, and its priority.

    plain_parameters(message.parameters)    a ModelInferRequest's parameters as plain values
    (service/transport/tensors.py) request_info(request)                   the dataplane's request -> RequestInfo
    (service/request_path/dataplane.py sets it
                                            on the request's CancelToken, where backends read it)

As Triton 2.51 shows them to a python model: `parameters()` holds the client's own parameters, without the ones
the protocol itself reads (PROTOCOL_KEYS); `sequence_id` is the correlation id and `sequence_start`/`sequence_end`
are the flags (1 and 2). Checked against real Triton by tests/differential/test_bls.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from engine.interface import RequestInfo

PROTOCOL_KEYS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout"})


class Described(Protocol):
    """What request_info reads of a request (the dataplane's InferenceRequest)."""

    @property
    def id(self) -> str: ...
    @property
    def parameters(self) -> Mapping[str, object]: ...
    @property
    def client_deadline(self) -> float | None: ...


SEQUENCE_START = 1
SEQUENCE_END = 2


def plain_parameters(parameters: Mapping[str, Any]) -> dict[str, object]:
    """{key: bool | int | float | str} of a protobuf map of InferParameter (bytes_param values are left out: Triton
    has no JSON for them). Cheap for the usual empty map."""
    if not parameters:
        return {}
    plain: dict[str, object] = {}
    for key, value in parameters.items():
        choice = value.WhichOneof("parameter_choice")
        if choice is not None and choice != "bytes_param":
            plain[key] = getattr(value, choice)
    return plain


def request_info(request: Described) -> RequestInfo:
    """The RequestInfo of a dataplane InferenceRequest (its `id`, `parameters` and `client_deadline`)."""
    parameters: Mapping[str, object] = request.parameters
    if not parameters:
        return RequestInfo(request.id, {}, request.client_deadline)
    own = {key: value for key, value in parameters.items() if key not in PROTOCOL_KEYS}
    correlation = parameters.get("sequence_id", 0)
    flags = (SEQUENCE_START if parameters.get("sequence_start") else 0) | (
        SEQUENCE_END if parameters.get("sequence_end") else 0
    )
    priority = parameters.get("priority", 0)
    if type(priority) is not int or priority < 0:  # refused by the dataplane (ModelRequest.priority_of), not here
        priority = 0
    return RequestInfo(request.id, own, request.client_deadline, correlation, flags, priority)  # type: ignore[arg-type]
