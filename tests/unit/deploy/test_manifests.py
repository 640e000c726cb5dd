"""deploy/: the Dockerfile and every manifest are checked without a cluster or an image build.

Every YAML document (the manifests and the yaml blocks of deploy/README.md) parses and is a well-formed
Kubernetes object; each slotserve command line in them and the Dockerfile's CMD is parsed by
`service.cli.build_parser()` and validated by `ServerOptions`, so a renamed or removed flag fails here rather than
in a cluster; the probes ask grpc.health.v1 on 8001; the grace period covers the shutdown sequence; the Services,
Prometheus annotations, secret mounts and the KServe runtime agree with the arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from service.cli import build_parser
from service.options import ServerOptions
from service.server import SHUTDOWN_MARGIN

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
DEPLOY_README = DEPLOY / "README.md"
MANIFESTS = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))

GRPC_PORT = 8001
DEFAULT_GRACE_PERIOD = 30  # Kubernetes' terminationGracePeriodSeconds when a pod spec does not set one
# The README's promise is "the process exits within drain + grace + 4 s" (two handler margins); a pod's grace
# period must also leave a little time for the process to start exiting and for the kubelet.
EXIT_SLACK = 5.0
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


# ---- loading ---------------------------------------------------------------------------------------------------


def _load(text: str) -> list[dict]:
    return [document for document in yaml.safe_load_all(text) if document is not None]


def manifest_documents() -> list[tuple[str, dict]]:
    """(file:index, document) for every document of every manifest file."""
    return [
        (f"{path.relative_to(ROOT)}:{index}", document)
        for path in MANIFESTS
        for index, document in enumerate(_load(path.read_text()))
    ]


def readme_yaml_blocks() -> list[str]:
    return re.findall(r"^```ya?ml\n(.*?)^```", DEPLOY_README.read_text(), flags=re.S | re.M)


def readme_documents() -> list[tuple[str, object]]:
    return [
        (f"deploy/README.md yaml block {index}", document)
        for index, block in enumerate(readme_yaml_blocks())
        for document in _load(block)
    ]


def all_documents() -> list[tuple[str, object]]:
    return manifest_documents() + readme_documents()


def walk(node) -> Iterator[dict]:
    """Every mapping inside a YAML document, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def is_slotserve_container(node: dict) -> bool:
    """A container running the slotserve image's ENTRYPOINT (so its args are slotserve flags)."""
    image = node.get("image")
    if not isinstance(image, str) or "command" in node:
        return False
    repository = image.split("@")[0].rsplit("/", 1)[-1].split(":")[0]
    return repository == "slotserve"


def slotserve_containers(documents) -> list[tuple[str, dict]]:
    return [(where, node) for where, document in documents for node in walk(document) if is_slotserve_container(node)]


def pod_specs(documents) -> list[tuple[str, dict]]:
    """Every mapping holding a `containers` list that runs slotserve: a pod template's spec, a ServingRuntime's
    spec (its pod spec is inline), or a README fragment."""
    found = []
    for where, document in documents:
        for node in walk(document):
            containers = node.get("containers")
            if isinstance(containers, list) and any(
                isinstance(c, dict) and is_slotserve_container(c) for c in containers
            ):
                found.append((where, node))
    return found


# ---- slotserve command lines -----------------------------------------------------------------------------------


def known_flags() -> set[str]:
    return {option for action in build_parser()._actions for option in action.option_strings}


def flag_names(args: list[str]) -> list[str]:
    return [arg.split("=", 1)[0] for arg in args if arg.startswith("--")]


def parse_slotserve(args: list[str], where: str) -> argparse.Namespace:
    """Parse with slotserve's own parser, then build ServerOptions from it, as `slotserve` itself does."""
    for arg in args:
        assert isinstance(arg, str), f"{where}: argument {arg!r} is not a string (quote it in YAML)"
        assert not (arg.startswith("--") and " " in arg.split("=", 1)[0]), f"{where}: malformed flag {arg!r}"
    known = known_flags()
    unknown = sorted({name for name in flag_names(args) if name not in known})
    assert not unknown, f"{where}: slotserve has no flag {', '.join(unknown)} (renamed or removed in service/cli.py?)"
    try:
        parsed = build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"{where}: `slotserve {shlex.join(args)}` is refused by service.cli.build_parser()")
    fields = {field.name for field in dataclasses.fields(ServerOptions) if field.init}
    try:
        ServerOptions(**{name: value for name, value in vars(parsed).items() if name in fields})
    except ValueError as error:
        pytest.fail(f"{where}: ServerOptions refuses these arguments: {error}")
    return parsed


def value_of(args: list[str], flag: str) -> str | None:
    """The value given to `flag` (last one wins, as argparse does), whether it is parsed yet or pending."""
    value = None
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


# ---- the Dockerfile --------------------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, with continuation lines joined and comments dropped."""
    instructions, pending = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        keyword, _, rest = full.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return instructions


def dockerfile_values(keyword: str) -> list[str]:
    return [rest for name, rest in dockerfile_instructions() if name == keyword]


def exec_form(keyword: str) -> list[str]:
    values = dockerfile_values(keyword)
    assert len(values) == 1, f"Dockerfile needs exactly one {keyword}"
    parsed = json.loads(values[0])
    assert isinstance(parsed, list) and all(isinstance(item, str) for item in parsed), (
        f"{keyword} must be in exec (JSON array) form, so signals reach slotserve as PID 1"
    )
    return parsed


def dockerfile_args() -> list[str]:
    return exec_form("CMD")


# ---- tests -----------------------------------------------------------------------------------------------------


def test_the_deploy_folder_has_its_parts():
    for relative in ("Dockerfile", "README.md", "kubernetes/slotserve.yaml"):
        assert (DEPLOY / relative).is_file(), f"deploy/{relative} is missing"
    kinds = {document.get("kind") for _, document in manifest_documents()}
    assert {"Deployment", "Service", "ClusterServingRuntime", "InferenceService"} <= kinds
    assert readme_yaml_blocks(), "deploy/README.md has no yaml examples"


@pytest.mark.parametrize(
    "where, document", all_documents(), ids=lambda value: value if isinstance(value, str) else None
)
def test_every_document_parses_as_a_kubernetes_object_or_fragment(where, document):
    assert isinstance(document, dict), f"{where}: a YAML document must be a mapping"
    if "kind" not in document and "apiVersion" not in document:
        assert where.startswith("deploy/README.md"), f"{where}: a manifest document needs apiVersion and kind"
        return  # a README fragment (a container or a volume to add): its flags are checked below
    api_version, kind = document.get("apiVersion"), document.get("kind")
    assert isinstance(api_version, str) and (
        api_version == "v1" or re.fullmatch(r"[a-z0-9.-]+/v\d+(\w+)?", api_version)
    ), where
    assert isinstance(kind, str) and re.fullmatch(r"[A-Z][A-Za-z]+", kind), f"{where}: kind {kind!r}"
    name = (document.get("metadata") or {}).get("name")
    assert isinstance(name, str) and DNS_SUBDOMAIN.fullmatch(name) and len(name) <= 253, (
        f"{where}: metadata.name {name!r}"
    )
    if kind in ("Service", "Deployment", "ClusterServingRuntime", "InferenceService"):
        assert DNS_LABEL.fullmatch(name) and len(name) <= 63, f"{where}: {kind} name must be a DNS label"
    assert isinstance(document.get("spec") or document.get("data") or document.get("stringData"), dict), (
        f"{where}: {kind} has no spec"
    )


def test_every_slotserve_command_line_is_accepted_by_service_cli():
    """Manifests, the Dockerfile's CMD and the README's examples. A container's args replace the image's CMD,
    so each one must be a complete command line."""
    command_lines = [
        (f"{where} container {node.get('name')}", node.get("args"))
        for where, node in slotserve_containers(all_documents())
    ]
    command_lines.append(("deploy/Dockerfile CMD", dockerfile_args()))
    assert len(command_lines) >= 4
    for where, args in command_lines:
        assert isinstance(args, list) and args, f"{where}: give slotserve its flags (args replace the image's CMD)"
        parsed = parse_slotserve(args, where)
        assert parsed.host in ("0.0.0.0", "::", "[::]"), (
            f"{where}: --host {parsed.host} is unreachable from the kubelet and the Service; use 0.0.0.0"
        )
        assert parsed.port == GRPC_PORT, f"{where}: --port must be {GRPC_PORT}"
        assert parsed.log_format == "json", f"{where}: use --log-format=json in a cluster"


def test_every_probe_asks_grpc_health_on_the_grpc_port():
    containers = slotserve_containers(manifest_documents())
    assert containers
    for where, container in containers:
        name = f"{where} container {container.get('name')}"
        ports = {port.get("containerPort") for port in container.get("ports", [])}
        assert GRPC_PORT in ports, f"{name}: declare containerPort {GRPC_PORT}"
        for probe_kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container.get(probe_kind)
            assert isinstance(probe, dict), f"{name}: needs a {probe_kind}"
            handlers = {"grpc", "exec", "httpGet", "tcpSocket"} & set(probe)
            assert handlers == {"grpc"}, f"{name}: {probe_kind} must use the gRPC probe, not {sorted(handlers)}"
            assert probe["grpc"].get("port") == GRPC_PORT, f"{name}: {probe_kind} must target port {GRPC_PORT}"
            # "" (the default) is the whole server; both slotserve services report the same status.
            assert probe["grpc"].get("service", "") in ("", "inference.GRPCInferenceService"), name


def test_grace_period_covers_drain_and_shutdown_grace():
    specs = pod_specs(all_documents())
    assert specs
    for where, spec in specs:
        period = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_PERIOD)
        for container in spec["containers"]:
            if not is_slotserve_container(container):
                continue
            parsed = parse_slotserve(container.get("args", []), where)
            needed = parsed.drain_seconds + parsed.shutdown_grace + 2 * SHUTDOWN_MARGIN + EXIT_SLACK
            assert period >= needed, (
                f"{where}: terminationGracePeriodSeconds {period} < --drain-seconds {parsed.drain_seconds} + "
                f"--shutdown-grace {parsed.shutdown_grace} + {2 * SHUTDOWN_MARGIN:g} s margin + {EXIT_SLACK:g} s: "
                "the kubelet would SIGKILL slotserve mid-shutdown"
            )


def test_no_prestop_hook_delays_the_shutdown_sequence():
    for where, container in slotserve_containers(all_documents()):
        assert "preStop" not in (container.get("lifecycle") or {}), (
            f"{where}: slotserve drains by itself (--drain-seconds); a preStop sleep only eats the grace period"
        )


def test_files_named_in_the_flags_are_mounted():
    """Token and TLS files come from mounted Secrets; the repository comes from a volume (KServe mounts
    /mnt/models itself)."""
    for where, container in slotserve_containers(all_documents()):
        args = container.get("args", [])
        mounts = [mount["mountPath"].rstrip("/") for mount in container.get("volumeMounts", [])]
        kserve = container.get("name") == "kserve-container"
        fragment = where.startswith("deploy/README.md")  # examples show only what they change
        for flag in (
            "--management-token-file",
            "--inference-token-file",
            "--tls-cert",
            "--tls-key",
            "--tls-client-ca",
            "--model-repository",
        ):
            path = value_of(args, flag)
            if path is None or (flag == "--model-repository" and (kserve or fragment)):
                continue
            assert any(path == mount or path.startswith(mount + "/") for mount in mounts), (
                f"{where}: {flag} {path} is not under any volumeMount of the container"
            )
        for flag in ("--management-token", "--inference-token"):
            assert value_of(args, flag) is None, (
                f"{where}: pass tokens as files ({flag}-file) from a Secret, not on the command line"
            )


def test_management_token_comes_from_a_secret_volume():
    for where, spec in pod_specs(manifest_documents()):
        volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
        for container in spec["containers"]:
            token_file = value_of(container.get("args", []), "--management-token-file")
            if token_file is None:
                continue
            assert "--allow-management" in container["args"], f"{where}: a token needs --allow-management"
            mount = max(
                (m for m in container.get("volumeMounts", []) if token_file.startswith(m["mountPath"])),
                key=lambda m: len(m["mountPath"]),
            )
            assert "secret" in volumes[mount["name"]], f"{where}: {token_file} must come from a Secret volume"


def test_no_usable_token_is_published():
    """A Secret written out in deploy/ must hold a placeholder that slotserve refuses, never a working token."""
    auth = pytest.importorskip("service.auth")
    secrets = [(where, d) for where, d in all_documents() if isinstance(d, dict) and d.get("kind") == "Secret"]
    for where, secret in secrets:
        assert not secret.get("data"), f"{where}: no encoded token values in deploy/"
        for key, value in (secret.get("stringData") or {}).items():
            with pytest.raises(ValueError):
                auth.Secret(str(value), f"{where} {key}")


def test_a_pod_with_shared_memory_shares_a_memory_backed_dev_shm_with_its_client():
    """--shared-memory system only makes sense with a client in the pod: both mount one memory-backed emptyDir at
    /dev/shm, run as one user, and slotserve bounds what it maps (prefix, bytes within the volume) and needs a
    token (its port listens on the pod's address for the probes)."""
    found = 0
    for where, spec in pod_specs(manifest_documents()):
        for container in spec["containers"]:
            args = container.get("args", [])
            if not is_slotserve_container(container) or value_of(args, "--shared-memory") != "system":
                continue
            found += 1
            volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
            shm = [m["name"] for m in container.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
            assert shm and volumes[shm[0]].get("emptyDir", {}).get("medium") == "Memory", where
            clients = [
                c
                for c in spec["containers"]
                if c is not container and any(m["name"] == shm[0] for m in c.get("volumeMounts", []))
            ]
            assert clients, f"{where}: no other container shares /dev/shm with slotserve"
            assert spec["securityContext"]["runAsUser"] and all(
                "runAsUser" not in c.get("securityContext", {}) for c in [container, *clients]
            ), f"{where}: slotserve and its client must run as one user (set it for the pod)"
            assert (value_of(args, "--shared-memory-prefix") or "/") != "/", f"{where}: restrict the keys"
            limit = volumes[shm[0]]["emptyDir"]["sizeLimit"]
            assert limit.endswith("Gi") and int(value_of(args, "--shared-memory-max-bytes")) <= int(limit[:-2]) << 30
            assert value_of(args, "--inference-token-file"), f"{where}: registering must need a token"
    assert found, "no manifest shows --shared-memory system"


def test_the_service_sends_grpc_to_the_pods():
    documents = [document for _, document in manifest_documents()]
    deployments = [d for d in documents if d["kind"] == "Deployment"]
    services = [d for d in documents if d["kind"] == "Service"]
    assert deployments and services
    for service in services:
        selected = [
            d
            for d in deployments
            if service["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert selected, f"Service {service['metadata']['name']} selects no Deployment's pods"
        deployment = selected[0]
        assert (
            deployment["spec"]["selector"]["matchLabels"].items()
            <= deployment["spec"]["template"]["metadata"]["labels"].items()
        )
        container = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if is_slotserve_container(c))
        named = {port["name"]: port["containerPort"] for port in container["ports"]}
        grpc_ports = [p for p in service["spec"]["ports"] if p.get("appProtocol") == "grpc"]
        assert grpc_ports, "the Service's gRPC port needs appProtocol: grpc (HTTP/2-aware proxies and meshes)"
        for port in grpc_ports:
            target = port.get("targetPort", port["port"])
            assert named.get(target, target) == GRPC_PORT, f"Service port {port['port']} must reach {GRPC_PORT}"


def test_prometheus_annotations_name_the_metrics_port():
    for where, document in manifest_documents():
        if document["kind"] == "Deployment":
            template = document["spec"]["template"]
            annotations = template["metadata"].get("annotations", {})
            key = "prometheus.io/port"
            containers = template["spec"]["containers"]
        elif document["kind"] == "ClusterServingRuntime":
            annotations = document["spec"].get("annotations", {})
            key = "prometheus.kserve.io/port"
            containers = document["spec"]["containers"]
        else:
            continue
        for container in containers:
            if not is_slotserve_container(container):
                continue
            metrics_port = value_of(container["args"], "--metrics-port")
            assert metrics_port is not None, f"{where}: start slotserve with --metrics-port"
            assert annotations.get(key) == metrics_port, f"{where}: {key} must be {metrics_port!r} (a string)"
            if document["kind"] == "Deployment":
                assert annotations.get("prometheus.io/scrape") == "true", where


def test_kserve_runtime_and_inference_service_agree():
    documents = [document for _, document in manifest_documents()]
    runtimes = {d["metadata"]["name"]: d for d in documents if d["kind"] == "ClusterServingRuntime"}
    services = [d for d in documents if d["kind"] == "InferenceService"]
    assert runtimes and services
    for runtime in runtimes.values():
        assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
        spec = runtime["spec"]
        assert {"onnx"} <= {model_format["name"] for model_format in spec["supportedModelFormats"]}
        for model_format in spec["supportedModelFormats"]:
            assert isinstance(model_format.get("version", ""), str), "format versions are strings (quote them)"
        # slotserve speaks the Open Inference Protocol over gRPC only: no REST ("v2") endpoint.
        assert spec["protocolVersions"] == ["grpc-v2"]
        (container,) = spec["containers"]
        assert container["name"] == "kserve-container"  # the name KServe merges the predictor's settings into
        assert {"containerPort": GRPC_PORT, "name": "h2c", "protocol": "TCP"} in container["ports"], (
            "KServe and Knative recognise a gRPC (HTTP/2 cleartext) port by the name h2c"
        )
        assert len(container["ports"]) == 1, "KServe (serverless) allows one container port"
        assert value_of(container["args"], "--model-repository") == "/mnt/models"  # KServe's storage path
    for service in services:
        assert service["apiVersion"] == "serving.kserve.io/v1beta1"
        model = service["spec"]["predictor"]["model"]
        runtime = runtimes.get(model["runtime"])
        assert runtime is not None, f"InferenceService names runtime {model['runtime']!r}, which is not here"
        formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
        assert model["modelFormat"]["name"] in formats
        assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
        assert re.match(r"^(s3|gs|pvc|https?|oci|hdfs|webhdfs)://", model["storageUri"]), model["storageUri"]


def test_dockerfile_builds_a_non_root_slotserve_image():
    instructions = dockerfile_instructions()
    keywords = [name for name, _ in instructions]
    assert instructions[0] == ("FROM", "python:3.11-slim")
    runs = dockerfile_values("RUN")
    assert any("pip install -r requirements.txt -c constraints.txt" in run for run in runs), (
        "install the pinned requirements with their constraints"
    )
    assert any("grpc_tools.protoc" in run and "pip install --no-deps ." in run for run in runs), (
        "generate generated/ and install the project (the console script) without re-resolving dependencies"
    )
    for source_list in dockerfile_values("COPY"):
        *sources, _destination = source_list.split()
        for source in sources:
            assert not source.startswith("--"), "COPY options are not expected here"
            assert (ROOT / source).exists(), f"Dockerfile copies {source}, which the repository does not have"
    requirements = ROOT / "requirements.txt"
    assert requirements.is_file() and (ROOT / "constraints.txt").is_file()

    users = dockerfile_values("USER")
    assert users, "the image must not run as root"
    user = users[-1].split(":")[0]
    assert user.isdigit() and user != "0", "USER must be a numeric non-root uid (Kubernetes runAsNonRoot checks it)"
    assert keywords.index("USER") < keywords.index("ENTRYPOINT")
    assert len(keywords) - 1 - keywords[::-1].index("RUN") < keywords.index("USER"), "nothing runs as root after USER"

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert exec_form("ENTRYPOINT") == ["slotserve"] and scripts["slotserve"] == "service.cli:main"

    exposed = {int(port.split("/")[0]) for value in dockerfile_values("EXPOSE") for port in value.split()}
    args = dockerfile_args()
    metrics_port = value_of(args, "--metrics-port")
    assert metrics_port is not None, "the image's default command should serve metrics"
    assert {GRPC_PORT, int(metrics_port)} <= exposed
    assert value_of(args, "--model-repository") == "/mnt/models"


def test_readme_names_every_file_of_the_folder():
    text = DEPLOY_README.read_text()
    for path in [DOCKERFILE, *MANIFESTS]:
        assert str(path.relative_to(DEPLOY)) in text, f"deploy/README.md does not mention {path.name}"
