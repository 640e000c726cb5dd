"""Python models (issue 22): the same model.py files on slotserve and on real Triton 2.51 (the tritonserver with
its python backend in bench/.venv-pytriton, started as tests/differential/reference.py starts it), in the same
run, measured point by point in alternating order with perf_analyzer.

  gil_1, gil_2   a CPU-bound model.py that holds the GIL (a pure-Python loop of SPIN_ITERATIONS, about 3 ms on
                 an idle core), 1 and 2 slots (Triton: instances), at GIL_CONCURRENCY clients: 2 slots over 1
                 on slotserve, and slotserve over Triton with 2.
  add_sub        tests/python_models' add/sub model.py on INT32 [1,16] (one slot), at 1 and 16 clients, against
                 slotserve's own ONNX `simple` (the demo's, the same shapes) in the same server, with its ratio to
                 Triton's python backend beside it.

slotserve runs with --parallel-jobs 2, so each model gets the slot count its instance_group asks for.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..common import DEMO_REPOSITORY, ROOT, log
from ..perf_analyzer import PerfAnalyzer, describe, measure
from ..servers import Launcher
from ..table import Table, column_median, first_error, fmt, fmt_x, met_if, paired_ratio

SPIN_ITERATIONS = 40_000
GIL_CONCURRENCY = 4
ADD_SUB_CONCURRENCY = (1, 16)
ADD_SUB_MODEL = ROOT / "tests" / "python_models" / "repository" / "add_sub" / "1" / "model.py"

GIL_MODEL = f'''"""Holds the GIL: a pure-Python loop of {SPIN_ITERATIONS} additions a request (bench/)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            total = 0
            for step in range({SPIN_ITERATIONS}):
                total += step
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)]))
        return responses
'''

IO_16 = """max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }}{second_input} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }}{second_output} ]
"""


def _config(name: str, instances: int, pair: bool) -> str:
    io = IO_16.format(
        second_input=', { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }' if pair else "",
        second_output=', { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }' if pair else "",
    )
    return f'name: "{name}"\nbackend: "python"\n{io}instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n'


def write_repositories(scratch: Path) -> tuple[Path, Path]:
    """(slotserve's repository, Triton's): the same python models in both; slotserve's also has the demo's
    ONNX `simple` (linked), which Triton's wheel (python backend only) cannot serve."""
    triton, ours = scratch / "python-triton", scratch / "python-slotserve"
    for repository in (triton, ours):
        for name, instances in (("gil_1", 1), ("gil_2", 2)):
            (repository / name / "1").mkdir(parents=True)
            (repository / name / "config.pbtxt").write_text(_config(name, instances, pair=False))
            (repository / name / "1" / "model.py").write_text(GIL_MODEL)
        (repository / "add_sub" / "1").mkdir(parents=True)
        (repository / "add_sub" / "config.pbtxt").write_text(_config("add_sub", 1, pair=True))
        (repository / "add_sub" / "1" / "model.py").write_text(ADD_SUB_MODEL.read_text())
    (ours / "simple").mkdir()
    (ours / "simple" / "1").symlink_to(DEMO_REPOSITORY / "simple" / "1", target_is_directory=True)
    (ours / "simple" / "config.pbtxt").write_text((DEMO_REPOSITORY / "simple" / "config.pbtxt").read_text())
    return ours, triton


class _TritonServer:
    """Real Triton as perf_analyzer's target: what measure() needs of a server (address, explain)."""

    def __init__(self, address: str) -> None:
        self.address = address

    @staticmethod
    def explain(message: str) -> str:
        return message


@contextlib.contextmanager
def _triton(repository: Path, scratch: Path):
    from tests.differential.reference import find_installation, run_triton

    installation, reason = find_installation()
    if installation is None:
        raise RuntimeError(reason)
    folder = scratch / "python-triton-run"
    folder.mkdir(exist_ok=True)
    with run_triton(installation, repository, folder) as running:
        yield _TritonServer(running.address)


POINTS = (
    *(("gil_1", server, GIL_CONCURRENCY) for server in ("slotserve", "triton")),
    *(("gil_2", server, GIL_CONCURRENCY) for server in ("slotserve", "triton")),
    *(("add_sub", server, c) for c in ADD_SUB_CONCURRENCY for server in ("slotserve", "triton")),
    *(("simple", "slotserve", c) for c in ADD_SUB_CONCURRENCY),
)


def section_python(args, launcher: Launcher, pa: PerfAnalyzer, table: Table, raw: dict, scratch: Path) -> None:
    ours, theirs = write_repositories(scratch)
    points: dict[tuple[str, str, int], list[dict]] = {}
    with contextlib.ExitStack() as stack:
        servers = {
            "slotserve": stack.enter_context(
                launcher.slotserve(
                    "slotserve-python",
                    ours,
                    ["--parallel-jobs", "2", "--allow-model-root", str(DEMO_REPOSITORY)],
                    default_args=False,
                )
            ),
            "triton": stack.enter_context(_triton(theirs, scratch)),
        }
        for round_index in range(args.rounds):
            for model, server, c in POINTS[::-1] if round_index % 2 else POINTS:
                point = measure(pa, servers[server], model, c)
                points.setdefault((model, server, c), []).append(point)
                log(f"python round {round_index + 1}/{args.rounds} {model} {server} c={c}: " + describe(point))
    raw["python"] = {f"{model} {server} c={c}": runs for (model, server, c), runs in points.items()}
    _rows(table, points)


def _rows(table: Table, points: dict) -> None:
    def rate(model: str, server: str, c: int) -> float:
        return column_median(points[(model, server, c)], "infer_per_s")

    errors = [first_error(runs) for runs in points.values() if first_error(runs)]
    note = f" [{str(errors[0])[:100]}]" if errors else ""
    c = GIL_CONCURRENCY
    table.add(
        "python",
        f"GIL-holding model.py c={c}: infer/s slotserve 1 slot, 2 slots; Triton 1, 2 instances",
        ", ".join(fmt(rate(m, s, c)) for s in ("slotserve", "triton") for m in ("gil_1", "gil_2")) + note,
    )
    scaling = paired_ratio(points[("gil_2", "slotserve", c)], points[("gil_1", "slotserve", c)], "infer_per_s")
    table.add(
        "python",
        f"GIL-holding model.py c={c}: 2 slots / 1 slot",
        fmt_x(scaling),
        ">= 1.8x",
        met_if(scaling, lambda v: v >= 1.8),
        ratio=scaling,
    )
    versus = paired_ratio(points[("gil_2", "slotserve", c)], points[("gil_2", "triton", c)], "infer_per_s")
    table.add(
        "python",
        f"GIL-holding model.py c={c}, 2 slots: slotserve / Triton (2 instances)",
        fmt_x(versus),
        ">= 0.9x",
        met_if(versus, lambda v: v >= 0.9),
        ratio=versus,
    )
    for c in ADD_SUB_CONCURRENCY:
        onnx = paired_ratio(points[("add_sub", "slotserve", c)], points[("simple", "slotserve", c)], "infer_per_s")
        triton = paired_ratio(points[("add_sub", "slotserve", c)], points[("add_sub", "triton", c)], "infer_per_s")
        table.add(
            "python",
            f"add_sub model.py c={c}: infer/s python, ONNX simple; Triton python",
            ", ".join(
                fmt(rate(m, s, c))
                for m, s in (("add_sub", "slotserve"), ("simple", "slotserve"), ("add_sub", "triton"))
            ),
        )
        table.add(
            "python",
            f"add_sub model.py c={c}: python / ONNX simple (slotserve); python slotserve / Triton",
            f"{fmt_x(onnx)}; {fmt_x(triton)}",
            ">= 0.8x (first)",
            met_if(onnx, lambda v: v >= 0.8),
            ratio=onnx,
            triton_ratio=triton,
        )
