"""Python workers under hostile and unlucky conditions (issue 33): a /dev/shm too small for a request, a decoupled
model that keeps sending after its stream was cancelled, BLS iterators left unread, a server whose stdout reader
went away, JSON logs, the memory a large request leaves behind. Real servers on real ports: in-process
(service.testing) where the test needs nothing of the process, `python -m service` processes where it does (a
private mount namespace, a closed stdout, the process's own RSS)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from client import ClientError, InferenceClient, ManagementClient
from tests.integration.python_models.test_python_models import write_model
from tests.python_models import REPOSITORY

ROOT = Path(__file__).resolve().parents[3]
WAIT = 60.0

FLOAT_IO = """
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

ECHO_IO = """
input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "PID" data_type: TYPE_INT32 dims: [ 1 ] }
]
"""

# Y = X (a copy of the request's tensor in the response segment), PID = the worker's process id.
ECHO = """
class TritonPythonModel:
    def execute(self, requests):
        pid = pb_utils.Tensor("PID", np.array([os.getpid()], np.int32))
        inputs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x), pid]) for x in inputs]
"""


def segment_files(*pids: int) -> list[str]:
    """The python-worker segments named in /dev/shm for the processes `pids`."""
    folder = Path("/dev/shm")
    if not folder.is_dir():
        return []
    return sorted(p.name for pid in pids for p in folder.glob(f"slotserve-py-{pid}-*"))


def wait_for(predicate, what: str, timeout: float = WAIT) -> float:
    """Re-check a state until it holds; returns the seconds it took. Raises AssertionError after `timeout`."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.02)  # ordering-free: re-checks a state predicate until a deadline
    return time.monotonic() - started


class Subprocess:
    """A `python -m service` process (optionally run through `prefix`, e.g. unshare) on 127.0.0.1:<free port>.
    Its stderr (the log) goes to a file; its stdout is read until the address line, then kept open or closed."""

    def __init__(self, tmp_path: Path, repository: Path, *flags: str, prefix=(), close_stdout: bool = False) -> None:
        self.log_path = tmp_path / f"server-{time.monotonic_ns()}.log"
        command = [
            sys.executable, "-m", "service", "--model-repository", str(repository), "--host", "127.0.0.1",
            "--port", "0", *flags,
        ]  # fmt: skip
        if prefix:  # a shell command line whose last word is `exec`: the server's command follows it
            command = [*prefix[:-1], prefix[-1] + " " + " ".join(_quoted(part) for part in command)]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"}
            )
        self.address = self._address()
        if close_stdout:
            self.process.stdout.close()  # type: ignore[union-attr]  # the reader of the server's stdout is gone
        self.client = InferenceClient(self.address, timeout=WAIT)
        self.management = ManagementClient(self.address, timeout=WAIT, token="")

    def _address(self) -> str:
        found: list[str] = []

        def read() -> None:
            for line in self.process.stdout:  # type: ignore[union-attr]
                text = line.decode(errors="replace")
                if "slotserve listening on " in text:
                    found.append(text.split("slotserve listening on ", 1)[1].split()[0])
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(WAIT)
        if not found:
            self.close()
            raise AssertionError(f"the server did not listen within {WAIT} s:\n{self.log}")
        return found[0]

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        for closeable in (getattr(self, "client", None), getattr(self, "management", None)):
            if closeable is not None:
                closeable.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=WAIT)
        if self.process.stdout is not None:
            self.process.stdout.close()


def _quoted(part: str) -> str:
    import shlex

    return shlex.quote(part)


@pytest.fixture
def subprocess_server(tmp_path):
    started: list[Subprocess] = []

    def start(repository: Path, *flags: str, **options) -> Subprocess:
        server = Subprocess(tmp_path, repository, *flags, **options)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()
        print(f"---- log of the server on {server.address} ----\n{server.log}")  # shown when the test failed


# ---- 1. a /dev/shm too small for a request ---------------------------------------------------------------------


def _private_shm_prefix(size: str) -> list[str]:
    """A command prefix that runs the rest in a private mount namespace with a `size` /dev/shm; skips the test
    where that cannot be done (not root, no unshare, no mount namespaces)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to give the server a private, small /dev/shm (CI runs as root)")
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size={size} tmpfs /dev/shm"],
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private /dev/shm here (unshare -m + mount): {probe.stderr.strip()}")
    return ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec"]


def test_a_request_too_big_for_a_small_dev_shm_is_refused_and_the_server_and_the_model_keep_serving(
    subprocess_server, tmp_path
):
    prefix = _private_shm_prefix("64m")
    write_model(tmp_path / "repo", "echo", ECHO, ECHO_IO)
    server = subprocess_server(tmp_path / "repo", prefix=prefix)
    small = np.arange(10, dtype=np.int32)

    def served() -> int:
        answer = server.client.infer("echo", {"X": small})
        np.testing.assert_array_equal(answer["Y"], small)
        return int(answer["PID"][0])

    worker = served()
    # 100 MiB does not fit at all (the request's segment is refused); 40 MiB fits on the way in, but the response
    # does not fit beside it (the worker's segment is refused). Each three times: three worker deaths would take
    # the model out of service.
    for megabytes in (100, 100, 100, 40, 40, 40):
        big = np.ones(megabytes << 18, dtype=np.int32)
        with pytest.raises(ClientError) as refused:
            server.client.infer("echo", {"X": big}, timeout=WAIT)
        error = refused.value
        assert (error.code, error.reason) == ("RESOURCE_EXHAUSTED", "out_of_memory"), (megabytes, error)
        assert "/dev/shm" in error.message and "MiB free" in error.message, error.message
        assert "model 'echo'" in error.message, error.message
        side = "the request:" if megabytes == 100 else "the response:"  # refused by the server, by the worker's grow
        assert side in error.message, error.message
        assert server.process.poll() is None, f"the server died: {server.process.returncode}\n{server.log}"
        assert served() == worker  # the same worker: nothing died
    status = server.management.get("echo")
    assert status.loaded, status.last_error
    (stats,) = server.client.statistics("echo")
    assert stats.inference_stats.fail.count == 6
    # a request that fits still gets through whole
    fits = np.arange(3 << 20, dtype=np.int32)  # 12 MiB each way
    np.testing.assert_array_equal(server.client.infer("echo", {"X": fits}, timeout=WAIT)["Y"], fits)


# ---- 2. the cancel-kill clock -------------------------------------------------------------------------------------

# X = 1: a response every 0.5 s for two minutes, never looking at is_cancelled(); X = 0: one response, then final.
CHATTY = """
import time
class TritonPythonModel:
    def execute(self, requests):
        sender = requests[0].get_response_sender()
        pid = pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([float(os.getpid())], np.float32))])
        sender.send(pid)
        if pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()[0] > 0:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                time.sleep(0.5)  # ordering-free: a model that keeps sending on purpose
                sender.send(pid)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
CANCEL_KILL_SECONDS = 2.0  # the default of cancel_kill_seconds
SLOT_FREE_BOUND = 6.0  # on top of it: the kill, the slot's release, a new worker's start on a loaded machine


def test_a_cancelled_stream_whose_model_keeps_sending_is_killed_on_time_and_frees_its_slot(slotserve, tmp_path):
    write_model(tmp_path, "chatty", CHATTY, FLOAT_IO + "model_transaction_policy { decoupled: true }\n")
    running = slotserve(tmp_path)  # one slot: the next request runs only once the cancelled one let it go

    items = running.client.stream_infer("chatty", [{"X": np.ones(1, np.float32)}], timeout=WAIT)
    stubborn = int(next(items)["Y"][0])
    assert int(next(items)["Y"][0]) == stubborn  # it keeps sending
    items.close()  # leaving the loop cancels the call
    cancelled_at = time.monotonic()
    budget = CANCEL_KILL_SECONDS + SLOT_FREE_BOUND
    (answer, *_rest) = running.client.stream_infer("chatty", [{"X": np.zeros(1, np.float32)}], timeout=budget)
    seconds = time.monotonic() - cancelled_at
    assert not isinstance(answer, ClientError), answer
    assert int(answer["Y"][0]) != stubborn  # a new worker: the stubborn one was killed
    print(f"slot free and answered {seconds:.2f} s after the cancel (cancel_kill_seconds {CANCEL_KILL_SECONDS:g})")
    assert seconds < budget
    assert running.management.get("chatty").loaded  # a kill after a cancellation is no failure of the model


# ---- 3. /dev/shm leftovers ------------------------------------------------------------------------------------

# Calls the decoupled `repeat` (10 responses) and keeps the iterator without ever reading it.
KEEPER = """
class TritonPythonModel:
    def initialize(self, args):
        self.kept = []
    def execute(self, requests):
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="repeat", inputs=[pb_utils.Tensor("IN", np.array([10], np.int32))],
                requested_output_names=["OUT"],
            )
            self.kept.append(call.exec(decoupled=True))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.ones(1, np.float32))]) for r in requests]
"""


def test_an_unread_decoupled_bls_iterator_leaves_no_file_once_its_request_ended(slotserve, tmp_path):
    shutil.copytree(REPOSITORY / "repeat", tmp_path / "repeat")
    write_model(tmp_path, "keeper", KEEPER, FLOAT_IO)
    running = slotserve(tmp_path)
    for _ in range(3):
        np.testing.assert_array_equal(running.client.infer("keeper", {"X": np.ones(1, np.float32)})["Y"], [1])

    def callee_done() -> bool:
        (stats,) = running.client.statistics("repeat")  # a stream ends as a success, or cancelled with its caller
        return stats.inference_stats.success.count + stats.inference_stats.fail.count == 3

    wait_for(callee_done, "the callee to end its three streams")
    # the responses nobody read were the calling requests' own: they ended, and so did their files
    wait_for(lambda: segment_files(os.getpid()) == [], f"no segment file left (still: {segment_files(os.getpid())})")
    np.testing.assert_array_equal(running.client.infer("keeper", {"X": np.ones(1, np.float32)})["Y"], [1])


# ---- 4. what workers print ------------------------------------------------------------------------------------

PRINTER = """
import sys
class TritonPythonModel:
    def execute(self, requests):
        value = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
        print(f"printed to stdout {value[0]:g}")
        print(f"printed to stderr {value[0]:g}", file=sys.stderr)
        pb_utils.Logger.log_warn(f"logged through pb_utils {value[0]:g}")
        if value[0] < 0:
            raise ValueError("a negative value")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", value * 2)])]
"""


def test_a_model_that_prints_answers_when_the_servers_stdout_reader_is_gone(subprocess_server, tmp_path):
    write_model(tmp_path / "repo", "printer", PRINTER, FLOAT_IO)
    server = subprocess_server(tmp_path / "repo", close_stdout=True)
    for value in (1.0, 2.0, 3.0):
        answer = server.client.infer("printer", {"X": np.full(1, value, np.float32)})
        np.testing.assert_array_equal(answer["Y"], [2 * value])
    # what the model printed is in the server's log, naming the model and its instance
    wait_for(lambda: "printed to stdout 3" in server.log, "the model's print in the log")
    (line,) = [line for line in server.log.splitlines() if "printed to stdout 3" in line]
    assert "model 'printer'" in line and "instance 0" in line, line


def test_in_json_log_mode_every_line_is_json_and_names_the_model_and_instance(subprocess_server, tmp_path):
    write_model(tmp_path / "repo", "printer", PRINTER, FLOAT_IO)
    server = subprocess_server(tmp_path / "repo", "--log-format", "json")
    server.client.infer("printer", {"X": np.full(1, 7, np.float32)})
    with pytest.raises(ClientError) as raised:
        server.client.infer("printer", {"X": np.full(1, -1, np.float32)})
    assert "ValueError: a negative value" in raised.value.message
    wait_for(lambda: "execute raised" in server.log, "the model's traceback in the log")
    records = []
    for line in server.log.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"a line of the log is not JSON: {line!r}") from None
    by_text = {
        text: [r for r in records if text in r["message"]]
        for text in ("printed to stdout 7", "printed to stderr 7", "logged through pb_utils 7", "execute raised")
    }
    for text, found in by_text.items():
        assert len(found) == 1, (text, found)
        record = found[0]
        assert record["model"] == "printer" and record["instance"] == 0, record
    assert by_text["logged through pb_utils 7"][0]["level"] == "WARNING"
    assert by_text["execute raised"][0]["level"] == "ERROR"
    assert "Traceback" in by_text["execute raised"][0]["message"]  # the traceback whole, in its one record


# ---- 5. the memory a large request leaves behind ----------------------------------------------------------------

# ECHO, and X = [-64] keeps 64 MiB for the worker's life (a model that grows).
GROWING = """
class TritonPythonModel:
    def initialize(self, args):
        self.kept = []
    def execute(self, requests):
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            if x.size == 1 and x[0] == -64:
                self.kept.append(np.ones(64 << 18, np.int32))
            pid = pb_utils.Tensor("PID", np.array([os.getpid()], np.int32))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x), pid]))
        return responses
"""
MiB = 1 << 20


def status_bytes(pid: int, field: str) -> int:
    """A size from /proc/<pid>/status (VmRSS, RssShmem, ...), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


def test_a_large_request_leaves_no_memory_behind_and_memory_bytes_follows_the_workers(subprocess_server, tmp_path):
    write_model(tmp_path / "repo", "growing", GROWING, ECHO_IO)
    server = subprocess_server(tmp_path / "repo", "--allow-management")
    small = {"X": np.arange(100, dtype=np.int32)}
    for _ in range(3):
        worker = int(server.client.infer("growing", small)["PID"][0])

    def measure() -> tuple[int, int, int, int]:
        """The server's shared memory mapped, its RSS, the worker's RSS, the model's memory_bytes."""
        pid = server.process.pid
        memory = server.management.get("growing").memory_bytes
        return status_bytes(pid, "RssShmem"), status_bytes(pid, "VmRSS"), status_bytes(worker, "VmRSS"), memory

    before = measure()
    large = np.arange(24 * MiB, dtype=np.int32)  # 96 MiB each way
    np.testing.assert_array_equal(server.client.infer("growing", {"X": large}, timeout=WAIT)["Y"], large)
    del large
    # the worker drops its mapping of the call's large segments once it has answered: a moment after the client
    wait_for(lambda: status_bytes(worker, "VmRSS") - before[2] < 40 * MiB, "the worker's memory to drop back", 10)
    after = measure()
    print(
        "after one 96 MiB request (MiB): server shared {:.0f} -> {:.0f}, server RSS {:.0f} -> {:.0f}, worker RSS "
        "{:.0f} -> {:.0f}, memory_bytes {:.0f} -> {:.0f}".format(
            *(v / MiB for pair in zip(before, after, strict=True) for v in pair)
        )
    )
    # the segments it needed went with it, in both processes (the server's own heap is gRPC's and the wire's:
    # the same for every backend, not the python model's)
    assert after[0] - before[0] < 8 * MiB, (before[0] / MiB, after[0] / MiB)
    assert after[2] - before[2] < 40 * MiB, (before[2] / MiB, after[2] / MiB)
    assert after[3] - before[3] < 40 * MiB, (before[3] / MiB, after[3] / MiB)

    # a model that keeps memory: memory_bytes sees it now, not what the worker weighed when it started
    assert int(server.client.infer("growing", {"X": np.array([-64], np.int32)})["PID"][0]) == worker
    kept = measure()
    assert kept[2] - after[2] > 60 * MiB and kept[3] - after[3] > 60 * MiB, (kept, after)
    # the worker's own memory with its segments once: about the worker's resident set
    assert abs(kept[3] - kept[2]) < 40 * MiB, (kept[3] / MiB, kept[2] / MiB)
