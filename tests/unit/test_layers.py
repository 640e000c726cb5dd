"""The layers stay what the folders say (docs/architecture.md): the server core knows nothing of
gRPC, protobuf messages or the transport above it, and the engines know nothing of the server. Read from each
module's own import statements (every import, also those inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = sorted((ROOT / "service" / "core").glob("*.py"))
ENGINE = sorted((ROOT / "engine").rglob("*.py"))

# What the core may not reach: gRPC, protobuf messages, and anything of service/ outside service/core/ (the wire,
# the servicers, the server, shared memory, the status table, metrics).
NOT_IN_CORE = ("grpc", "generated", "google.protobuf")


def imported_modules(path: Path, package: str) -> set[str]:
    """Absolute names of every module `path` imports (relative imports resolved against `package`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _forbidden(names: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in prefixes))


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_the_core_imports_nothing_of_the_transport(path):
    assert CORE, "service/core/ is empty"
    names = imported_modules(path, "service.core")
    assert _forbidden(names, NOT_IN_CORE) == []
    outside = sorted(n for n in names if n.startswith("service.") and not n.startswith("service.core"))
    assert outside == [], f"{path.name} reaches out of service/core/"


def test_importing_the_core_loads_nothing_else_of_the_server():
    import subprocess
    import sys

    code = (
        "import sys, service.core.lifecycle, service.core.registry, service.core.residency; "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('service.', 'grpc', 'generated')) "
        "and not m.startswith('service.core'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    # The engines read config.pbtxt into the ModelConfig message (a model-format fact): that much may come along.
    assert set(result.stdout.split()) <= {"generated", "generated.model_config_pb2"}, result.stdout


@pytest.mark.parametrize("path", ENGINE, ids=lambda p: str(p.relative_to(ROOT)))
def test_engines_import_nothing_of_the_server_or_grpc(path):
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    # (The repository reads config.pbtxt into the ModelConfig message, a model-format fact, not the transport.)
    transport = (
        "service",
        "grpc",
        "generated.grpc_service_pb2",
        "generated.grpc_service_pb2_grpc",
        "generated.management_pb2",
        "generated.management_pb2_grpc",
    )
    assert _forbidden(imported_modules(path, package), transport) == []


@pytest.mark.parametrize("module", ["dataplane.py", "stream_requests.py"])
def test_the_dataplane_knows_no_wire_format(module):
    """One admit-and-run path over a neutral request (docs/architecture.md): the dataplane (and a stream's requests in
    flight) import neither gRPC nor protobuf messages nor the modules that speak them (service/transport/wire.py,
    service/transport/tensors.py, the servicers)."""
    names = imported_modules(ROOT / "service" / "request_path" / module, "service.request_path")
    assert (
        _forbidden(
            names, NOT_IN_CORE + ("service.transport.wire", "service.transport.tensors", "service.transport.servicers")
        )
        == []
    )


SERVICE = sorted((ROOT / "service").rglob("*.py"))
MODEL_PRIVATE = {"_lock", "_pool", "_committed", "_state", "_init", "_core"}


@pytest.mark.parametrize("path", SERVICE, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_reaches_into_another_objects_lock_pool_or_admission_core(path):
    """ModelEntry is the only way into a model (docs/architecture.md): outside its own class, nothing reads
    another object's lock, pool, committed configuration, state or admission core (`x._lock`, `entry._pool`,
    `admission._core`); an object touches only its own (`self._lock`)."""
    reached = [
        f"line {node.lineno}: .{node.attr}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr in MODEL_PRIVATE
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    ]
    assert reached == []


# The request path's modules (docs/architecture.md "The request path"): the core, and the dataplane with the
# features it serves through (the response cache, a stream's requests, ensembles, the server's calls to its models).
REQUEST_PATH = [*CORE, *sorted((ROOT / "service" / "request_path").glob("*.py"))]


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def import_graph(paths: list[Path]) -> dict[str, set[str]]:
    """module -> the modules of `paths` it imports (every import, type-checking ones too: a circle of types is a
    circle a reader walks all the same)."""
    names = {_module_name(path): path for path in paths}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        package = name.rsplit(".", 1)[0]
        graph[name] = {module for module in imported_modules(path, package) if module in names and module != name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for following in sorted(graph[node]):
            if following not in index:
                visit(following)
                low[node] = min(low[node], low[following])
            elif following in on_stack:
                low[node] = min(low[node], index[following])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_the_circle_finder_finds_a_circle():
    """The check below can fail: a made-up graph with a circle of three and a line is reported with the three."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_circles(graph) == [["a", "b", "c"]]


def test_no_import_circle_among_the_core_and_the_request_path():
    """Imports inside service/core/, and between the dataplane and the features around it, point one way only (a
    module's readers can read it without the modules that import it): no circle, not even through a
    type-checking import."""
    assert import_circles(import_graph(CORE)) == []
    assert import_circles(import_graph(REQUEST_PATH)) == []
