"""Swap-in cost under a memory budget: digits and minilm alternating through a budget that holds one of them.

    .venv/bin/python benchmarks/lifecycle/swap_in.py [--models-dir models] [--rounds 5]

The real data plane and model manager (the same objects `headroom serve --model-memory-budget-mb` wires), in
process. Each round sends, per model, one request that finds the model evicted (a swap-in: evict the other,
load, warm up) and then one that finds it resident (a hit), interleaved, so both see the same machine load.
Reports the median request latency of swaps and hits and the swap-in time the server exports
(`headroom_model_swap_in_seconds`), and writes benchmarks/results/lifecycle/swap_in-<UTC time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from headroom.core.clock import MonotonicClock
from headroom.core.types import InferenceRequest, Tensor
from headroom.lifecycle.residency import ResidencyConfig
from headroom.models.repository import ModelRepository
from headroom.server.dataplane import DataPlane
from headroom.server.metrics import ServerMetrics
from headroom.server.model_manager import ModelManager, entry_size_bytes

RESULTS = Path(__file__).resolve().parents[1] / "results" / "lifecycle"


def _request(model: str) -> InferenceRequest:
    if model == "digits":
        data = np.zeros((1, 1, 8, 8), dtype=np.float32)
        tensor = Tensor("input", "FP32", data.shape, data)
    else:
        data = np.array([[b"the quick brown fox"]], dtype=object)
        tensor = Tensor("text", "BYTES", data.shape, data)
    return InferenceRequest(request_id="bench", model_name=model, model_version="", inputs=(tensor,))


async def run(models_dir: Path, rounds: int) -> dict[str, Any]:
    registry = CollectorRegistry()
    clock = MonotonicClock()
    dataplane = DataPlane(ServerMetrics(registry), clock)
    repo = ModelRepository(models_dir)
    index = repo.scan(["digits", "minilm"])
    sizes = {e.name: entry_size_bytes(e) for e in index.models}
    budget = max(sizes.values()) + min(sizes.values()) // 2  # one of the two at a time
    manager = ModelManager(repo, dataplane)
    residency = manager.enable_budget(index, ResidencyConfig(budget), clock, registry)
    dataplane.attach_lifecycle(residency, None)
    await residency.start()
    latency: dict[str, dict[str, list[float]]] = {m: {"swap": [], "hit": []} for m in sizes}
    for _ in range(rounds):
        for model in ("minilm", "digits"):  # digits is resident after start(): minilm swaps first
            for kind in ("swap", "hit"):
                assert residency.is_resident(model) == (kind == "hit")
                start = time.perf_counter()
                await dataplane.infer(_request(model))
                latency[model][kind].append(time.perf_counter() - start)
    swaps = residency.swap_ins()
    await dataplane.stop()
    result: dict[str, Any] = {
        "budget_bytes": budget, "size_bytes": sizes, "rounds": rounds,
        "models": {}, "evictions": len([s for s in swaps if s.evicted]),
    }
    for model in sizes:
        swap_s = [s.duration_s for s in swaps if s.model == model]
        result["models"][model] = {
            "request_swap_p50_ms": statistics.median(latency[model]["swap"]) * 1e3,
            "request_hit_p50_ms": statistics.median(latency[model]["hit"]) * 1e3,
            "swap_in_p50_ms": statistics.median(swap_s) * 1e3,
            "swap_in_ms": [round(s * 1e3, 2) for s in swap_s],
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models-dir", type=Path, default=Path("models"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    result = asyncio.run(run(args.models_dir, args.rounds))
    result.update({
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg": os.getloadavg()},
        "command": "python benchmarks/lifecycle/swap_in.py " + f"--rounds {args.rounds}",
    })
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"swap_in-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"budget {result['budget_bytes'] / 2**20:.1f} MiB, sizes "
          + ", ".join(f"{m} {s / 2**20:.2f} MiB" for m, s in result["size_bytes"].items()))
    print(f"{'model':8} {'swap-in p50 ms':>15} {'request (swap) p50 ms':>22} {'request (hit) p50 ms':>21}")
    for model, row in result["models"].items():
        print(f"{model:8} {row['swap_in_p50_ms']:15.1f} {row['request_swap_p50_ms']:22.1f} "
              f"{row['request_hit_p50_ms']:21.2f}")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
