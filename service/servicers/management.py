"""`slotserve.management.v1.ModelManagement`: register, reconfigure, unload, bulk unload, status.

Each RPC decodes its request, calls one registry operation and encodes the answer with `converters.py`."""

from __future__ import annotations

import grpc

from engine.interface import CancelToken
from generated import management_pb2 as pb
from generated import management_pb2_grpc as pb_grpc

from ..auth import Access
from ..core.registry import ModelRegistry
from . import converters
from .common import AccessGate, CallTracker, rpc

Context = grpc.ServicerContext


class ManagementServicer(pb_grpc.ModelManagementServicer):
    def __init__(self, registry: ModelRegistry, access: AccessGate, calls: CallTracker) -> None:
        self._registry = registry
        self.calls = calls  # read by `rpc`, as `access`
        self.access = access

    @rpc(access=Access.MANAGE)
    def RegisterModel(self, request: pb.RegisterModelRequest, context: Context, token: CancelToken) -> pb.ModelStatus:
        registration = converters.registration(request)
        # A load whose client gave up goes on without holding this handler thread (service/core/detached.py).
        status = self._registry.detached.run(
            lambda: self._registry.register(registration, cancel=token), token, f"registration of '{request.model_id}'"
        )
        return converters.model_status(status)

    @rpc(access=Access.MANAGE)
    def UnloadModel(self, request: pb.UnloadModelRequest, context: Context, token: CancelToken) -> pb.ModelStatus:
        return converters.model_status(self._registry.unload(request.model_id, cancel=token))

    @rpc(access=Access.MANAGE)
    def UnloadModels(
        self, request: pb.UnloadModelsRequest, context: Context, token: CancelToken
    ) -> pb.UnloadModelsResponse:
        unloaded, not_found = self._registry.unload_many(request.model_ids, all_models=request.all, cancel=token)
        return converters.unloaded_models(unloaded, not_found)

    # Status calls change nothing (no --allow-management needed) but belong to the management protocol: with
    # --management-token set they need it (service.auth, Access.STATUS).

    @rpc(access=Access.STATUS)
    def ListModels(self, request: pb.ListModelsRequest, context: Context, token: CancelToken) -> pb.ListModelsResponse:
        return converters.model_statuses(self._registry.statuses())

    @rpc(access=Access.STATUS)
    def GetModel(self, request: pb.GetModelRequest, context: Context, token: CancelToken) -> pb.ModelStatus:
        return converters.model_status(self._registry.get(request.model_id).status())


def add_management_servicer(servicer: ManagementServicer, server: grpc.Server) -> None:
    """Register the management service (the generated registration)."""
    pb_grpc.add_ModelManagementServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]  # generated/: no stubs
