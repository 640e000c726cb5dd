"""Server bootstrap: builds the core (repository, backends, registry, dataplane), the gRPC server with its
servicers, health and reflection, and runs startup and shutdown.

`Server` is what both `python -m service` and the in-process test API (`service.testing`) use.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from engine.fixture import FixtureBackend
from engine.interface import Backend
from engine.onnxruntime_backend import OnnxRuntimeBackend
from engine.repository import ModelRepository
from generated import grpc_service_pb2, grpc_service_pb2_grpc, management_pb2, management_pb2_grpc

from .dataplane import Dataplane
from .lifecycle import SharedRuntime
from .options import ServerOptions
from .registry import ModelRegistry, RegistryPolicy
from .residency import ColdLoadGuard, Residency
from .servicers.common import HandlerBudget, ManagementGate
from .servicers.inference import InferenceServicer
from .servicers.management import ManagementServicer

_LOG = logging.getLogger(__name__)

VERSION = "0.1.0"
INFERENCE_SERVICE = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
MANAGEMENT_SERVICE = management_pb2.DESCRIPTOR.services_by_name["ModelManagement"].full_name


def default_backends() -> dict[str, Backend]:
    """The backends every server has. TensorRT is added when its package is importable (it probes the GPU
    only when a TensorRT model loads)."""
    backends: dict[str, Backend] = {"onnxruntime": OnnxRuntimeBackend(), "fixture": FixtureBackend()}
    try:
        from engine.tensorrt.backend import TensorRTBackend
    except ImportError:
        pass
    else:
        backends["tensorrt"] = TensorRTBackend()
    return backends


class ServerState:
    """Readiness as clients see it (ServerReady, health)."""

    def __init__(self) -> None:
        self.ready = False
        self.shutting_down = False


class Server:
    """One slotserve server. `start()` binds and (optionally) loads the repository; `stop()` shuts down."""

    def __init__(self, options: ServerOptions, backends: Mapping[str, Backend] | None = None) -> None:
        self.options = options
        all_backends = dict(backends if backends is not None else default_backends())
        all_backends.update(options.extra_backends)
        self.residency = Residency(lambda: self.registry.entries(), max_resident_models=options.max_resident_models,
                                   memory_budget=options.memory_budget, idle_unload=options.idle_unload)
        self.runtime = SharedRuntime(backends=all_backends, max_queue=options.max_queue,
                                     cold_loads=ColdLoadGuard(options.max_concurrent_loads), residency=self.residency)
        self.repository = ModelRepository(options.model_repository)
        self.registry = ModelRegistry(self.repository, self.runtime, RegistryPolicy(
            parallel_jobs=options.parallel_jobs, admission_timeout=options.admission_timeout))
        self.dataplane = Dataplane(self.registry)
        self.state = ServerState()
        self.health = health.HealthServicer()
        self.budget = HandlerBudget(options.inference_handlers)
        self._grpc: grpc.Server | None = None
        self.port: int | None = None
        self._stopped = threading.Event()

    @property
    def address(self) -> str:
        host = self.options.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def _build_grpc(self) -> grpc.Server:
        limit = self.options.max_message_bytes
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.options.max_workers, thread_name_prefix="grpc"),
            options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit),
                     ("grpc.so_reuseport", 0)],
        )
        management = ManagementGate(self.options.allow_management)
        grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
            InferenceServicer(self.registry, self.dataplane, self.budget, management, self.state, VERSION), server)
        management_pb2_grpc.add_ModelManagementServicer_to_server(
            ManagementServicer(self.registry, management), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        if self.options.reflection:
            reflection.enable_server_reflection(
                (INFERENCE_SERVICE, MANAGEMENT_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        return server

    def start(self) -> int:
        """Register (and by default load) the repository's models, bind, start serving. Returns the port.

        Raises RuntimeError if the address cannot be bound.
        """
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        self.residency.start()
        self.registry.register_repository(load=self.options.load_at_startup)
        self._grpc = self._build_grpc()
        try:
            self.port = self._grpc.add_insecure_port(f"{self._bind_host()}:{self.options.port}")
        except RuntimeError as error:
            raise RuntimeError(f"cannot listen on {self.options.host}:{self.options.port}: {error}") from None
        self._grpc.start()
        self.state.ready = True
        self._set_health(health_pb2.HealthCheckResponse.SERVING)
        _LOG.info("slotserve %s serving %s on %s", VERSION, self.repository.root, self.address)
        return self.port

    def _bind_host(self) -> str:
        host = self.options.host
        return f"[{host}]" if ":" in host and not host.startswith("[") else host

    def _set_health(self, status) -> None:
        for service in ("", INFERENCE_SERVICE, MANAGEMENT_SERVICE):
            self.health.set(service, status)

    def stop(self, grace: float | None = None) -> None:
        """Stop: health NOT_SERVING, refuse new calls, let running calls finish for `grace` seconds (default
        --shutdown-grace), then close the engines. Blocks until done. Idempotent."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.state.ready = False
        self.state.shutting_down = True
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        grace = self.options.shutdown_grace if grace is None else grace
        if self._grpc is not None:
            self._grpc.stop(grace).wait()
        started = time.monotonic()
        self.residency.stop()
        self.registry.unload_many(all_models=True)
        _LOG.info("slotserve stopped (engines closed in %.3f s)", time.monotonic() - started)

    def wait(self) -> None:
        if self._grpc is not None:
            self._grpc.wait_for_termination()
