"""Run slotserve inside your own tests.

    from service.testing import serve

    def test_my_model(tmp_path):
        with serve("path/to/model_repository", parallel_jobs=2) as running:
            outputs = running.client.infer("my_model", {"INPUT0": array})
            assert running.management.get("my_model").loaded

`serve` starts a real gRPC server on a free port of 127.0.0.1 in this process, waits until it is ready,
yields a `RunningServer` (address, ready `InferenceClient` and `ManagementClient`, and the `Server` itself for
introspection), and shuts it down cleanly when the block ends, even when the test fails.

As a pytest fixture: add `pytest_plugins = ["service.testing"]` to your conftest.py, then

    def test_x(slotserve):
        running = slotserve("path/to/model_repository", allow_management=True)

Every server a test starts through the fixture is stopped at the end of that test.

Note: tritonclient registers its own copy of the protocol's .proto files in protobuf's default pool; it cannot
be imported into the same process as slotserve's generated code. Drive a server started here with
`running.client`, or run tritonclient in a subprocess against `running.address`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from engine.interface import Backend

from .options import ServerOptions
from .server import Server


@dataclass
class RunningServer:
    address: str  # host:port to dial
    port: int
    server: Server
    client: object  # client.InferenceClient
    management: object  # client.ManagementClient


@contextlib.contextmanager
def serve(model_repository: str | Path, *, backends: Mapping[str, Backend] | None = None,
          stop_grace: float = 5.0, **options) -> Iterator[RunningServer]:
    """Start a server on 127.0.0.1:<free port> with `options` (the fields of ServerOptions, e.g.
    parallel_jobs=2, allow_management=True, load_at_startup=False). `backends` adds or replaces backends by
    name (for example a FixtureBackend with the test's FixtureControls). Blocks until the server is ready.
    """
    from client import InferenceClient, ManagementClient

    settings = ServerOptions(model_repository=Path(model_repository), host="127.0.0.1",
                             port=options.pop("port", 0), extra_backends=dict(backends or {}), **options)
    server = Server(settings)
    server.start()
    address = f"127.0.0.1:{server.port}"
    client = InferenceClient(address)
    management = ManagementClient(address, token="")
    try:
        yield RunningServer(address, server.port, server, client, management)
    finally:
        client.close()
        management.close()
        server.stop(grace=stop_grace)


try:
    import pytest
except ImportError:  # pytest is only needed for the fixture
    pytest = None

if pytest is not None:
    @pytest.fixture
    def slotserve():
        """A factory: `slotserve(repository, **options) -> RunningServer`; every server stops after the test."""
        with contextlib.ExitStack() as stack:
            def start(model_repository, **options) -> RunningServer:
                return stack.enter_context(serve(model_repository, **options))
            yield start
