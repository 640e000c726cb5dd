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

Tokens and TLS: pass the server's options (`management_token=`, `inference_token=`, `tls_cert=`, `tls_key=`,
`tls_client_ca=`) and `running.client` / `running.management` come configured to match: they send the tokens,
and connect with TLS trusting `tls_ca` (default: the server's own certificate, which suits a self-signed one),
presenting `tls_client_cert` + `tls_client_key` for mutual TLS. `running.client_options` holds the keyword
arguments they were built with, to open more clients the same way:

    with serve(repo, tls_cert=cert, tls_key=key, tls_ca=ca, inference_token="t") as running:
        other = InferenceClient(running.address, **running.client_options)

The address is 127.0.0.1, so the server's certificate must name IP 127.0.0.1, or pass `tls_server_name`
(e.g. "localhost") to check it against that name.

Note: tritonclient registers its own copy of the protocol's .proto files in protobuf's default pool; it cannot
be imported into the same process as slotserve's generated code. Drive a server started here with
`running.client`, or run tritonclient in a subprocess against `running.address`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.interface import Backend

from .options import ServerOptions
from .server import Server

if TYPE_CHECKING:  # the client package is imported when a server starts, not with this module
    from client import InferenceClient, ManagementClient


@dataclass
class RunningServer:
    address: str  # host:port to dial
    port: int
    server: Server
    client: InferenceClient
    management: ManagementClient
    client_options: dict[str, Any] = field(default_factory=dict, repr=False)  # tokens and TLS of both clients


@contextlib.contextmanager
def serve(
    model_repository: str | Path,
    *,
    backends: Mapping[str, Backend] | None = None,
    stop_grace: float = 5.0,
    tls_ca: str | Path | bytes | None = None,
    tls_client_cert: str | Path | bytes | None = None,
    tls_client_key: str | Path | bytes | None = None,
    tls_server_name: str | None = None,
    **options: Any,
) -> Iterator[RunningServer]:
    """Start a server on 127.0.0.1:<free port> with `options` (the fields of ServerOptions, e.g.
    parallel_jobs=2, allow_management=True, load_at_startup=False, management_token="t", tls_cert=path).
    `backends` adds or replaces backends by name (for example a FixtureBackend with the test's
    FixtureControls). Blocks until the server is ready. The `tls_*` arguments configure the clients (see the
    module's docstring); raises RuntimeError (tls.TLSConfigError) for unusable server TLS files.
    """
    from client import InferenceClient, ManagementClient

    options.setdefault("enable_test_backends", True)  # the harness is for tests: fixture models load
    settings = ServerOptions(
        model_repository=Path(model_repository),
        host="127.0.0.1",
        port=options.pop("port", 0),
        extra_backends=dict(backends or {}),
        **options,
    )
    # ServerOptions keeps only the tokens' digests; the clients get the strings the caller passed.
    client_options = _client_options(
        settings,
        options.get("inference_token"),
        options.get("management_token"),
        tls_ca,
        tls_client_cert,
        tls_client_key,
        tls_server_name,
    )
    server = Server(settings)
    server.start()
    address = f"127.0.0.1:{server.port}"
    clients: list[InferenceClient | ManagementClient] = []
    try:  # a client that cannot be built (an unreadable TLS file) still stops the server
        inference = InferenceClient(address, **client_options)
        clients.append(inference)
        management = ManagementClient(address, **_management_options(client_options))
        clients.append(management)
        assert server.port is not None  # set by start()
        yield RunningServer(address, server.port, server, inference, management, client_options)
    finally:
        for client in clients:
            client.close()
        server.stop(grace=stop_grace)


def _client_options(
    settings: ServerOptions,
    inference_token: object,
    management_token: object,
    tls_ca: str | Path | bytes | None,
    tls_cert: str | Path | bytes | None,
    tls_key: str | Path | bytes | None,
    server_name: str | None,
) -> dict[str, Any]:
    """InferenceClient keywords that match the server: its tokens (as strings; "" sends none, so the
    environment's tokens never leak into a test) and TLS."""
    for token in (inference_token, management_token):
        if token is not None and not isinstance(token, str):
            raise TypeError("serve() needs tokens as strings, to give them to its clients")
    options: dict[str, Any] = {"token": inference_token or "", "management_token": management_token or ""}
    if settings.tls_cert is not None:
        options.update(
            tls_ca=tls_ca if tls_ca is not None else settings.tls_cert,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_server_name=server_name,
        )
    elif any(value is not None for value in (tls_ca, tls_cert, tls_key, server_name)):
        raise ValueError("client TLS settings given for a server without tls_cert")
    return options


def _management_options(client_options: dict[str, Any]) -> dict[str, Any]:
    """The same settings under ManagementClient's names (its `token` is the management token)."""
    options = dict(client_options)
    options["inference_token"] = options.pop("token")
    options["token"] = options.pop("management_token")
    return options


try:
    import pytest
except ImportError:  # pytest is only needed for the fixture
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def slotserve() -> Iterator[Callable[..., RunningServer]]:
        """A factory: `slotserve(repository, **options) -> RunningServer`; every server stops after the test."""
        with contextlib.ExitStack() as stack:

            def start(model_repository: str | Path, **options: Any) -> RunningServer:
                return stack.enter_context(serve(model_repository, **options))

            yield start
