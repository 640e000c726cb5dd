"""Request rescheduling for python models: Triton's `request.set_release_flags(
pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)` (the python backend's README, "Request Rescheduling"), which hands
a request back unfinished so that it runs again later (docs/python-models.md, docs/sequences.md).

How the model's release flag travels back from the worker with the request's result:

* a non-decoupled call: the request's result in the call's Done message is a `Released` record
  (engine/python/messages.py) instead of its Tensors or ErrorResult (`released_result`, in the worker's
  `_collect`); the model must return None for
  it, as Triton requires (Triton's words otherwise, failing the call), or None for the whole list when it
  reschedules every request;
* a decoupled call: once `execute` has returned (its coroutine ended, for an `async def execute`), the worker sends a
  `Released` record as a message of its own for each request rescheduled and not closed by a final flag, naming the
  request's call (its run), and closes its response sender (`send_released`): the server's stream of that request
  ends there, after the responses it sent.

What the server makes of it (`released_outcome`): RequestRescheduled on a model whose sequence_batching has
`iterative_sequence: true` (service/core/sequences.py runs the request again); on any other model a ModelError in
the words Triton logs for it ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is
not configured to handle such a flag."), where Triton leaves the client waiting.

Importable by both sides: the worker's functions import the model-facing module only when they run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import EngineError, ModelError, RequestRescheduled
from .messages import Released

if TYPE_CHECKING:
    from ..config.specs import ModelSpec

RELEASE_ALL = 1  # TRITONSERVER_REQUEST_RELEASE_ALL: the request is done (the default)
RELEASE_RESCHEDULE = 2  # TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: run it again

NOT_CONFIGURED = (
    "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured to handle "
    "such a flag."
)


# ---- the worker's side ---------------------------------------------------------------------------------------------


def release_flags(request: Any) -> int:
    """The release flags the model set on `request` (a pb_utils.InferenceRequest), RELEASE_ALL by default."""
    return int(getattr(request, "_release_flags", RELEASE_ALL))


def rescheduled(request: Any) -> bool:
    """Whether the model released `request` with RELEASE_RESCHEDULE (Triton compares the flags for equality)."""
    return release_flags(request) == RELEASE_RESCHEDULE


def released_result(request: Any, response: object, index: int) -> Released | None:
    """The result of the `index`-th request of a non-decoupled call: a Released record when the model rescheduled
    it (RELEASE_RESCHEDULE, as Triton compares it), else None (the response is read as usual). Raises
    TritonModelException in Triton's words when the model returned a response for a rescheduled request: the
    request runs again with the same inputs, so it may have one response only, from its last execution."""
    if not rescheduled(request):
        return None
    if response is not None:
        from . import triton_python_backend_utils as pb_utils

        raise pb_utils.TritonModelException(
            "Expected a None object in the execute function return list for reschduled request, found type "
            f"'{type(response)}'."
        )
    return Released(index, RELEASE_RESCHEDULE)


def send_released(worker: Any, run: int, lock: Any, requests: Sequence[Any], senders: Sequence[Any]) -> None:
    """After a decoupled `execute` (call `run`) returned: tell the server about each request the model rescheduled
    whose sender is still open (a Released message; its answers so far are its stream's) and close that sender, so
    that the call does not wait for a final flag the model will send on a later execution. A request that got its
    final flag is done: its reschedule is not honoured. `lock` is the one its senders send under. Raises OSError
    when the server is gone."""
    for index, (request, sender) in enumerate(zip(requests, senders, strict=True)):
        if not rescheduled(request):
            continue
        with lock:
            if sender.closed:
                continue
            worker.send(Released(index, RELEASE_RESCHEDULE, run))
            sender.close()


# ---- the server's side ---------------------------------------------------------------------------------------------


def released_outcome(model: str, spec: ModelSpec) -> EngineError:
    """What a rescheduled request of `model` becomes: RequestRescheduled for an iterative sequence model (its
    request runs again), else ModelError in Triton's words (the request fails; nothing runs it again)."""
    if spec.sequence is not None and spec.sequence.iterative:
        return RequestRescheduled(f"model '{model}' rescheduled the request")
    return ModelError(
        f"model '{model}': {NOT_CONFIGURED} Set sequence_batching {{ iterative_sequence: true }} in its "
        "config.pbtxt to run a rescheduled request again."
    )
