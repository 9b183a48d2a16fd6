"""The router in Kubernetes: `headroom route --discover k8s` in front of the replica Deployment.

Without it, a Service would spread requests over the replica pods with kube-proxy's random choice, and every
policy headroom's router applies (P2C / peak-EWMA, shedding, hedging, retries, prefix affinity, canary,
degradation) would vanish in production. The objects:

* ServiceAccount + Role (get/list/watch `endpointslices`) + RoleBinding: what discovery needs, nothing more;
* ConfigMap `<name>-router` holding `router.yaml` (the same file `headroom route --config` reads);
* Deployment `<name>-router`: `headroom route --discover k8s --k8s-service <name>-replicas --config ...`,
  readiness on `/v2/health/ready` (200 while any replica is ready), liveness on `/router/stats`;
* Service `<name>` (the address clients use) selects the router pods; the replicas sit behind the headless
  Service `<name>-replicas`, which only the router reads.
"""

from __future__ import annotations

from typing import Any

from headroom.router.k8s_config import K8sConfig, Manifest

ROUTER_CONFIG_PATH = "/etc/headroom/router.yaml"


def labels(cfg: K8sConfig, component: str) -> dict[str, str]:
    """Labels of one component ("replica" or "router"): selectors never mix the two."""
    return {"app.kubernetes.io/name": cfg.name, "app.kubernetes.io/part-of": "headroom",
            "app.kubernetes.io/component": component}


def _meta(cfg: K8sConfig, name: str, component: str) -> dict[str, Any]:
    return {"name": name, "namespace": cfg.namespace, "labels": labels(cfg, component)}


def router_name(cfg: K8sConfig) -> str:
    return f"{cfg.name}-router"


def replicas_service_name(cfg: K8sConfig) -> str:
    return f"{cfg.name}-replicas"


def router_args(cfg: K8sConfig) -> list[str]:
    """`headroom route ...` as the router container runs it (a test parses it with the real CLI)."""
    return ["route", "--discover", "k8s", "--k8s-service", replicas_service_name(cfg), "--host", "0.0.0.0",
            "--port", str(cfg.http_port), "--grpc-port", str(cfg.grpc_port), "--config", ROUTER_CONFIG_PATH]


def _rbac(cfg: K8sConfig) -> list[Manifest]:
    name = router_name(cfg)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(cfg, name, "router")},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(cfg, name, "router"),
         "rules": [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(cfg, name, "router"),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": cfg.namespace}]},
    ]


def _config_map(cfg: K8sConfig) -> Manifest:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(cfg, router_name(cfg), "router"),
            "data": {"router.yaml": cfg.router_config or "{}\n"}}


def _router_deployment(cfg: K8sConfig) -> Manifest:
    def probe(path: str, period_s: int, failures: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period_s, "timeoutSeconds": 1,
                "failureThreshold": failures, "successThreshold": 1}

    container = {
        "name": "router", "image": cfg.image, "args": router_args(cfg),
        "ports": [{"name": "http", "containerPort": cfg.http_port, "protocol": "TCP"},
                  {"name": "grpc", "containerPort": cfg.grpc_port, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": cfg.router_cpu, "memory": cfg.router_memory},
                      "limits": {"cpu": cfg.router_cpu, "memory": cfg.router_memory}},
        "readinessProbe": probe("/v2/health/ready", 5, 2),
        "livenessProbe": probe("/router/stats", 10, 3),
        "volumeMounts": [{"name": "config", "mountPath": "/etc/headroom", "readOnly": True}],
        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True},
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(cfg, router_name(cfg), "router"),
        "spec": {
            "replicas": cfg.router_replicas,
            "selector": {"matchLabels": labels(cfg, "router")},
            "template": {
                "metadata": {"labels": labels(cfg, "router"),
                             "annotations": {"prometheus.io/scrape": "true", "prometheus.io/path": "/metrics",
                                             "prometheus.io/port": str(cfg.http_port)}},
                "spec": {"serviceAccountName": router_name(cfg),
                         "securityContext": {"runAsUser": 1000, "runAsNonRoot": True},
                         "containers": [container],
                         "volumes": [{"name": "config", "configMap": {"name": router_name(cfg)}}]},
            },
        },
    }


def _router_service(cfg: K8sConfig) -> Manifest:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(cfg, cfg.name, "router"),
            "spec": {"selector": labels(cfg, "router"), "ports": [
                {"name": "http", "port": cfg.http_port, "targetPort": "http", "protocol": "TCP"},
                {"name": "grpc", "port": cfg.grpc_port, "targetPort": "grpc", "protocol": "TCP",
                 "appProtocol": "grpc"}]}}


def router_manifests(cfg: K8sConfig) -> list[Manifest]:
    """RBAC, config, the router Deployment and the public Service, in apply order."""
    return [*_rbac(cfg), _config_map(cfg), _router_deployment(cfg), _router_service(cfg)]
