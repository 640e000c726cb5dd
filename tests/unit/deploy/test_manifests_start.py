"""Each manifest's slotserve container starts under the manifest's own constraints (issue 35, item 2).

deploy/kubernetes/*.yaml set `readOnlyRootFilesystem: true` and mounted nothing on /tmp, and the server died at
startup (`FileNotFoundError: No usable temporary directory found`: `tempfile.gettempdir()` for the folder of loads
with files). Parsing the manifests (test_deploy_manifests.py) could not see it. Here each container is run as its
manifest says: a private mount namespace (tests/unit/deploy/_sandbox.py) where the root is read-only when the
manifest says so, only the manifest's volumes are mounted (and writable unless `readOnly`), the server runs as the
manifest's uid, gid and fsGroup with the container's `args`; it must answer ServerReady with every model READY,
write nothing at startup outside /dev/shm (python models' tensors), stop on SIGTERM with status 0, and, where the
manifest allows management, take a load with files under its --model-files-dir volume.

Needs root and `unshare` (as CI runs); skips, naming the reason, elsewhere or where the sandbox cannot be built
(no overlayfs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import json_format, text_format

from generated import model_config_pb2
from tests.integration._support import require_demo
from tests.unit.deploy._sandbox import SETUP_FAILED
from tests.unit.deploy.test_manifests import ROOT, manifest_documents, pod_specs, value_of

IMAGE_GID = 10001  # deploy/Dockerfile: USER 10001:10001
TOKEN = "0123456789abcdef0123456789abcdef"
SANDBOX_SECONDS = 600.0
PYTHON_ECHO = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        outputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", output)]) for output in outputs]
"""
PYTHON_CONFIG = """name: "pyecho"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def containers() -> list[tuple[str, dict, dict]]:
    """(where, pod spec, slotserve container) for every manifest file's slotserve container."""
    found = []
    for where, spec in pod_specs(manifest_documents()):
        for container in spec["containers"]:
            if "command" not in container and str(container.get("image", "")).startswith("slotserve"):
                found.append((f"{where} {container['name']}", spec, container))
    return found


def size_of(limit: str | None) -> str | None:
    """A Kubernetes quantity (512Mi, 1Gi) as tmpfs's size option."""
    if limit is None:
        return None
    for suffix, unit in (("Ki", "k"), ("Mi", "m"), ("Gi", "g")):
        if str(limit).endswith(suffix):
            return str(limit)[: -len(suffix)] + unit
    return str(limit)


def volumes_of(spec: dict, container: dict, repository_path: str) -> list[dict]:
    """The container's volume mounts as the sandbox's volumes. KServe's storage initializer puts the model
    repository at /mnt/models, read-only, when the runtime declares no volume there."""
    declared = {volume["name"]: volume for volume in spec.get("volumes", [])}
    volumes = []
    for mount in container.get("volumeMounts", []):
        volume = declared[mount["name"]]
        entry = {"path": mount["mountPath"], "read_only": bool(mount.get("readOnly")), "size": None, "files": {}}
        if "secret" in volume:
            entry.update(kind="secret", files={"token": TOKEN + "\n"})
        elif "emptyDir" in volume:
            empty = volume["emptyDir"] or {}
            kind = "repository" if mount["mountPath"] == repository_path else "emptyDir"
            entry.update(kind=kind, size=size_of(empty.get("sizeLimit")))
        else:
            pytest.fail(f"volume {mount['name']}: the sandbox knows emptyDir and secret volumes only")
        volumes.append(entry)
    if not any(volume["path"] == repository_path for volume in volumes):
        volumes.append({"path": repository_path, "kind": "repository", "read_only": True, "size": None, "files": {}})
    return volumes


def write_repository(folder: Path) -> Path:
    """The demo's ONNX `simple` and a python echo model (python models need /dev/shm)."""
    repository = folder / "models"
    shutil.copytree(require_demo() / "simple", repository / "simple")
    (repository / "pyecho" / "1").mkdir(parents=True)
    (repository / "pyecho" / "config.pbtxt").write_text(PYTHON_CONFIG)
    (repository / "pyecho" / "1" / "model.py").write_text(PYTHON_ECHO)
    return repository


def load_with_files(repository: Path, files_dir: str) -> dict:
    config = text_format.Parse((repository / "simple" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    config.name = "uploaded"
    return {
        "name": "uploaded",
        "config": json_format.MessageToJson(config),
        "files": {"1/model.onnx": str(repository / "simple" / "1" / "model.onnx")},
        "folder": files_dir,
    }


def sandbox_spec(tmp_path: Path, spec: dict, container: dict) -> dict:
    args = container["args"]
    repository_path, port = value_of(args, "--model-repository"), value_of(args, "--port")
    assert repository_path and port, "the container's args name --model-repository and --port"
    security = {**(spec.get("securityContext") or {}), **(container.get("securityContext") or {})}
    repository = write_repository(tmp_path)
    stage = tmp_path / "stage"
    stage.mkdir()
    files_dir = value_of(args, "--model-files-dir")
    assert files_dir or "--allow-management" not in args, (
        "a manifest that allows management (loads with files) must give --model-files-dir a mounted volume: the "
        "default, the system temporary folder, is on the read-only root"
    )
    return {
        "stage": str(stage),
        "argv": args,
        "port": int(port),
        "read_only_root": bool(security.get("readOnlyRootFilesystem")),
        "uid": security["runAsUser"],
        "gid": security.get("runAsGroup", IMAGE_GID),
        "fs_group": (spec.get("securityContext") or {}).get("fsGroup"),
        "volumes": volumes_of(spec, container, repository_path),
        "repository": str(repository),
        "token": TOKEN,
        "load_with_files": load_with_files(repository, files_dir) if files_dir else None,
    }


def run_sandbox(tmp_path: Path, spec: dict) -> dict:
    if os.geteuid() != 0:
        pytest.skip("needs root for a private mount namespace (unshare -m); CI runs as root")
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux's unshare")
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    done = subprocess.run(
        ["unshare", "--mount", "--net", "--propagation", "private", "--", sys.executable]
        + ["-m", "tests.unit.deploy._sandbox", str(spec_file)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=SANDBOX_SECONDS,
    )
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {}
    if done.returncode == SETUP_FAILED or (done.returncode != 0 and "unshare" in done.stderr and not lines):
        pytest.skip(f"the sandbox cannot be built here: {result.get('setup_error') or done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    return result


def test_every_manifest_has_a_slotserve_container_to_start():
    where = [name for name, _, _ in containers()]
    assert len(where) >= 3, where  # the Deployment, the sidecar pod, the KServe runtime


@pytest.mark.parametrize("where, spec, container", containers(), ids=[name for name, _, _ in containers()])
def test_the_server_starts_under_the_manifests_constraints(where, spec, container, tmp_path):
    sandbox = sandbox_spec(tmp_path, spec, container)
    result = run_sandbox(tmp_path, sandbox)
    log = result.get("log", "")
    assert result.get("listening"), f"{where}: the server did not start; its log:\n{log}"
    assert result["ready"] is True, log
    assert set(result["uids"]) == {sandbox["uid"]} and set(result["gids"]) == {sandbox["gid"]}, result
    assert {name: state for name, (state, _) in result["models"].items() if name != "uploaded"} == {
        "simple": "READY",
        "pyecho": "READY",
    }, result["models"]
    written = {path: files for path, files in result["written"].items() if path != "/dev/shm"}
    assert all(not files for files in written.values()), f"{where}: written at startup: {written}"
    if sandbox["load_with_files"] is not None:
        assert result["load_with_files"] == "OK", result["load_with_files"]
        assert any(path.endswith("/1/model.onnx") for path in result["written_during_load"]), result
    assert result["exit_code"] == 0, log
