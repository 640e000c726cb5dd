"""Typed messages between the server and a python-model worker (engine/python/backend.py <-> worker.py).

The messages that say which request they belong to are records here, read by field, never by position. Older
messages still travel as tuples tagged by a string (see engine/python/transport.py's list); they move here as
they change. Each record is a NamedTuple that both processes import. Pickle writes a NamedTuple as its class and
its fields; Execute, sent for every request, travels as a plain tuple instead (`to_wire`, `from_wire`: its tag and
its fields in order, 6 microseconds less a request on the 2-core test machine, where an add_sub round trip takes
about 150), written and read only by the record itself, as transport.Descriptor does.

    server -> worker  Execute    run the requests laid out in one lane's request segment, as one `execute` call
    worker -> server  Ready      the model initialized: its completed configuration, and what its execute is
    worker -> server  BlsCall    a BLS call made for a request in flight (its run), to run through the server

A *run* is one `execute` call of a worker (its number, unique per worker); a *lane* is one of a worker's requests in
flight at once, each with its own request and response segments and its own words of the cancel board. A worker
serves one lane unless its model overlaps its calls (`async def execute` of a decoupled model: docs/python-models.md).
"""

from __future__ import annotations

from typing import NamedTuple

from .transport import CallRequest

EXECUTE = "execute"  # an Execute's tag on the wire


class Execute(NamedTuple):
    """Run `requests` (each a dict of its tensors' descriptors in the lane's request segment, its requested outputs and
    what it says about itself) as one execute call numbered `run`, on lane `lane`. `segments` names the lane's
    segments that were replaced since the lane's last call ({"request"|"response": (path, size)}), which the worker
    maps before it reads the requests."""

    run: int
    lane: int
    requests: list[dict]
    segments: dict[str, tuple[str, int]]

    def to_wire(self) -> tuple:
        """The message as the pipe carries it: ("execute", run, lane, requests, segments)."""
        return (EXECUTE, *self)

    @classmethod
    def from_wire(cls, wire: tuple) -> Execute:
        return cls._make(wire[1:])


class Ready(NamedTuple):
    """The worker imported model.py and ran `initialize`: `config` is the completed configuration (JSON), and
    `async_execute` says whether the model's `execute` is a coroutine function (`async def`)."""

    config: str
    async_execute: bool


class BlsCall(NamedTuple):
    """A BLS call (`InferenceRequest.exec`/`async_exec`) that a request of `run` made: the server runs it with that
    request's deadline and cancellation and answers ("part", tag, CallReply, final) messages."""

    tag: int
    run: int
    call: CallRequest
