"""Hostile management input: generated RepositoryModelLoad and RepositoryModelUnload calls, with model names and
`file:` paths built from what broke the server before (issue 33: `..`, a leading `/`, `a/b`, a trailing newline,
300 characters, ANSI escapes, NUL, non-ASCII), config JSON that is valid, wrong or not JSON, and file contents,
against one real server in explicit mode with loads with files allowed.

What every example asserts:
* the call ends with a status in {OK, INVALID_ARGUMENT, NOT_FOUND, INTERNAL (Triton's "failed to poll from model
  repository" for a repository or file path it refuses), UNAVAILABLE (a model that fails to load)}, never UNKNOWN,
  and a name that is not a plain model name is INVALID_ARGUMENT before anything touches the disk;
* nothing was ever written outside --model-files-dir (a sentinel folder beside it stays empty, and the repository
  holds only what the test put there), and after the call no staging folder of a failed load is left behind;
* the server still answers: ServerLive, and a request to the model that was loaded first.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from service.testing import serve
from tests.integration._support import demo_subset

from .lab import FUZZ, examples

ALLOWED = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "INTERNAL", "UNAVAILABLE"}
CALL_SECONDS = 30.0
PLAIN = "simple"  # the demo's add/sub model, loaded at the start: it must answer after every example

HOSTILE_PIECES = ["..", "/", "a/b", "\n", "\r", "\x1b[31m", "\x00", "é", " ", ".", "-", "_", "x" * 300, "victim"]


def names() -> st.SearchStrategy[str]:
    """Model names: plain ones, and plain ones with hostile pieces put together."""
    plain = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True)
    hostile = st.lists(st.sampled_from(HOSTILE_PIECES) | plain, min_size=1, max_size=4).map("".join)
    return plain | hostile


def configs() -> st.SearchStrategy[str | None]:
    """The `config` parameter: none, an ONNX add/sub config, a wrong one, or text that is not JSON."""
    good = json.dumps(
        {
            "backend": "onnxruntime",
            "max_batch_size": 8,
            "input": [{"name": n, "data_type": "TYPE_INT32", "dims": [16]} for n in ("INPUT0", "INPUT1")],
            "output": [{"name": n, "data_type": "TYPE_INT32", "dims": [16]} for n in ("OUTPUT0", "OUTPUT1")],
        }
    )
    wrong = st.sampled_from(['{"max_batch_size": "lots"}', '{"backend": "nope"}', "[]", '{"input": 7}'])
    return st.none() | st.just(good) | wrong | st.text(max_size=40)


def file_paths() -> st.SearchStrategy[str]:
    return st.sampled_from(["1/model.onnx", "config.pbtxt", "1/../../escaped", "/abs", "a/" + "y" * 260]) | names()


def load_request(name: str, config: str | None, files: dict[str, bytes]) -> pb.RepositoryModelLoadRequest:
    request = pb.RepositoryModelLoadRequest(model_name=name)
    if config is not None:
        request.parameters["config"].string_param = config
    for path, contents in files.items():
        request.parameters[f"file:{path}"].bytes_param = contents
    return request


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("management-fuzz")
    repository = demo_subset(root / "repository", PLAIN)
    files = root / "files"
    files.mkdir()
    (root / "sentinel").mkdir()  # beside --model-files-dir: an escape from it would land here
    with serve(
        repository,
        model_control_mode="explicit",
        allow_management=True,
        load_models=(PLAIN,),
        model_files_dir=files,
    ) as running:
        channel = grpc.insecure_channel(running.address)
        yield running, pb_grpc.GRPCInferenceServiceStub(channel), root
        channel.close()


def status_of(call, request) -> tuple[str, str]:
    try:
        call(request, timeout=CALL_SECONDS)
    except grpc.RpcError as error:
        return error.code().name, error.details() or ""
    return "OK", ""


def plain_name(name: str) -> bool:
    """The documented model-name rule (docs/model-control.md), written out here on its own: 1-128 letters, digits,
    `_`, `.` or `-`, starting with a letter or digit (so no path part, no control character, no newline)."""
    return re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", name) is not None


def snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def assert_still_serving(stub) -> None:
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=CALL_SECONDS).live
    request = pb.ModelInferRequest(model_name=PLAIN)
    for input_name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=input_name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    reply = stub.ModelInfer(request, timeout=CALL_SECONDS)
    assert np.frombuffer(reply.raw_output_contents[0], np.int32).tolist() == (np.arange(16) * 2).tolist()


@settings(FUZZ, max_examples=examples(60))
@given(
    name=names(),
    config=configs(),
    files=st.dictionaries(file_paths(), st.binary(max_size=64), max_size=3),
    unload=st.booleans(),
)
def test_hostile_loads_and_unloads_are_refused_by_name_and_leave_nothing_behind(server, name, config, files, unload):
    running, stub, root = server
    assume(name != PLAIN)  # the model every example asks afterwards
    repository_before = snapshot(root / "repository")
    if files and config is None:
        config = "{}"
    code, message = status_of(stub.RepositoryModelLoad, load_request(name, config, files))
    note(f"load {name!r}: {code} {message[:200]}")
    assert code in ALLOWED, (name, code, message)
    if not plain_name(name):
        assert code == "INVALID_ARGUMENT", (name, code, message)
    if unload:
        code, message = status_of(stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name=name))
        note(f"unload {name!r}: {code} {message[:200]}")
        assert code in ALLOWED, (name, code, message)
    assert not any((root / "sentinel").iterdir()), "a load wrote outside --model-files-dir"
    assert snapshot(root / "repository") == repository_before, "a load wrote into the repository"
    assert_still_serving(stub)
