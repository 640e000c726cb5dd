"""engine/'s floors (engine/__init__.py): the shared vocabulary (datatypes, errors, tensor_codec), the config reader
(engine/config/), the backend interface (interface.py), the backends. Each module imports only from its own floor
or those below, and no module of engine/ is part of an import circle. Read from each module's own import statements:
every import, also those inside functions and under TYPE_CHECKING (a circle of types is a circle a reader walks)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "engine"

VOCABULARY = ("engine.datatypes", "engine.errors", "engine.tensor_codec")
CONFIG = "engine.config"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(ENGINE.rglob("*.py"))}


def engine_imports(name: str) -> set[str]:
    """The modules of engine/ that module `name` imports (`from . import x` counts as module x; a name imported
    from a module counts as that module)."""
    path = MODULES[name]
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{module}.{alias.name}" in MODULES:
                    found.add(f"{module}.{alias.name}")
                elif module in MODULES:
                    found.add(module)
    found.discard(name)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_circle_finder_finds_a_circle():
    """The finder itself: a circle through three modules and a lone one are told apart."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_engine_is_part_of_an_import_circle():
    graph = {name: engine_imports(name) for name in MODULES}
    assert CONFIG in graph and "engine.interface" in graph, "engine/ is not where this test looks"
    assert circles(graph) == []


@pytest.mark.parametrize("name", [n for n in MODULES if n == CONFIG or n.startswith(CONFIG + ".")])
def test_the_config_reader_imports_no_backend_and_not_the_interface(name):
    """The config reader reads specs; the backends load them. It may use the vocabulary and itself, nothing else
    of engine/ (not the interface, not a backend)."""
    outside = sorted(
        module
        for module in engine_imports(name)
        if module != "engine" and module not in VOCABULARY and not module.startswith(CONFIG)
    )
    assert outside == [], f"{name} imports {outside}"


@pytest.mark.parametrize("name", VOCABULARY)
def test_the_vocabulary_imports_only_itself(name):
    assert engine_imports(name) <= set(VOCABULARY)


def test_the_interface_imports_no_backend():
    allowed = {"engine", *VOCABULARY}
    outside = sorted(m for m in engine_imports("engine.interface") if m not in allowed and not m.startswith(CONFIG))
    assert outside == []


def test_reading_a_repository_loads_no_backend():
    """What `import engine.config.repository` brings along, in a fresh interpreter: no backend module, not the
    interface, and none of the backends' libraries (ONNX Runtime, onnx)."""
    code = (
        "import sys, engine.config.repository, engine.config.warmup; "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('engine.', 'onnx')))))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.split())
    assert loaded, "nothing of engine/ was loaded: the check looks at the wrong names"
    backends = sorted(m for m in loaded if not (m.startswith(CONFIG) or m in VOCABULARY))
    assert backends == []
