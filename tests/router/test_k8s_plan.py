"""`headroom deploy k8s --peak-qps`: the capacity plan sets replicas, PDB, per-pod targets and resource requests."""

from __future__ import annotations

from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # no py.typed marker
import typer
import yaml
from typer.testing import CliRunner

from headroom.plan.capacity import plan_capacity
from headroom.router.k8s import deploy_app
from headroom.router.k8s_plan import fields_from_plan

K8S_VERSION = "1.37.0"


def test_the_plan_decides_counts_budget_and_targets() -> None:
    # S = 100 ms, p99 SLO 1 s: rho_max = 1 - 4.6 x 0.1 = 0.54; mu = 10/s; 100/s needs ceil(100 / 0.54 / 10) = 19,
    # +30% headroom = 25 (> 19 + 1); a pod at rho_max serves 5.4/s and holds 0.54 / 0.46 = 1.17 on average
    plan = plan_capacity(100.0, 1.0, 0.1, redundancy=1)
    assert plan.recommended_replicas == 25
    assert fields_from_plan(plan, 8, "4", "6Gi") == {
        "replicas": 25, "max_replicas": 25, "pdb_max_unavailable": 1, "target_rps_per_pod": 5,
        "target_inflight_per_pod": 1, "cpu": "4", "memory": "6Gi"}
    assert fields_from_plan(plan, 40, "4", "6Gi")["max_replicas"] == 40  # a higher ceiling asked for is kept


def _render(*args: str) -> dict[str, dict[str, Any]]:
    app = typer.Typer()
    app.add_typer(deploy_app, name="deploy")
    result = CliRunner().invoke(app, ["deploy", "k8s", *args])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.output))
    for doc in docs:
        if not doc["apiVersion"].startswith("keda.sh/"):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    return {d["kind"]: d for d in docs if d["metadata"]["name"] == "headroom"}


def test_rendered_manifests_carry_the_plan() -> None:
    docs = _render("--peak-qps", "100", "--p99-ms", "1000", "--service-ms", "100", "--redundancy", "2",
                   "--replica-cpu", "4", "--replica-memory", "6Gi")
    assert docs["Deployment"]["spec"]["replicas"] == 25  # max(19 + 30% headroom = 25, N+2 = 21)
    assert docs["PodDisruptionBudget"]["spec"] == {"maxUnavailable": 2, "selector": {
        "matchLabels": docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"]}}
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "4", "memory": "6Gi"}
    assert docs["HorizontalPodAutoscaler"]["spec"]["maxReplicas"] >= docs["Deployment"]["spec"]["replicas"]
    keda = _render("--peak-qps", "100", "--p99-ms", "1000", "--service-ms", "100", "--autoscaler", "keda")
    assert keda["ScaledObject"]["spec"]["triggers"][0]["metadata"]["threshold"] == "5"


def test_without_a_plan_the_budget_is_min_available_and_an_unreachable_slo_is_refused() -> None:
    assert _render()["PodDisruptionBudget"]["spec"]["minAvailable"] == 1
    app = typer.Typer()
    app.add_typer(deploy_app, name="deploy")
    bad = CliRunner().invoke(app, ["deploy", "k8s", "--peak-qps", "10", "--p99-ms", "100", "--service-ms", "100"])
    assert bad.exit_code == 2 and "slo" in bad.output.lower(), bad.output
