"""Throughput of headroom on Ray Serve with 1 and then 2 model replicas, on a local Ray cluster in this process.

    .venv/bin/python benchmarks/ray_serve/scaling.py                       # ~2 min on 2 busy cores
    .venv/bin/python benchmarks/ray_serve/scaling.py --duration-s 5        # quick look

Two models, closed loop (`--concurrency` clients, each sending its next request when the previous answer
arrives) through Serve's HTTP proxy -> headroom's ingress -> DeploymentHandle -> the replicas' data planes:

* `wait` (latency-bound): a Python model that sleeps `--wait-ms` (100) per request, one request at a time per
  replica (max_batch_size 1, one instance), so one replica serves at most 1000 / wait_ms req/s whatever the CPU
  (10 req/s; the proxy + ingress path tops out far above that): it shows whether Serve spreads the load over
  the replicas;
* `digits` (CPU-bound, the default CNN): one replica batches; a second replica only helps if a core is free for
  it (the proxy, the ingress and this load generator share the same cores).

Both models are loaded on every replica (`multiplex=False`); the router is headroom's `least_outstanding`.
Results: benchmarks/results/ray_serve/scaling_<date>_<time>.json (throughput, p50 / p99 latency, errors).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import platform
import socket
import statistics
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import typer

from headroom.ray_serve.app import AppArgs, build_app
from headroom.router.ray_cluster import RayClusterConfig, connect_ray, shutdown_ray

ROOT = Path(__file__).resolve().parents[2]
WAIT_MODEL = """
import time

class Wait:
    def predict(self, inputs):
        time.sleep({wait_s})
        return {"y": inputs["x"]}
"""
WAIT_CONFIG = """
backend: python
max_batch_size: 1
inputs: [{name: x, datatype: FP32, shape: [2]}]
outputs: [{name: y, datatype: FP32, shape: [2]}]
dynamic_batching: {max_queue_delay_ms: 0, max_queue_size: 64}
warmup: {batch_sizes: [1]}
"""


def _repository(root: Path, wait_ms: float) -> Path:
    (root / "wait" / "1").mkdir(parents=True)
    (root / "wait" / "config.yaml").write_text(textwrap.dedent(WAIT_CONFIG))
    (root / "wait" / "1" / "model.py").write_text(textwrap.dedent(WAIT_MODEL).replace("{wait_s}", str(wait_ms / 1e3)))
    (root / "digits").symlink_to(ROOT / "models" / "digits")
    return root


def _body(model: str, i: int) -> dict[str, Any]:
    if model == "wait":
        return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [i, i]}]}
    data = np.random.default_rng(i).integers(0, 17, size=64).astype(float).tolist()
    return {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": data}]}


async def _closed_loop(url: str, model: str, concurrency: int, duration_s: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    end = time.monotonic() + duration_s

    async with httpx.AsyncClient(timeout=60.0, limits=httpx.Limits(max_connections=concurrency)) as client:
        async def worker(w: int) -> None:
            nonlocal errors
            i = w
            while time.monotonic() < end:
                t0 = time.monotonic()
                r = await client.post(f"{url}/v2/models/{model}/infer", json=_body(model, i))
                if r.status_code == 200:
                    latencies.append(time.monotonic() - t0)
                else:
                    errors += 1
                i += concurrency

        start = time.monotonic()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        elapsed = time.monotonic() - start
    latencies.sort()
    return {"model": model, "ok": len(latencies), "errors": errors, "elapsed_s": round(elapsed, 3),
            "throughput_rps": round(len(latencies) / elapsed, 1),
            "p50_ms": round(1e3 * statistics.median(latencies), 1) if latencies else None,
            "p99_ms": round(1e3 * latencies[int(0.99 * (len(latencies) - 1))], 1) if latencies else None}


def main(duration_s: float = typer.Option(15.0, help="Seconds per (replicas, model) run."),
         concurrency: int = typer.Option(8, help="Closed-loop clients."),
         wait_ms: float = typer.Option(100.0, help="How long the latency-bound model takes per request."),
         out: Path = typer.Option(ROOT / "benchmarks" / "results" / "ray_serve", help="Result directory."),
         note: str = typer.Option("", help="Recorded with the results (e.g. that the machine was shared).")) -> None:
    from ray import serve

    repo = _repository(Path(tempfile.mkdtemp(prefix="headroom-serve-bench-")), wait_ms)
    connect_ray(RayClusterConfig(num_cpus=os.cpu_count() or 2))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    url = f"http://127.0.0.1:{port}"
    runs = []
    try:
        for replicas in (1, 2):
            args = AppArgs.model_validate({
                "model_repository": str(repo), "replicas": replicas, "multiplex": False,
                "router": "least_outstanding", "replica_capacity": 16, "trusted_backends": ["python", "onnxruntime"],
                "replica_num_cpus": 0.25, "ingress_num_cpus": 0.25})
            serve.run(build_app(args), name="bench", route_prefix="/")
            for model in ("wait", "digits"):
                asyncio.run(_closed_loop(url, model, concurrency, 1.0))  # warm-up
                result = asyncio.run(_closed_loop(url, model, concurrency, duration_s))
                runs.append({"replicas": replicas, **result})
                print(runs[-1], flush=True)
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]  # untyped in Ray
        shutdown_ray()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d_%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"scaling_{stamp}.json"
    path.write_text(json.dumps({
        "benchmark": "ray_serve_scaling", "concurrency": concurrency, "duration_s": duration_s, "wait_ms": wait_ms,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "note": note},
        "runs": runs}, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    typer.run(main)
