"""What a registration fixes besides the spec (`ModelSettings`) and what every model shares (`SharedRuntime`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from engine.config.specs import ModelSpec
from engine.interface import Backend

from .errors import BackendNotAvailable
from .events import Events
from .rate_limiter import ResourcePool
from .residency import ColdLoadGuard, Residency


@dataclass(frozen=True)
class ModelSettings:
    """What a registration fixes besides the spec."""

    slots: int  # configured slot count
    explicit_slots: bool  # asked for by the operator (must be honoured) rather than the server default
    admission_timeout: float  # effective seconds, capped by the server ceiling; 0 = unbounded
    source: str = ""
    max_queue: int | None = None  # queued requests of this model (dynamic_batching's max_queue_size); None: server's


@dataclass
class SharedRuntime:
    """What every model entry shares: backends, the cold-load guard, residency policy, limits and clock."""

    backends: Mapping[str, Backend]
    max_queue: int = 0
    # --refuse-predicted-wait: refuse at arrival a request whose deadline comes before its predicted turn
    # (service/core/service_rate.py refuse_if_wait_exceeds).
    refuse_predicted_wait: bool = False
    clock: Callable[[], float] = time.monotonic
    cold_loads: ColdLoadGuard | None = None  # None: loads are not limited
    residency: Residency | None = None  # None: no resident-model limit or budget
    events: Events = field(default_factory=Events)  # lifecycle events: logged, and counted for the metrics
    # --model-control-mode (service/request_path/model_control.py): "" lets a request load an unloaded model; otherwise
    # requests never load one and are refused with this text (it names the mode and what loads the model).
    lazy_load_refusal: str = ""
    rate_limiter: ResourcePool | None = None  # --rate-limit execution_count (service/core/rate_limiter.py); None: off

    def backend(self, spec: ModelSpec) -> Backend:
        try:
            return self.backends[spec.backend]
        except KeyError:
            raise BackendNotAvailable(backend_missing_message(spec.name, spec.backend)) from None


# Backends that exist only to make tests deterministic (engine/testing/): named so that a production server refuses
# them with the flag that enables them, instead of calling them unknown.
TEST_BACKENDS = ("fixture",)


def backend_missing_message(model: str, backend: str) -> str:
    if backend in TEST_BACKENDS:
        return (
            f"model '{model}': backend '{backend}' is a test backend; this server runs it only when started "
            "with --enable-test-backends"
        )
    return f"model '{model}': backend '{backend}' is not available on this server"


__all__ = ["TEST_BACKENDS", "ModelSettings", "SharedRuntime", "backend_missing_message"]
