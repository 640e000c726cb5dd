"""A python model whose `initialize` and `execute` a test can hold, for the lifecycle tests of issues 33 (a hung
initialize holds only its own model) and 34 (instance-count updates while the model serves).

`write_gated_model(root, name, gates)` writes `root/name` (config.pbtxt and 1/model.py). The model answers
Y = X (FP32) and passes a **file gate** at `initialize` and at `execute`: while `gates/<point>.hold` exists, it
writes `gates/<point>.arrived.<its pid>` and waits until `gates/<point>.release` exists. The gate folder is
named by the config's `gate_dir` parameter and lies outside the model's folder, so that holding and releasing
never changes the model's files (a reload compares them).

`Gates` is the test's side: hold, release, wait for arrivals (each wait bounded, never a sleep that orders
events: it polls a state the model writes until a deadline).
"""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

WAIT = 30.0  # seconds a test waits for a state the model or the server reaches (a busy machine)

MODEL_PY = '''
import json
import os
import time

import triton_python_backend_utils as pb_utils


def _gate(folder, point):
    """The test's gate: while <point>.hold exists, record the arrival (this worker's pid) and wait for
    <point>.release."""
    if not os.path.exists(os.path.join(folder, point + ".hold")):
        return
    with open(os.path.join(folder, "%s.arrived.%d" % (point, os.getpid())), "w"):
        pass
    while not os.path.exists(os.path.join(folder, point + ".release")):
        time.sleep(0.005)  # ordering-free: the model waits for its test to release the gate


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.gates = config["parameters"]["gate_dir"]["string_value"]
        _gate(self.gates, "initialize")

    def execute(self, requests):
        _gate(self.gates, "execute")
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
            for r in requests
        ]
'''


def config_text(name: str, gates: Path, count: int | None = None, extra: str = "") -> str:
    group = f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n" if count is not None else ""
    return (
        textwrap.dedent(
            f"""\
        name: "{name}"
        backend: "python"
        input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        parameters {{ key: "gate_dir" value: {{ string_value: "{gates}" }} }}
        """
        )
        + group
        + extra
    )


def write_gated_model(root: Path, name: str, gates: Path, count: int | None = None, extra: str = "") -> Path:
    """Write the gated model `name` under `root`; its gates live in `gates` (created)."""
    gates.mkdir(parents=True, exist_ok=True)
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(MODEL_PY)
    (folder / "config.pbtxt").write_text(config_text(name, gates, count, extra))
    return folder


def set_instance_count(root: Path, name: str, gates: Path, count: int) -> None:
    """Rewrite config.pbtxt with another instance count (as qa/L0_model_update's update_instance_group)."""
    (root / name / "config.pbtxt").write_text(config_text(name, gates, count))


class Gates:
    """One model's gates (a folder the model reads)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def hold(self, point: str) -> None:
        (self.folder / f"{point}.release").unlink(missing_ok=True)
        (self.folder / f"{point}.hold").touch()

    def release(self, point: str) -> None:
        """Let every worker waiting at `point` go, and stop holding it."""
        (self.folder / f"{point}.release").touch()
        (self.folder / f"{point}.hold").unlink(missing_ok=True)

    def release_all(self) -> None:
        for point in ("initialize", "execute"):
            self.release(point)

    def arrived(self, point: str) -> list[int]:
        """The pids of the workers that reached `point` while it was held."""
        return sorted(int(path.name.rsplit(".", 1)[1]) for path in self.folder.glob(f"{point}.arrived.*"))

    def wait_arrivals(self, point: str, count: int, timeout: float = WAIT) -> list[int]:
        deadline = time.monotonic() + timeout
        while len(pids := self.arrived(point)) < count:
            assert time.monotonic() < deadline, f"{count} worker(s) never reached {point} in {self.folder}: {pids}"
            time.sleep(0.01)  # ordering-free: polls a state the model writes, until a deadline
        return pids


def is_alive(pid: int) -> bool:
    """Whether process `pid` exists (a zombie counts as gone: a reaped or killed worker)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def worker_pids() -> list[int]:
    """The python workers this process started that are still running (not zombies)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().split(")")[-1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if parent == os.getpid() and b"engine.python.worker" in command and is_alive(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def wait_until(predicate, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"never happened within {timeout} s: {what}"
        time.sleep(0.01)  # ordering-free: polls an observable state until a deadline
