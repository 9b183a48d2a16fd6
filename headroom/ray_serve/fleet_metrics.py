"""`GET /metrics` on a headroom Ray Serve application: every replica's own Prometheus page, labelled per replica.

Each model and LLM replica keeps its own registry (the data plane's, the engine's: the families `headroom serve`
exports). Serve's HTTP proxy reaches one ingress replica, and a `DeploymentHandle` routes each call to one
replica it chooses, so the ingress asks each replica in turn: it lists the deployment's replica actors (Serve
names them `SERVE_REPLICA::<app>#<deployment>#<replica id>`), then calls `metrics_page(target_replica=id)`, which
headroom's request router sends to exactly that replica (`headroom.ray_serve.router`). An answer from another
replica (Serve's own router, `router: serve`, cannot be told where to send it) is asked again, a few times at
most. The merged page has one family per name, each sample labelled `deployment` and `replica`, plus:

    headroom_serve_replica_up{deployment,replica}   1: its page is included; 0: no answer in time
    headroom_serve_ingress_events_total{event}      this ingress replica's requests, replica_lost_retries,
                                                    retries_exhausted, timeouts (as /ingress/stats)

Ray's own per-node metrics export (`ray_serve_*`, scraped from each node's metrics agent) is separate and
unchanged; this page is what a Prometheus scrape of the application's HTTP address gets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from starlette.responses import Response

from headroom.ray_serve.retries import awaited

log = logging.getLogger("headroom.ray_serve")

ACTOR_PREFIX = "SERVE_REPLICA::"
SCRAPE_TIMEOUT_S = 10.0  # per replica and try
MAX_TRIES = 4  # per replica: answers from another replica are asked again


def replica_ids(actor_names: list[str], app: str, deployment: str) -> list[str]:
    """The replica ids of `deployment` in `app` among Serve's replica actor names."""
    prefix = f"{ACTOR_PREFIX}{app}#{deployment}#"
    return sorted(name[len(prefix):] for name in actor_names if name.startswith(prefix) and len(name) > len(prefix))


def merge_pages(pages: list[tuple[str, str, str]]) -> dict[str, Metric]:
    """{family name: family} from (deployment, replica, exposition) pages, each sample labelled with its
    deployment and replica (a page that does not parse is skipped, logged)."""
    families: dict[str, Metric] = {}
    for deployment, replica, text in pages:
        try:
            parsed = list(text_string_to_metric_families(text))
        except ValueError as exc:
            log.warning("metrics of %s replica %s do not parse: %s", deployment, replica, exc)
            continue
        for family in parsed:
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                             family.unit))
            merged.samples.extend(
                Sample(s.name, {**s.labels, "deployment": deployment, "replica": replica}, s.value, s.timestamp,
                       s.exemplar) for s in family.samples)
    return families


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


class FleetMetrics:
    """The merged page of the deployments' replicas (`handles`: deployment name -> handle, None skipped)."""

    def __init__(self, handles: Mapping[str, Any], stats: Mapping[str, int]) -> None:
        self.handles = {name: h for name, h in handles.items() if h is not None}
        self.stats = stats

    async def page(self) -> Response:
        import ray
        from ray import serve

        app = serve.get_replica_context().app_name
        actors = await asyncio.to_thread(ray.util.list_named_actors, all_namespaces=True)
        names = [str(a["name"]) for a in actors if isinstance(a, dict)]
        targets = [(d, rid, h) for d, h in self.handles.items() for rid in replica_ids(names, app, d)]
        # one scrape at a time: with several calls pending at once, Serve may hand the replica chosen for one
        # to another (then a call waits for a routing pass that never comes; seen as a 10 s scrape timeout)
        texts = [await self._scrape(h, rid) for _, rid, h in targets]
        families = merge_pages([(d, rid, text) for (d, rid, _), text in zip(targets, texts, strict=True)
                                if text is not None])
        up = Metric("headroom_serve_replica_up", "1 when the replica's page is included, 0 when it did not answer.",
                    "gauge")
        for (d, rid, _), text in zip(targets, texts, strict=True):
            up.samples.append(Sample("headroom_serve_replica_up", {"deployment": d, "replica": rid},
                                     float(text is not None)))
        events = Metric("headroom_serve_ingress_events", "This ingress replica's requests and failures.", "counter")
        for event, count in sorted(self.stats.items()):
            events.samples.append(Sample("headroom_serve_ingress_events_total", {"event": event}, float(count)))
        registry = CollectorRegistry()
        registry.register(_Families([*families.values(), up, events]))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def _scrape(self, handle: Any, replica_id: str) -> str | None:
        """`replica_id`'s exposition, or None when it did not answer (in time, or at all)."""
        for _ in range(MAX_TRIES):
            try:
                answered, page, _ = await asyncio.wait_for(
                    awaited(handle.metrics_page.remote(target_replica=replica_id)), SCRAPE_TIMEOUT_S)
            except Exception as exc:  # a replica gone or wedged: reported as down, never a failed page
                log.warning("metrics of replica %s: %s", replica_id, exc)
                return None
            if answered == replica_id:
                return bytes(page).decode("utf-8")
        return None
