"""Generated Kubernetes manifests, validated against the Kubernetes 1.37 schemas (kubernetes-validate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # no py.typed marker
import pytest
import typer
import yaml
from typer.testing import CliRunner

from headroom.router.k8s import K8sConfig, deploy_app, manifests, to_yaml
from tests.support.keda_schema import validate_strictly

K8S_VERSION = "1.37.0"


@pytest.mark.parametrize("autoscaler", ["hpa", "keda"])
def test_core_manifests_validate_strictly(autoscaler: str) -> None:
    docs = manifests(K8sConfig(autoscaler=autoscaler))
    kinds = [d["kind"] for d in docs]
    assert kinds[:3] == ["Deployment", "Service", "PodDisruptionBudget"]
    for doc in docs:
        if doc["apiVersion"].startswith("keda.sh/"):
            validate_strictly(doc)  # a CRD: KEDA's own schema, unknown keys refused
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize(("path", "value"), [(("spec", "minReplicaCont"), 1), (("spec", "triggers", 0, "type"), 5),
                                             (("spec", "triggers", 0, "metadatas"), {}),
                                             (("spec", "advanced", "horizontalPodAutoscalerConfig", "behaviour"), {})])
def test_a_misspelt_or_mistyped_scaled_object_is_refused(path: tuple[Any, ...], value: object) -> None:
    so = next(d for d in manifests(K8sConfig(autoscaler="keda")) if d["kind"] == "ScaledObject")
    node: Any = so
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
    node[path[-1]] = value
    with pytest.raises(ValueError):
        validate_strictly(so)


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
    assert trigger["type"] == "prometheus" and "headroom_router_requests_total" in trigger["metadata"]["query"]
    assert 'pod=~"llm-router-.*"' in trigger["metadata"]["query"]
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
    # the Prometheus address is the user's, not a hard-coded one: --prometheus-url reaches the KEDA trigger
    keda = CliRunner().invoke(app, ["deploy", "k8s", "--autoscaler", "keda", "--prometheus-url",
                                    "http://prom.observability.svc:9090"])
    assert keda.exit_code == 0, keda.output
    scaled = next(d for d in yaml.safe_load_all(keda.output) if d and d["kind"] == "ScaledObject")
    assert scaled["spec"]["triggers"][0]["metadata"]["serverAddress"] == "http://prom.observability.svc:9090"


def _by_name(docs: list[dict[str, object]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(str(d["kind"]), str(d["metadata"]["name"])): d for d in docs}  # type: ignore[index]


@pytest.mark.parametrize("volume", ["image", "pvc"])
def test_the_router_fronts_the_replicas_and_everything_validates(volume: str) -> None:
    docs = _by_name(manifests(K8sConfig(name="hr", model_volume=volume)))
    for doc in docs.values():
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    replicas_svc, public = docs["Service", "hr-replicas"], docs["Service", "hr"]
    assert replicas_svc["spec"]["clusterIP"] == "None"  # headless: only the router reads its endpoints
    assert replicas_svc["spec"]["selector"]["app.kubernetes.io/component"] == "replica"
    assert public["spec"]["selector"]["app.kubernetes.io/component"] == "router"
    replica_pod = docs["Deployment", "hr"]["spec"]["template"]
    assert replica_pod["metadata"]["labels"] == replicas_svc["spec"]["selector"]
    router_pod = docs["Deployment", "hr-router"]["spec"]["template"]
    assert router_pod["metadata"]["labels"] == public["spec"]["selector"]
    assert router_pod["spec"]["serviceAccountName"] == "hr-router"
    rules = docs["Role", "hr-router"]["rules"]
    assert rules == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                      "verbs": ["get", "list", "watch"]}]
    mounts = {m["name"]: m for m in replica_pod["spec"]["containers"][0]["volumeMounts"]}
    assert "cache" in mounts  # a writable cache on the read-only root filesystem
    assert ("models" in mounts) == (volume == "pvc") and (("PersistentVolumeClaim", "hr-models") in docs) == (
        volume == "pvc")


def test_container_args_parse_with_the_real_cli() -> None:
    """The pods' command lines are accepted by `headroom route` / `headroom serve` as they are (no image is
    built here: this is the entrypoint contract the Dockerfile's ENTRYPOINT ["headroom"] relies on)."""
    from headroom.cli.main import load_subcommand

    docs = _by_name(manifests(K8sConfig(name="hr")))
    for deploy, command in (("hr", "serve"), ("hr-router", "route")):
        args = docs["Deployment", deploy]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[0] == command
        cmd = load_subcommand(command)
        ctx = cmd.make_context(command, list(args[1:]), resilient_parsing=False)
        assert ctx.params  # parsed: unknown or malformed options raise click.UsageError above
    router_args = docs["Deployment", "hr-router"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert router_args[router_args.index("--k8s-service") + 1] == "hr-replicas"


def test_dockerfile_entrypoint_contract() -> None:
    """No container daemon here, so no image is built in CI: this checks what the image promises instead — its
    default command parses as `headroom serve` options, it runs as a non-root user, and it pins the same torch as
    constraints.txt (a CPU build from the CPU wheel index)."""
    import json

    from headroom.cli.main import load_subcommand

    root = Path(__file__).resolve().parents[2]
    text = (root / "deploy" / "docker" / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    entry = json.loads(next(ln for ln in lines if ln.startswith("ENTRYPOINT")).removeprefix("ENTRYPOINT"))
    cmd = json.loads(next(ln for ln in lines if ln.startswith("CMD")).removeprefix("CMD"))
    assert entry == ["headroom"] and cmd[0] == "serve"
    load_subcommand("serve").make_context("serve", cmd[1:])
    assert next(ln for ln in reversed(lines) if ln.startswith("USER")) == "USER 1000"
    pinned = next(ln for ln in (root / "constraints.txt").read_text().splitlines() if ln.startswith("torch=="))
    assert pinned in text and "whl/cpu" in text
