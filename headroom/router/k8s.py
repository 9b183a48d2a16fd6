"""`headroom deploy k8s`: Kubernetes manifests for a headroom fleet (Deployment, Service, PDB, HPA or KEDA).

Defaults follow the Kubernetes docs and the textbook's cold-start advice (all cited inline):

* startupProbe on `/v2/health/ready` gates the other probes until the models are loaded and warmed (model
  loads take minutes, so it allows `startup_budget_s`); readinessProbe on `/v2/health/ready` for the pod's
  whole life (a draining replica answers 503 at once); livenessProbe on `/v2/health/live`.
* preStop sleeps `prestop_sleep_s` because endpoint removal is asynchronous, then SIGTERM starts headroom's
  drain, bounded by `--drain-timeout-s`; the sum stays inside `terminationGracePeriodSeconds`.
* The autoscaler is an HPA (autoscaling/v2, on the per-pod `headroom_inflight_requests` metric from a
  Prometheus adapter, HPA behaviour as in headroom.autoscaler.policy) or a KEDA ScaledObject with a
  Prometheus trigger (the simulator page's pattern: scale on request rate per pod).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
import yaml

Manifest = dict[str, Any]


@dataclass(frozen=True, slots=True)
class K8sConfig:
    """What the manifests describe."""

    name: str = "headroom"  # Deployment / Service / PDB / autoscaler name and `app` label
    namespace: str = "default"  # target namespace
    image: str = "headroom:latest"  # container image with headroom and the model repository
    model_repository: str = "/models"  # model repository path inside the image
    replicas: int = 2  # initial replicas (the autoscaler takes over)
    http_port: int = 8000  # KServe V2 / OpenAI / metrics
    grpc_port: int = 8001  # inference.GRPCInferenceService
    cpu: str = "2"  # CPU request = limit (Guaranteed QoS keeps latency predictable)
    memory: str = "4Gi"  # memory request = limit
    startup_budget_s: int = 300  # startup probe allows this long for loading + warm-up (10 s x 30)
    termination_grace_s: int = 30  # Kubernetes default terminationGracePeriodSeconds
    prestop_sleep_s: int = 5  # wait for endpoint removal before draining
    autoscaler: str = "hpa"  # hpa | keda
    min_replicas: int = 1  # simulator page: keep one replica alive (cold starts take minutes)
    max_replicas: int = 8  # simulator page KEDA example: maxReplicaCount 8
    target_inflight_per_pod: int = 6  # HPA target: in-flight requests per pod (75% of a capacity of 8)
    prometheus_url: str = "http://prometheus.monitoring:9090"  # KEDA Prometheus trigger serverAddress
    target_rps_per_pod: int = 40  # KEDA threshold: requests/s per pod (simulator page example: 40)
    min_available: int = 1  # PodDisruptionBudget minAvailable

    def __post_init__(self) -> None:
        if self.autoscaler not in ("hpa", "keda"):
            raise ValueError(f"autoscaler must be 'hpa' or 'keda', got {self.autoscaler!r}")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError("need 1 <= min_replicas <= max_replicas")
        if self.prestop_sleep_s + 1 >= self.termination_grace_s:
            raise ValueError("prestop_sleep_s must leave time to drain inside termination_grace_s")

    @property
    def drain_timeout_s(self) -> int:
        """headroom's own drain budget: the grace period minus the preStop sleep and a 2 s margin."""
        return max(1, self.termination_grace_s - self.prestop_sleep_s - 2)


def _labels(cfg: K8sConfig) -> dict[str, str]:
    return {"app.kubernetes.io/name": cfg.name, "app.kubernetes.io/part-of": "headroom"}


def _meta(cfg: K8sConfig) -> dict[str, Any]:
    return {"name": cfg.name, "namespace": cfg.namespace, "labels": _labels(cfg)}


def deployment(cfg: K8sConfig) -> Manifest:
    def probe(path: str, period_s: int, failures: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period_s, "timeoutSeconds": 1,
                "failureThreshold": failures, "successThreshold": 1}

    container = {
        "name": "headroom",
        "image": cfg.image,
        "args": ["serve", "--host", "0.0.0.0", "--http-port", str(cfg.http_port), "--grpc-port",
                 str(cfg.grpc_port), "--model-repository", cfg.model_repository,
                 "--drain-timeout-s", str(cfg.drain_timeout_s)],
        "ports": [{"name": "http", "containerPort": cfg.http_port, "protocol": "TCP"},
                  {"name": "grpc", "containerPort": cfg.grpc_port, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": cfg.cpu, "memory": cfg.memory},
                      "limits": {"cpu": cfg.cpu, "memory": cfg.memory}},
        # K8s probe defaults: period 10 s, timeout 1 s, failure threshold 3.
        "startupProbe": probe("/v2/health/ready", 10, max(1, cfg.startup_budget_s // 10)),
        "readinessProbe": probe("/v2/health/ready", 5, 2),
        "livenessProbe": probe("/v2/health/live", 10, 3),
        "lifecycle": {"preStop": {"sleep": {"seconds": cfg.prestop_sleep_s}}},
        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True},
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(cfg),
        "spec": {
            "replicas": cfg.replicas,
            "selector": {"matchLabels": _labels(cfg)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": _labels(cfg),
                             "annotations": {"prometheus.io/scrape": "true", "prometheus.io/path": "/metrics",
                                             "prometheus.io/port": str(cfg.http_port)}},
                "spec": {"terminationGracePeriodSeconds": cfg.termination_grace_s,
                         "securityContext": {"runAsUser": 1000, "runAsNonRoot": True},
                         "containers": [container]},
            },
        },
    }


def service(cfg: K8sConfig) -> Manifest:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(cfg),
            "spec": {"selector": _labels(cfg), "ports": [
                {"name": "http", "port": cfg.http_port, "targetPort": "http", "protocol": "TCP"},
                {"name": "grpc", "port": cfg.grpc_port, "targetPort": "grpc", "protocol": "TCP",
                 "appProtocol": "grpc"}]}}


def pod_disruption_budget(cfg: K8sConfig) -> Manifest:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(cfg),
            "spec": {"minAvailable": cfg.min_available, "selector": {"matchLabels": _labels(cfg)}}}


def hpa(cfg: K8sConfig) -> Manifest:
    """HPA behaviour mirrors headroom.autoscaler.policy: up max(100%, 4 pods)/15 s, down after 300 s."""
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": _meta(cfg),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": cfg.name},
            "minReplicas": cfg.min_replicas, "maxReplicas": cfg.max_replicas,
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": "headroom_inflight_requests"},
                "target": {"type": "AverageValue", "averageValue": str(cfg.target_inflight_per_pod)}}}],
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max", "policies": [
                    {"type": "Percent", "value": 100, "periodSeconds": 15},
                    {"type": "Pods", "value": 4, "periodSeconds": 15}]},
                "scaleDown": {"stabilizationWindowSeconds": 300, "policies": [
                    {"type": "Percent", "value": 100, "periodSeconds": 15}]},
            },
        },
    }


def keda_scaled_object(cfg: K8sConfig) -> Manifest:
    """KEDA ScaledObject (keda.sh/v1alpha1; a CRD, so not in the core schemas)."""
    selector = f'namespace="{cfg.namespace}",pod=~"{cfg.name}-.*"'
    query = f"sum(rate(headroom_requests_total{{{selector}}}[1m]))"
    return {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": _meta(cfg),
        "spec": {
            "scaleTargetRef": {"name": cfg.name},
            "pollingInterval": 15,  # KEDA default 30 s; headroom's autoscaler syncs every 15 s like the HPA
            "cooldownPeriod": 300,  # KEDA default (only applies to scaling to zero)
            "minReplicaCount": cfg.min_replicas, "maxReplicaCount": cfg.max_replicas,
            "triggers": [{"type": "prometheus", "metadata": {
                "serverAddress": cfg.prometheus_url, "query": query, "threshold": str(cfg.target_rps_per_pod)}}],
        },
    }


def manifests(cfg: K8sConfig) -> list[Manifest]:
    """Deployment, Service, PodDisruptionBudget and the chosen autoscaler, in apply order."""
    scaler = hpa(cfg) if cfg.autoscaler == "hpa" else keda_scaled_object(cfg)
    return [deployment(cfg), service(cfg), pod_disruption_budget(cfg), scaler]


def to_yaml(docs: list[Manifest]) -> str:
    return str(yaml.safe_dump_all(docs, sort_keys=False))


deploy_app = typer.Typer(help="Write deployment manifests.", no_args_is_help=True, add_completion=False)


@deploy_app.callback()
def deploy() -> None:
    """Write deployment manifests: `headroom deploy k8s` (a group, so the target is named as documented)."""


@deploy_app.command("k8s")
def k8s(
    image: str = typer.Option("headroom:latest", help="Container image holding headroom and the models."),
    name: str = typer.Option("headroom", help="Name and app label of every object."),
    namespace: str = typer.Option("default", help="Target namespace."),
    replicas: int = typer.Option(2, help="Initial replicas."),
    autoscaler: str = typer.Option("hpa", help="hpa (needs a Prometheus adapter) or keda (KEDA installed)."),
    min_replicas: int = typer.Option(1, help="Autoscaling floor."),
    max_replicas: int = typer.Option(8, help="Autoscaling ceiling."),
    output: Path | None = typer.Option(None, help="Write here instead of stdout."),
) -> None:
    """Kubernetes manifests: Deployment (startup/readiness/liveness probes, preStop drain), Service,
    PodDisruptionBudget and an HPA or KEDA ScaledObject on headroom's Prometheus metrics."""
    try:
        cfg = K8sConfig(image=image, name=name, namespace=namespace, replicas=replicas, autoscaler=autoscaler,
                        min_replicas=min_replicas, max_replicas=max_replicas)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    text = to_yaml(manifests(cfg))
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text)
        typer.echo(f"wrote {len(manifests(cfg))} manifests to {output}; apply with: kubectl apply -f {output}",
                   err=True)
