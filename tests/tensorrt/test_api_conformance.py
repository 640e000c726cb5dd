"""Every TensorRT and CUDA-runtime name the backend uses exists in the real modules, in both API generations the
GPU extras install (tensorrt-cu12: TensorRT 10 + cuda-python 12; tensorrt-cu13: TensorRT 11 + cuda-python 13), so a
rename or removal in a TensorRT or cuda-python release fails here rather than on a GPU machine.

The real modules that install without a GPU:
  * `tensorrt_lean` 11 (pip `tensorrt-lean-cu13`, in the dev venv) and 10 (pip `tensorrt-lean-cu12`): the
    runtime names, and the builder-side classes the lean runtime also carries (IOptimizationProfile,
    ITimingCache, MemoryPoolType);
  * the published stubs (pip `tensorrt-stubs`, TensorRT 10.13, installed with --no-deps): builder names (the full
    `tensorrt` with its builder is a download from pypi.nvidia.com that needs no GPU but is not reachable here).
    The stubs are not valid Python in places, so they are read as text, not imported or parsed with `ast`;
  * `cuda.bindings.runtime` and `cuda.bindings.utils` 13 (dev venv) and 12: the CUDA names.
TensorRT 10 and cuda-bindings 12 use the module names of their successors, so `make setup` installs them into a
folder of their own (.venv/trt-api-cu12, pins in tests/tensorrt/api-generation-cu12.txt) that a subprocess imports.
The dev environment pins all of these, so a missing module fails the check, saying which package to install;
SLOTSERVE_ALLOW_MISSING_TRT_MODULES=1 makes it skip instead (a partial environment of one's own).

Checks that need nothing installed: api_names.py and protocols.py agree; the backend's code reaches TensorRT and
CUDA only through listed names; no listed name is one TensorRT 11 removed; the double provides every listed name.
With the real modules installed, the double is also checked to offer nothing the real modules lack.
"""

from __future__ import annotations

import ast
import enum
import importlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from functools import cache, lru_cache
from pathlib import Path

import pytest

from engine.tensorrt import api_names, protocols
from engine.tensorrt.api_names import BUILDER, CUDA_UTILS, CUDART, MODULE, REMOVED_IN_TRT11, RUNTIME
from engine.tensorrt.cuda import STICKY_ERRORS
from engine.testing import tensorrt_double as double

PACKAGE = Path(api_names.__file__).parent
LEAN_PIN = "tensorrt-lean-cu13==11.4.0.106"
STUBS_PIN = "tensorrt-stubs==10.13.0.35.1 (pip install --no-deps)"
CUDA_PIN = "cuda-bindings==13.5.0"
CU12_FOLDER = Path(os.environ.get("SLOTSERVE_TRT_API_CU12") or Path(__file__).parents[2] / ".venv" / "trt-api-cu12")
CU12_PINS = "tests/tensorrt/api-generation-cu12.txt (make setup)"


# ----------------------------------------------------------------------------------------- real modules


@cache
def _import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _missing(message: str) -> None:
    """A pinned module is absent: fail (or skip, where the environment says a partial install is intended)."""
    if os.environ.get("SLOTSERVE_ALLOW_MISSING_TRT_MODULES") == "1":
        pytest.skip(message)
    pytest.fail(message + "; run `make setup`, or set SLOTSERVE_ALLOW_MISSING_TRT_MODULES=1 to skip")


def lean_module():
    module = _import("tensorrt_lean")
    if module is None:
        _missing(f"tensorrt_lean is not installed ({LEAN_PIN})")
    return module


def cudart_module():
    module = _import("cuda.bindings.runtime")
    if module is None:
        _missing(f"cuda.bindings is not installed ({CUDA_PIN})")
    return module


_CLASS = re.compile(r"^class (\w+)(?:\(([^)]*)\))?:")
_MEMBER = re.compile(r"^    (?:def |class )?(\w+)\s*[:(=]")
_MODULE_NAME = re.compile(r"^(?:from \S+ import (\w+)|class (\w+)|def (\w+)|(\w+)\s*[:=])")


@cache
def stub_surface() -> tuple[frozenset[str], dict[str, frozenset[str]]] | None:
    """(module-level names, {class: member names incl. inherited}) from the installed tensorrt-stubs."""
    try:
        files = importlib.metadata.files("tensorrt-stubs") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    by_name = {str(f).replace("\\", "/"): f for f in files}
    init, bindings = by_name.get("tensorrt/__init__.pyi"), by_name.get("tensorrt_bindings/tensorrt.pyi")
    if init is None or bindings is None:
        return None
    own: dict[str, set[str]] = {}
    bases: dict[str, list[str]] = {}
    current = None
    for line in Path(bindings.locate()).read_text().splitlines():
        found = _CLASS.match(line)
        if found:
            current = found[1]
            own[current] = set()
            bases[current] = [b.strip().split(".")[-1] for b in (found[2] or "").split(",") if b.strip()]
        elif line and not line[0].isspace():
            current = None
        elif current is not None and (member := _MEMBER.match(line)):
            own[current].add(member[1])

    def members(name: str, seen: frozenset = frozenset()) -> set[str]:
        result = set(own.get(name, ()))
        for base in bases.get(name, ()):
            if base not in seen:
                result |= members(base, seen | {name})
        return result

    module_names = set(own)
    for line in Path(init.locate()).read_text().splitlines():
        found = _MODULE_NAME.match(line)
        if found:
            module_names.add(next(g for g in found.groups() if g))
    return frozenset(module_names), {name: frozenset(members(name)) for name in own}


def stubs():
    surface = stub_surface()
    if surface is None:
        _missing(f"tensorrt-stubs is not installed ({STUBS_PIN})")
    return surface


def _missing_in_module(module, names: dict[str, tuple[str, ...]], only_present_owners: bool = False) -> list[str]:
    missing = []
    for owner, attrs in names.items():
        if owner == MODULE:
            if not only_present_owners:
                missing += [a for a in attrs if not hasattr(module, a)]
            continue
        if not hasattr(module, owner):
            if not only_present_owners:
                missing.append(owner)
            continue
        target = getattr(module, owner)
        missing += [f"{owner}.{a}" for a in attrs if not hasattr(target, a)]
    return missing


def _missing_in_stubs(names: dict[str, tuple[str, ...]]) -> list[str]:
    module_names, classes = stubs()
    missing = []
    for owner, attrs in names.items():
        if owner == MODULE:
            missing += [a for a in attrs if a not in module_names]
        elif owner not in classes:
            missing.append(owner)
        else:
            missing += [f"{owner}.{a}" for a in attrs if a not in classes[owner]]
    return missing


# ---------------------------------------------------------------------------- the other API generation

# Run in a subprocess with the cu12 folder first on sys.path: which of the given names each module lacks.
_PROBE = """
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
report = {}
for module_name, table in json.load(sys.stdin).items():
    module = importlib.import_module(module_name)
    missing = []
    for owner, attrs in table.items():
        target = getattr(module, owner, None) if owner else module
        if target is None:
            missing.append(owner)
            continue
        missing += [f"{owner}.{a}" if owner else a for a in attrs if not hasattr(target, a)]
    version = getattr(module, "__version__", None) or getattr(importlib.import_module("cuda.bindings"),
                                                               "__version__", "")
    report[module_name] = {"missing": missing, "version": str(version), "file": module.__file__}
print(json.dumps(report))
"""


@lru_cache(maxsize=1)
def cu12_generation() -> dict:
    """{module: {missing, version, file}} for TensorRT 10's lean runtime and cuda-bindings 12."""
    if not (CU12_FOLDER / ".stamp").exists():
        _missing(f"the TensorRT 10 / CUDA 12 API modules are not installed in {CU12_FOLDER} ({CU12_PINS})")
    present_builder = {owner: attrs for owner, attrs in BUILDER.items() if owner}
    names = {
        "tensorrt_lean": {**RUNTIME, **present_builder},
        "cuda.bindings.runtime": {**CUDART, "cudaError_t": tuple(sorted(STICKY_ERRORS)) + CUDART["cudaError_t"]},
        "cuda.bindings.utils": CUDA_UTILS,
    }
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, str(CU12_FOLDER)],
        input=json.dumps(names),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_other_generation_is_tensorrt_10_and_cuda_bindings_12_from_its_own_folder():
    report = cu12_generation()
    assert report["tensorrt_lean"]["version"].startswith("10.")
    assert report["cuda.bindings.runtime"]["version"].startswith("12.")
    assert all(str(CU12_FOLDER) in entry["file"] for entry in report.values())


def test_runtime_names_exist_in_tensorrt_lean_10():
    # The builder-side classes the lean runtime carries count too; Builder/OnnxParser themselves it lacks.
    missing = cu12_generation()["tensorrt_lean"]["missing"]
    assert [
        name
        for name in missing
        if name.split(".")[0] not in ("Builder", "OnnxParser", "INetworkDefinition", "ITensor", "IBuilderConfig")
    ] == []


def test_cuda_names_exist_in_cuda_bindings_12():
    assert cu12_generation()["cuda.bindings.runtime"]["missing"] == []
    assert cu12_generation()["cuda.bindings.utils"]["missing"] == []


def test_the_sticky_errors_are_cuda_error_names():
    real = cudart_module()
    assert STICKY_ERRORS <= set(real.cudaError_t.__members__)


# ---------------------------------------------------------------------------- the names exist in real modules


def test_runtime_names_exist_in_tensorrt_lean_11():
    assert _missing_in_module(lean_module(), RUNTIME) == []


def test_runtime_names_exist_in_the_tensorrt_10_stubs():
    assert _missing_in_stubs(RUNTIME) == []


def test_builder_names_exist_in_the_tensorrt_10_stubs():
    assert _missing_in_stubs(BUILDER) == []


def test_builder_classes_that_tensorrt_lean_11_carries_have_our_names():
    # The lean runtime has no Builder, but it carries IOptimizationProfile, ITimingCache and MemoryPoolType from
    # the 11.x bindings: a 11.x rename of their members shows up here.
    assert _missing_in_module(lean_module(), BUILDER, only_present_owners=True) == []


def test_cuda_names_exist_in_cuda_bindings_runtime():
    assert _missing_in_module(cudart_module(), CUDART) == []


def test_cuda_utils_names_exist_in_cuda_bindings_utils():
    cudart_module()
    utils = _import("cuda.bindings.utils")
    if utils is None:
        _missing(f"cuda.bindings.utils is missing (cuda-bindings < 12.9.1); {CUDA_PIN} has it")
    assert _missing_in_module(utils, CUDA_UTILS) == []


def test_no_name_we_use_was_removed_in_tensorrt_11():
    used = set(api_names.qualified(RUNTIME)) | set(api_names.qualified(BUILDER))
    assert used & REMOVED_IN_TRT11 == set()


def test_the_removal_list_matches_tensorrt_lean_11():
    lean = lean_module()
    still_there = [
        name
        for name in REMOVED_IN_TRT11
        if hasattr(lean, name.split(".")[0]) and hasattr(getattr(lean, name.split(".")[0]), name.split(".")[1])
    ]
    assert still_there == []


# ------------------------------------------------------------------------ api_names, protocols, the code agree


def protocol_members(cls: type) -> set[str]:
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object or not getattr(klass, "_is_protocol", False) or klass.__module__ == "typing":
            continue
        candidates = set(vars(klass)) | set(getattr(klass, "__annotations__", {}))
        names |= {n for n in candidates if not n.startswith("_") or n == "__version__"}
    return names


def test_protocols_list_exactly_the_api_names():
    for names, table in (
        (RUNTIME, protocols.RUNTIME_PROTOCOLS),
        (BUILDER, protocols.BUILDER_PROTOCOLS),
        (CUDART, protocols.CUDART_PROTOCOLS),
        (CUDA_UTILS, protocols.CUDA_UTILS_PROTOCOLS),
    ):
        for owner, protocol in table.items():
            assert protocol_members(protocol) == set(names[owner]), protocol.__name__
    builder_module = protocol_members(protocols.TensorRTBuilderModule) - protocol_members(
        protocols.TensorRTRuntimeModule
    )
    assert builder_module == set(BUILDER[MODULE])


# Names the adapter gives the objects it gets from TensorRT, and the api_names owner each one stands for.
_TYPED_NAMES = {
    "engine": "ICudaEngine",
    "runtime": "Runtime",
    "builder": "Builder",
    "network": "INetworkDefinition",
    "parser": "OnnxParser",
    "config": "IBuilderConfig",
    "optimization_profile": "IOptimizationProfile",
    "context": "IExecutionContext",
    "self._trt": "IExecutionContext",
}


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def _uses(path: Path, module_variable: str, names: dict[str, tuple[str, ...]]) -> list[str]:  # noqa: C901
    """Names reached through `module_variable` (e.g. `trt.X`, `trt.X.Y`) or through a variable named in
    _TYPED_NAMES that are not listed in `names`."""
    unlisted = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        base = _dotted(node.value)
        if base == module_variable:
            if node.attr not in names[MODULE]:
                unlisted.append(f"{path.name}: {module_variable}.{node.attr}")
        elif base and base.startswith(module_variable + ".") and base.count(".") == module_variable.count(".") + 1:
            owner = base.rsplit(".", 1)[1]
            if node.attr not in names.get(owner, ()):
                unlisted.append(f"{path.name}: {base}.{node.attr}")
        elif base in _TYPED_NAMES and module_variable == "trt":
            owner = _TYPED_NAMES[base]
            if node.attr not in RUNTIME.get(owner, ()) + BUILDER.get(owner, ()):
                unlisted.append(f"{path.name}: {base}.{node.attr} ({owner})")
    return unlisted


def test_the_adapter_uses_only_listed_names():
    trt_names = {owner: RUNTIME.get(owner, ()) + BUILDER.get(owner, ()) for owner in set(RUNTIME) | set(BUILDER)}
    unlisted = []
    for name in ("backend.py", "model.py", "slot.py", "engine_io.py", "builder.py"):
        unlisted += _uses(PACKAGE / name, "trt", trt_names)
    unlisted += _uses(PACKAGE / "cuda.py", "self.module", CUDART)
    unlisted += _uses(PACKAGE / "cuda.py", "utils", CUDA_UTILS)
    assert unlisted == []


def test_the_scan_notices_an_unlisted_name(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(trt, engine, self):\n    trt.Runtime\n    trt.BuilderFlag.FP16\n"
        "    engine.device_memory_size\n    self.module.cudaGraphLaunch()\n"
    )
    trt_names = {owner: RUNTIME.get(owner, ()) + BUILDER.get(owner, ()) for owner in set(RUNTIME) | set(BUILDER)}
    assert sorted(_uses(sample, "trt", trt_names)) == [
        "sample.py: engine.device_memory_size (ICudaEngine)",
        "sample.py: trt.BuilderFlag",
        "sample.py: trt.BuilderFlag.FP16",
    ]
    assert _uses(sample, "self.module", CUDART) == ["sample.py: self.module.cudaGraphLaunch"]


# ------------------------------------------------------------------------------------ the double is faithful


def test_the_double_provides_every_listed_name():
    device = double.FakeDevice()
    assert _missing_in_module(device.trt, RUNTIME) == []
    assert _missing_in_module(device.trt, BUILDER) == []
    assert _missing_in_module(device.trt_lean, RUNTIME) == []
    assert not hasattr(device.trt_lean, "Builder") and not hasattr(device.trt_lean, "OnnxParser")
    assert _missing_in_module(device.cudart, CUDART) == []


def _double_public(cls: type) -> set[str]:
    """Public names the double itself defines on `cls` (enum members for enums)."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        return set(cls.__members__)
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass.__module__.startswith(double.__name__ + "."):
            names |= {n for n in vars(klass) if not n.startswith("_")}
    return names


def test_the_double_offers_nothing_the_real_tensorrt_lacks():
    lean = lean_module()
    module_names, classes = stubs()
    device = double.FakeDevice()
    invented = []
    for name in (n for n in vars(device.trt) if not n.startswith("_")):
        if not hasattr(lean, name) and name not in module_names:
            invented.append(name)
            continue
        value = getattr(device.trt, name)
        if not isinstance(value, type):
            continue
        real = set(classes.get(name, ()))
        if hasattr(lean, name):
            real_lean = getattr(lean, name)
            real |= set(getattr(real_lean, "__members__", {})) | set(dir(real_lean))
        invented += [f"{name}.{member}" for member in _double_public(value) if member not in real]
    assert invented == []


def test_the_double_offers_nothing_cuda_bindings_lacks():
    real = cudart_module()
    fake = double.FakeDevice().cudart
    invented = [n for n in _double_public(type(fake)) if not hasattr(real, n)]
    for name in ("cudaError_t", "cudaMemcpyKind"):
        invented += [f"{name}.{m}" for m in getattr(fake, name).__members__ if not hasattr(getattr(real, name), m)]
    assert invented == []
