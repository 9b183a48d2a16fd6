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
* resource requests: the CPU and memory of the replica whose service time was measured (`--replica-cpu`,
  `--replica-memory`): the plan's per-replica rate holds only for a pod of that shape, so requests = limits
  = that shape (Guaranteed QoS keeps the measured service time).
"""

from __future__ import annotations

import math
from typing import Any

from headroom.plan.capacity import CapacityPlan


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
