"""`headroom deploy k8s`: Kubernetes manifests for a headroom fleet: the replicas (Deployment, headless Service,
PDB, HPA or KEDA, optionally a model PersistentVolumeClaim) and headroom's router in front of them
(`headroom.router.k8s_router`: it discovers the replicas through the EndpointSlice API).

Defaults follow the Kubernetes docs and the textbook's cold-start advice (all cited inline):

* startupProbe on `/v2/health/ready` gates the other probes until the models are loaded and warmed (model
  loads take minutes, so it allows `startup_budget_s`); readinessProbe on `/v2/health/ready` for the pod's
  whole life (a draining replica answers 503 at once); livenessProbe on `/v2/health/live`.
* preStop sleeps `prestop_sleep_s` because endpoint removal is asynchronous, then SIGTERM starts headroom's
  drain, bounded by `--drain-timeout-s`; the sum stays inside `terminationGracePeriodSeconds`.
* The autoscaler is an HPA (autoscaling/v2, on the per-pod `headroom_inflight_requests` metric from a
  Prometheus adapter, HPA behaviour as in headroom.autoscaler.policy) or a KEDA ScaledObject with a
  Prometheus trigger on the router's request rate (the simulator page's pattern: scale on request rate per
  pod), with the Prometheus address as a parameter (`--prometheus-url`).
* The root filesystem is read-only; compiled kernels and converted tokenizers go to an emptyDir
  (`HEADROOM_CACHE_DIR`). The models are in the image (`--model-volume image`, see deploy/Dockerfile) or on a
  ReadOnlyMany claim (`--model-volume pvc`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml

from headroom.plan.capacity import plan_capacity
from headroom.router.fleet_config import FleetConfig, dump_fleet_config, given_flags, load_fleet_config
from headroom.router.k8s_config import K8sConfig, Manifest
from headroom.router.k8s_plan import fields_from_plan, from_profile_file
from headroom.router.k8s_router import labels, replicas_service_name, router_manifests, router_name


def _labels(cfg: K8sConfig) -> dict[str, str]:
    return labels(cfg, "replica")


def _meta(cfg: K8sConfig, name: str = "") -> dict[str, Any]:
    return {"name": name or cfg.name, "namespace": cfg.namespace, "labels": _labels(cfg)}


CACHE_DIR = "/var/cache/headroom"  # HEADROOM_CACHE_DIR: compiled kernels, converted tokenizers (an emptyDir)


def _volumes(cfg: K8sConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container mounts): a writable cache on a read-only root filesystem, and the models from a
    PersistentVolumeClaim when `model_volume` is pvc (else they are in the image at `model_repository`)."""
    volumes: list[dict[str, Any]] = [{"name": "cache", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "cache", "mountPath": CACHE_DIR}]
    if cfg.model_volume == "pvc":
        volumes.append({"name": "models", "persistentVolumeClaim": {"claimName": f"{cfg.name}-models",
                                                                    "readOnly": True}})
        mounts.append({"name": "models", "mountPath": cfg.model_repository, "readOnly": True})
    return volumes, mounts


def model_claim(cfg: K8sConfig) -> Manifest:
    """The models' PersistentVolumeClaim (ReadOnlyMany: every replica mounts the same copy)."""
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(cfg, f"{cfg.name}-models"),
            "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": cfg.model_volume_size}}}}


def deployment(cfg: K8sConfig) -> Manifest:
    def probe(path: str, period_s: int, failures: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period_s, "timeoutSeconds": 1,
                "failureThreshold": failures, "successThreshold": 1}

    volumes, mounts = _volumes(cfg)
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
        "env": [{"name": "HEADROOM_CACHE_DIR", "value": CACHE_DIR}],
        "volumeMounts": mounts,
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
                         "containers": [container], "volumes": volumes},
            },
        },
    }


def service(cfg: K8sConfig) -> Manifest:
    """The replicas' headless Service: its EndpointSlices are what the router discovers (clients use the
    router's Service, `cfg.name`)."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(cfg, replicas_service_name(cfg)),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": False, "selector": _labels(cfg), "ports": [
                {"name": "http", "port": cfg.http_port, "targetPort": "http", "protocol": "TCP"},
                {"name": "grpc", "port": cfg.grpc_port, "targetPort": "grpc", "protocol": "TCP",
                 "appProtocol": "grpc"}]}}


def pod_disruption_budget(cfg: K8sConfig) -> Manifest:
    budget = {"maxUnavailable": cfg.pdb_max_unavailable} if cfg.pdb_max_unavailable else {
        "minAvailable": cfg.min_available}
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(cfg),
            "spec": {**budget, "selector": {"matchLabels": _labels(cfg)}}}


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
    selector = f'namespace="{cfg.namespace}",pod=~"{router_name(cfg)}-.*"'
    query = f"sum(rate(headroom_router_requests_total{{{selector}}}[1m]))"  # every request passes the router
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
    """The replicas (Deployment, headless Service, PodDisruptionBudget, the chosen autoscaler, the model claim
    when asked for), then the router in front of them (`headroom.router.k8s_router`), in apply order."""
    scaler = hpa(cfg) if cfg.autoscaler == "hpa" else keda_scaled_object(cfg)
    claim = [model_claim(cfg)] if cfg.model_volume == "pvc" else []
    return [deployment(cfg), service(cfg), pod_disruption_budget(cfg), scaler, *claim, *router_manifests(cfg)]


def to_yaml(docs: list[Manifest]) -> str:
    return str(yaml.safe_dump_all(docs, sort_keys=False))


deploy_app = typer.Typer(help="Write deployment manifests.", no_args_is_help=True, add_completion=False)
_DEFAULTS = K8sConfig()


def from_fleet(fleet: FleetConfig) -> dict[str, Any]:
    """The K8sConfig fields a router.yaml decides: replicas, the autoscaler's range, per-pod targets from the
    replica capacity (75% of it, the autoscaler's scale-up point) and a grace period that covers the drain."""
    spec = fleet.fleet
    out: dict[str, Any] = {"replicas": spec.replicas,
                           "target_inflight_per_pod": max(1, int(spec.replica_capacity * 0.75))}
    grace = int(spec.drain_timeout_s) + _DEFAULTS.prestop_sleep_s + 2
    out["termination_grace_s"] = max(_DEFAULTS.termination_grace_s, grace)
    if fleet.autoscaler is not None:
        out["min_replicas"] = max(1, fleet.autoscaler.min_replicas)
        out["max_replicas"] = fleet.autoscaler.max_replicas
    out["router_config"] = dump_fleet_config(fleet)  # the router pods read the very same (validated) file
    return out


@deploy_app.callback()
def deploy() -> None:
    """Write deployment manifests: `headroom deploy k8s` (a group, so the target is named as documented)."""


@deploy_app.command("k8s")
def k8s(
    ctx: typer.Context,
    config: Path | None = typer.Option(None, "--config", help="router.yaml (the file `headroom route --config` "
                                       "reads): replicas, autoscaling floor/ceiling, replica capacity and drain "
                                       "time come from it; flags given here override it."),
    image: str = typer.Option("headroom:latest", help="Container image holding headroom and the models."),
    name: str = typer.Option("headroom", help="Name and app label of every object."),
    namespace: str = typer.Option("default", help="Target namespace."),
    replicas: int = typer.Option(2, help="Initial replicas."),
    autoscaler: str = typer.Option("hpa", help="hpa (needs a Prometheus adapter) or keda (KEDA installed)."),
    min_replicas: int = typer.Option(1, help="Autoscaling floor."),
    max_replicas: int = typer.Option(8, help="Autoscaling ceiling."),
    prometheus_url: str = typer.Option(_DEFAULTS.prometheus_url, help="Prometheus the KEDA trigger queries."),
    model_volume: str = typer.Option("image", help="image: the models are baked into the image (deploy/Dockerfile)"
                                     "; pvc: mount a ReadOnlyMany PersistentVolumeClaim <name>-models."),
    router_replicas: int = typer.Option(2, help="Router pods in front of the replicas."),
    peak_qps: float | None = typer.Option(None, help="Plan for this peak rate (requests/s, with --p99-ms and "
                                          "--service-ms, as `headroom plan capacity`): the plan sets replicas, "
                                          "the PDB, the autoscaler's per-pod targets and the ceiling."),
    p99_ms: float = typer.Option(1000.0, help="With --peak-qps: the p99 latency SLO (ms)."),
    service_ms: float = typer.Option(100.0, help="With --peak-qps: one replica's measured service time (ms)."),
    from_profile: Path | None = typer.Option(None, "--from-profile", help="A `headroom profile --output` file: "
                                             "the service time at batch 1 (instead of --service-ms) and "
                                            "the replica's CPU and memory requests, from the shape it was "
                                            "measured on (--replica-cpu / --replica-memory override them)."),
    redundancy: int = typer.Option(1, help="With --peak-qps: k of N+k, replicas that may be down (PDB)."),
    replica_cpu: str = typer.Option("2", help="CPU request = limit of a replica (the shape --service-ms was "
                                    "measured on; default: --from-profile's, else 2)."),
    replica_memory: str = typer.Option("4Gi", help="Memory request = limit of a replica (default: "
                                       "--from-profile's measured peak plus the server's share, else 4Gi)."),
    output: Path | None = typer.Option(None, help="Write here instead of stdout."),
) -> None:
    """Kubernetes manifests: the replica Deployment (startup/readiness/liveness probes, preStop drain), its
    headless Service, PodDisruptionBudget and an HPA or KEDA ScaledObject on headroom's Prometheus metrics, and
    headroom's router in front (RBAC for endpoint discovery, its router.yaml as a ConfigMap, Deployment, the
    public Service). With --peak-qps the capacity plan decides the replica count, the PDB and the autoscaler's
    per-pod targets."""
    try:
        fields: dict[str, Any] = {"image": image, "name": name, "namespace": namespace, "replicas": replicas,
                                  "autoscaler": autoscaler, "min_replicas": min_replicas,
                                  "max_replicas": max_replicas, "prometheus_url": prometheus_url,
                                  "model_volume": model_volume, "router_replicas": router_replicas,
                                  "cpu": replica_cpu, "memory": replica_memory}
        if config is not None:
            fields |= from_fleet(load_fleet_config(config))
        given = given_flags(ctx)
        fields |= {k: v for k, v in given.items() if k in fields}
        if from_profile is not None:  # the measured shape (headroom.router.k8s_plan.replica_shape)
            service_ms, cpu, memory = from_profile_file(from_profile)
            replica_cpu = replica_cpu if "replica_cpu" in given else cpu
            replica_memory = replica_memory if "replica_memory" in given else memory
            fields |= {"cpu": replica_cpu, "memory": replica_memory}
        if peak_qps is not None:  # the planner feeds the deployment (headroom.router.k8s_plan)
            plan = plan_capacity(peak_qps, p99_ms / 1e3, service_ms / 1e3, redundancy=redundancy)
            fields |= fields_from_plan(plan, int(fields["max_replicas"]), replica_cpu, replica_memory)
        cfg = K8sConfig(**fields)
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
