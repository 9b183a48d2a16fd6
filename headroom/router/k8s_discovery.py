"""Replicas discovered from Kubernetes: the router keeps its policies when the fleet runs on a cluster.

In Kubernetes the replica Deployment (and its HPA / KEDA ScaledObject) owns the pods; the router only has to
know where they are. `K8sEndpointsFleet` polls the EndpointSlice API for the replicas' headless Service
(`GET /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices?labelSelector=kubernetes.io/service-name=SVC`,
the API kube-proxy itself reads) and hands the ready endpoints to the router as upstreams. It is the same
`ReplicaFleet` contract as the local and Ray replica managers, so `headroom route --discover k8s` reuses the
whole router (health checks, ejection, P2C / peak-EWMA, shedding, hedging, canary, degradation).

In a pod it reads the standard in-cluster settings: `KUBERNETES_SERVICE_HOST` / `_PORT`, the service-account
token and CA under /var/run/secrets/kubernetes.io/serviceaccount. `--k8s-api URL` points it elsewhere (tests
use a fake API server on 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from headroom.autoscaler.actuator import ColdStartTiming
from headroom.core.tasks import cancel_and_wait
from headroom.router.upstream import Upstream

log = logging.getLogger("headroom.router.k8s")

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True, slots=True)
class DiscoveryConfig:
    """Where to find the replicas."""

    service: str  # the replicas' (headless) Service
    namespace: str = ""  # "" = the pod's own namespace (service-account file), else "default"
    api_url: str = ""  # "" = in-cluster (KUBERNETES_SERVICE_HOST/PORT)
    port_name: str = "http"  # the EndpointSlice port that serves HTTP
    grpc_port_name: str = "grpc"  # the EndpointSlice port that serves gRPC ("" = none)
    capacity: int = 8  # concurrent requests one replica serves within its SLO
    poll_interval_s: float = 2.0  # how often the slices are read (endpoint changes take effect this fast)
    timeout_s: float = 5.0  # one API call

    def __post_init__(self) -> None:
        if not self.service:
            raise ValueError("the replicas' Service name is required (--k8s-service)")
        if self.poll_interval_s <= 0 or self.timeout_s <= 0 or self.capacity < 1:
            raise ValueError("poll_interval_s and timeout_s must be > 0, capacity >= 1")


def upstreams_from_slices(doc: Mapping[str, Any], cfg: DiscoveryConfig) -> tuple[Upstream, ...]:
    """The ready, non-terminating endpoints of an EndpointSliceList as upstreams, sorted by id (pure)."""
    found: dict[str, Upstream] = {}
    for item in doc.get("items") or ():
        ports = {p.get("name", ""): p.get("port") for p in item.get("ports") or () if p.get("port")}
        http_port, grpc_port = ports.get(cfg.port_name), ports.get(cfg.grpc_port_name)
        if http_port is None:
            continue
        for ep in item.get("endpoints") or ():
            cond = ep.get("conditions") or {}
            if cond.get("ready") is False or cond.get("terminating") is True or not ep.get("addresses"):
                continue  # Kubernetes: ready unset means ready
            address = ep["addresses"][0]
            host = f"[{address}]" if ":" in address else address
            rid = str((ep.get("targetRef") or {}).get("name") or f"{address}:{http_port}")
            grpc = f"{host}:{grpc_port}" if grpc_port else ""
            found[rid] = Upstream(rid, f"http://{host}:{http_port}", capacity=cfg.capacity, grpc_target=grpc)
    return tuple(found[k] for k in sorted(found))


def _in_cluster() -> tuple[str, dict[str, str], str | bool]:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise RuntimeError("not in a Kubernetes pod (KUBERNETES_SERVICE_HOST is unset): pass --k8s-api URL")
    token = (SERVICE_ACCOUNT / "token").read_text().strip()
    ca = SERVICE_ACCOUNT / "ca.crt"
    return f"https://{host}:{port}", {"Authorization": f"Bearer {token}"}, str(ca) if ca.exists() else True


def _namespace(cfg: DiscoveryConfig) -> str:
    if cfg.namespace:
        return cfg.namespace
    try:
        return (SERVICE_ACCOUNT / "namespace").read_text().strip() or "default"
    except OSError:
        return "default"


class K8sEndpointsFleet:
    """The `ReplicaFleet` of a router whose replicas Kubernetes runs: discovery instead of process management."""

    def __init__(self, cfg: DiscoveryConfig, on_change: Callable[[tuple[Upstream, ...]], None]) -> None:
        self.cfg = cfg
        self._on_change = on_change
        self._serving: tuple[Upstream, ...] = ()
        self._events: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self._first = asyncio.Event()
        self._base: str
        self._headers: dict[str, str]
        self._verify: str | bool
        if cfg.api_url:
            self._base, self._headers, self._verify = cfg.api_url.rstrip("/"), {}, True
        else:
            self._base, self._headers, self._verify = _in_cluster()
        ns, svc = _namespace(cfg), quote(f"kubernetes.io/service-name={cfg.service}", safe="")
        self._url = f"{self._base}/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector={svc}"

    @property
    def cold_starts(self) -> Sequence[ColdStartTiming]:
        return ()  # Kubernetes starts the pods; their start-up is the startup probe's business

    @property
    def events(self) -> list[str]:
        return self._events

    def serving(self) -> tuple[Upstream, ...]:
        return self._serving

    async def scale_to(self, replicas: int, warm_pool: int) -> None:
        """Start discovering (the replica count belongs to the Deployment and its autoscaler); returns after
        the first successful read of the slices."""
        if self._task is None:
            self._task = asyncio.create_task(self._poll(), name="k8s-endpoint-discovery")
        await self._first.wait()

    async def refresh(self, client: httpx.AsyncClient) -> None:
        """One read of the EndpointSlices; the router learns the change at once."""
        resp = await client.get(self._url, headers=self._headers)
        resp.raise_for_status()
        found = upstreams_from_slices(resp.json(), self.cfg)
        if found != self._serving:
            before, after = {u.replica_id for u in self._serving}, {u.replica_id for u in found}
            for rid in sorted(after - before):
                log.info("event=discovered replica=%s service=%s", rid, self.cfg.service)
                self._events.append(f"discovered {rid}")
            for rid in sorted(before - after):
                log.info("event=gone replica=%s service=%s", rid, self.cfg.service)
                self._events.append(f"gone {rid}")
            self._serving = found
            self._on_change(found)
        self._first.set()

    async def _poll(self) -> None:
        async with httpx.AsyncClient(timeout=self.cfg.timeout_s, verify=self._verify) as client:
            while True:
                try:
                    await self.refresh(client)
                except (httpx.HTTPError, ValueError) as exc:  # keep the last known set; try again next period
                    log.warning("event=discovery_failed service=%s error=%r", self.cfg.service, exc)
                await asyncio.sleep(self.cfg.poll_interval_s)

    async def close(self) -> None:
        """Stop discovering. The pods are Kubernetes' to drain (preStop + SIGTERM), not the router's."""
        await cancel_and_wait(self._task)
        self._task = None
