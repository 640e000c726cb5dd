"""Fixtures of the QA port (README.md): each case runs once on Triton 2.51 and once on slotserve.

* `server`: one server per module and kind, on the module's repository (`MODELS`, a mapping of name to
  harness.Model, or a function returning one), started with the module's `TRITON_ARGS` / `SLOTSERVE_OPTIONS`.
  For read-only cases: pytest runs the module's cases kind by kind, so each server starts once.
* `launch`: `launch(models, triton_args=(), **slotserve_options) -> Server` for a case that needs a server of
  its own (a load that fails, a repository that changes, a server that stops); stopped at the end of the case.

Without Triton's venv (CI's clean clone) every case skips, naming the reason, as the other differential tests do.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from service.testing import serve

from ..conftest import INSTALLATION, MISSING_REASON
from ..reference import RunningTriton, _launch, _stop, _tail, free_ports, run_triton
from .harness import KINDS, Model, Server, wait_for, write_repository

CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]  # tritonclient's
DEFAULT_SLOTSERVE = {"allow_management": True, "metrics_port": 0, "parallel_jobs": 1}


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "qa_slotserve_fails(cause): a ported QA case slotserve fails (xfail strict)")
    config.addinivalue_line("markers", "qa_triton_fails(reason): a ported QA case Triton 2.51 fails here (skipped)")


def _kind(item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    return callspec.params.get("server") or callspec.params.get("launch")


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        triton = item.get_closest_marker("qa_triton_fails")
        if triton is not None:
            item.add_marker(pytest.mark.skip(reason=f"Triton 2.51 fails this case here: {triton.args[0]}"))
            continue
        ours = item.get_closest_marker("qa_slotserve_fails")
        if ours is not None and _kind(item) == "slotserve":
            item.add_marker(pytest.mark.xfail(strict=True, reason=ours.args[0]))


@contextlib.contextmanager
def run_triton_live(repository: Path, folder: Path, *args: str) -> Iterator[RunningTriton]:
    """Triton started and live, not necessarily ready (a model that fails to load makes it not ready for good,
    with --exit-on-error=false): reference.run_triton waits for readiness."""
    assert INSTALLATION is not None
    grpc_port, http_port, metrics_port = free_ports(3)
    process, log = _launch(INSTALLATION, repository, folder, args, grpc_port, http_port, metrics_port)
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    try:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        deadline = time.monotonic() + 120
        started = f"Started GRPCInferenceService at 127.0.0.1:{grpc_port}"
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tritonserver did not start:\n{_tail(log)}")
            if started in log.read_text(errors="replace"):
                with contextlib.suppress(grpc.RpcError):
                    if stub.ServerLive(pb.ServerLiveRequest(), timeout=2).live:
                        break
            time.sleep(0.2)  # ordering-free: polls an observable state until a deadline
        yield RunningTriton(
            f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{metrics_port}/metrics", channel, stub, process, log
        )
    finally:
        channel.close()
        _stop(process)


def start(stack: ExitStack, kind: str, repository: Path, folder: Path, triton_args=(), **options) -> Server:
    """Start `kind` on `repository`; stopped when `stack` closes. With "--exit-on-error=false" among
    `triton_args`, Triton is waited for until live only (it may never be ready)."""
    if kind == "triton":
        if INSTALLATION is None:
            pytest.skip(MISSING_REASON)
        folder.mkdir(parents=True, exist_ok=True)
        if "--exit-on-error=false" in triton_args:
            running = stack.enter_context(run_triton_live(repository, folder, *triton_args))
        else:
            running = stack.enter_context(run_triton(INSTALLATION, repository, folder, *triton_args))
        channel = stack.enter_context(grpc.insecure_channel(running.address, options=CHANNEL_OPTIONS))
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        return Server("triton", running.address, stub, running.metrics_url, repository, running.log)
    if INSTALLATION is None:  # the comparison needs both: skip slotserve's run too
        pytest.skip(MISSING_REASON)
    settings = {**DEFAULT_SLOTSERVE, **options}
    ours = stack.enter_context(serve(repository, **settings))
    channel = stack.enter_context(grpc.insecure_channel(ours.address, options=CHANNEL_OPTIONS))
    metrics_url = f"http://127.0.0.1:{ours.server.metrics_port}/metrics"
    return Server("slotserve", ours.address, pb_grpc.GRPCInferenceServiceStub(channel), metrics_url, repository)


def _models(source) -> Mapping[str, Model]:
    return source() if callable(source) else source


@pytest.fixture(scope="module", params=KINDS)
def server(request, tmp_path_factory) -> Iterator[Server]:
    module = request.module
    root = tmp_path_factory.mktemp(f"{module.__name__.rsplit('.', 1)[-1]}-{request.param}")
    repository = write_repository(root / "models", _models(module.MODELS))
    environment = getattr(module, "ENVIRONMENT", {})
    saved = {key: os.environ.get(key) for key in environment}
    os.environ.update(environment)  # the servers (and their model processes) inherit it
    try:
        with ExitStack() as stack:
            triton_args = getattr(module, "TRITON_ARGS", ())
            options = getattr(module, "SLOTSERVE_OPTIONS", {})
            yield start(stack, request.param, repository, root / "run", triton_args, **options)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(params=KINDS)
def launch(request, tmp_path) -> Iterator[Callable[..., Server]]:
    """`launch(models, triton_args=(), **slotserve_options)`: a server of this case's own."""
    with ExitStack() as stack:
        count = iter(range(100))

        def launch_one(models, triton_args=(), **options) -> Server:
            root = tmp_path / f"{request.param}-{next(count)}"
            repository = write_repository(root / "models", _models(models))
            return start(stack, request.param, repository, root / "run", triton_args, **options)

        launch_one.kind = request.param  # type: ignore[attr-defined]
        yield launch_one


@pytest.fixture
def logged(caplog) -> Callable[[Server, str, float], None]:
    """`logged(server, text, seconds=30)`: wait until the server's log has `text` (Triton's log file; slotserve's
    log records, its python workers' output included, in this process); AssertionError after `seconds`."""

    def wait(server: Server, text: str, seconds: float = 30.0) -> None:
        def seen() -> bool:
            if server.log is not None:
                return text in server.log.read_text(errors="replace")
            return text in caplog.text

        wait_for(seen, f"{text!r} in the {server.kind} log", seconds=seconds)

    return wait
