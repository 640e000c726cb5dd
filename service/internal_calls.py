"""Calls from inside the server to a model, through that model's full admission (FIFO, slots, batching,
residency, statistics), with numpy arrays in and out: no wire encoding or decoding on either side.

    outputs = call_model(dataplane, "preprocess", {"RAW": array}, deadline=..., cancel=token)

An ensemble's steps (service/ensemble.py) go through here, and python models' BLS calls (service/model_calls.py;
`call_model_stream` for a decoupled callee). The request is
the dataplane's neutral `InferenceRequest`: its tensors are `ArrayTensors` (the arrays themselves, never copied:
a step's output goes to the next step as the same array), counted in the tensor-memory account like a client's
(`decoded_bytes` is what the arrays hold), and its `respond` returns the run's outputs. The caller's deadline is
the request's client deadline (the model's own admission timeout may make it earlier), its CancelToken the
request's. Errors are the dataplane's (the core's errors, as for a client call).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from engine import datatypes
from engine.interface import CancelToken, FinalOutputs, Outputs

from .core.errors import InvalidRequest
from .dataplane import Dataplane, DecodedRequest, InferenceRequest, InferenceResponse, output_bytes


@dataclass
class ArrayTensors:
    """A request's tensors that are already numpy arrays (dataplane.RequestTensors). `datatypes` names the KServe
    datatype of an input whose numpy dtype does not say it (BYTES as object arrays are found by kind)."""

    inputs: Mapping[str, np.ndarray]
    outputs: Sequence[str] = ()
    datatypes: Mapping[str, str] = field(default_factory=dict)

    def decoded_bytes(self) -> int:
        return output_bytes(dict(self.inputs))

    def decode(self) -> DecodedRequest:
        """The arrays as they are (no copy), with their signature. Raises InvalidRequest for a value that is not a
        numpy array or whose dtype has no KServe datatype."""
        signature = {}
        for name, array in self.inputs.items():
            if not isinstance(array, np.ndarray):
                raise InvalidRequest(f"input '{name}' is a {type(array).__name__}, not a numpy array")
            signature[name] = (self._datatype(name, array), tuple(int(d) for d in array.shape))
        return DecodedRequest(dict(self.inputs), signature, list(self.outputs), timeout_us=0)

    def _datatype(self, name: str, array: np.ndarray) -> str:
        given = self.datatypes.get(name)
        if given is not None:
            return given
        try:
            return datatypes.from_numpy(array.dtype)
        except KeyError:
            raise InvalidRequest(
                f"input '{name}' has numpy dtype {array.dtype}, which no KServe datatype fits"
            ) from None

    def answer_key(self, decoded: DecodedRequest, version: str) -> bytes:
        """Every input's name, datatype, shape and bytes, the requested outputs and the version, hashed."""
        digest = hashlib.sha256()
        for value in (version, *sorted(decoded.outputs)):
            digest.update(f"{len(value)}:{value}".encode())
        for name in sorted(decoded.inputs):
            array = decoded.inputs[name]
            datatype, shape = decoded.signature[name]
            digest.update(f"{len(name)}:{name}:{datatype}:{list(shape)}".encode())
            if array.dtype == object:
                for element in array.reshape(-1):
                    data = element if isinstance(element, bytes) else str(element).encode()
                    digest.update(len(data).to_bytes(8, "little"))
                    digest.update(data)
            else:
                digest.update(np.ascontiguousarray(array).tobytes())
        return digest.digest()


def _outputs_of(response: InferenceResponse) -> Outputs:
    return response.outputs


def call_model(
    dataplane: Dataplane,
    model: str,
    inputs: Mapping[str, np.ndarray],
    *,
    version: str = "",
    outputs: Sequence[str] = (),
    datatypes_of: Mapping[str, str] | None = None,
    deadline: float | None = None,
    cancel: CancelToken | None = None,
    request_id: str = "",
    parameters: Mapping[str, object] | None = None,
) -> Outputs:
    """Run `model` on `inputs` through its admission and return its outputs ({name: array}; all of them when
    `outputs` is empty). Blocks while queued (until `deadline`, on the monotonic clock, or the model's own
    admission timeout), while the model loads, and for the run. Raises what `Dataplane.infer` raises:
    ModelNotFound, ServerBusy, InvalidRequest, the engine's errors; CANCELLED-type errors once `cancel` fires.
    `parameters` are the request's (as a client's: `sequence_id` and the like included)."""
    request = _request(model, inputs, version, outputs, datatypes_of, deadline, request_id, parameters)
    return dataplane.infer(request, cancel=cancel)


def call_model_stream(
    dataplane: Dataplane,
    model: str,
    inputs: Mapping[str, np.ndarray],
    *,
    version: str = "",
    outputs: Sequence[str] = (),
    deadline: float | None = None,
    cancel: CancelToken | None = None,
    request_id: str = "",
    parameters: Mapping[str, object] | None = None,
) -> Iterator[Outputs]:
    """`call_model` for a streaming (decoupled) model: its outputs, response by response (another model's one).
    Holds the callee's slot until the iterator ends or is closed. Raises as `call_model`, from the iterator."""
    request = _request(model, inputs, version, outputs, None, deadline, request_id, parameters, _stream_outputs_of)
    return dataplane.infer_stream(request, cancel=cancel)


def _stream_outputs_of(response: InferenceResponse) -> Outputs:
    """A streamed answer's outputs, as FinalOutputs when it ends the stream (a model that is not decoupled answers
    once, with the final flag): a BLS `exec(decoupled=True)` then ends with it, as Triton's iterator does."""
    return FinalOutputs(response.outputs) if response.final else response.outputs


def _request(
    model: str,
    inputs: Mapping[str, np.ndarray],
    version: str,
    outputs: Sequence[str],
    datatypes_of: Mapping[str, str] | None,
    deadline: float | None,
    request_id: str,
    parameters: Mapping[str, object] | None,
    respond: Callable[[InferenceResponse], Outputs] | None = None,
) -> InferenceRequest[Outputs]:
    return InferenceRequest(
        model=model,
        version=version,
        id=request_id,
        tensors=ArrayTensors(inputs, outputs, datatypes_of or {}),
        respond=respond or _outputs_of,
        client_deadline=deadline,
        parameters=dict(parameters or {}),
    )


__all__ = ["ArrayTensors", "call_model", "call_model_stream"]
