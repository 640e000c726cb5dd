"""The rate limiter's pool of resources (`--rate-limit execution_count`; docs/lifecycle.md, "Rate limiter").

A model's slots (Triton's instances) may need resources to run (config.pbtxt `instance_group[0].rate_limiter`,
engine/config/rate_limiter.py). A slot granted by its model's admission takes them here where its run begins
(service/core/lifecycle.py `acquire_lease`, the batch leader in service/core/batching.py) and gives them back
with its lease (service/core/lease.py), so two models sharing a resource of count 1 never run at once.

* **Availability**, as tritonserver 2.51's (asked in tests/differential/test_rate_limiter.py): a resource named by
  `--rate-limit-resource name:count[:device]` (names as written) has the most the flags that apply give (per
  device, or for the one device given; the device is ignored for a `global` resource). Without any such flag, a
  resource has the most any loaded model needs. Once one is given, a resource no flag gives (for the device,
  unless global) has none: a model needing it fails to load. slotserve's slots all count as device 0
  (instance_group kind and gpus are ignored), as Triton's instances on device 0 see it.
* **Load-time errors** (`register`, ModelLoadError with Triton's words): a model that needs more of a resource
  than the command line gives, or that names a resource `global` where a loaded model has it per device (or the
  reverse).
* **Order**: waiters are served one at a time from the head, never past a waiter whose resources are not free
  (no barging: a newcomer takes its resources at once only if nobody waits), and resources freed are *handed* to
  the head under the lock. The head is the waiter with the least `max(priority, 1) * runs` (runs: how many times
  its model took resources so far, counted at arrival), earliest arrival among equals: Triton's
  `execution_count` weighing, where priority 2 gets half the turns of priority 1 and models take turns. With one
  priority and one model this is plain FIFO. A model registered later starts level with the least-run model
  (slotserve's choice: from 0 it would take every turn until it caught up).
* **Deadlines**: a wait ends at the request's deadline (ResourcesBusy, naming the resources that were not free)
  or when its CancelToken fires (RequestCancelled); the deadline is the request's (None: no limit, as admission).
  A BLS call or ensemble step made by a running request waits like any request: a caller that holds what its
  callee needs (Triton core#448) fails at its deadline with the resource named, it never hangs past it.

Locking: `ResourcePool._lock` guards every table below; a leaf (nothing is taken under it, and it is never held
across a wait: a waiter blocks on its own waker lock, released by whoever hands it the resources).
"""

from __future__ import annotations

import bisect
import enum
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from engine.config.rate_limiter import RateLimiterSpec, ResourceNeed
from engine.errors import ModelLoadError
from engine.interface import CancelToken

from .blocking import blocking_wait
from .errors import RequestCancelled, ServerBusy

# slotserve runs every slot as device 0 (instance_group kind and gpus are not applied).
SLOT_DEVICE = 0
_GLOBAL = -1  # the device of a global resource's one pool


class RateLimitMode(enum.StrEnum):
    """`--rate-limit`: off ignores every rate_limiter block (tritonserver's default); execution_count applies them."""

    OFF = "off"
    EXECUTION_COUNT = "execution_count"


@dataclass(frozen=True)
class ResourceFlag:
    """One `--rate-limit-resource name:count[:device]` (device None: every device)."""

    name: str
    count: int
    device: int | None = None


def parse_resource_flag(text: str) -> ResourceFlag:
    """`name:count[:device]`, as tritonserver reads it. Raises ValueError naming what is wrong."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(f"'{text}': expected <name>:<count> or <name>:<count>:<device>")
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise ValueError(f"'{text}': the count and device must be integers") from None
    if count < 0 or (device is not None and device < 0):
        raise ValueError(f"'{text}': the count and device must not be negative")
    return ResourceFlag(parts[0], count, device)


class ResourcesBusy(ServerBusy):
    """A run's resources were not free before its request's deadline (UNAVAILABLE, reason server_busy)."""


class WaiterState(enum.Enum):
    """A request's turn for resources. QUEUED -> GRANTED -> RELEASED; QUEUED -> EXPIRED | CANCELLED;
    arrival -> GRANTED (nobody waiting, resources free)."""

    QUEUED = "queued"
    GRANTED = "granted"
    RELEASED = "released"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


_NEXT = {
    WaiterState.QUEUED: {WaiterState.GRANTED, WaiterState.EXPIRED, WaiterState.CANCELLED},
    WaiterState.GRANTED: {WaiterState.RELEASED},
}

_Key = tuple[str, int]  # (resource name, device; _GLOBAL for a global resource)


@dataclass(eq=False)
class Grant:
    """One run's claim on resources: queued, then granted (holding `needs`), then released (`release`, once)."""

    pool: ResourcePool
    model: str
    needs: Mapping[_Key, int]
    order: tuple[int, int]  # (weighted runs, arrival): smaller is served first
    state: WaiterState = WaiterState.QUEUED
    waker: threading.Lock | None = field(default=None, repr=False)

    def move(self, to: WaiterState) -> None:
        if to not in _NEXT.get(self.state, set()):
            raise RuntimeError(f"resource grant of model '{self.model}': {self.state.value} -> {to.value}")
        self.state = to

    def release(self) -> None:
        """Give the resources back (idempotent; nothing for a grant that was never granted). Never blocks."""
        self.pool.release(self)


class ResourcePool:
    """Every resource of the server, the models that need them, and the runs waiting for them. Thread-safe."""

    def __init__(self, flags: Iterable[ResourceFlag] = (), clock: Callable[[], float] = time.monotonic) -> None:
        self._flags = tuple(flags)
        self._clock = clock
        self._lock = threading.Lock()  # guards: _models, _in_use, _waiting, _runs, _arrivals
        self._models: dict[str, RateLimiterSpec] = {}  # registered models ("name/version") and what they need
        self._in_use: dict[_Key, int] = {}
        self._waiting: list[Grant] = []  # sorted by Grant.order
        self._runs: dict[str, int] = {}  # times each model took its resources
        self._arrivals = itertools.count()

    # ---- models ---------------------------------------------------------------------------------------------

    def register(self, model: str, spec: RateLimiterSpec) -> None:
        """A model's slots are about to load with `spec`'s needs. Raises ModelLoadError, registering nothing,
        when the command line gives fewer of a resource than it needs, or when a registered model has one of its
        resources global where it is per device (or the reverse). Registering a model again replaces its needs."""
        with self._lock:
            for need in spec.resources:
                self._check_kind_locked(model, need)
                explicit = self._explicit(need)
                if explicit is not None and explicit < need.count:
                    raise ModelLoadError(
                        f'Resource count for "{need.name}" is limited to {explicit} which will prevent scheduling '
                        f"of one or more model instances, the minimum required count is {need.count}"
                    )
            if model not in self._runs:  # a newcomer starts level with the least-run model, not at 0: it would
                # otherwise take every turn until it caught up with models that ran for hours
                self._runs[model] = min((self._runs[other] for other in self._models if other in self._runs), default=0)
            self._models[model] = spec

    def unregister(self, model: str) -> None:
        """The model's slots are gone: its needs no longer count towards a resource's default availability."""
        with self._lock:
            self._models.pop(model, None)

    def _check_kind_locked(self, model: str, need: ResourceNeed) -> None:
        for other, spec in self._models.items():
            if other == model:
                continue
            if any(theirs.name == need.name and theirs.shared != need.shared for theirs in spec.resources):
                raise ModelLoadError(
                    f'Resource "{need.name}" is present as both global and device-specific resource in the model '
                    "configuration."
                )

    def _explicit(self, need: ResourceNeed) -> int | None:
        """What the command line gives of `need`'s resource on the slots' device (None: no flag at all, the
        default applies). As Triton 2.51's resource manager: the most any applicable flag gives (for a global
        resource every flag of its name, whatever its device; otherwise those for the device and for every
        device), names as written, and 0 for a resource no flag gives once any flag is given."""
        if not self._flags:
            return None
        applicable = [
            flag.count
            for flag in self._flags
            if flag.name == need.name and (need.shared or flag.device in (None, SLOT_DEVICE))
        ]
        return max(applicable, default=0)

    def _available_locked(self, key: _Key) -> int:
        name = key[0]
        shared = key[1] == _GLOBAL
        explicit = self._explicit(ResourceNeed(name, 0, shared))
        if explicit is not None:
            return explicit
        return max(
            (need.count for spec in self._models.values() for need in spec.resources if need.name == name),
            default=0,
        )

    def available(self) -> dict[str, int]:
        """Each resource's availability now, by name (for tests and the status log)."""
        with self._lock:
            keys = {_key(need) for spec in self._models.values() for need in spec.resources}
            return {name: self._available_locked((name, device)) for name, device in sorted(keys)}

    # ---- runs -----------------------------------------------------------------------------------------------

    def arrive(self, model: str) -> Grant:
        """A run of `model` asks for its resources without waiting: the grant is GRANTED when nobody waits and
        they are free (or the model needs none), QUEUED otherwise (its waker held, released when it is granted).
        A model never registered needs nothing."""
        with self._lock:
            spec = self._models.get(model)
            needs = {_key(need): need.count for need in spec.resources if need.count > 0} if spec else {}
            weight = max(spec.priority, 1) if spec else 1
            grant = Grant(self, model, needs, (weight * self._runs.get(model, 0), next(self._arrivals)))
            if not needs or (not self._waiting and self._fits_locked(grant)):
                self._grant_locked(grant)
                return grant
            grant.waker = threading.Lock()
            grant.waker.acquire()
            bisect.insort(self._waiting, grant, key=lambda waiting: waiting.order)
            self._dispatch_locked()  # it may sort first, and fit
            return grant

    def acquire(self, model: str, deadline: float | None, cancel: CancelToken | None = None) -> Grant:
        """Take `model`'s resources for one run, waiting in order until they are free. Returns the GRANTED grant;
        the caller must `release` it. Blocks (bounded by `deadline`, monotonic; None: no limit) without holding
        the lock. Raises ResourcesBusy at the deadline (naming the resources that were not free) and
        RequestCancelled when `cancel` fires first; the caller holds nothing then."""
        grant = self.arrive(model)
        if grant.state is WaiterState.GRANTED:
            return grant
        return self._wait(grant, deadline, cancel)

    def _wait(self, grant: Grant, deadline: float | None, cancel: CancelToken | None) -> Grant:
        waker = grant.waker
        assert waker is not None  # a queued grant has one

        def on_cancel() -> None:
            self._withdraw(grant, WaiterState.CANCELLED)

        if cancel is not None:
            cancel.add_callback(on_cancel)
        try:
            while True:
                timeout = -1.0 if deadline is None else max(0.0, deadline - self._clock())
                with blocking_wait:
                    woken = waker.acquire(timeout=timeout)
                if woken or grant.state is not WaiterState.QUEUED:
                    break
                if deadline is not None and self._clock() >= deadline:
                    self._withdraw(grant, WaiterState.EXPIRED)
        finally:
            if cancel is not None:
                cancel.remove_callback(on_cancel)
        if grant.state is WaiterState.GRANTED:
            return grant
        if grant.state is WaiterState.CANCELLED:
            raise RequestCancelled("the caller gave up while its run waited for rate limiter resources")
        raise ResourcesBusy(self._busy_message(grant))

    def _withdraw(self, grant: Grant, to: WaiterState) -> None:
        """A queued grant leaves (deadline, cancel); the waiters behind it may fit now. Wakes its own thread."""
        with self._lock:
            if grant.state is not WaiterState.QUEUED:
                return
            grant.move(to)
            self._waiting.remove(grant)
            self._dispatch_locked()
        assert grant.waker is not None  # only a queued grant is withdrawn
        grant.waker.release()  # only the one call that moved it out of QUEUED gets here

    def release(self, grant: Grant) -> None:
        """Give a granted run's resources back and hand them to the waiters they now fit (idempotent)."""
        with self._lock:
            if grant.state is not WaiterState.GRANTED:
                return
            grant.move(WaiterState.RELEASED)
            for key, count in grant.needs.items():
                self._in_use[key] -= count
            self._dispatch_locked()

    def _fits_locked(self, grant: Grant) -> bool:
        return all(
            self._in_use.get(key, 0) + count <= self._available_locked(key) for key, count in grant.needs.items()
        )

    def _grant_locked(self, grant: Grant) -> None:
        grant.move(WaiterState.GRANTED)
        for key, count in grant.needs.items():
            self._in_use[key] = self._in_use.get(key, 0) + count
        self._runs[grant.model] = self._runs.get(grant.model, 0) + 1

    def _dispatch_locked(self) -> None:
        """Hand freed resources to the head of the queue while it fits; never past a head that does not."""
        while self._waiting and self._fits_locked(self._waiting[0]):
            grant = self._waiting.pop(0)
            self._grant_locked(grant)
            assert grant.waker is not None
            grant.waker.release()  # a lock released under our lock: the waiter's thread runs once we let go

    def _busy_message(self, grant: Grant) -> str:
        with self._lock:
            short = []
            for (name, device), count in sorted(grant.needs.items()):
                available = self._available_locked((name, device))
                free = max(0, available - self._in_use.get((name, device), 0))
                short.append(f"'{name}' (needs {count}, {free} of {available} free)")
        model = grant.model.rsplit("/", 1)[0]
        return (
            f"model '{model}': rate limiter resource {', '.join(short)} not free before the request's "
            "deadline (held by running requests: a BLS caller or ensemble step holding what its callee needs "
            "waits until its deadline)"
        )

    def queued(self) -> int:
        """Runs waiting for resources now."""
        with self._lock:
            return len(self._waiting)


def _key(need: ResourceNeed) -> _Key:
    return (need.name, _GLOBAL if need.shared else SLOT_DEVICE)


def model_key(name: str, version: str) -> str:
    """How the pool names a model's version."""
    return f"{name}/{version}"


__all__ = [
    "Grant",
    "RateLimitMode",
    "ResourceFlag",
    "ResourcePool",
    "ResourcesBusy",
    "WaiterState",
    "model_key",
    "parse_resource_flag",
]
