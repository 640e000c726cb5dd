"""`slotserve.management.v1.ModelManagement`: register, reconfigure, unload, bulk unload, status."""

from __future__ import annotations

from generated import management_pb2 as pb
from generated import management_pb2_grpc as pb_grpc

from ..auth import Access
from ..core.errors import InvalidRequest
from ..core.lifecycle import ModelState, ModelStatus
from ..core.registry import ModelRegistry, Registration
from ..options import seconds_problem
from .common import AccessGate, CallTracker, rpc

_STATE = {
    ModelState.UNLOADED: pb.MODEL_STATE_UNLOADED,
    ModelState.LOADING: pb.MODEL_STATE_LOADING,
    ModelState.READY: pb.MODEL_STATE_READY,
    ModelState.RECONFIGURING: pb.MODEL_STATE_RECONFIGURING,
    ModelState.UNLOADING: pb.MODEL_STATE_UNLOADING,
}


def status_message(status: ModelStatus) -> pb.ModelStatus:
    message = pb.ModelStatus(
        model_id=status.name,
        loaded=status.loaded,
        state=_STATE[status.state],
        slots=status.slots,
        active_slots=status.active_slots,
        queued_requests=status.queued_requests,
        backend=status.backend,
        last_error=status.last_error,
        source=status.source,
        admission_timeout_seconds=status.admission_timeout,
        version=status.version,
    )
    if status.max_parallel_slots is not None:
        message.max_parallel_slots = status.max_parallel_slots
    if status.memory_bytes is not None:
        message.memory_bytes = status.memory_bytes
    times = status.load_times
    if times is not None:
        message.load_times.CopyFrom(
            pb.LoadTimes(
                load_seconds=times.load_seconds, warmup_seconds=times.warmup_seconds, warmup_runs=times.warmup_runs
            )
        )
    batching = status.batching
    if batching is not None:
        message.batching.CopyFrom(
            pb.DynamicBatching(
                max_batch_size=status.max_batch_size,
                max_queue_delay_microseconds=batching.max_queue_delay_us,
                preferred_batch_sizes=batching.preferred_batch_sizes,
                max_queue_size=batching.max_queue_size,
                allow_timeout_override=batching.allow_timeout_override,
            )
        )
    return message


def _admission_timeout(request: pb.RegisterModelRequest) -> float | None:
    """The request's admission timeout (None when absent). Raises InvalidRequest naming the field for NaN,
    infinities, negatives and more than a year: `min(nan, ceiling)` is NaN, so a NaN used to escape the
    server's --admission-timeout ceiling and wait without limit."""
    if not request.HasField("admission_timeout_seconds"):
        return None
    value = request.admission_timeout_seconds
    problem = seconds_problem(
        "admission_timeout_seconds", value, zero="waits without limit, capped by the server's --admission-timeout"
    )
    if problem is not None:
        raise InvalidRequest(problem)
    return value


class ManagementServicer(pb_grpc.ModelManagementServicer):
    def __init__(self, registry: ModelRegistry, access: AccessGate, calls: CallTracker) -> None:
        self._registry = registry
        self._calls = calls
        self._access = access

    @rpc(access=Access.MANAGE)
    def RegisterModel(self, request, context, token):
        registration = Registration(
            name=request.model_id,
            source=request.source,
            backend=request.backend,
            options=dict(request.options),
            slots=request.slots if request.HasField("slots") else None,
            admission_timeout=_admission_timeout(request),
            config_json=request.config_json,
        )
        # A load whose client gave up goes on without holding this handler thread (service/core/detached.py).
        status = self._registry.detached.run(
            lambda: self._registry.register(registration, cancel=token), token, f"registration of '{request.model_id}'"
        )
        return status_message(status)

    @rpc(access=Access.MANAGE)
    def UnloadModel(self, request, context, token):
        return status_message(self._registry.unload(request.model_id, cancel=token))

    @rpc(access=Access.MANAGE)
    def UnloadModels(self, request, context, token):
        unloaded, not_found = self._registry.unload_many(request.model_ids, all_models=request.all, cancel=token)
        return pb.UnloadModelsResponse(unloaded=unloaded, not_found=not_found)

    # Status calls change nothing (no --allow-management needed) but belong to the management protocol: with
    # --management-token set they need it (service.auth, Access.STATUS).

    @rpc(access=Access.STATUS)
    def ListModels(self, request, context, token):
        return pb.ListModelsResponse(models=[status_message(s) for s in self._registry.statuses()])

    @rpc(access=Access.STATUS)
    def GetModel(self, request, context, token):
        return status_message(self._registry.get(request.model_id).status())
