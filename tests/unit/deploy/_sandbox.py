"""A pod's filesystem for one slotserve container, on this machine: run as `unshare --mount --net
--propagation private -- python -m tests.unit.deploy._sandbox SPEC.json` (root), it builds the container's view
in a private mount namespace, starts the server in it as the manifest's user, asks it ServerReady, and prints one
JSON object (the result) on stdout. tests/unit/deploy/test_manifests_start.py writes the spec from a manifest.

The view:

* the root filesystem is this machine's `/` through an overlay whose upper layer is a tmpfs (so that the mount
  points of the volumes can be made without touching the real disk, and the sandbox can let the manifest's user
  reach the interpreter, as the image's world-readable install would), then remounted read-only when the container
  says `readOnlyRootFilesystem: true`;
* /dev, /proc and /sys are bound in; /dev/shm is a fresh tmpfs of the container runtime's default size (64 MiB),
  or the manifest's memory-backed emptyDir at /dev/shm with its sizeLimit;
* each volume the container mounts is a tmpfs at its mountPath: an emptyDir empty and writable by anyone (as
  Kubernetes makes it), the models volume holding the test's repository, a Secret holding a token file (mode
  0440, group fsGroup); `readOnly: true` mounts are remounted read-only;
* a network namespace of its own (loopback only), so the manifest's ports (8001, 8002) never collide with this
  machine's.

The server runs as `python -m service <the container's args>` (the image's ENTRYPOINT is the `slotserve` console
script, which calls the same `service.cli.main`), chrooted into the view, as the manifest's uid, gid and fsGroup,
with the image's environment. Exit status 77 (and `setup_error` in the result) when the sandbox itself cannot be
built here (no overlayfs, no permission): the test skips, naming it.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
READY_SECONDS = 120.0  # the server loads its models first; a loaded machine gets a wide margin
STOP_SECONDS = 60.0
SETUP_FAILED = 77
DEFAULT_SHM = "64m"  # what Docker and containerd give a container's /dev/shm


class SetupError(Exception):
    """The sandbox cannot be built on this machine."""


def run(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SetupError(f"{' '.join(command)}: {done.stderr.strip() or done.returncode}")


def tmpfs(path: Path, size: str, mode: str) -> None:
    run("mount", "-t", "tmpfs", "-o", f"size={size},mode={mode}", "slotserve-sandbox", str(path))


def read_only(path: Path) -> None:
    run("mount", "-o", "remount,ro,bind", str(path))


def loopback_up() -> None:
    """`ip link set lo up` without iproute2: SIOCGIFFLAGS / SIOCSIFFLAGS on a socket."""
    get_flags, set_flags, up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, get_flags, request)[:18])[1]
        fcntl.ioctl(sock, set_flags, struct.pack("16sH", b"lo", flags | up))


def reachable(root: Path, *paths: str) -> None:
    """Let every user traverse the folders down to `paths` in the overlay (this machine keeps its interpreter under
    a 0700 /root; the image installs it world-readable). Only the overlay's upper layer changes."""
    for path in paths:
        for folder in [Path(path), *Path(path).parents]:
            inside = root / folder.relative_to("/")
            if inside.is_dir() and not inside.stat().st_mode & 0o001:
                inside.chmod(inside.stat().st_mode | 0o011)


def build(spec: dict) -> Path:
    """The container's view under spec["stage"]; returns its root. Raises SetupError."""
    stage = Path(spec["stage"])
    run("mount", "--make-rprivate", "/")
    tmpfs(stage, "256m", "0755")
    for name in ("upper", "work", "root"):
        (stage / name).mkdir()
    root = stage / "root"
    run(
        "mount",
        "-t",
        "overlay",
        "slotserve-sandbox",
        "-o",
        f"lowerdir=/,upperdir={stage / 'upper'},workdir={stage / 'work'}",
        str(root),
    )
    for volume in spec["volumes"]:
        (root / volume["path"].lstrip("/")).mkdir(parents=True, exist_ok=True)
    reachable(root, os.path.realpath(sys.executable), sys.prefix, str(ROOT), os.path.realpath(ROOT / ".venv"))
    if spec["read_only_root"]:
        run("mount", "-o", "remount,ro", str(root))
    for system in ("dev", "proc", "sys"):
        run("mount", "--rbind", f"/{system}", str(root / system))
    if not any(volume["path"] == "/dev/shm" for volume in spec["volumes"]):
        tmpfs(root / "dev" / "shm", DEFAULT_SHM, "1777")
    for volume in spec["volumes"]:
        mount_volume(root, volume, spec)
    loopback_up()
    return root


def mount_volume(root: Path, volume: dict, spec: dict) -> None:
    target = root / volume["path"].lstrip("/")
    tmpfs(target, volume.get("size") or "1g", "1777" if volume["path"] == "/dev/shm" else "0777")
    if volume["kind"] == "repository":
        shutil.copytree(spec["repository"], target, dirs_exist_ok=True)
    elif volume["kind"] == "secret":
        target.chmod(0o755)
        for name, content in volume["files"].items():
            (target / name).write_text(content)
            os.chown(target / name, 0, spec["fs_group"] if spec["fs_group"] is not None else spec["gid"])
            (target / name).chmod(0o440)
    if volume["read_only"]:
        read_only(target)


def serve(root: Path, spec: dict) -> dict:
    """Start the server in the view, wait for its address, ask ServerReady (and run spec["after_ready"]), stop it."""
    groups = [spec["gid"]] + ([spec["fs_group"]] if spec["fs_group"] is not None else [])

    def enter() -> None:  # in the child, before exec: the container's root and user
        os.chroot(root)
        os.chdir(ROOT)
        os.setgroups(groups)
        os.setgid(spec["gid"])
        os.setuid(spec["uid"])

    environment = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/nonexistent",
        "PYTHONDONTWRITEBYTECODE": "1",  # the image's environment (deploy/Dockerfile)
        "PYTHONUNBUFFERED": "1",
        "PIP_NO_CACHE_DIR": "1",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "service", *spec["argv"]],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=enter,  # noqa: PLW1509 - the sandbox is single-threaded until here
    )
    log: list[str] = []
    reader = threading.Thread(target=lambda: log.extend(process.stderr or ()), daemon=True)
    reader.start()
    result: dict = {"ready": False, "listening": None}
    try:
        result["listening"] = _address(process)
        result["uids"] = _ids(process.pid, "Uid")  # real, effective, saved, filesystem: the manifest's user
        result["gids"] = _ids(process.pid, "Gid")
        if result["listening"] is not None:
            result.update(_ask(spec))
            result["written"] = written(root, spec)  # at startup: before a load with files writes
            if spec.get("load_with_files"):
                result.update(_load_with_files(spec))
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            result["exit_code"] = process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            result["exit_code"] = process.wait()
        reader.join(timeout=10)
        result["log"] = "".join(log)[-8000:]
    return result


def _ids(pid: int, field: str) -> list[int]:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # already gone
        return []
    line = next(line for line in status.splitlines() if line.startswith(f"{field}:"))
    return [int(value) for value in line.split()[1:]]


def _address(process: subprocess.Popen) -> str | None:
    """The address the server prints once it listens, or None if it exits (or stays silent) first."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        for line in list(lines):
            if line.startswith("slotserve listening on "):
                return line.split()[-1]
        time.sleep(0.05)  # ordering-free: polls the process's output until a deadline
    return None


def _ask(spec: dict) -> dict:
    import grpc

    from generated import grpc_service_pb2 as pb
    from generated import grpc_service_pb2_grpc as pb_grpc

    answers: dict = {}
    with grpc.insecure_channel(f"127.0.0.1:{spec['port']}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        metadata = [("authorization", f"Bearer {spec['token']}")] if spec.get("token") else []
        answers["ready"] = stub.ServerReady(pb.ServerReadyRequest(), timeout=60, metadata=metadata).ready
        index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=60, metadata=metadata)
        answers["models"] = {model.name: [model.state, model.reason] for model in index.models}
    return answers


def _load_with_files(spec: dict) -> dict:
    """RepositoryModelLoad with file: parameters (spec["load_with_files"]); what it answered and wrote."""
    import grpc

    from generated import grpc_service_pb2 as pb
    from generated import grpc_service_pb2_grpc as pb_grpc

    load = spec["load_with_files"]
    answers: dict = {}
    request = pb.RepositoryModelLoadRequest(model_name=load["name"])
    request.parameters["config"].string_param = load["config"]
    for name, path in load["files"].items():
        request.parameters[f"file:{name}"].bytes_param = Path(path).read_bytes()
    metadata = [("authorization", f"Bearer {spec['token']}")]
    with grpc.insecure_channel(f"127.0.0.1:{spec['port']}") as channel:
        try:
            pb_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(request, timeout=120, metadata=metadata)
            answers["load_with_files"] = "OK"
        except grpc.RpcError as error:
            answers["load_with_files"] = f"{error.code().name}: {error.details()}"
    answers["written_during_load"] = written_below(Path(spec["stage"]) / "root", load["folder"])
    return answers


def written(root: Path, spec: dict) -> dict[str, list[str]]:
    """The files in each writable volume (the models volume aside) and in /dev/shm."""
    return {
        volume["path"]: written_below(root, volume["path"])
        for volume in spec["volumes"]
        if not volume["read_only"] and volume["kind"] != "repository"
    }


def written_below(root: Path, path: str) -> list[str]:
    folder = root / path.lstrip("/")
    return sorted(str(item.relative_to(folder)) for item in folder.rglob("*"))


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    try:
        root = build(spec)
    except (SetupError, OSError) as error:
        print(json.dumps({"setup_error": str(error)}))
        return SETUP_FAILED
    print(json.dumps(serve(root, spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
