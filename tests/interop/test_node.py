"""A Node.js client (@grpc/grpc-js with @grpc/proto-loader, loading the repository's proto/ at run time) against
slotserve: the "SDK in another language" case. tests/interop/node/client.js asserts and prints JSON; this test
checks its exit code and that JSON again.

Needs `node` and the packages pinned in tests/interop/node/package-lock.json (`make node-deps`, which `make test`
runs, installs them with `npm ci`). Skipped, with the reason, only when node is absent, or when node_modules is
missing and `npm ci` cannot install it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.config.repository import ModelRepository

from .support import last_json_line, run_process

pytestmark = pytest.mark.interop

NODE_DIR = Path(__file__).resolve().parent / "node"


@pytest.fixture(scope="module")
def node() -> str:
    executable = shutil.which("node")
    if executable is None:
        pytest.skip("node is not installed")
    modules = NODE_DIR / "node_modules"
    if not (modules / "@grpc" / "grpc-js").is_dir() or not (modules / "@grpc" / "proto-loader").is_dir():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("tests/interop/node/node_modules is missing and npm is not installed (make node-deps)")
        completed = run_process([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_DIR, timeout=300)
        if completed.returncode != 0:
            pytest.skip(f"tests/interop/node/node_modules is missing and `npm ci` failed: {completed.stderr[-500:]}")
    # What is installed is what package.json pins (a stale node_modules would test something else).
    pins = json.loads((NODE_DIR / "package.json").read_text())["dependencies"]
    for package, version in pins.items():
        installed = json.loads((modules / package / "package.json").read_text())["version"]
        assert installed == version, (
            f"{package} {installed} is installed, package.json pins {version}: run make node-deps"
        )
    return executable


def check_sum_diff(entry: dict) -> None:
    a = np.asarray(entry["INPUT0"], dtype=np.int32).reshape(entry["shape"])
    b = np.asarray(entry["INPUT1"], dtype=np.int32).reshape(entry["shape"])
    np.testing.assert_array_equal(np.asarray(entry["OUTPUT0"], np.int32).reshape(entry["shape"]), a + b)
    np.testing.assert_array_equal(np.asarray(entry["OUTPUT1"], np.int32).reshape(entry["shape"]), a - b)


def test_node_grpc_js_client(node, slotserve, demo_repository):
    server = slotserve(demo_repository, parallel_jobs=2, allow_management=True)

    completed = run_process([node, str(NODE_DIR / "client.js"), server.address], cwd=NODE_DIR, timeout=120)
    assert completed.returncode == 0, f"client.js exited {completed.returncode}\n{completed.stdout}\n{completed.stderr}"
    result = last_json_line(completed)

    assert result["live"] is True
    spec = ModelRepository(demo_repository).read("simple")
    metadata = result["metadata"]
    assert metadata["name"] == "simple" and metadata["versions"] == [spec.version]
    assert metadata["inputs"] == [
        {"name": t.name, "datatype": t.datatype, "shape": [-1, *t.shape]} for t in spec.inputs
    ]
    assert metadata["outputs"] == [
        {"name": t.name, "datatype": t.datatype, "shape": [-1, *t.shape]} for t in spec.outputs
    ]

    assert result["infer"]["id"] == "node-infer" and result["infer"]["shape"] == [3, 16]
    check_sum_diff(result["infer"])

    assert result["unknown_model"]["code"] == 5  # NOT_FOUND
    assert "Request for unknown model" in result["unknown_model"]["details"]

    stream = result["stream"]
    assert stream["status"] == 0  # the stream ended cleanly, with OK, after the failed request
    ok_first, failed, ok_last = stream["responses"]
    assert ok_first["id"] == "node-stream-0" and ok_last["id"] == "node-stream-2"
    check_sum_diff(ok_first)
    check_sum_diff(ok_last)
    assert failed["id"] == "node-stream-bad"
    assert "FP32" in failed["error_message"], failed

    # RegisterModel reconfigured simple to one slot; the server agrees, and ListModels showed it.
    register = result["register"]
    assert register == {**register, "model_id": "simple", "loaded": True, "state": "MODEL_STATE_READY", "slots": 1}
    check_sum_diff(register["infer"])
    status = server.management.get("simple")
    assert status.loaded and status.slots == 1
    listed = {m["model_id"]: m for m in result["models"]}
    assert sorted(listed) == sorted(p.parent.name for p in demo_repository.glob("*/config.pbtxt"))
    assert listed["simple"]["slots"] == 1
    assert all(m["loaded"] and m["state"] == "MODEL_STATE_READY" for m in listed.values())
