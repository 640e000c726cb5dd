"""A client cannot forge log lines (issue 33, item 11): newlines, carriage returns and ANSI escapes sent through every
client-controlled field reach the server's log escaped, in text and in JSON.

A string `sequence_id` holding "\\n2026-12-04 ... ERROR slotserve: ..." used to be logged verbatim when its request
was refused, giving a forged ERROR line; region, tensor and model names did the same. Each field below carries its
own marker inside a forged line; the server runs as a process at DEBUG (every refusal logged) with its stderr kept
as bytes, and every line must be one record: no raw control character, no marker at the start of a line, and in
JSON mode every line one JSON object. The markers of the fields logged today must appear (escaped), so the test
cannot pass by logging nothing.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import grpc
import numpy as np
import pytest

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from tests.integration._support import demo_subset
from tests.sequence_models import SequenceOptions, write_onnx_echo
from tests.shutdown.harness import ROOT, WAIT

CALL_TIMEOUT = 60.0
FORGED = "\n2026-12-04 00:00:00,000 ERROR slotserve: FORGED-{}\x1b[31m red\r\x1b[2K\u2028x\x85y"
LOGGED = ("sequence-id", "region", "input-name", "output-name")  # refusals that name them, logged at DEBUG
CONTROLS = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\xa8\xa9]")  # raw, in UTF-8; \t and \n aside
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")


def evil(field: str) -> str:
    return FORGED.format(field)


def infer_request(model: str = "simple") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=evil("request-id"))
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.zeros(16, np.int32).tobytes())
    return request


def hostile_calls(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """One refused call per client-controlled field, each carrying its marker."""
    sequence = pb.ModelInferRequest(model_name="seq", id=evil("request-id"))
    sequence.inputs.add(name="INPUT", datatype="INT32", shape=[1, 1])
    sequence.raw_input_contents.append(np.zeros(1, np.int32).tobytes())
    sequence.parameters["sequence_id"].string_param = evil("sequence-id")  # not started: refused naming it
    calls: list[tuple] = [(stub.ModelInfer, sequence)]
    region = infer_request()
    region.inputs[0].parameters["shared_memory_region"].string_param = evil("region")
    region.inputs[0].parameters["shared_memory_byte_size"].int64_param = 64
    del region.raw_input_contents[:]
    calls.append((stub.ModelInfer, region))
    named_input = infer_request()
    named_input.inputs[0].name = evil("input-name")
    calls.append((stub.ModelInfer, named_input))
    named_output = infer_request()
    named_output.outputs.add(name=evil("output-name"))
    calls.append((stub.ModelInfer, named_output))
    parameters = infer_request()
    parameters.parameters["timeout"].string_param = evil("timeout-parameter")
    parameters.parameters[evil("parameter-key")].string_param = evil("parameter-value")
    calls.append((stub.ModelInfer, parameters))
    calls.append((stub.ModelInfer, infer_request(evil("model-name"))))
    calls.append((stub.ModelMetadata, pb.ModelMetadataRequest(name=evil("metadata-name"))))
    calls.append((stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name=evil("load-name"))))
    calls.append((stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name=evil("unload-name"))))
    register = pb.SystemSharedMemoryRegisterRequest(name=evil("region-name"), key="/" + evil("key"), byte_size=64)
    calls.append((stub.SystemSharedMemoryRegister, register))
    calls.append((stub.SystemSharedMemoryUnregister, pb.SystemSharedMemoryUnregisterRequest(name=evil("unreg"))))
    for method, message in calls:
        try:  # most are refused (an unload of an unknown name is not: Triton's answer)
            method(message, timeout=CALL_TIMEOUT)
        except grpc.RpcError as error:
            assert error.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), error


@pytest.fixture
def repository(tmp_path):
    root = demo_subset(tmp_path / "repository", "simple")
    write_onnx_echo(root, "seq", SequenceOptions(corrid_type="TYPE_STRING"))
    return root


def server_log(repository, tmp_path, log_format: str) -> bytes:
    """Start the server at DEBUG, make the hostile calls, stop it (SIGTERM); its stderr as bytes."""
    log_path = tmp_path / f"server-{log_format}.log"
    command = [sys.executable, "-m", "service", "--model-repository", str(repository), "--port", "0"]
    command += ["--log-level", "DEBUG", "--log-format", log_format, "--allow-management", "--shared-memory", "system"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            address = None
            assert process.stdout is not None
            for line in process.stdout:  # the server prints its address once it serves
                if line.startswith("slotserve listening on "):
                    address = line.split()[-1]
                    break
            assert address, log_path.read_text(errors="replace")
            with grpc.insecure_channel(address) as channel:
                hostile_calls(pb_grpc.GRPCInferenceServiceStub(channel))
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=WAIT) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
    return log_path.read_bytes()


def test_text_log_lines_cannot_be_forged(repository, tmp_path):
    raw = server_log(repository, tmp_path, "text")
    assert not CONTROLS.search(raw), CONTROLS.search(raw)
    text = raw.decode("utf-8")
    for line in text.splitlines():
        assert "FORGED-" not in line or TEXT_LINE.match(line), line  # a marker only inside a real record
        assert TEXT_LINE.match(line) or line.startswith(("Traceback", " ", "During", "The above")) or ":" in line, line
    for field in LOGGED:
        assert f"\\n2026-12-04 00:00:00,000 ERROR slotserve: FORGED-{field}\\x1b[31m red\\r" in text, field


def test_json_log_lines_cannot_be_forged(repository, tmp_path):
    raw = server_log(repository, tmp_path, "json")
    assert not CONTROLS.search(raw), CONTROLS.search(raw)
    records = [json.loads(line) for line in raw.decode("utf-8").splitlines()]  # each line one JSON object
    messages = "\n".join(record["message"] for record in records)
    for field in LOGGED:
        assert f"\n2026-12-04 00:00:00,000 ERROR slotserve: FORGED-{field}\x1b[31m red\r" in messages, field
