"""What `headroom deploy k8s` renders: one frozen value (the CLI and a router.yaml fill it in)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    min_available: int = 1  # PodDisruptionBudget minAvailable (unless pdb_max_unavailable is set)
    pdb_max_unavailable: int = 0  # > 0: the PDB's maxUnavailable instead (from a capacity plan: k of N+k)
    model_volume: str = "image"  # image: the models are baked into the image | pvc: a PersistentVolumeClaim
    model_volume_size: str = "5Gi"  # with model_volume pvc: the claim's size (ReadOnlyMany)
    router_replicas: int = 2  # router pods (stateless; two so a node loss leaves one)
    router_cpu: str = "1"  # router CPU request = limit
    router_memory: str = "512Mi"  # router memory request = limit
    router_config: str = ""  # router.yaml text mounted into the router pods ("" = the router's defaults)

    def __post_init__(self) -> None:
        if self.autoscaler not in ("hpa", "keda"):
            raise ValueError(f"autoscaler must be 'hpa' or 'keda', got {self.autoscaler!r}")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError("need 1 <= min_replicas <= max_replicas")
        if self.model_volume not in ("image", "pvc"):
            raise ValueError(f"model_volume must be 'image' or 'pvc', got {self.model_volume!r}")
        if self.pdb_max_unavailable < 0:
            raise ValueError("pdb_max_unavailable must be >= 0")
        if self.router_replicas < 1:
            raise ValueError("router_replicas must be >= 1")
        if self.prestop_sleep_s + 1 >= self.termination_grace_s:
            raise ValueError("prestop_sleep_s must leave time to drain inside termination_grace_s")

    @property
    def drain_timeout_s(self) -> int:
        """headroom's own drain budget: the grace period minus the preStop sleep and a 2 s margin."""
        return max(1, self.termination_grace_s - self.prestop_sleep_s - 2)
