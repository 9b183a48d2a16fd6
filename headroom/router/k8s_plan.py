"""`headroom deploy k8s --peak-qps ... --p99-ms ... --service-ms ...`: the capacity plan feeds the manifests.

A pure function of `headroom.plan.capacity.plan_capacity`'s answer (napkin math 1.3) to the K8sConfig fields
it decides:

* ``replicas``: the recommended count (headroom now, rho_max after k failures);
* ``max_replicas``: at least that, so the autoscaler can reach the peak plan;
* the PodDisruptionBudget: ``maxUnavailable`` = k of N+k. The plan stays within the SLO with k replicas
  gone, so voluntary disruptions (node drains, upgrades) may take exactly that many at a time, at any scale
  (a ``minAvailable`` of the peak count would block every drain once the autoscaler scaled down);
* the autoscaler's per-pod targets: a pod at the safe utilisation rho_max serves mu x rho_max requests/s
  (KEDA's threshold) and holds rho_max / (1 - rho_max) requests on average (M/M/1 at rho_max: the HPA's
  in-flight target);
* resource requests: the CPU and memory of the replica whose service time was measured: the plan's
  per-replica rate holds only for a pod of that shape, so requests = limits = that shape (Guaranteed QoS keeps
  the measured service time). With `--from-profile` (a `headroom profile` file) the shape comes from the
  measurement itself (`replica_shape`): the CPUs the profiling process could run on, and its peak resident
  memory with the model loaded and running its largest batches, with a 25% margin, rounded up to 64 Mi.
  Measured on 2026-12-07 (2-core EPYC): `headroom profile`'s peak was 412 MiB for digits and 668 MiB for
  minilm, and `headroom serve` of the same model peaked at 111 MiB (ready) and 367 MiB (after a 15 s burst
  of 64 clients): the profiling process holds more than the server (it imports the whole toolset), so its
  peak bounds a replica's. Otherwise `--replica-cpu` / `--replica-memory` say it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headroom.plan.capacity import CapacityPlan

MiB = 1024 * 1024
MEMORY_MARGIN = 1.25  # headroom over the measured peak: requests in flight, allocator fragmentation
MEMORY_STEP_BYTES = 64 * MiB


def fields_from_plan(plan: CapacityPlan, max_replicas: int, replica_cpu: str, replica_memory: str) -> dict[str, Any]:
    """The K8sConfig fields `plan` decides (`max_replicas`: the ceiling asked for, raised to the plan's count)."""
    rho = plan.max_utilisation
    return {
        "replicas": plan.recommended_replicas,
        "max_replicas": max(max_replicas, plan.recommended_replicas),
        "pdb_max_unavailable": plan.redundancy,  # 0 (no failure planned for): the PDB keeps its minAvailable
        "target_rps_per_pod": max(1, math.floor(plan.per_replica_rate_per_s * rho)),
        "target_inflight_per_pod": max(1, round(rho / (1.0 - rho))),
        "cpu": replica_cpu,
        "memory": replica_memory,
    }


def replica_shape(meta: Mapping[str, Any]) -> tuple[str, str]:
    """(cpu, memory) requests for a replica, from a profile's `meta` (`headroom profile` writes `cpus` and
    `peak_rss_bytes`); ValueError naming what is missing."""
    cpus, rss = meta.get("cpus"), meta.get("peak_rss_bytes")
    if not isinstance(cpus, int) or isinstance(cpus, bool) or cpus < 1:
        raise ValueError("the profile does not say how many CPUs it was measured on (meta.cpus); re-run "
                         "`headroom profile MODEL --output FILE`, or give --replica-cpu and --replica-memory")
    if not isinstance(rss, int) or isinstance(rss, bool) or rss < 1:
        raise ValueError("the profile does not say how much memory the model used (meta.peak_rss_bytes); re-run "
                         "`headroom profile MODEL --output FILE`, or give --replica-memory")
    need = rss * MEMORY_MARGIN
    return str(cpus), f"{math.ceil(need / MEMORY_STEP_BYTES) * MEMORY_STEP_BYTES // MiB}Mi"


def from_profile_file(path: Path) -> tuple[float, str, str]:
    """(service ms at batch 1, cpu, memory) from a `headroom profile --output` file; ValueError saying what is
    wrong. Read here, not through headroom.sim, which imports the router."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--from-profile {path}: cannot read a profile ({exc})") from None
    service = doc.get("service_ms") if isinstance(doc, dict) else None
    first = service.get("1") if isinstance(service, dict) else None
    if not isinstance(first, (int, float)) or isinstance(first, bool) or not first > 0:
        raise ValueError(f"--from-profile {path}: no service time at batch size 1 (service_ms['1']); write it "
                         "with `headroom profile MODEL --output FILE`")
    meta = doc.get("meta")
    cpu, memory = replica_shape(meta if isinstance(meta, dict) else {})
    return float(first), cpu, memory
