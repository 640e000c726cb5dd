"""No /dev/shm file of a python model outlives its server (issue 33): a SIGTERM with a hung worker (in execute, in
initialize), a SIGKILL (the next server to start removes what the dead one left), and files of live servers are
never touched. Real `python -m service` processes and signals."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import numpy as np

from tests.python_models import REPOSITORY

from .harness import WAIT, exit_bound, wait_until

SHM = Path("/dev/shm")

FLOAT_IO = """
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

HEADER = """
import os, time
from pathlib import Path
import numpy as np
import triton_python_backend_utils as pb_utils
"""


def write_model(repository: Path, name: str, body: str, config: str = FLOAT_IO) -> Path:
    directory = repository / name
    (directory / "1").mkdir(parents=True)
    (directory / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n' + textwrap.dedent(config))
    (directory / "1" / "model.py").write_text(HEADER + textwrap.dedent(body))
    return directory


def files_of(*pids: int) -> list[str]:
    """The python-worker segments named in /dev/shm for the processes `pids`."""
    return sorted(p.name for pid in pids for p in SHM.glob(f"slotserve-py-{pid}-*")) if SHM.is_dir() else []


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` (a server's python workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


# X = 1: writes a marker file (the test's sign the worker is in execute), then never returns and ignores
# is_cancelled(); X = 0: answers.
HANGS_IN_EXECUTE = """
class TritonPythonModel:
    def execute(self, requests):
        if pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()[0] > 0:
            Path(os.environ["SLOTSERVE_TEST_MARKER"]).touch()
            while True:
                time.sleep(0.05)  # ordering-free: a model that hangs on purpose
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.ones(1, np.float32))])]
"""

HANGS_IN_INITIALIZE = """
class TritonPythonModel:
    def initialize(self, args):
        Path(os.environ["SLOTSERVE_TEST_MARKER"]).touch()
        while True:
            time.sleep(0.05)  # ordering-free: an initialize that hangs on purpose
"""


def test_sigterm_with_a_worker_hung_in_execute_leaves_no_file(tmp_path, start_server, monkeypatch):
    marker = tmp_path / "executing"
    monkeypatch.setenv("SLOTSERVE_TEST_MARKER", str(marker))
    write_model(tmp_path / "repo", "hung", HANGS_IN_EXECUTE)
    server = start_server(tmp_path / "repo", "--drain-seconds", "0", "--shutdown-grace", "1")
    server.client.infer("hung", {"X": np.zeros(1, np.float32)})
    workers = children_of(server.process.pid)
    call = server.call_async(server.client.infer, "hung", {"X": np.ones(1, np.float32)}, timeout=WAIT)
    wait_until(marker.exists, "the worker to hang in execute")
    server.signal(signal.SIGTERM)
    assert server.wait_exit(timeout=exit_bound(0, 1) + WAIT) == 0
    call.exception(timeout=WAIT)  # the call ended with the server
    assert workers and files_of(server.process.pid, *workers) == []


def test_sigterm_with_a_worker_hung_in_initialize_leaves_no_file(tmp_path, start_server, monkeypatch):
    marker = tmp_path / "initializing"
    monkeypatch.setenv("SLOTSERVE_TEST_MARKER", str(marker))
    write_model(tmp_path / "repo", "hung", HANGS_IN_INITIALIZE)
    server = start_server(tmp_path / "repo", "--no-load-at-startup", "--drain-seconds", "0", "--shutdown-grace", "1")
    call = server.call_async(server.client.infer, "hung", {"X": np.ones(1, np.float32)}, timeout=WAIT)
    wait_until(marker.exists, "the worker to hang in initialize")
    workers = children_of(server.process.pid)
    server.signal(signal.SIGTERM)
    assert server.wait_exit(timeout=exit_bound(0, 1) + WAIT) == 0
    call.exception(timeout=WAIT)
    assert workers and files_of(server.process.pid, *workers) == []


# Holds a decoupled BLS call's responses unread (each in a reply segment the server made) and waits in execute
# until it is cancelled: the files stay named while the request runs.
HOLDS_REPLIES = """
class TritonPythonModel:
    def execute(self, requests):
        ten = [pb_utils.Tensor("IN", np.array([10], np.int32))]
        call = pb_utils.InferenceRequest(model_name="repeat", inputs=ten, requested_output_names=["OUT"])
        responses = call.exec(decoupled=True)
        Path(os.environ["SLOTSERVE_TEST_MARKER"]).touch()
        while not requests[0].is_cancelled():
            time.sleep(0.05)  # ordering-free: waits for its cancellation
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.ones(1, np.float32))])]
"""


def test_a_server_starting_removes_the_files_a_killed_server_left_and_keeps_those_of_live_ones(
    tmp_path, start_server, monkeypatch
):
    import shutil

    marker = tmp_path / "holding"
    monkeypatch.setenv("SLOTSERVE_TEST_MARKER", str(marker))
    repository = tmp_path / "repo"
    write_model(repository, "holder", HOLDS_REPLIES)
    shutil.copytree(REPOSITORY / "repeat", repository / "repeat")
    killed = start_server(repository)
    lanes = len(files_of(killed.process.pid))  # both workers' request and response segments, made with them
    call = killed.call_async(killed.client.infer, "holder", {"X": np.ones(1, np.float32)}, timeout=WAIT)
    wait_until(marker.exists, "the model to hold its BLS responses")
    wait_until(lambda: len(files_of(killed.process.pid)) > lanes, "the unread responses' files")
    workers = children_of(killed.process.pid)
    held = files_of(killed.process.pid, *workers)
    killed.signal(signal.SIGKILL)
    killed.wait_exit()
    call.exception(timeout=WAIT)
    left = files_of(killed.process.pid, *workers)
    assert set(held) <= set(left), (held, left)  # a killed server removes nothing itself

    # A live process's file (this test's pid, made after it started) is not a leftover.
    live = SHM / f"slotserve-py-{os.getpid()}-livetest0000"
    live.touch()
    try:
        (tmp_path / "empty").mkdir()
        start_server(tmp_path / "empty")  # any server: its python backend sweeps /dev/shm as it is made
        assert files_of(killed.process.pid, *workers) == []
        assert live.exists()
    finally:
        live.unlink(missing_ok=True)
