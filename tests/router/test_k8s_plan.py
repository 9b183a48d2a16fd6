"""`headroom deploy k8s --peak-qps`: the capacity plan sets replicas, PDB, per-pod targets and resource requests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # no py.typed marker
import pytest
import typer
import yaml
from typer.testing import CliRunner

from headroom.plan.capacity import plan_capacity
from headroom.router.k8s import deploy_app
from headroom.router.k8s_plan import fields_from_plan, replica_shape

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


def test_the_replica_shape_comes_from_the_profile_measurement() -> None:
    MiB = 1024 * 1024
    # 412 MiB measured x 1.25 = 515 MiB, rounded up to 64 Mi steps
    assert replica_shape({"cpus": 2, "peak_rss_bytes": 412 * MiB}) == ("2", "576Mi")
    assert replica_shape({"cpus": 1, "peak_rss_bytes": 1}) == ("1", "64Mi")
    for meta in ({}, {"cpus": 2}, {"peak_rss_bytes": MiB}, {"cpus": 0, "peak_rss_bytes": MiB},
                 {"cpus": True, "peak_rss_bytes": MiB}, {"cpus": 2, "peak_rss_bytes": "1Gi"},
                 {"cpus": 2.5, "peak_rss_bytes": MiB}, {"cpus": 2, "peak_rss_bytes": 0}):
        with pytest.raises(ValueError, match="headroom profile"):
            replica_shape(meta)


def test_deploy_from_a_profile_takes_its_service_time_and_shape(tmp_path: Path) -> None:
    profile = tmp_path / "m.json"
    profile.write_text(json.dumps({"name": "m", "service_ms": {"1": 100.0, "8": 300.0}, "cv": 0.1,
                                   "meta": {"cpus": 4, "peak_rss_bytes": 3000 * 1024 * 1024}}))
    # the same plan as --service-ms 100 (25 replicas), with the measured shape: 3000 MiB x 1.25 -> 3776Mi
    docs = _render("--peak-qps", "100", "--p99-ms", "1000", "--from-profile", str(profile))
    assert docs["Deployment"]["spec"]["replicas"] == 25
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "4", "memory": "3776Mi"}
    assert container["resources"]["limits"] == container["resources"]["requests"]
    flagged = _render("--from-profile", str(profile), "--replica-cpu", "3")  # a flag given wins
    container = flagged["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "3", "memory": "3776Mi"}
    old = tmp_path / "old.json"  # a profile written before the shape was recorded
    old.write_text(json.dumps({"name": "m", "service_ms": {"1": 100.0}}))
    app = typer.Typer()
    app.add_typer(deploy_app, name="deploy")
    bad = CliRunner().invoke(app, ["deploy", "k8s", "--from-profile", str(old)])
    assert bad.exit_code == 2 and "meta.cpus" in bad.output, bad.output
    garbled = tmp_path / "garbled.json"
    garbled.write_text("{not json")
    for path, says in ((garbled, "cannot read a profile"), (tmp_path / "missing.json", "cannot read a profile")):
        refused = CliRunner().invoke(app, ["deploy", "k8s", "--from-profile", str(path)])
        assert refused.exit_code == 2 and says in refused.output, refused.output
