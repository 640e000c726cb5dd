"""The leases a model hands out: a request's `Lease` (one slot of its published pool), a manager's `ExclusiveLease`
(the whole model) and a bulk unload's `Barrier` (an exclusive lease queued without waiting).

A lease is made by its model (service/core/lifecycle.py `ModelEntry`), which it knows only as a `LeaseOwner`: the
model's name, its admission, and the calls that end a lease. Releasing is idempotent and never blocks, except that
a lease whose run found its device failed retires the pool (`retire_failed_pool`: it waits for the earlier leases).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from engine.errors import DeviceFailedError
from engine.interface import CancelToken, Context, ModelMetadata, Outputs

from .admission import AdmissionController, Ticket, TicketState, refusal_error
from .blocking import blocking_wait
from .pool import SlotPool
from .rate_limiter import Grant, ResourcePool, model_key


class LeaseOwner(Protocol):
    """What a lease knows of its model (ModelEntry)."""

    @property
    def name(self) -> str: ...

    @property
    def admission(self) -> AdmissionController: ...

    def end_lease(self, ticket: Ticket[Any]) -> None:
        """A request's lease ended: its ticket goes back to admission."""
        ...

    def release_exclusive(self, ticket: Ticket[Any]) -> None:
        """A manager's lease (or a granted barrier) ended."""
        ...

    def retire_failed_pool(self, pool: SlotPool, error: DeviceFailedError) -> None:
        """Take `pool` out of service after its device failed under a lease (blocks for the drain)."""
        ...

    @property
    def resources(self) -> ResourcePool | None:
        """The server's rate limiter (None: `--rate-limit off`)."""
        ...


class Lease:
    """A granted request slot, bound to the published pool and one context of it.

    Release it exactly once (`release` is idempotent); until then the pool cannot be torn down. With the rate
    limiter on, its run's resources are taken by `take_resources` once the slot is granted, and given back first
    when it is released (the slot stays busy while it waits for them, as Triton's instance does).
    """

    __slots__ = ("entry", "ticket", "pool", "context", "queue_ns", "_released", "_device_failure", "_grant")

    def __init__(self, entry: LeaseOwner, ticket: Ticket[Any], pool: SlotPool, context: Context, queue_ns: int) -> None:
        self.entry = entry
        self.ticket = ticket
        self.pool = pool
        self.context = context
        self.queue_ns = queue_ns
        self._released = False
        self._device_failure: DeviceFailedError | None = None  # set when the backend's device failed under it
        self._grant: Grant | None = None  # the run's rate limiter resources, once taken

    def take_resources(self, deadline: float | None, cancel: CancelToken | None) -> None:
        """Take the resources the model's slots need from the server's rate limiter (nothing when it is off or
        the model needs none), waiting in the limiter's order until `deadline`. Raises ResourcesBusy (naming the
        resources) or RequestCancelled, holding no resources then; the caller still holds the lease and
        releases it."""
        limiter = getattr(self.entry, "resources", None)
        if limiter is None or self.pool.spec.rate_limiter is None or self._grant is not None:
            return  # (a model that names no resources never touches the limiter's lock)
        self._grant = limiter.acquire(model_key(self.entry.name, self.pool.spec.version), deadline, cancel)

    @property
    def metadata(self) -> ModelMetadata:
        return self.pool.metadata

    @property
    def version(self) -> str:
        return self.pool.spec.version

    @property
    def streaming(self) -> bool:
        """Whether the model answers a request with a stream of responses (execute_stream)."""
        return self.pool.primary.streaming

    def execute(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], cancel: CancelToken) -> Outputs:
        """Run the engine on this lease's context. On a model of several slots the thread waits on the engine
        meanwhile (blocking_wait: its handler pool may start another call, which may take another slot). A wait
        in a one-slot model's engine frees nothing another call of the model could use: stepping aside there
        would only wake another runner to queue behind it (a wake-up a request, measured as a loss on `simple`)."""
        try:
            if self.pool.request_slots > 1:
                with blocking_wait:
                    return self.context.execute(inputs, outputs, cancel)
            return self.context.execute(inputs, outputs, cancel)
        except DeviceFailedError as error:  # the device failed: the pool is retired when this lease ends
            self._device_failure = error
            raise

    def execute_stream(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], cancel: CancelToken
    ) -> Iterator[Outputs]:
        """The engine's answers, one by one; the thread waits on the engine for each (blocking_wait, taken for
        each answer and never across a yield: a generator may be closed on another thread)."""
        answers: Iterator[Outputs] = iter(())
        try:
            answers = self.context.execute_stream(inputs, outputs, cancel)  # a device failure here is caught too
            while True:
                with blocking_wait:
                    answer = next(answers, None)  # an answer is a dict of outputs, never None
                if answer is None:
                    return
                yield answer
        except DeviceFailedError as error:  # the device failed: the pool is retired when this lease ends
            self._device_failure = error
            raise
        finally:  # closed early (the client went away): the engine's stream is closed with it, as `yield from` did
            close = getattr(answers, "close", None)  # a generator's; a plain iterator has nothing to close
            if close is not None:
                close()

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        if self._grant is not None:  # first: a run of another model waiting for them may start now
            self._grant.release()
        self.pool.give_back(self.context)
        self.entry.end_lease(self.ticket)
        if self._device_failure is not None:
            self.entry.retire_failed_pool(self.pool, self._device_failure)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class ExclusiveLease:
    """A manager's hold on a whole model (a granted MANAGER ticket): every earlier lease has ended and no later
    one is granted until it is released. Use it as a context manager (`with entry.exclusive(...):`); `release`
    is idempotent."""

    __slots__ = ("entry", "_ticket", "_released")

    def __init__(self, entry: LeaseOwner, ticket: Ticket[Any]) -> None:
        self.entry = entry
        self._ticket = ticket
        self._released = False

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self.entry.release_exclusive(self._ticket)

    def __enter__(self) -> ExclusiveLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


Owner = TypeVar("Owner", bound=LeaseOwner)


class Barrier(Generic[Owner]):
    """A bulk unload's exclusive barrier on one model, queued without waiting (ModelEntry.post_barrier). Its
    `on_change` callback reports it when it is granted or refused; the bulk unload then unloads under it, or
    gives up. `withdraw` ends it in any state (idempotent)."""

    __slots__ = ("entry", "_ticket", "_ended")

    def __init__(self, entry: Owner) -> None:
        self.entry = entry
        self._ticket: Ticket[Any] | None = None
        self._ended = False

    def attach(self, ticket: Ticket[Any]) -> None:
        """The barrier's ticket, once its model queued it (ModelEntry.post_barrier, under the model lock)."""
        self._ticket = ticket

    @property
    def decided(self) -> bool:
        """Granted or refused already (a queued barrier is reported by its callback later)."""
        return self._ticket is not None and self._ticket.state is not TicketState.QUEUED

    @property
    def granted(self) -> bool:
        return self._ticket is not None and self._ticket.state is TicketState.GRANTED

    @property
    def refused(self) -> bool:
        return self._ticket is not None and self._ticket.state is TicketState.REFUSED

    def refusal(self) -> Exception:
        """The error a refused barrier's bulk unload raises (ShuttingDown: the queue closed under it)."""
        assert self._ticket is not None
        return refusal_error(self._ticket, self.entry.name)

    def withdraw(self) -> None:
        """Leave the queue if still queued; release if granted. Never blocks."""
        if self._ended or self._ticket is None:
            return
        self._ended = True
        self.entry.admission.cancel_queued(self._ticket)
        if self._ticket.state is TicketState.GRANTED:
            self.entry.release_exclusive(self._ticket)

    def __enter__(self) -> Barrier[Owner]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.withdraw()
