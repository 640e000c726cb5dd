"""Differential tests: the same calls to slotserve and to real Triton (2.51, from nvidia-pytriton, set up by
bench/setup.sh), answers compared. They skip, naming the reason, when Triton is not set up.

tritonclient cannot be imported into a process that holds slotserve's generated protobuf code (both register the
protocol's .proto files in the default pool), so both servers are driven with the generated gRPC stub
(`generated.grpc_service_pb2_grpc.GRPCInferenceServiceStub`): the same request messages go to both, and the
replies are protobuf messages of one type that compare field by field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from generated import grpc_service_pb2_grpc as pb_grpc
from service.testing import serve

from .reference import find_installation, run_triton
from .repositories import Repositories, write_add_sub_repositories

INSTALLATION, MISSING_REASON = find_installation()


@dataclass
class Endpoint:
    """One server under test: its address and a stub on an open channel."""

    name: str  # "triton" or "slotserve", for messages
    address: str
    stub: pb_grpc.GRPCInferenceServiceStub
    metrics_url: str  # Prometheus text over HTTP


def _start_triton(stack: ExitStack, folder: Path, repository: Path, *args: str) -> Endpoint:
    if INSTALLATION is None:
        pytest.skip(MISSING_REASON)
    folder.mkdir(parents=True, exist_ok=True)
    running = stack.enter_context(run_triton(INSTALLATION, repository, folder, *args))
    return Endpoint("triton", running.address, running.stub, running.metrics_url)


def _start_slotserve(stack: ExitStack, repository: Path, **options) -> Endpoint:
    options.setdefault("allow_management", True)  # Triton's repository extension is on by default
    options.setdefault("metrics_port", 0)  # Triton serves metrics by default
    running = stack.enter_context(serve(repository, **options))
    channel = stack.enter_context(grpc.insecure_channel(running.address))
    metrics_url = f"http://127.0.0.1:{running.server.metrics_port}/metrics"
    return Endpoint("slotserve", running.address, pb_grpc.GRPCInferenceServiceStub(channel), metrics_url)


@pytest.fixture
def triton(tmp_path) -> Iterator[Callable[..., Endpoint]]:
    """`triton(repository, *args) -> Endpoint`: real tritonserver on free ports with extra command-line `args`
    (e.g. "--model-control-mode=explicit"), ready; stopped at the end of the test. Skips when not set up."""
    with ExitStack() as stack:
        yield lambda repository, *args: _start_triton(stack, tmp_path / "triton-run", Path(repository), *args)


@pytest.fixture
def slotserve_endpoint() -> Iterator[Callable[..., Endpoint]]:
    """`slotserve_endpoint(repository, **options) -> Endpoint`: slotserve in this process (service.testing.serve,
    management allowed unless told otherwise), ready; stopped at the end of the test."""
    with ExitStack() as stack:
        yield lambda repository, **options: _start_slotserve(stack, Path(repository), **options)


@pytest.fixture
def write_repositories(tmp_path) -> Callable[..., Repositories]:
    """`write_repositories(names=("simple", "simple_int8")) -> Repositories`: the add/sub models, ONNX for
    slotserve and python for Triton (repositories.py)."""
    return lambda names=("simple", "simple_int8"): write_add_sub_repositories(tmp_path / "repositories", names)


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> Iterator[tuple[Endpoint, Endpoint]]:
    """(triton, slotserve) on the same add/sub repository, started once for a module of read-only questions."""
    if INSTALLATION is None:
        pytest.skip(MISSING_REASON)
    root = tmp_path_factory.mktemp("differential")
    repositories = write_add_sub_repositories(root / "repositories")
    with ExitStack() as stack:
        reference = _start_triton(stack, root / "triton-run", repositories.triton)
        ours = _start_slotserve(stack, repositories.slotserve)
        yield reference, ours
