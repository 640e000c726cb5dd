"""Typed messages between the server and a python-model worker (engine/python/backend.py <-> worker.py).

The messages that say which request they belong to are records here, read by field, never by position. Older
messages still travel as tuples tagged by a string (see engine/python/transport.py's list); they move here as
they change. Each record is a NamedTuple: pickle writes it as its class and its fields, a few microseconds a
message, and both processes import this module.

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


class Execute(NamedTuple):
    """Run `requests` (each a dict of its tensors' descriptors in the lane's request segment, its requested outputs and
    what it says about itself) as one execute call numbered `run`, on lane `lane`. `segments` names the lane's
    segments that were replaced since the lane's last call ({"request"|"response": (path, size)}), which the worker
    maps before it reads the requests."""

    run: int
    lane: int
    requests: list[dict]
    segments: dict[str, tuple[str, int]]


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
