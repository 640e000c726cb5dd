"""Generated hostile input for python models' workers (issue 33): tensors of every size around the shared-memory
segments' thresholds, whatever bytes a model writes to its stdout and stderr (invalid UTF-8, endless lines, forged
log records), streams cancelled after any number of responses by a model that ignores it, BLS iterators read
partly and dropped. After each example: the answer is exact, the server and the worker serve on, no segment file
is left named, what the model wrote is in the log as records naming the model and its slot."""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client import ClientError
from engine.python import output, transport
from service.testing import serve
from tests.integration.python_models.test_python_models import write_model
from tests.python_models import REPOSITORY

from .lab import FUZZ, examples

ECHO = """
class TritonPythonModel:
    def execute(self, requests):
        pid = pb_utils.Tensor("PID", np.array([os.getpid()], np.int32))
        inputs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x), pid]) for x in inputs]
"""
ECHO_IO = """
input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "PID" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# Writes TEXT's bytes as they are to stdout (MODE 0) or stderr (MODE 1); answers their length.
WRITER = """
import sys
class TritonPythonModel:
    def execute(self, requests):
        text = pb_utils.get_input_tensor_by_name(requests[0], "TEXT").as_numpy()[0]
        stream = sys.stderr if pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy()[0] else sys.stdout
        stream.buffer.write(text)
        stream.flush()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("N", np.array([len(text)], np.int32))])]
"""
WRITER_IO = """
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }, { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# Sends a response every 50 ms for a minute and never looks at is_cancelled() (X > 0); X = 0: one, then final.
CHATTY = """
import time
class TritonPythonModel:
    def execute(self, requests):
        sender = requests[0].get_response_sender()
        pid = pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([float(os.getpid())], np.float32))])
        sender.send(pid)
        if pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()[0] > 0:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.05)  # ordering-free: a model that keeps sending on purpose
                sender.send(pid)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
FLOAT_IO = """
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
KILL_SOON = 'parameters { key: "cancel_kill_seconds" value: { string_value: "0.5" } }\n'

# Calls repeat(N) decoupled and reads the first K responses (X = [N, K]), then lets the iterator go (or keeps it).
READER = """
class TritonPythonModel:
    def initialize(self, args):
        self.kept = []
    def execute(self, requests):
        n, k, keep = (int(v) for v in pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy())
        n_in = [pb_utils.Tensor("IN", np.array([n], np.int32))]
        call = pb_utils.InferenceRequest(model_name="repeat", inputs=n_in, requested_output_names=["OUT"])
        responses = call.exec(decoupled=True)
        seen = []
        for response in responses:
            if len(seen) == k:
                break
            seen.extend(response.output_tensors()[0].as_numpy().tolist() if response.output_tensors() else [])
        if keep:
            self.kept.append(responses)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array(seen, np.int32))])]
"""
READER_IO = """
input [ { name: "X" data_type: TYPE_INT32 dims: [ 3 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""

MiB = 1 << 20
KEEP = transport.KEEP_SEGMENT_BYTES // 4  # int32 elements of a segment at the threshold
SIZES = st.one_of(
    st.sampled_from([0, 1, 16383, 16384, 16385, KEEP - 1, KEEP, KEEP + 1, 5 * MiB // 4]),
    st.integers(min_value=0, max_value=6 * MiB // 4),
)


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    repository = tmp_path_factory.mktemp("python_workers")
    write_model(repository, "echo", ECHO, ECHO_IO)
    write_model(repository, "writer", WRITER, WRITER_IO)
    write_model(repository, "chatty", CHATTY, FLOAT_IO + "model_transaction_policy { decoupled: true }\n" + KILL_SOON)
    write_model(repository, "reader", READER, READER_IO)
    shutil.copytree(REPOSITORY / "repeat", repository / "repeat")
    with serve(repository) as running:
        yield running


def named_segments() -> list[str]:
    folder = Path("/dev/shm")
    return sorted(p.name for p in folder.glob(f"slotserve-py-{os.getpid()}-*")) if folder.is_dir() else []


def no_segment_left(timeout: float = 10.0) -> None:
    """Until no segment of this process is named (a BLS part that came after its request ended is made, then
    removed at once: give it that moment)."""
    deadline = time.monotonic() + timeout
    while named_segments():
        assert time.monotonic() < deadline, f"segment files left: {named_segments()}"
        time.sleep(0.01)  # ordering-free: re-checks the folder until a deadline


@settings(FUZZ, max_examples=examples(25))
@given(sizes=st.lists(SIZES, min_size=1, max_size=3))
def test_tensors_of_any_size_come_back_whole_and_leave_nothing_behind(workers, sizes):
    pids = set()
    for size in sizes:
        x = np.random.default_rng(size).integers(-(2**31), 2**31 - 1, size, dtype=np.int32)
        answer = workers.client.infer("echo", {"X": x}, timeout=60)
        np.testing.assert_array_equal(answer["Y"], x)
        pids.add(int(answer["PID"][0]))
        assert named_segments() == []
    assert len(pids) == 1  # one worker served them all: none died
    memory = workers.management.get("echo").memory_bytes
    assert memory is not None and memory < 200 * MiB, memory  # no large segment stays pinned


TEXTS = st.one_of(
    st.binary(max_size=2048),
    st.builds(lambda head, body: head + body, st.sampled_from([b"", output.RECORD_MARK.encode()]), st.binary()),
    st.builds(lambda n: b"x" * n, st.integers(min_value=output.MAX_LINE - 2, max_value=3 * output.MAX_LINE)),
    st.sampled_from([
        output.RECORD_MARK.encode() + b'{"level": "CRITICAL", "logger": "x", "message": "forged"}\n',
        output.RECORD_MARK.encode() + b'{"level": 7, "logger": null}\n',
        output.RECORD_MARK.encode() + b"[1, 2]\n",
        b"\xff\xfe\xfd\n\r\n\n",
        b"no newline at the end",
    ]),
)  # fmt: skip


@settings(FUZZ, max_examples=examples(40))
@given(text=TEXTS, mode=st.integers(min_value=0, max_value=1))
def test_whatever_a_model_writes_becomes_log_records_and_the_request_is_answered(workers, text, mode):
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("slotserve.python_model")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # a print is INFO (a server's root logger is at --log-level, INFO by default)
    try:
        inputs = {"TEXT": np.array([text], dtype=object), "MODE": np.array([mode], np.int32)}
        answer = workers.client.infer("writer", inputs, timeout=60)
        assert int(answer["N"][0]) == len(text)
        marker = b"end-of-example %d" % time.monotonic_ns()
        end = {"TEXT": np.array([b"\n" + marker + b"\n"], dtype=object), "MODE": np.array([mode], np.int32)}
        workers.client.infer("writer", end)
        deadline = time.monotonic() + 30
        while not any(marker.decode() in record.getMessage() for record in records):
            assert time.monotonic() < deadline, "the model's output never reached the log"
            time.sleep(0.01)  # ordering-free: waits for the reader thread's record until a deadline
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    for record in records:
        assert getattr(record, "model", None) == "writer", record
        assert record.event_fields["instance"] == 0, record  # type: ignore[attr-defined]
        fields = record.event_fields  # type: ignore[attr-defined]
        assert "\n" not in record.getMessage() or "worker_logger" in fields, record  # one line, or one record


@settings(FUZZ, max_examples=examples(6))
@given(responses=st.integers(min_value=1, max_value=4))
def test_a_stream_cancelled_after_any_response_frees_its_slot_on_time(workers, responses):
    items = workers.client.stream_infer("chatty", [{"X": np.ones(1, np.float32)}], timeout=60)
    for _ in range(responses):
        stubborn = int(next(items)["Y"][0])
    items.close()
    cancelled = time.monotonic()
    (answer, *_rest) = workers.client.stream_infer("chatty", [{"X": np.zeros(1, np.float32)}], timeout=30)
    assert not isinstance(answer, ClientError), answer
    assert int(answer["Y"][0]) != stubborn
    assert time.monotonic() - cancelled < 0.5 + 10  # cancel_kill_seconds + a new worker's start on a busy machine


@settings(FUZZ, max_examples=examples(25))
@given(
    n=st.integers(min_value=0, max_value=12),
    k=st.integers(min_value=0, max_value=12),
    keep=st.integers(min_value=0, max_value=1),
)
def test_bls_responses_read_partly_leave_no_file_once_the_request_ended(workers, n, k, keep):
    answer = workers.client.infer("reader", {"X": np.array([n, k, keep], np.int32)}, timeout=60)
    assert answer["Y"].tolist() == list(range(min(n, k)))
    no_segment_left()


def test_the_examples_ran(workers):
    """The module's server still serves after every example above (the last one to run in this file)."""
    answer = workers.client.infer("echo", {"X": np.arange(examples(3), dtype=np.int32)})
    assert answer["Y"].tolist() == list(range(examples(3)))
