"""Generated Kubernetes manifests, validated against the Kubernetes 1.37 schemas (kubernetes-validate)."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate  # type: ignore[import-untyped]  # no py.typed marker
import pytest
import typer
import yaml
from typer.testing import CliRunner

from headroom.router.k8s import K8sConfig, deploy_app, manifests, to_yaml

K8S_VERSION = "1.37.0"


@pytest.mark.parametrize("autoscaler", ["hpa", "keda"])
def test_core_manifests_validate_strictly(autoscaler: str) -> None:
    docs = manifests(K8sConfig(autoscaler=autoscaler))
    kinds = [d["kind"] for d in docs]
    assert kinds[:3] == ["Deployment", "Service", "PodDisruptionBudget"]
    for doc in docs:
        if doc["apiVersion"].startswith("keda.sh/"):
            continue  # a CRD: checked structurally below
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_an_invalid_manifest_is_caught_by_the_validator() -> None:
    bad = manifests(K8sConfig())[0]
    bad["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_probes_and_drain_fit_inside_the_grace_period() -> None:
    cfg = K8sConfig(termination_grace_s=30, prestop_sleep_s=5)
    pod = manifests(cfg)[0]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= cfg.startup_budget_s
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    drain = int(c["args"][c["args"].index("--drain-timeout-s") + 1])
    assert c["lifecycle"]["preStop"]["sleep"]["seconds"] + drain < pod["terminationGracePeriodSeconds"]


def test_hpa_behaviour_matches_the_autoscaler_policy_defaults() -> None:
    spec = manifests(K8sConfig())[3]["spec"]
    assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    assert spec["behavior"]["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert spec["metrics"][0]["pods"]["metric"]["name"] == "headroom_inflight_requests"


def test_keda_scaled_object_targets_the_deployment_with_a_prometheus_trigger() -> None:
    so = manifests(K8sConfig(autoscaler="keda", name="llm"))[3]
    assert so["kind"] == "ScaledObject" and so["spec"]["scaleTargetRef"]["name"] == "llm"
    trigger = so["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus" and "headroom_requests_total" in trigger["metadata"]["query"]
    assert all(isinstance(v, str) for v in trigger["metadata"].values())  # KEDA wants strings


def test_cli_writes_yaml_and_rejects_bad_input(tmp_path: Path) -> None:
    app = typer.Typer()
    app.add_typer(deploy_app, name="deploy")
    out = tmp_path / "headroom.yaml"
    result = CliRunner().invoke(app, ["deploy", "k8s", "--image", "me/headroom:1", "--output", str(out)])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(out.read_text()))
    assert docs == manifests(K8sConfig(image="me/headroom:1"))
    assert to_yaml(docs) == out.read_text()
    bad = CliRunner().invoke(app, ["deploy", "k8s", "--autoscaler", "vpa"])
    assert bad.exit_code == 2 and "hpa" in bad.output
