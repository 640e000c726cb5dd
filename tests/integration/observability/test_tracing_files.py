"""Triton-mode trace files from real requests on a real server: Triton 2.51's JSON format with every activity of each
request in order, BLS calls with their parent_id, the files named and rotated as Triton names them (`file` with
log_frequency 0, `file.0`, `file.1`, ... with log_frequency N, an indexed file when count runs out), read by Triton's
own trace summary tool (qa/common/trace_summary.py, read from the Triton mirror into a temporary folder at test
time, never committed; skipped with the reason when the mirror is absent); tracing off writes nothing and makes no
trace anywhere on the request path.

The server is stopped before its files are read: its shutdown writes what the trace files collected."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from client import ClientError
from service.core import tracing
from service.core.trace_settings import TraceLevel, TraceSettings
from service.testing import serve
from tests.integration._support import demo_subset
from tests.integration.python_models.test_bls import CHAIN, CHAIN_IO, python_repository
from tests.integration.python_models.test_python_models import write_model

TRITON_MIRROR = Path("/work/.mirror/triton-inference-server+server/repo")
X = np.arange(16, dtype=np.int32).reshape(1, 16)
ACTIVITIES = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]
BOUND = 30.0


def file_settings(path: Path, **fields) -> TraceSettings:
    fields.setdefault("levels", frozenset({TraceLevel.TIMESTAMPS}))
    return TraceSettings(rate=1, file=str(path), **fields)


def traces_of(records: list[dict]) -> dict[int, dict]:
    """Triton's records grouped by trace id: the head's fields and the timestamps' names in file order."""
    traces: dict[int, dict] = {}
    for record in records:
        trace = traces.setdefault(record["id"], {"names": [], "ns": []})
        if "timestamps" in record:
            for stamp in record["timestamps"]:
                trace["names"].append(stamp["name"])
                trace["ns"].append(stamp["ns"])
        else:
            assert set(record) <= {"id", "model_name", "model_version", "request_id", "parent_id"}
            trace.update(record)
    return traces


def infer(running, model: str = "simple", **kwargs) -> None:
    if model == "simple":
        running.client.infer("simple", {"INPUT0": X, "INPUT1": X}, **kwargs)
    else:
        running.client.infer(model, {"X": X}, **kwargs)


def test_each_request_and_bls_call_has_every_activity_in_order_in_tritons_format(tmp_path):
    root = python_repository(tmp_path, "add_sub")
    demo_subset(root, "simple")
    write_model(root, "chain", CHAIN, CHAIN_IO)
    trace_file = tmp_path / "trace.json"
    with serve(root, trace_settings=file_settings(trace_file)) as running:
        infer(running, request_id="one")
        infer(running, "chain")
    assert sorted(path.name for path in tmp_path.glob("trace.json*")) == ["trace.json"]  # log_frequency 0: one file
    traces = traces_of(json.loads(trace_file.read_text()))
    assert len(traces) == 4  # simple; chain and its two BLS calls
    by_model = {(trace["model_name"], "parent_id" in trace): trace for trace in traces.values()}
    alone, chain = by_model[("simple", False)], by_model[("chain", False)]
    assert alone["request_id"] == "one" and alone["model_version"] == 1
    frontend = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"]
    for top in (alone, chain):  # through gRPC: Triton's frontend activities around ours
        assert [name for name in top["names"] if name not in ACTIVITIES] == [
            *frontend,
            "GRPC_SEND_START",
            "GRPC_SEND_END",
        ]
        assert top["names"][:3] == [*frontend, "REQUEST_START"]
    for trace in traces.values():
        assert [name for name in trace["names"] if name in ACTIVITIES] == ACTIVITIES
        assert trace["ns"] == sorted(trace["ns"])  # written in time order
    chain_id = next(key for key, trace in traces.items() if trace is chain)
    calls = [trace for trace in traces.values() if trace.get("parent_id") == chain_id]
    assert sorted(call["model_name"] for call in calls) == ["add_sub", "simple"]
    for call in calls:
        assert not any(name.startswith("GRPC_") for name in call["names"])  # not from the frontend
        assert chain["ns"][0] <= call["ns"][0] <= call["ns"][-1] <= chain["ns"][-1]


def test_log_frequency_rotates_files_as_triton_names_them(tmp_path):
    repo = demo_subset(tmp_path / "repo", "simple")
    trace_file = tmp_path / "trace.json"
    with serve(repo, trace_settings=file_settings(trace_file, log_frequency=2)) as running:
        for _ in range(5):
            infer(running)
    names = sorted(path.name for path in tmp_path.glob("trace.json*"))
    assert names == ["trace.json.0", "trace.json.1", "trace.json.2"]  # 2 + 2, the last one at shutdown
    counts = [len(traces_of(json.loads((tmp_path / name).read_text()))) for name in names]
    assert counts == [2, 2, 1]
    ids = [key for name in names for key in traces_of(json.loads((tmp_path / name).read_text()))]
    assert ids == sorted(ids) and len(set(ids)) == 5


def test_count_stops_tracing_and_its_last_trace_writes_an_indexed_file_as_triton_does(tmp_path):
    repo = demo_subset(tmp_path / "repo", "simple")
    trace_file = tmp_path / "trace.json"
    with serve(repo, trace_settings=file_settings(trace_file, count=3)) as running:
        for _ in range(5):
            infer(running)
        assert running.server.trace_settings.settings().count == 0
    assert sorted(path.name for path in tmp_path.glob("trace.json*")) == ["trace.json.0"]
    assert len(traces_of(json.loads((tmp_path / "trace.json.0").read_text()))) == 3


def test_a_settings_update_writes_what_was_collected(tmp_path):
    repo = demo_subset(tmp_path / "repo", "simple")
    trace_file = tmp_path / "trace.json"
    with serve(repo, trace_settings=file_settings(trace_file)) as running:
        infer(running)
        infer(running)
        running.server.trace_settings.update("", {"trace_rate": ["2"]})  # a replaced setting's traces are written
        deadline = time.monotonic() + BOUND
        while not trace_file.exists() and time.monotonic() < deadline:  # ordering-free (the writer's thread)
            time.sleep(0.01)  # ordering-free: polls for the writer thread's file until a deadline
        assert trace_file.exists()
        infer(running)
        infer(running)  # the second at rate 2: traced
    assert len(traces_of(json.loads(trace_file.read_text()))) == 3


def test_a_refused_request_is_traced_up_to_its_end(tmp_path):
    repo = demo_subset(tmp_path / "repo", "simple")
    trace_file = tmp_path / "trace.json"
    with serve(repo, trace_settings=file_settings(trace_file)) as running:
        with pytest.raises(ClientError):
            running.client.infer("simple", {"INPUT0": X, "INPUT1": X.astype(np.float32)})
    (trace,) = traces_of(json.loads(trace_file.read_text())).values()
    assert [name for name in trace["names"] if name in ACTIVITIES] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]


def test_tracing_off_writes_nothing(tmp_path):
    repo = demo_subset(tmp_path / "repo", "simple")
    trace_file = tmp_path / "trace.json"
    with serve(repo, trace_settings=file_settings(trace_file, levels=frozenset())) as running:
        for _ in range(3):
            infer(running)
        written = running.server.trace_output.files.written
    assert written == 0 and list(tmp_path.glob("trace.json*")) == []


def triton_summary_tool(folder: Path) -> Path:
    """Triton 2.51's trace summary tool, read from the mirror into `folder` (never committed here)."""
    if not TRITON_MIRROR.exists():
        pytest.skip(f"the Triton mirror is absent ({TRITON_MIRROR}): Triton's trace summary tool cannot be read")
    shown = subprocess.run(
        ["git", "-C", str(TRITON_MIRROR), "show", "v2.51.0:qa/common/trace_summary.py"],
        capture_output=True,
        text=True,
        timeout=BOUND,
    )
    if shown.returncode != 0:
        pytest.skip(f"qa/common/trace_summary.py not readable at v2.51.0: {shown.stderr.strip()}")
    tool = folder / "trace_summary.py"
    tool.write_text(shown.stdout)
    return tool


def test_tritons_trace_summary_tool_reads_our_file(tmp_path):
    tool = triton_summary_tool(tmp_path)
    root = python_repository(tmp_path, "add_sub")
    demo_subset(root, "simple")
    write_model(root, "chain", CHAIN, CHAIN_IO)
    trace_file = tmp_path / "trace.json"
    with serve(root, trace_settings=file_settings(trace_file)) as running:
        for _ in range(3):
            infer(running)
        infer(running, "chain")
    summary = subprocess.run(
        [sys.executable, str(tool), "-t", str(trace_file)], capture_output=True, text=True, timeout=BOUND
    )
    assert summary.returncode == 0, summary.stderr
    out = summary.stdout
    # its gRPC summary counts our requests (a trace is counted only with Triton's gRPC frontend activities), the BLS
    # calls under their parent, and splits each into queue and compute (input, infer, output)
    assert "Summary for simple (1): trace count = 4" in out  # 3 requests + the chain's BLS call
    assert "Summary for chain (1): trace count = 1" in out
    assert "Summary for add_sub (1): trace count = 1" in out
    assert out.count("GRPC infer request (avg)") == 2  # the two models clients called
    for line in ("Queue (avg)", "Compute (avg)", "Input (avg)", "Infer (avg)", "Output (avg)"):
        assert line in out
    assert "parent id:" in out


def test_a_request_that_is_not_traced_makes_no_trace_anywhere_on_its_path(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a trace was made while tracing is off")

    monkeypatch.setattr(tracing.RequestTrace, "__init__", refuse)
    monkeypatch.setattr(tracing.Tracer, "start", refuse)
    repo = demo_subset(tmp_path / "repo", "simple")
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    with serve(repo, trace_settings=TraceSettings(file=str(tmp_path / "t.json"))) as running:  # level OFF
        running.client.infer("simple", {"INPUT0": x, "INPUT1": x})
        assert running.server.dataplane.tracing_on is False


def test_the_tensors_level_writes_each_input_and_output_as_triton_does_and_its_tool_reads_them(tmp_path):
    tool = triton_summary_tool(tmp_path)
    repo = demo_subset(tmp_path / "repo", "simple")
    trace_file = tmp_path / "trace.json"
    levels = frozenset({TraceLevel.TENSORS})
    with serve(repo, trace_settings=file_settings(trace_file, levels=levels)) as running:
        answer = running.client.infer("simple", {"INPUT0": X, "INPUT1": 2 * X})
    records = json.loads(trace_file.read_text())
    assert not any("timestamps" in record for record in records)  # TIMESTAMPS was not asked for
    tensors = {(r["activity"], r["tensor"]["name"]): r["tensor"] for r in records if "activity" in r}
    assert set(tensors) == {
        ("TENSOR_QUEUE_INPUT", "INPUT0"),
        ("TENSOR_QUEUE_INPUT", "INPUT1"),
        ("TENSOR_BACKEND_OUTPUT", "OUTPUT0"),
        ("TENSOR_BACKEND_OUTPUT", "OUTPUT1"),
    }
    assert tensors[("TENSOR_QUEUE_INPUT", "INPUT1")] == {
        "name": "INPUT1",
        "data": ",".join(str(v) for v in (2 * X).reshape(-1)),
        "shape": "1,16",
        "dtype": "INT32",
    }
    assert tensors[("TENSOR_BACKEND_OUTPUT", "OUTPUT0")]["data"] == ",".join(
        str(v) for v in answer["OUTPUT0"].reshape(-1)
    )
    summary = subprocess.run(
        [sys.executable, str(tool), str(trace_file)], capture_output=True, text=True, timeout=BOUND
    )
    assert summary.returncode == 0, summary.stderr
    assert "Data Flow:" in summary.stdout and "QUEUE_INPUT:" in summary.stdout
    assert "BACKEND_OUTPUT:" in summary.stdout


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_trace_file_that_cannot_be_written_loses_the_traces_never_a_request(tmp_path, caplog, kind):
    """An unlucky operator's trace_file: a folder, or a FIFO nobody reads. Requests are answered as without tracing,
    the writer says why in the log, and the server stops within its bound."""
    import os

    repo = demo_subset(tmp_path / "repo", "simple")
    trace_file = tmp_path / "trace.json"
    if kind == "folder":
        trace_file.mkdir()
    else:
        os.mkfifo(trace_file)
    started = time.monotonic()
    with serve(repo, trace_settings=file_settings(trace_file)) as running:
        for _ in range(3):
            infer(running)
        snapshot = running.server.registry.get("simple").statistics.snapshot()
        assert (snapshot.success.count, snapshot.failures) == (3, {})
    assert time.monotonic() - started < BOUND
    assert "cannot write" in caplog.text  # a folder: EISDIR; a FIFO with no reader: ENXIO, at once
    assert trace_file.is_dir() if kind == "folder" else trace_file.is_fifo()
