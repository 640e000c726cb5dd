"""The server's calls to its own models, for backends (engine.interface ModelCalls): python models' BLS calls.

Built by the server with its dataplane and handed to every backend (`Backend.bind_model_calls`), so the engine
never imports the service. Each call is an internal call (service/request_path/internal_calls.py): through the callee's
full admission (FIFO, slots, batching, residency, statistics), with the RequestInfo the backend gives (its deadline is
the calling request's) and the backend's CancelToken.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from engine.interface import CancelToken, ModelCalls, Outputs, RequestInfo

from ..core.outcomes import seen_by_client
from ..transport import status_codes
from .dataplane import Dataplane
from .internal_calls import call_model, call_model_stream


def _parameters(request: RequestInfo) -> dict[str, object]:
    """The call's parameters as a client's request would carry them (its sequence fields included)."""
    parameters = dict(request.parameters)
    if request.correlation_id:
        parameters["sequence_id"] = request.correlation_id
    if request.flags & 1:
        parameters["sequence_start"] = True
    if request.flags & 2:
        parameters["sequence_end"] = True
    return parameters


class DataplaneModelCalls(ModelCalls):
    def __init__(self, dataplane: Dataplane) -> None:
        self._dataplane = dataplane

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str,
        outputs: Sequence[str],
        cancel: CancelToken,
        request: RequestInfo,
    ) -> Outputs:
        return call_model(
            self._dataplane,
            model,
            inputs,
            version=version,
            outputs=outputs,
            deadline=request.deadline,
            cancel=cancel,
            request_id=request.id,
            parameters=_parameters(request),
        )

    def infer_stream(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str,
        outputs: Sequence[str],
        cancel: CancelToken,
        request: RequestInfo,
    ) -> Iterator[Outputs]:
        return call_model_stream(
            self._dataplane,
            model,
            inputs,
            version=version,
            outputs=outputs,
            deadline=request.deadline,
            cancel=cancel,
            request_id=request.id,
            parameters=_parameters(request),
        )

    @staticmethod
    def describe(error: BaseException, cancel: CancelToken | None = None) -> tuple[str, str]:
        code, message, _reason = status_codes.describe(seen_by_client(error, cancel))
        return code.name, message


__all__ = ["DataplaneModelCalls"]
