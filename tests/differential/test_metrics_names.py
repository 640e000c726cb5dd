"""Triton's metric names at slotserve's metrics endpoint, against real Triton 2.51 (nvidia-pytriton's tritonserver,
set up by bench/setup.sh as bench/.venv-pytriton, or named by $SLOTSERVE_TRITON_VENV). Skips, with the reason,
when it is not there.

The same traffic goes to both servers (an identity model with `response_cache { enable: true }`: two distinct
requests, two repeats), then both are scraped once. Every `nv_*` family slotserve serves must exist in Triton's
exposition with the same type and the same label names, and the counts (not the durations: the two servers' runs
take different times) must be equal.

The starter here is deliberately small (HTTP only, a python-backend identity model); the shared harness of
tests/differential/ (branch `triton`) can replace it once merged.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from service.testing import serve
from tests.integration._support import write_fixture_model

ROOT = Path(__file__).resolve().parents[2]
STARTUP = 120.0  # seconds: tritonserver and its python stub start slowly on a loaded machine
CONFIG = """name: "idm"
backend: "{backend}"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
response_cache {{ enable: true }}
"""
IDENTITY = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]
            )
            for r in requests
        ]
"""
TRAFFIC = ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0])  # 2 misses, then 2 hits
COUNTS = (
    "nv_inference_request_success",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_cache_num_hits_per_model",
    "nv_cache_num_misses_per_model",
)


def tritonserver_folder() -> Path:
    venv = Path(os.environ.get("SLOTSERVE_TRITON_VENV") or ROOT / "bench" / ".venv-pytriton")
    found = sorted(venv.glob("lib/python3*/site-packages/pytriton/tritonserver"))
    if not found or not (found[0] / "caches" / "local" / "libtritoncache_local.so").exists():
        pytest.skip(f"real Triton is not set up at {venv} (bench/setup.sh, or $SLOTSERVE_TRITON_VENV)")
    return found[0]


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@contextmanager
def triton(folder: Path, work: Path):
    """tritonserver with the identity model, HTTP and metrics on free ports, a 1 MiB local response cache; yields
    (http port, metrics port) once the model is ready; stopped (and waited for) at the end."""
    site = folder.parents[1]
    venv = folder.parents[4]
    backends = work / "backends"
    shutil.copytree(folder / "backends", backends, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(folder / "python_backend_stubs" / "3.11" / "triton_python_backend_stub", backends / "python")
    repository = work / "repository"
    (repository / "idm" / "1").mkdir(parents=True)
    (repository / "idm" / "config.pbtxt").write_text(CONFIG.format(backend="python"))
    (repository / "idm" / "1" / "model.py").write_text(IDENTITY)
    libdir = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    environment = dict(os.environ)
    environment["LD_LIBRARY_PATH"] = ":".join(
        [str(site / "nvidia_pytriton.libs"), libdir, str(folder / "external_libs")]
    )
    environment["PATH"] = f"{venv / 'bin'}:{environment['PATH']}"
    http, metrics = free_ports(2)
    command = [
        str(folder / "bin" / "tritonserver"),
        f"--model-repository={repository}",
        f"--backend-directory={backends}",
        f"--cache-dir={folder / 'caches'}",
        "--cache-config=local,size=1048576",
        "--allow-grpc=false",
        f"--http-port={http}",
        f"--metrics-port={metrics}",
    ]
    log = (work / "tritonserver.log").open("w")
    process = subprocess.Popen(command, env=environment, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + STARTUP
        while not ready(http):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"tritonserver did not get ready; its log: {work / 'tritonserver.log'}")
            time.sleep(0.2)  # ordering-free: polls an observable state until a deadline
        yield http, metrics
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/idm/ready", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError):
        return False


def triton_infer(port: int, values: list[float]) -> list[float]:
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [len(values)], "data": values}]})
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/idm/infer", data=body.encode())
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["outputs"][0]["data"]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as response:
        return response.read().decode()


def families(text: str) -> dict[str, str]:
    """nv_* family -> its TYPE."""
    return dict(re.findall(r"^# TYPE (nv_\w+) (\w+)$", text, flags=re.M))


def label_names(text: str) -> dict[str, set[tuple[str, ...]]]:
    """nv_* family -> the sets of label names its samples carry."""
    found: dict[str, set[tuple[str, ...]]] = {}
    for name, labels in re.findall(r"^(nv_\w+)(?:\{([^}]*)\})? \S+$", text, flags=re.M):
        found.setdefault(name, set()).add(tuple(sorted(re.findall(r'(\w+)="', labels or ""))))
    return found


def value(text: str, name: str) -> float:
    match = re.search(rf'^{name}\{{model="idm",version="1"\}} (\S+)$', text, flags=re.M)
    assert match, f"{name} for model idm is missing"
    return float(match.group(1))


def test_triton_metric_names_types_labels_and_counts_match_real_triton(tmp_path):
    folder = tritonserver_folder()
    with triton(folder, tmp_path / "triton") as (http, metrics):
        for values in TRAFFIC:
            assert triton_infer(http, values) == values
        reference = scrape(metrics)

    repository = tmp_path / "slotserve"
    write_fixture_model(
        repository, "idm", inputs=[("INPUT0", "FP32", [-1])], outputs=[("OUTPUT0", "FP32", [-1])], extra=""
    )
    (repository / "idm" / "config.pbtxt").write_text(CONFIG.format(backend="fixture"))
    with serve(repository, metrics_port=0, response_cache_bytes=1 << 20) as running:
        for values in TRAFFIC:
            answer = running.client.infer("idm", {"INPUT0": np.asarray(values, np.float32)})
            assert answer["OUTPUT0"].tolist() == values
        ours = running.server.metrics.render()

    theirs_types, our_types = families(reference), families(ours)
    assert our_types, "slotserve serves no nv_* family"
    assert {name: theirs_types.get(name) for name in our_types} == our_types  # each exists in Triton, same type
    theirs_labels, our_labels = label_names(reference), label_names(ours)
    for name in our_types:
        assert our_labels[name] == theirs_labels[name], name
    for name in COUNTS:
        assert value(ours, name) == value(reference, name), name
    assert value(ours, "nv_cache_num_hits_per_model") == 2
