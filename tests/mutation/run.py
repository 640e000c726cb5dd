"""A mutation run of the core (`make mutate`): plant one small, plausible bug at a time in service/core/admission.py,
batching.py and residency.py, run the tests that exercise that module, and count the bugs they catch.

    python -m tests.mutation.run                      every module: a table, the survivors; each module's
                                                      result is kept in tests/mutation/last-result.txt
    python -m tests.mutation.run --module batching    one module
    python -m tests.mutation.run --list               the mutants, without running anything
    python -m tests.mutation.run --only KEY ...       just these mutants (keys as printed), verbose
    python -m tests.mutation.run --jobs 2             two mutants at once (default 1: the machine is shared)

Why our own script and not mutmut or cosmic-ray: both rewrite or copy the source tree (mutmut 3 copies it into
mutants/ and adds a trampoline per function; cosmic-ray keeps a session database and needs a config per module),
and both run the whole configured test command per mutant. This one is ~300 lines with no dependency: a mutant is
applied in the test process only, by an import hook that compiles the mutated syntax tree in place of the
module's file (nothing on disk changes, so nothing needs restoring, and line numbers stay those of the file), and
each module has its own small test subset, fastest-killing tests first, run with `-x`.

Operators (each applied at one site per mutant):
    CMP    a comparison flipped: < <=, > >=, == !=, is / is not, in / not in
    NUM    an integer constant + 1 (off by one); a float x -> x / 1000 when x >= 1000 (a unit), else x + 1
    BOOL   True <-> False
    NOT    an `if`/`while`/conditional test negated; a `not` removed
    ANDOR  `and` <-> `or`
    CALL   a call statement removed (notify, release, nudge, discard, a callback, ...)
    AUG    an augmented assignment removed (a counter not counted)
    MINMAX min <-> max
    RET    `return X` -> `return None`
    ARITH  + <-> -
    EXC    `except BaseException` -> `except Exception` (an asynchronous exception escapes the handler)
    FIN    try/finally flattened: the finally block runs only when nothing raised
    RAISE  a `raise` statement removed
Not mutated: strings (messages), f-strings, annotations, argument and class field defaults, __repr__, logging
calls.

A mutant is killed when its test subset fails or runs past the timeout (3 x the unmutated subset's time, at least
60 s); it survives when the subset passes. Mutants that change nothing observable (equivalent mutants) are named,
with the reason, in tests/mutation/equivalents.txt and left out of the kill rate: kill rate = killed / (mutants -
named equivalents). A mutant's key names its function, operator, the mutated code and its occurrence there, not
its line number, so the list survives edits elsewhere in the file.
"""

from __future__ import annotations

import argparse
import ast
import importlib.abc
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
EQUIVALENTS = HERE / "equivalents.txt"
LAST_RESULT = HERE / "last-result.txt"

# Each module's tests, fastest-killing first (pytest runs them in this order with -x). In-process only: no test
# here starts a server process or binds a fixed port, so mutants can run side by side.
_CORE_UNIT = [
    "tests/unit/service/core/test_admission_boundaries.py",
    "tests/unit/service/core/test_admission_priority.py",
    "tests/unit/service/core/test_batch_delay_wakeups.py",
    "tests/unit/service/core/test_admission_interrupted.py",
]
SUBSETS: dict[str, list[str]] = {
    "admission": [
        *_CORE_UNIT,
        "tests/contract/test_batching.py",
        "tests/contract/test_batch_members.py",
        "tests/contract/test_order.py",
        "tests/contract/test_priorities.py",
        "tests/contract/test_time_admission.py",
        "tests/unit/service/core/test_residency_failures_and_batches.py",
        "tests/unit/service/core/test_bulk_unload.py",
        "tests/unit/service/servicers/test_call_tokens.py",
        "tests/unit/service/core/test_admission.py",
        "tests/unit/service/core/test_admission_controller.py",
        "tests/unit/service/core/test_admission_batching.py",
        "tests/unit/service/core/test_admission_priority_machine.py",
    ],
    "batching": [
        "tests/contract/test_batch_members.py",
        "tests/contract/test_batching.py",
        "tests/unit/service/core/test_batch_delay_wakeups.py",
        "tests/contract/test_stream_statistics.py",
    ],
    "residency": [
        "tests/unit/service/core/test_residency_boundaries.py",
        "tests/unit/service/core/test_memory_budget_over_time.py",
        "tests/unit/service/core/test_residency_failures_and_batches.py",
        "tests/contract/test_memory_budget_never_fits.py",
        "tests/unit/service/core/test_cold_load_registration_eviction_races.py",
        "tests/unit/service/core/test_memory_budget_reservation.py",
        "tests/unit/service/core/test_idle_reaper.py",
        "tests/unit/service/core/test_cold_load_failure.py",
        "tests/contract/test_residency.py",
        "tests/contract/test_residency_refusals_and_budget.py",
        "tests/contract/test_two_a_loading_b_ready.py",
        "tests/contract/test_ops_loading.py",
    ],
}
MODULES = {name: f"service.core.{name}" for name in SUBSETS}


# ---- finding and applying mutants --------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutant:
    module: str  # "admission"
    index: int  # position among the module's sites (stable for one version of the file)
    key: str  # stable across edits elsewhere: module:function:operator:code#occurrence
    line: int
    operator: str
    change: str  # what it does, in words


_FLIPS = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_SYMBOLS = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
}
_SKIPPED_FIELDS = {"annotation", "returns", "defaults", "kw_defaults", "decorator_list"}


def _is_logging(call: ast.Call) -> bool:
    func = call.func
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in ("_LOG", "log")


def _nodes(tree: ast.AST):
    """(node, parent, field, index, function) in a fixed pre-order; skips what is never mutated."""

    def visit(node, parent, field, index, function):
        if isinstance(node, ast.JoinedStr):
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__repr__":
                return
            function = f"{function}.{node.name}" if function else node.name
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            return
        if isinstance(node, ast.AnnAssign) and isinstance(parent, ast.ClassDef):
            return  # a class field's default: like an argument default, set by whoever builds the object
        yield node, parent, field, index, function
        for name, value in ast.iter_fields(node):
            if name in _SKIPPED_FIELDS:
                continue
            if isinstance(value, list):
                for position, item in enumerate(value):
                    if isinstance(item, ast.AST):
                        yield from visit(item, node, name, position, function)
            elif isinstance(value, ast.AST):
                yield from visit(value, node, name, None, function)

    yield from visit(tree, None, None, None, "")


def _replace(parent, field, index, new) -> None:
    if index is None:
        setattr(parent, field, new)
    else:
        getattr(parent, field)[index] = new


def _pass_like(node: ast.stmt) -> ast.stmt:
    return ast.copy_location(ast.Pass(), node)


def _sites(tree: ast.AST):
    """Every mutation of `tree`: (operator, function, code, change, node, apply). `apply()` mutates `tree`."""
    for node, parent, field, index, function in _nodes(tree):
        apply: Callable[[], None]  # each kind of site below defines it, binding that site's values as defaults
        other: Any
        code = ast.unparse(node) if not isinstance(node, ast.Module) else ""
        if isinstance(node, ast.Compare):
            for position, op in enumerate(node.ops):
                flipped = _FLIPS[type(op)]

                def apply(node=node, position=position, flipped=flipped):
                    node.ops[position] = flipped()

                yield ("CMP", function, code, f"{_SYMBOLS[type(op)]} -> {_SYMBOLS[flipped]}", node, apply)
        elif isinstance(node, ast.Constant) and type(node.value) is bool:

            def apply(node=node):
                node.value = not node.value

            yield "BOOL", function, code, f"{node.value} -> {not node.value}", node, apply
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
            value: Any = node.value
            new = value + 1 if type(value) is int or abs(value) < 1000 else value / 1000

            def apply(node=node, new=new):
                node.value = new

            yield "NUM", function, code, f"{value!r} -> {new!r}", node, apply
        elif isinstance(node, (ast.If, ast.While, ast.IfExp)):

            def apply(node=node):
                node.test = ast.copy_location(ast.UnaryOp(ast.Not(), node.test), node.test)

            yield "NOT", function, ast.unparse(node.test), "condition negated", node, apply
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):

            def apply(node=node, parent=parent, field=field, index=index):
                _replace(parent, field, index, node.operand)

            yield "NOT", function, code, "`not` removed", node, apply
        elif isinstance(node, ast.BoolOp):
            other = ast.Or if isinstance(node.op, ast.And) else ast.And

            def apply(node=node, other=other):
                node.op = other()

            yield "ANDOR", function, code, f"{type(node.op).__name__.lower()} -> {other.__name__.lower()}", node, apply
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and not _is_logging(node.value):

            def apply(node=node, parent=parent, field=field, index=index):
                _replace(parent, field, index, _pass_like(node))

            yield "CALL", function, code, "call removed", node, apply
        elif isinstance(node, ast.AugAssign):

            def apply(node=node, parent=parent, field=field, index=index):
                _replace(parent, field, index, _pass_like(node))

            yield "AUG", function, code, "not done", node, apply
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            other = "max" if node.func.id == "min" else "min"

            def apply(node=node, other=other):
                node.func = ast.copy_location(ast.Name(other, ast.Load()), node.func)

            yield "MINMAX", function, code, f"{node.func.id} -> {other}", node, apply
        elif (
            isinstance(node, ast.Return)
            and node.value is not None
            and not (isinstance(node.value, ast.Constant) and node.value.value is None)
        ):

            def apply(node=node):
                node.value = None

            yield "RET", function, code, "returns None", node, apply
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            other = ast.Sub if isinstance(node.op, ast.Add) else ast.Add

            def apply(node=node, other=other):
                node.op = other()

            yield (
                "ARITH",
                function,
                code,
                f"{'+' if other is ast.Sub else '-'} -> {'-' if other is ast.Sub else '+'}",
                node,
                apply,
            )
        elif (
            isinstance(node, ast.ExceptHandler) and isinstance(node.type, ast.Name) and node.type.id == "BaseException"
        ):

            def apply(node=node):
                node.type = ast.copy_location(ast.Name("Exception", ast.Load()), node.type)

            yield "EXC", function, f"except BaseException (line {node.lineno})", "-> except Exception", node, apply
        elif isinstance(node, ast.Try) and node.finalbody and not node.handlers:

            def apply(node=node, parent=parent, field=field, index=index):
                body = getattr(parent, field)
                body[index : index + 1] = [*node.body, *node.finalbody]

            yield (
                "FIN",
                function,
                f"try/finally (line {node.lineno})",
                "finally runs only without an exception",
                node,
                apply,
            )
        elif isinstance(node, ast.Raise):

            def apply(node=node, parent=parent, field=field, index=index):
                _replace(parent, field, index, _pass_like(node))

            yield "RAISE", function, code, "raise removed", node, apply


def _source(module: str) -> tuple[Path, str]:
    path = ROOT / "service" / "core" / f"{module}.py"
    return path, path.read_text()


def mutants(module: str) -> list[Mutant]:
    path, source = _source(module)
    found: list[Mutant] = []
    seen: dict[str, int] = {}
    for index, (operator, function, code, change, node, _apply) in enumerate(_sites(ast.parse(source))):
        short = " ".join(code.split())
        short = short if len(short) <= 60 else short[:57] + "..."
        base = f"{module}:{function or '<module>'}:{operator}:{short}:{change}"
        seen[base] = seen.get(base, 0) + 1
        found.append(Mutant(module, index, f"{base}#{seen[base]}", getattr(node, "lineno", 0), operator, change))
    return found


def mutated_code(module: str, index: int):
    """The compiled module with mutant `index` applied."""
    path, source = _source(module)
    tree = ast.parse(source)
    sites = list(_sites(tree))
    sites[index][5]()
    ast.fix_missing_locations(tree)
    return compile(tree, str(path), "exec")


# ---- the test process of one mutant --------------------------------------------------------------------------


class _MutantFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `fullname` from the mutated code instead of its file (the file's path stays its __file__)."""

    def __init__(self, fullname: str, path: Path, code) -> None:
        self.fullname, self.path, self.code = fullname, path, code

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.fullname:
            return None
        return importlib.util.spec_from_file_location(fullname, self.path, loader=self)

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        exec(self.code, module.__dict__)


def child(module: str, index: int | None, pytest_args: list[str]) -> int:
    """Run pytest in this process with mutant `index` of `module` in place (None: the real code)."""
    sys.dont_write_bytecode = True
    if index is not None:
        path, _ = _source(module)
        sys.meta_path.insert(0, _MutantFinder(MODULES[module], path, mutated_code(module, index)))
    from hypothesis import settings  # before any test module builds its settings, so they inherit these

    settings.register_profile("mutation", database=None, derandomize=True, print_blob=False)
    settings.load_profile("mutation")
    import pytest

    return pytest.main(pytest_args)


# ---- the runner --------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    mutant: Mutant | None
    verdict: str  # killed, timeout, survived, error
    seconds: float
    detail: str = ""


def _run_one(module: str, mutant: Mutant | None, timeout: float, workdir: Path, verbose: bool) -> Outcome:
    name = "baseline" if mutant is None else str(mutant.index)
    basetemp = workdir / f"{module}-{name}"
    command = [
        sys.executable,
        "-m",
        "tests.mutation.run",
        "--child",
        module,
        "-" if mutant is None else str(mutant.index),
        "--",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--basetemp={basetemp}",
        "-W",
        "ignore",
        *SUBSETS[module],
    ]
    started = time.monotonic()
    # Its own process group, so a timeout ends the test process and every thread or child it left behind.
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=timeout)
        verdict = "survived" if process.returncode == 0 else "killed"
        if process.returncode not in (0, 1):  # 2: interrupted, 3: internal error, 4: usage, 5: no tests
            verdict = "killed" if mutant is not None and process.returncode in (2, 3) else "error"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        output, _ = process.communicate()
        verdict = "timeout"
    finally:
        shutil.rmtree(basetemp, ignore_errors=True)
    lines = output.strip().splitlines()
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    detail = (failed[0] if failed else (lines[-1] if lines else ""))[:160]
    if verbose:
        print(output)
    return Outcome(mutant, verdict, time.monotonic() - started, detail)


def _equivalents() -> dict[str, str]:
    named = {}
    if EQUIVALENTS.exists():
        for line in EQUIVALENTS.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                key, _, reason = line.partition("  # ")
                named[key.strip()] = reason.strip()
    return named


HEADER = "module      mutants  killed  timeout  equivalent  survived  kill rate (of non-equivalent)"


def _mutant(outcome: Outcome) -> Mutant:
    """The mutant an outcome is about (only the baseline run has none, and a report never holds it)."""
    assert outcome.mutant is not None
    return outcome.mutant


def _module_report(module: str, outcomes: list[Outcome], named: dict[str, str], baseline: float) -> str:
    """One module's table row, then its survivors and any equivalents a test now kills."""
    killed = sum(o.verdict == "killed" for o in outcomes)
    timeouts = sum(o.verdict == "timeout" for o in outcomes)
    equivalent = [o for o in outcomes if o.verdict == "survived" and _mutant(o).key in named]
    survived = [o for o in outcomes if o.verdict in ("survived", "error") and _mutant(o).key not in named]
    stale = [o for o in outcomes if o.verdict in ("killed", "timeout") and _mutant(o).key in named]
    counted = len(outcomes) - len(equivalent)
    rate = 100.0 * (killed + timeouts) / counted if counted else 100.0
    out = [
        f"{module:<11} {len(outcomes):>7}  {killed:>6}  {timeouts:>7}  {len(equivalent):>10}  "
        f"{len(survived):>8}  {rate:5.1f} %   (subset {baseline:.0f} s unmutated)"
    ]
    out += [f"    survivor  {o.verdict:<8} line {_mutant(o).line:<4} {_mutant(o).key}" for o in survived]
    out += [f"    named equivalent but killed (take it out of equivalents.txt): {_mutant(o).key}" for o in stale]
    return "\n".join(out)


def _report(results: dict[str, list[Outcome]], named: dict[str, str], baselines: dict[str, float]) -> str:
    """The table of this run; a survivor is a bug no test caught, or an equivalent mutant not named yet."""
    blocks = [
        _module_report(module, outcomes, named, baselines.get(module, 0.0)) for module, outcomes in results.items()
    ]
    return "\n".join([HEADER, *blocks])


def _record(results, named, baselines) -> None:
    """Keep each module's latest full run in LAST_RESULT (a run of one module replaces only its own block)."""
    blocks: dict[str, str] = {}
    if LAST_RESULT.exists():
        current = None
        for line in LAST_RESULT.read_text().splitlines():
            if line.startswith("## "):
                current = line[3:].split(",")[0]
                blocks[current] = line
            elif current is not None:
                blocks[current] += "\n" + line
    stamp = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    for module, outcomes in results.items():
        blocks[module] = (
            f"## {module}, run {stamp} UTC\n"
            + HEADER
            + "\n"
            + _module_report(module, outcomes, named, baselines.get(module, 0.0))
        )
    text = "\n\n".join(blocks[module].strip() for module in SUBSETS if module in blocks)
    LAST_RESULT.write_text(
        "# The last full run of each module of `make mutate` (python -m tests.mutation.run); "
        "docs/architecture.md says how to read it.\n\n" + text + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        module, index, _, *pytest_args = argv[1:]
        return child(module, None if index == "-" else int(index), pytest_args)
    parser = argparse.ArgumentParser(prog="python -m tests.mutation.run", description=__doc__.split("\n")[0])
    parser.add_argument("--module", action="append", choices=sorted(SUBSETS), help="only this module (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--only", nargs="+", metavar="KEY", help="run just these mutants (keys or key prefixes)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    args = parser.parse_args(argv)
    modules = args.module or list(SUBSETS)
    named = _equivalents()
    chosen = {module: mutants(module) for module in modules}
    if args.only:
        chosen = {m: [x for x in found if any(x.key.startswith(k) for k in args.only)] for m, found in chosen.items()}
        chosen = {m: found for m, found in chosen.items() if found}
    if args.list:
        for found in chosen.values():
            for mutant in found:
                mark = "  [equivalent]" if mutant.key in named else ""
                print(f"line {mutant.line:<4} {mutant.key}{mark}")
        print(f"{sum(map(len, chosen.values()))} mutants")
        return 0
    results: dict[str, list[Outcome]] = {}
    baselines: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="slotserve-mutation-") as workdir:
        for module, found in chosen.items():
            baseline = _run_one(module, None, 900, Path(workdir), verbose=False)
            if baseline.verdict != "survived":
                print(f"{module}: the test subset fails without any mutant ({baseline.detail}); fix that first")
                return 2
            baselines[module] = baseline.seconds
            timeout = max(60.0, 3 * baseline.seconds)
            print(
                f"{module}: {len(found)} mutants; subset {baseline.seconds:.1f} s unmutated, timeout {timeout:.0f} s",
                flush=True,
            )
            done = []

            # `one` runs only inside this iteration's pool (list(pool.map(...)) returns before the loop moves on),
            # so the loop variables it reads (B023) are this iteration's.
            def one(mutant: Mutant) -> Outcome:
                outcome = _run_one(module, mutant, timeout, Path(workdir), verbose=bool(args.only))  # noqa: B023
                done.append(outcome)  # noqa: B023
                print(
                    f"  [{len(done):>3}/{len(found)}] {outcome.verdict:<8} {outcome.seconds:5.1f} s  "  # noqa: B023
                    f"line {mutant.line:<4} {mutant.key}",
                    flush=True,
                )
                return outcome

            with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
                results[module] = list(pool.map(one, found))
    report = _report(results, named, baselines)
    print("\n" + report)
    if not args.only:
        _record(results, named, baselines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
