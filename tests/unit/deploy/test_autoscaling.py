"""deploy/kubernetes/autoscaling*.yaml: the autoscaling examples are valid objects that scale slotserve.yaml's
Deployment on metrics slotserve serves (issue 37, "Autoscaling signals").

* Every object of deploy/ whose kind kubernetes-validate has a schema for (built-in kinds: the HPA, the adapter rules'
  ConfigMap, the Deployments and Services) is valid in strict mode (unknown fields refused) for the oldest and the
  newest Kubernetes version it knows.
* KEDA's ScaledObject is a CRD that kubernetes-validate does not know. Checked here instead: its fields are the
  ScaledObject spec's and the prometheus scaler's (KEDA's own names: `KEDA_SPEC_FIELDS`, `PROMETHEUS_METADATA`),
  every trigger metadata value a string (the CRD's `additionalProperties: {type: string}`), and its
  `horizontalPodAutoscalerConfig.behavior`, which is Kubernetes' HPA behavior, validated by kubernetes-validate
  inside an HPA.
* Both target the Deployment of slotserve.yaml; the HPA asks for the metrics the adapter rules make.
* Every metric named by a query (the adapter's rules, KEDA's triggers, the PromQL of docs/observability.md's
  Autoscaling section) is one a running slotserve serves, and the oldest-wait targets are below the Deployment's
  --admission-timeout (a target above it would never be reached: requests are refused first).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import kubernetes_validate  # type: ignore[import-untyped]  # no type information shipped
import pytest
import yaml
from kubernetes_validate import utils as validate_utils  # type: ignore[import-untyped]

from service.testing import serve
from tests.integration._support import write_fixture_model
from tests.unit.deploy.test_manifests import DEPLOY, ROOT, manifest_documents, value_of

AUTOSCALING = DEPLOY / "kubernetes" / "autoscaling.yaml"
KEDA = DEPLOY / "kubernetes" / "autoscaling-keda.yaml"
OBSERVABILITY = ROOT / "docs" / "observability.md"
VERSIONS = sorted({validate_utils.all_versions()[0], kubernetes_validate.latest_version()})
METRIC = re.compile(r"\b(?:slotserve|nv)_[a-z_]+\b")

# ScaledObject spec fields (KEDA 2.x, apis/keda/v1alpha1 ScaledObjectSpec) and the prometheus scaler's metadata keys
# (pkg/scalers/prometheus_scaler.go), the first three required.
KEDA_SPEC_FIELDS = {
    "scaleTargetRef",
    "pollingInterval",
    "initialCooldownPeriod",
    "cooldownPeriod",
    "idleReplicaCount",
    "minReplicaCount",
    "maxReplicaCount",
    "advanced",
    "triggers",
    "fallback",
}
KEDA_TRIGGER_FIELDS = {"type", "name", "metadata", "metricType", "useCachedMetrics", "authenticationRef"}
PROMETHEUS_REQUIRED = {"serverAddress", "query", "threshold"}
PROMETHEUS_METADATA = PROMETHEUS_REQUIRED | {
    "queryParameters",
    "activationThreshold",
    "namespace",
    "customHeaders",
    "ignoreNullValues",
    "unsafeSsl",
    "awsRegion",
    "timeout",
    "identityOwner",
}


def documents(path: Path) -> list[dict]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document is not None]


def one(path: Path, kind: str) -> dict:
    (found,) = [document for document in documents(path) if document["kind"] == kind]
    return found


def deployment() -> dict:
    (found,) = [
        document
        for where, document in manifest_documents()
        if where.startswith("deploy/kubernetes/slotserve.yaml") and document["kind"] == "Deployment"
    ]
    return found


def admission_timeout() -> float:
    container = deployment()["spec"]["template"]["spec"]["containers"][0]
    timeout = value_of(container["args"], "--admission-timeout")
    assert timeout is not None, "slotserve.yaml sets --admission-timeout: the oldest-wait targets are set below it"
    return float(timeout)


def adapter_config() -> dict:
    return yaml.safe_load(one(AUTOSCALING, "ConfigMap")["data"]["config.yaml"])


def autoscaling_section() -> str:
    text = OBSERVABILITY.read_text()
    match = re.search(r"^## Autoscaling\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, "docs/observability.md has no Autoscaling section"
    return match.group(1)


@pytest.fixture(scope="module")
def served_metrics(tmp_path_factory) -> set[str]:
    """Every family and sample name a running slotserve with one model serves."""
    repository = tmp_path_factory.mktemp("repository")
    write_fixture_model(repository, "m", inputs=[("INPUT0", "FP32", [-1])], outputs=[("OUTPUT0", "FP32", [-1])])
    with serve(repository) as running:
        text = running.server.metrics.render()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    assert "slotserve_model_slots" in names and "nv_inference_pending_request_count" in names
    return names


# ---- kubernetes-validate ---------------------------------------------------------------------------------------


def validatable() -> list[tuple[str, dict]]:
    """(where, document) for every deploy/ object of a kind kubernetes-validate has a schema for."""
    found = []
    for where, document in manifest_documents():
        try:
            kubernetes_validate.validate(document, VERSIONS[-1], strict=False)
        except kubernetes_validate.SchemaNotFoundError:
            continue
        except kubernetes_validate.ValidationError:
            pass  # known, and invalid: the test below names the problem
        found.append((where, document))
    return found


def test_the_validator_knows_the_autoscaling_kinds_and_refuses_a_misspelt_field():
    kinds = {document["kind"] for _, document in validatable()}
    assert {"HorizontalPodAutoscaler", "ConfigMap", "Deployment", "Service"} <= kinds
    broken = copy.deepcopy(one(AUTOSCALING, "HorizontalPodAutoscaler"))
    broken["spec"]["minReplica"] = broken["spec"].pop("minReplicas")
    for version in VERSIONS:
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("where, document", validatable(), ids=lambda value: value if isinstance(value, str) else None)
def test_every_built_in_object_in_deploy_is_valid(where, document, version):
    try:
        kubernetes_validate.validate(document, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"{where} is not a valid {document['kind']} for Kubernetes {version}: {error.message}")


# ---- what the HPA and the ScaledObject scale ---------------------------------------------------------------------


def test_both_scale_the_deployment_of_slotserve_yaml_within_sane_bounds():
    target = deployment()
    hpa = one(AUTOSCALING, "HorizontalPodAutoscaler")["spec"]
    keda = one(KEDA, "ScaledObject")["spec"]
    for where, reference, low, high in (
        ("HPA", hpa["scaleTargetRef"], hpa["minReplicas"], hpa["maxReplicas"]),
        ("ScaledObject", keda["scaleTargetRef"], keda["minReplicaCount"], keda["maxReplicaCount"]),
    ):
        assert reference == {
            "apiVersion": target["apiVersion"],
            "kind": "Deployment",
            "name": target["metadata"]["name"],
        }
        # The Deployment's own replica count is the floor: scaling in below it would undo slotserve.yaml's choice of
        # two replicas (a rolling update with maxUnavailable 0 keeps one serving while the other restarts).
        assert target["spec"]["replicas"] <= low < high, where


def test_the_hpa_asks_for_the_metrics_the_adapter_rules_make():
    config = adapter_config()
    made = {"Pods": {}, "External": {}}
    for kind, rules in (("Pods", config["rules"]), ("External", config["externalRules"])):
        for rule in rules:
            series = METRIC.findall(rule["seriesQuery"])
            assert len(series) == 1 and re.fullmatch(rule["name"]["matches"], series[0]), rule["name"]
            made[kind][rule["name"]["as"]] = rule
            overrides = rule["resources"]["overrides"]
            assert overrides["namespace"] == {"resource": "namespace"}
            if kind == "Pods":  # a per-pod metric: the adapter must tell the pods apart
                assert overrides["pod"] == {"resource": "pod"}
                assert "<<.GroupBy>>" in rule["metricsQuery"] and "<<.LabelMatchers>>" in rule["metricsQuery"]
    asked = {
        (m["type"], m[m["type"].lower()]["metric"]["name"])
        for m in one(AUTOSCALING, "HorizontalPodAutoscaler")["spec"]["metrics"]
    }
    assert asked == {(kind, name) for kind, names in made.items() for name in names}


def test_the_oldest_wait_targets_are_below_the_admission_timeout():
    timeout = admission_timeout()
    hpa = one(AUTOSCALING, "HorizontalPodAutoscaler")["spec"]["metrics"]
    (external,) = [m["external"] for m in hpa if m["type"] == "External"]
    assert external["metric"]["name"] == "slotserve_oldest_wait_seconds"
    assert 0 < float(external["target"]["value"]) < timeout
    (trigger,) = [t for t in one(KEDA, "ScaledObject")["spec"]["triggers"] if "oldest_wait" in t["metadata"]["query"]]
    assert 0 < float(trigger["metadata"]["threshold"]) < timeout


# ---- KEDA's ScaledObject, checked without a schema from kubernetes-validate --------------------------------------


def docs_yaml() -> list[dict]:
    """The YAML documents of docs/observability.md's Autoscaling section."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", autoscaling_section(), flags=re.S | re.M)
    return [document for block in blocks for document in yaml.safe_load_all(block) if document is not None]


def docs_object(kind: str) -> dict:
    (found,) = [document for document in docs_yaml() if document.get("kind") == kind]
    return found


@pytest.mark.parametrize("version", VERSIONS)
def test_the_docs_hpa_is_valid_and_scales_as_the_file_does(version):
    hpa = docs_object("HorizontalPodAutoscaler")
    kubernetes_validate.validate(hpa, version, strict=True)
    shipped = one(AUTOSCALING, "HorizontalPodAutoscaler")["spec"]
    keys = ("scaleTargetRef", "minReplicas", "maxReplicas", "metrics")
    assert {key: hpa["spec"][key] for key in keys} == {key: shipped[key] for key in keys}


def test_the_docs_adapter_rules_are_the_files():
    (rules,) = [document for document in docs_yaml() if "rules" in document]
    assert rules == adapter_config()


@pytest.mark.parametrize("source", ["deploy", "docs"])
def test_the_scaled_object_uses_keda_fields_and_string_metadata(source):
    scaled = one(KEDA, "ScaledObject") if source == "deploy" else docs_object("ScaledObject")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert set(spec) <= KEDA_SPEC_FIELDS, sorted(set(spec) - KEDA_SPEC_FIELDS)
    assert {"scaleTargetRef", "triggers"} <= set(spec)
    for field in {"minReplicaCount", "maxReplicaCount", "pollingInterval"} & set(spec):
        assert isinstance(spec[field], int), field
    assert spec["triggers"]
    for trigger in spec["triggers"]:
        assert set(trigger) <= KEDA_TRIGGER_FIELDS, sorted(set(trigger) - KEDA_TRIGGER_FIELDS)
        assert trigger["type"] == "prometheus"
        assert trigger.get("metricType", "AverageValue") in ("Value", "AverageValue")
        metadata = trigger["metadata"]
        assert all(isinstance(value, str) for value in metadata.values()), "KEDA's metadata values are strings"
        assert PROMETHEUS_REQUIRED <= set(metadata) <= PROMETHEUS_METADATA, sorted(metadata)
        float(metadata["threshold"])
        assert re.match(r"^https?://", metadata["serverAddress"])


@pytest.mark.parametrize("version", VERSIONS)
def test_the_scaled_object_behavior_is_a_valid_hpa_behavior(version):
    """KEDA copies advanced.horizontalPodAutoscalerConfig.behavior into the HPA it makes: an autoscaling/v2 one."""
    behavior = one(KEDA, "ScaledObject")["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    hpa = copy.deepcopy(one(AUTOSCALING, "HorizontalPodAutoscaler"))
    hpa["spec"]["behavior"] = behavior
    kubernetes_validate.validate(hpa, version, strict=True)


# ---- every metric named is served ---------------------------------------------------------------------------------


def queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every query the examples and the docs give."""
    config = adapter_config()
    found = [
        (f"adapter rule {rule['name']['as']}", rule[key])
        for rule in config["rules"] + config["externalRules"]
        for key in ("seriesQuery", "metricsQuery")
    ]
    for where, scaled in (("deploy/", one(KEDA, "ScaledObject")), ("docs/", docs_object("ScaledObject"))):
        found += [(f"{where} KEDA trigger {t['name']}", t["metadata"]["query"]) for t in scaled["spec"]["triggers"]]
    found += [
        (f"docs/observability.md promql block {index}", block)
        for index, block in enumerate(re.findall(r"^```promql\n(.*?)^```", autoscaling_section(), flags=re.S | re.M))
    ]
    return found


def test_every_metric_a_query_names_is_served(served_metrics):
    where_found = queries()
    assert any(where.startswith("docs/") for where, _ in where_found), "the Autoscaling section shows no query"
    for where, query in where_found:
        named = set(METRIC.findall(query))
        assert named, f"{where}: names no slotserve metric"
        assert named <= served_metrics, f"{where}: slotserve serves no {sorted(named - served_metrics)}"
