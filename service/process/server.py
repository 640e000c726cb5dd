"""Server bootstrap: builds the core (repository, backends, registry, dataplane), the gRPC server with its
servicers, health and reflection, and runs startup and shutdown.

`Server` is what both `python -m service` and the in-process test API (`service.testing`) use.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from engine.config.repository import ModelRepository
from engine.interface import Backend
from engine.onnxruntime_backend import OnnxRuntimeBackend
from engine.python.backend import PythonBackend
from engine.tensorrt.backend import TensorRTBackend
from generated import grpc_service_pb2, management_pb2

from ..core.events import Events, log_event
from ..core.lifecycle import SharedRuntime
from ..core.log_settings import LogControl
from ..core.rate_limiter import RateLimitMode, ResourcePool
from ..core.registry import ModelRegistry, RegistryPolicy
from ..core.residency import ColdLoadGuard, Residency
from ..core.trace_settings import TraceSettingsStore
from ..core.tracing import Tracer
from ..request_path.dataplane import Dataplane
from ..request_path.ensemble import EnsembleBackend
from ..request_path.model_calls import DataplaneModelCalls
from ..request_path.model_control import ControlSettings, ModelControl, lazy_load_refusal
from ..request_path.model_files import ModelFiles
from ..request_path.response_cache import ResponseCache
from ..transport import tls
from ..transport.auth import Authenticator
from ..transport.servicers.common import SHUTDOWN, AccessGate, CallTracker
from ..transport.servicers.inference import InferenceServicer, add_inference_servicer
from ..transport.servicers.management import ManagementServicer, add_management_servicer
from ..transport.shared_memory import SharedMemoryRegistry
from ..transport.tensor_memory import TensorMemory
from .custom_metrics import CustomMetrics
from .handler_threads import HandlerThreads
from .metrics import BusyCallsCollector, ServerMetrics, SlotserveCollector
from .options import ServerOptions
from .timers import TimerQueue
from .trace_output import TraceOutput

if TYPE_CHECKING:  # the front ends' modules load only with --frontends N > 1
    from ..frontends.forwarded import HandlerTable
    from ..frontends.supervisor import Frontends

_LOG = logging.getLogger(__name__)

VERSION = "0.1.0"
SHUTDOWN_MARGIN = 2.0  # seconds past the grace for cancelled work to return before it is abandoned
INFERENCE_SERVICE = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
MANAGEMENT_SERVICE = management_pb2.DESCRIPTOR.services_by_name["ModelManagement"].full_name


def default_backends(*, test_backends: bool = False, python_environments_dir: Path | None = None) -> dict[str, Backend]:
    """The backends a server has. The TensorRT backend imports TensorRT and probes the GPU only when a
    TensorRT model loads; without them that load fails with FAILED_PRECONDITION. The test doubles
    (engine/testing/: the fixture backend) are imported and added only with `test_backends`
    (--enable-test-backends); without it a model naming them is refused by name. Python models' packed execution
    environments are extracted under `python_environments_dir` (--python-environments-dir)."""
    backends: dict[str, Backend] = {
        "onnxruntime": OnnxRuntimeBackend(),
        "tensorrt": TensorRTBackend(),
        "python": PythonBackend(python_environments_dir),
    }
    if test_backends:
        from engine.testing import test_backends as make_test_backends

        backends.update(make_test_backends())
    return backends


@dataclass(frozen=True)
class ShutdownReport:
    abandoned_calls: int  # handlers still running when the server gave up on them (hung backend calls)
    abandoned_models: list[str]  # models whose engines were left open because a hung call holds them
    closed_models: list[str]
    seconds: float


class ServerState:
    """Readiness as clients see it (ServerReady, health). `ready` says the server serves (set after the startup
    loads, cleared when a shutdown begins); with `strict` (--strict-readiness true, Triton's default) ServerReady
    asks `not_ready_models` as well, and a model loading or failed keeps it false."""

    def __init__(self, not_ready_models: Callable[[], list[str]] | None = None) -> None:
        self.ready = False
        self._not_ready_models = not_ready_models

    def server_ready(self) -> bool:
        """ServerReady's answer. Never blocks on a load (the registry's and each model's lock are taken briefly)."""
        if not self.ready:
            return False
        return self._not_ready_models is None or not self._not_ready_models()


class Server:
    """One slotserve server. `start()` binds and (optionally) loads the repository; `stop()` shuts down."""

    def __init__(self, options: ServerOptions, backends: Mapping[str, Backend] | None = None) -> None:
        self.options = options
        all_backends = dict(
            backends
            if backends is not None
            else default_backends(
                test_backends=options.enable_test_backends, python_environments_dir=options.python_environments_dir
            )
        )
        all_backends.update(options.extra_backends)
        ensembles = all_backends.setdefault("ensemble", EnsembleBackend())  # bound to the dataplane below
        self.residency = Residency(
            max_resident_models=options.max_resident_models,
            memory_budget=options.memory_budget,
            idle_unload=options.idle_unload,
        )
        self.runtime = SharedRuntime(
            backends=all_backends,
            max_queue=options.max_queue,
            refuse_predicted_wait=options.refuse_predicted_wait,
            cold_loads=ColdLoadGuard(options.max_concurrent_loads),
            residency=self.residency,
            lazy_load_refusal=lazy_load_refusal(options.model_control_mode),
            # --rate-limit execution_count: one pool of resources shared by every model's slots; off: none.
            rate_limiter=(
                ResourcePool(options.rate_limit_resources)
                if options.rate_limit is RateLimitMode.EXECUTION_COUNT
                else None
            ),
        )
        # Named now (the repository's allowed roots are fixed here), created on the first load with files: nothing is
        # written at startup, so a read-only root filesystem starts (deploy/kubernetes/*.yaml).
        self.model_files = ModelFiles(options.model_files_dir or temporary_folder(), options.max_load_file_bytes)
        self.repository = ModelRepository(
            options.model_repository, allowed_roots=(*options.allowed_model_roots, self.model_files.root)
        )
        self.registry = ModelRegistry(
            self.repository,
            self.runtime,
            RegistryPolicy(parallel_jobs=options.parallel_jobs, admission_timeout=options.admission_timeout),
        )
        self.control = ModelControl(
            ControlSettings(
                options.model_control_mode,
                options.load_models,
                options.repository_poll_seconds,
                options.load_at_startup,
            ),
            self.registry,
            self.model_files,
        )
        # System shared memory: a registry only when enabled (--shared-memory system).
        self.shared_memory = (
            SharedMemoryRegistry(options.shared_memory_prefix, options.shared_memory_max_bytes)
            if options.shared_memory == "system"
            else None
        )
        # Request tracing: the settings (--trace-config, the TraceSetting RPC) and where traces go (closed at shutdown).
        self.trace_settings = TraceSettingsStore(options.trace_settings)
        self.trace_output = TraceOutput(self.trace_settings)
        self.dataplane = Dataplane(
            self.registry,
            tensor_memory=TensorMemory(options.max_request_tensor_bytes, options.max_inflight_tensor_bytes),
            response_cache=ResponseCache(options.response_cache_bytes),
            tracer=Tracer(self.trace_settings, self.trace_output),
        )
        if isinstance(ensembles, EnsembleBackend):
            ensembles.bind(self.dataplane)
        model_calls = DataplaneModelCalls(self.dataplane)  # python models' BLS calls
        for backend in all_backends.values():
            backend.bind_model_calls(model_calls)
        # Python models' custom metrics (pb_utils.MetricFamily): a model's go when it unloads (its events say when).
        self.custom_metrics = CustomMetrics()
        self.runtime.events.subscribe(self.custom_metrics.note_event)
        for backend in all_backends.values():
            if isinstance(backend, PythonBackend):
                backend.bind_custom_metrics(self.custom_metrics)
        # Always collected (a scrape reads live objects; nothing is recorded for it), served only with
        # --metrics-port.
        self.metrics = ServerMetrics(
            SlotserveCollector(
                self.registry,
                self.residency,
                self.runtime.events,
                self.runtime.cold_loads,
                self.dataplane,
                custom_metrics=self.custom_metrics,
            )
        )
        # The process's logging, as the LogSettings RPC reads and changes it (--log-verbose N read back as N).
        self.log_settings = LogControl(verbose_level=options.log_verbose_level)
        self.state = ServerState(self.registry.not_ready_models if options.strict_readiness else None)
        self.health = health.HealthServicer()
        self.calls = CallTracker(options.inference_handlers, options.management_handlers)
        self.metrics.registry.register(BusyCallsCollector(lambda: self.calls.refused))  # slotserve_busy_calls_total
        self.timers = TimerQueue("stream-write-timeouts")
        self._access = AccessGate(
            options.allow_management, Authenticator(options.management_token, options.inference_token)
        )
        self._executor: HandlerThreads | None = None
        self._grpc: grpc.Server | None = None
        self._frontends: Frontends | None = None  # --frontends N > 1: their supervisor
        self._serving = False  # the health, as the front ends answer it
        self.port: int | None = None
        self._shutdown_lock = threading.Lock()  # guards: _shutdown_claimed
        self._shutdown_claimed = False
        self._shutdown_done = threading.Event()
        self.report: ShutdownReport | None = None

    @property
    def address(self) -> str:
        host = self.options.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    @property
    def metrics_port(self) -> int | None:
        """The bound --metrics-port (the free port picked for 0), or None when metrics are not served."""
        return self.metrics.port

    @property
    def handler_threads(self) -> HandlerThreads | None:
        """The gRPC handler threads (their `statistics()`), once the server is built."""
        return self._executor

    def _start_metrics(self) -> None:
        """Serve /metrics when --metrics-port is set. Raises RuntimeError if its port cannot be bound."""
        port = self.options.metrics_port
        if port is None:
            return
        host = self.options.metrics_host or self.options.host
        try:
            self.metrics.start(host, port)
        except OSError as error:
            raise RuntimeError(f"cannot serve metrics on {host}:{port}: {error}") from None

    def _build_grpc(self) -> grpc.Server:
        """The gRPC server and its handler threads.

        --handler-runners threads run calls at once, the rest wait first come first served, and a call that has
        waited STALL_SECONDS gets a thread of its own (`HandlerThreads`: grpcio reads a unary request on that
        thread, so a fixed pool would let stalled calls take every thread and silence the health probes);
        --max-workers threads are kept, more start on demand and end when idle. The threads are bounded by the
        calls open at once, --max-concurrent-rpcs (beyond it grpcio refuses a call with RESOURCE_EXHAUSTED before
        it takes a thread). No per-connection stream limit: HTTP/2 refuses a stream beyond it, and a client's next call
        racing the close of its last one then fails with UNAVAILABLE (the fuzz tests saw it). docs/operations.md
        ("Probes and stalled calls") has the figures."""
        self._executor = HandlerThreads(keep=self.options.max_workers, runners=self.options.handler_runners)
        server = grpc.server(
            self._executor,  # type: ignore[arg-type]  # grpcio only calls submit; its stubs ask for a ThreadPoolExecutor
            options=[
                ("grpc.max_receive_message_length", self.options.max_message_bytes),
                ("grpc.max_send_message_length", self.options.max_message_bytes),
                ("grpc.so_reuseport", 1 if self.options.reuse_port else 0),
                *self.options.grpc_arguments,
            ],
            maximum_concurrent_rpcs=self.options.concurrent_rpcs,
        )
        self._add_servicers(server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        if self.options.reflection:
            reflection.enable_server_reflection(
                (INFERENCE_SERVICE, MANAGEMENT_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server
            )
        return server

    def _grpc_arguments(self) -> list[tuple[str, int]]:
        """The front ends' gRPC arguments (each adds grpc.so_reuseport itself)."""
        limit = self.options.max_message_bytes
        return [
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            *self.options.grpc_arguments,
        ]

    def _add_servicers(self, server: grpc.Server | HandlerTable) -> None:
        """Register both services' servicers on `server` (or, with front ends, in the table their calls run from)."""
        access = self._access
        add_inference_servicer(
            InferenceServicer(
                self.registry,
                self.dataplane,
                self.calls,
                access,
                self.state,
                VERSION,
                self.timers,
                self.options.stream_write_timeout,
                self.shared_memory,
                control=self.control,
                trace_settings=self.trace_settings,
                log_control=self.log_settings,
            ),
            server,  # type: ignore[arg-type]  # a HandlerTable takes what a grpc.Server takes
        )
        add_management_servicer(ManagementServicer(self.registry, access, self.calls), server)  # type: ignore[arg-type]

    def _build_frontends(self) -> Frontends:
        """--frontends N > 1: the servicers in a table, run on this process's handler threads, for N front-end
        processes (service/frontends/supervisor.py). Health and reflection are answered by the front ends."""
        from ..frontends.forwarded import HandlerTable
        from ..frontends.infer import ForwardedInfer
        from ..frontends.supervisor import Frontends, FrontendSettings, tls_material

        self._executor = HandlerThreads(keep=self.options.max_workers, runners=self.options.handler_runners)
        table = HandlerTable()
        self._add_servicers(table)
        options = self.options
        settings = FrontendSettings(
            tuple(self._grpc_arguments()),
            options.concurrent_rpcs,
            options.max_workers,
            options.reflection,
            tls_material(options.tls_cert, options.tls_key, options.tls_client_ca),
        )
        infer = ForwardedInfer(self._access, self.calls, self.dataplane)  # ModelInfers the front ends decoded
        return Frontends(options.frontends, table, self._executor, settings, lambda: self._serving, infer)

    def start(self) -> int:
        """Bind and listen, register (and by default load) the repository's models, then report ready. Returns the
        port once the startup loads have ended (the server answers while they run: ServerReady false).

        Raises RuntimeError if the address cannot be bound, or with --exit-on-error if a model failed to load at
        startup (nothing served, what loaded is closed), and tls.TLSConfigError (a RuntimeError) for an unusable
        TLS file, before anything is loaded.
        """
        try:
            credentials = tls.server_credentials(self.options)  # fail fast: before any model loads
        except tls.TLSConfigError:
            self.timers.close()  # the only thing running yet
            raise
        try:
            self._start_metrics()  # first, so a scrape can watch the startup loads
        except RuntimeError:
            self.timers.close()
            raise
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        self.residency.start()
        if self.options.frontends > 1:
            self._start_frontends()
        else:
            self._grpc = self._build_grpc()
            try:
                address = f"{self._bind_host()}:{self.options.port}"
                # With TLS the port speaks only TLS: a plaintext client cannot complete a handshake.
                self.port = (
                    self._grpc.add_insecure_port(address)
                    if credentials is None
                    else self._grpc.add_secure_port(address, credentials)
                )
            except RuntimeError as error:
                self._release_unserved()
                raise RuntimeError(f"cannot listen on {self.options.host}:{self.options.port}: {error}") from None
            # Listening before the startup loads: ServerLive answers, ServerReady and health say not ready until
            # they have ended (each within its own bound: a hung python initialize fails at its initialize
            # timeout), and the models loaded already serve meanwhile (docs/lifecycle.md, "Startup").
            self._grpc.start()
        assert self.port is not None  # set by either branch
        failures = StartupFailures(self.runtime.events) if self.options.exit_on_error else None
        try:
            self.control.start()  # registers the repository's models and loads what --model-control-mode says
        except BaseException:
            self.stop(grace=0.0)  # it listens already: a startup that fails still releases what it started
            raise
        failed = failures.close() if failures is not None else []
        if failed:
            self.stop(grace=0.0)
            raise RuntimeError(
                f"--exit-on-error: {len(failed)} model(s) failed to load at startup: "
                f"{', '.join(repr(name) for name in failed)} (the log says why); start with --exit-on-error=false "
                "to serve the others"
            )
        with self._shutdown_lock:  # a shutdown that began during the startup loads keeps the server not ready
            if self._shutdown_claimed:
                return self.port
            self.state.ready = True
            self._set_health(health_pb2.HealthCheckResponse.SERVING)
        metrics = self.metrics_port
        log_event(
            _LOG,
            "serving",
            version=VERSION,
            repository=str(self.repository.root),
            address=self.address,
            metrics_address=None
            if metrics is None
            else _host_port(self.options.metrics_host or self.options.host, metrics),
        )
        return self.port

    def _start_frontends(self) -> None:
        """Start the front ends on the (reserved) port; the port is set once every one of them listens. Raises
        RuntimeError when one cannot start, after releasing what startup built."""
        self._frontends = self._build_frontends()
        try:
            self.port = self._frontends.start(self.options.host, self.options.port)
        except RuntimeError:
            self._frontends.close(0.0)
            self._release_unserved()
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
            raise

    def frontend_pids(self) -> list[int]:
        """The live front-end processes' ids in index order (empty with --frontends 1)."""
        return self._frontends.pids() if self._frontends is not None else []

    def _release_unserved(self) -> None:
        """Nothing serves: release what startup built (threads, loaded engines) before raising."""
        self.residency.stop()
        self.registry.close_idle_models()
        self.control.stop(timeout=0.0)
        self.timers.close()
        self.metrics.stop()

    def _bind_host(self) -> str:
        host = self.options.host
        return f"[{host}]" if ":" in host and not host.startswith("[") else host

    def _set_health(self, status: int) -> None:  # a HealthCheckResponse.ServingStatus
        for service in ("", INFERENCE_SERVICE, MANAGEMENT_SERVICE):
            self.health.set(service, status)
        self._serving = status == health_pb2.HealthCheckResponse.SERVING
        if self._frontends is not None:
            self._frontends.set_serving(self._serving)  # each front end answers health from it

    def shutdown(
        self, *, drain_seconds: float | None = None, grace: float | None = None, margin: float = SHUTDOWN_MARGIN
    ) -> ShutdownReport:
        """Stop in the documented order; blocks for at most drain + grace + 2 x margin seconds. Idempotent: a
        second call waits for the first and returns its report.

        1. health and ServerReady turn NOT_SERVING, so load balancers move away;
        2. for `drain_seconds` (default --drain-seconds) the server keeps serving normally;
        3. new calls are refused; calls in progress, queued requests included, may finish until `grace`
           (default --shutdown-grace) runs out;
        4. then what is still queued is refused with UNAVAILABLE (shutting_down) and running work is cancelled
           (ONNX Runtime runs are terminated; engines that cannot be interrupted finish their run);
        5. handler threads get `margin` seconds to return; a call still hung in a backend is abandoned and logged;
        6. the engines of every model nobody holds are closed (a model held by an abandoned call is left).
        No registry, model or socket lock is held while waiting for handlers. Every wait ends by one deadline
        counted from this call's start, min(1, margin / 2) s before the bound, so that the steps after the
        last wait and the process's exit fit inside the bound too.
        """
        with self._shutdown_lock:  # check and claim in one step: two callers must not both run it
            claimed_already, self._shutdown_claimed = self._shutdown_claimed, True
        if claimed_already:
            self._shutdown_done.wait()
            return self.report  # type: ignore[return-value]
        started = time.monotonic()
        drain = self.options.drain_seconds if drain_seconds is None else drain_seconds
        grace = self.options.shutdown_grace if grace is None else grace
        self.state.ready = False
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        log_event(_LOG, "shutdown_draining", drain_seconds=drain)
        # Every wait ends by `bound`, counted from the start (a step that began late cannot push it back), and
        # `finish` before drain + grace + 2 x margin: the steps after the last wait (executor, timers, metrics)
        # and the process's exit need that time, and a supervisor's grace set to the bound must not run out.
        finish = min(1.0, margin / 2)
        bound = started + drain + grace + 2 * margin - finish

        def left(limit: float = float("inf")) -> float:
            return max(0.0, min(limit, bound - time.monotonic()))

        if drain > 0:
            threading.Event().wait(drain)  # keep serving while load balancers move away
        # gRPC cancels the calls still running when its stop grace runs out: a little before the bound, so that
        # the last wait below (until the bound) sees it done; ending both at the bound raced, and a hung call let
        # go just after the shutdown returned could still answer its client OK.
        stopped = self._grpc.stop(max(0.0, left() - finish / 2)) if self._grpc is not None else None
        if self._frontends is not None:  # their listeners close first; their calls in progress go on here
            self._frontends.stop_listening(max(0.0, left() - finish / 2))
        log_event(_LOG, "shutdown_closed_to_new_calls", calls=self.calls.active, grace_seconds=grace)
        # The reaper retires nothing more; a retirement it is in the middle of finishes on its own (its teardown
        # can be slow), and must not hold up the steps below: it is not waited for here.
        self.residency.stop(timeout=0.0)
        self.control.stop_polling()  # no scan starts after this; one under way is joined below
        if not self.calls.wait_idle(max(0.0, started + drain + grace - time.monotonic())):
            log_event(_LOG, "shutdown_grace_over", calls=self.calls.active)
            for entry in self.registry.entries():
                entry.admission.close()
            self.calls.cancel_all(SHUTDOWN)
            self.calls.wait_idle(left(margin))
        abandoned_calls = self.calls.active
        if abandoned_calls:
            log_event(_LOG, "shutdown_calls_abandoned", calls=abandoned_calls)
        if not self.residency.stop(timeout=left(margin)):
            log_event(_LOG, "shutdown_reaper_abandoned")
        self.control.stop(timeout=left(margin))  # before closing: a scan's load must not open an engine after it
        closed, abandoned_models = self.registry.close_idle_models()
        if self.shared_memory is not None:
            self.shared_memory.close()  # regions an abandoned call still holds stay mapped until it lets go
        if abandoned_models:
            log_event(_LOG, "shutdown_engines_left_open", models=abandoned_models)
        if stopped is not None:
            stopped.wait(left(margin))
        if self._frontends is not None:  # every call has ended (or was abandoned): the front ends exit
            self._frontends.close(left(margin))
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self.timers.close()
        self.trace_output.close()  # after the calls ended: their traces are written and exported
        self.metrics.stop()  # last: a scrape could watch the whole shutdown
        self.report = ShutdownReport(abandoned_calls, abandoned_models, closed, time.monotonic() - started)
        log_event(_LOG, "shutdown_done", seconds=self.report.seconds, closed_models=len(closed))
        self._shutdown_done.set()
        return self.report

    def stop(self, grace: float | None = None) -> ShutdownReport:
        """Shut down without a drain period (see `shutdown`)."""
        return self.shutdown(drain_seconds=0.0, grace=grace)

    def wait(self) -> None:
        if self._grpc is not None:
            self._grpc.wait_for_termination()
        elif self._frontends is not None:
            self._shutdown_done.wait()


class StartupFailures:
    """The models whose startup load failed (their `not_loaded_at_startup` events), noted from construction until
    `close`, for --exit-on-error. The listener only appends to a list (Events.subscribe's rule: never block)."""

    def __init__(self, events: Events) -> None:
        self._names: list[str] = []
        self._open = True
        events.subscribe(self._note)

    def _note(self, event: str, model: str, fields: Mapping[str, object]) -> None:
        if self._open and event == "not_loaded_at_startup":
            self._names.append(model)

    def close(self) -> list[str]:
        """Stop noting; the models noted, each once, in the order they failed."""
        self._open = False
        return list(dict.fromkeys(self._names))


def temporary_folder() -> Path:
    """The system temporary folder (tempfile's choice: $TMPDIR, $TEMP, $TMP, else /tmp), found without touching the
    disk. tempfile.gettempdir() writes a probe file into each candidate and raises FileNotFoundError when none is
    writable, as on a read-only root filesystem; a server that never loads with files must start there all the
    same (a load with files then fails naming the folder: give --model-files-dir a mounted volume)."""
    if tempfile.tempdir is not None:  # set by the program (a test) or by an earlier gettempdir()
        return Path(tempfile.tempdir)
    for variable in ("TMPDIR", "TEMP", "TMP"):
        if os.environ.get(variable):
            return Path(os.environ[variable])
    return Path("/tmp")


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
