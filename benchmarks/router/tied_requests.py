"""Tied requests against no second copy and against p95 hedging: latency and work per request, real processes.

    .venv/bin/python benchmarks/router/tied_requests.py                  # ~4 min
    .venv/bin/python benchmarks/router/tied_requests.py --repeats 1 --requests 200   # quick look

Each run starts a real `headroom route --config router.yaml` with two real `headroom serve` replicas of a python
model that sleeps `--base-ms` per request and, with probability `--stall-prob` per execution, `--stall-ms` more
(a replica-side hiccup: a GC pause, a noisy neighbour; a copy on the other replica does not share it). The
model runs one request at a time, so a stalled execution also holds up the queue behind it. An open-loop
Poisson schedule of `--requests` at `--rate` per second goes through the router. Arms, interleaved per repeat,
each on freshly started replicas:

* `none`: no second copy (policy peak_ewma, as `headroom route` ships);
* `hedge`: a backup after the p95 of recent latency (hedge budget 5%, Tail at Scale's default);
* `tied`: both copies tagged, a second copy `--tied-delay-ms` later (budget 100%: every request tied); the copy
  that starts executing first has its twin cancelled (headroom.router.tied).

Reported per run: latency p50 / p99 / max (from each request's intended send time) and executions per request
(the model appends one line per execution to a file: > 1.0 is work done twice). Medians over the repeats go to
the summary. Results: benchmarks/results/router_tied_<date>.json.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import typer
import yaml
from rich.console import Console
from rich.table import Table

from headroom.router.replicas import free_port

ROOT = Path(__file__).resolve().parents[2]
MODEL = """
import random
import time

class Jittery:
    def load(self, context):
        self.seen = context.version_dir / "seen.txt"
        self.rng = random.Random()

    def predict(self, inputs):
        with open(self.seen, "a") as f:
            f.write("x\\n")
        stall = {stall_ms} if self.rng.random() < {stall_prob} else 0.0
        time.sleep(({base_ms} + stall) / 1000.0)
        return {{"y": inputs["x"]}}
"""
ARMS = ("none", "hedge", "tied")


def _repository(root: Path, base_ms: float, stall_ms: float, stall_prob: float) -> Path:
    (root / "jit" / "1").mkdir(parents=True)
    (root / "jit" / "config.yaml").write_text(textwrap.dedent("""
        backend: python
        max_batch_size: 1
        inputs: [{name: x, datatype: FP32, shape: [1]}]
        outputs: [{name: y, datatype: FP32, shape: [1]}]
        dynamic_batching: {max_queue_delay_ms: 0, max_queue_size: 256, default_timeout_ms: 60000}
    """))
    (root / "jit" / "1" / "model.py").write_text(MODEL.format(base_ms=base_ms, stall_ms=stall_ms,
                                                             stall_prob=stall_prob))
    return root


def _router_yaml(arm: str, repo: Path, tied_delay_ms: float) -> dict[str, Any]:
    router: dict[str, Any] = {"policy": "peak_ewma"}
    if arm == "hedge":
        router["hedging"] = True
    if arm == "tied":
        router.update(tied=True, tied_delay_s=tied_delay_ms / 1e3,
                      hedge_budget={"budget_fraction": 1.0, "max_tokens": 10, "initial_tokens": 10})
    return {"fleet": {"replicas": 2, "model_repository": str(repo), "models": ["jit"], "replica_capacity": 64,
                      "drain_timeout_s": 5}, "router": router}


async def _load(url: str, n: int, rate: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=60.0,
                                 limits=httpx.Limits(max_connections=256, max_keepalive_connections=256)) as c:
        async def one(at: float) -> None:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            r = await c.post("/v2/models/jit/infer", json=body)
            if r.status_code != 200:
                raise RuntimeError(f"{r.status_code}: {r.text}")
            latencies.append(time.monotonic() - at)  # from the intended send time: open loop

        t, start = 0.0, time.monotonic() + 0.2
        sends = []
        for _ in range(n):
            t += rng.expovariate(rate)
            sends.append(one(start + t))
        await asyncio.gather(*sends)
    return latencies


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1e3


def _run(arm: str, args: dict[str, Any], seed: int, tmp: Path) -> dict[str, Any]:
    repo = _repository(tmp / f"{arm}-{seed}", args["base_ms"], args["stall_ms"], args["stall_prob"])
    config = tmp / f"{arm}-{seed}.yaml"
    config.write_text(yaml.safe_dump(_router_yaml(arm, repo, args["tied_delay_ms"])))
    port = free_port()
    log = (tmp / f"{arm}-{seed}.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "headroom.cli.main", "route", "--config", str(config),
                             "--port", str(port), "--grpc-port", "-1", "--trusted-backends",
                             "python,onnxruntime,torch,llm"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:  # both replicas ready behind the router
            try:
                reps = httpx.get(url + "/router/stats", timeout=2.0).json()["replicas"]
                if len(reps) == 2 and all(r["ready"] for r in reps):
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"router did not start: {(tmp / f'{arm}-{seed}.log').read_text()[-2000:]}")
            time.sleep(0.2)
        seen = repo / "jit" / "1" / "seen.txt"
        warm = len(seen.read_text().splitlines()) if seen.exists() else 0
        lat = asyncio.run(_load(url, args["requests"], args["rate"], seed))
        counters = httpx.get(url + "/router/stats", timeout=5.0).json()["counters"]
        time.sleep(0.5)  # let cancelled copies' executions (if any) finish and log before counting
        runs = len(seen.read_text().splitlines()) - warm
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()
    return {"arm": arm, "seed": seed, "p50_ms": _pct(lat, 0.5), "p99_ms": _pct(lat, 0.99),
            "max_ms": max(lat) * 1e3, "executions_per_request": runs / len(lat),
            "counters": {k: counters.get(k, 0) for k in ("hedges", "hedge_wins", "tied", "tied_unsent",
                                                          "tied_withdrawn")}}


def main(requests: int = typer.Option(600, help="Requests per run."),
         rate: float = typer.Option(30.0, help="Open-loop Poisson rate, requests/s."),
         repeats: int = typer.Option(3, help="Interleaved repeats of every arm."),
         base_ms: float = typer.Option(20.0, help="The model's service time."),
         stall_ms: float = typer.Option(200.0, help="Extra time of a stalled execution."),
         stall_prob: float = typer.Option(0.05, help="Probability that an execution stalls."),
         tied_delay_ms: float = typer.Option(2.0, help="Delay of the tied second copy."),
         note: str = typer.Option("", help="Free text stored with the results.")) -> None:
    console = Console()
    args = {"requests": requests, "rate": rate, "base_ms": base_ms, "stall_ms": stall_ms, "stall_prob": stall_prob,
            "tied_delay_ms": tied_delay_ms}
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        for rep in range(repeats):
            for arm in ARMS:
                r = _run(arm, args, 1000 + rep, Path(d))
                runs.append(r)
                console.print(f"repeat {rep + 1} {arm}: p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
                              f"max {r['max_ms']:.0f} ms, {r['executions_per_request']:.3f} executions/request, "
                              f"{r['counters']}")
    summary = {arm: {k: statistics.median(r[k] for r in runs if r["arm"] == arm)
                     for k in ("p50_ms", "p99_ms", "max_ms", "executions_per_request")} for arm in ARMS}
    table = Table(title=f"medians of {repeats} ({requests} requests at {rate}/s per run)")
    for col in ("arm", "p50 ms", "p99 ms", "max ms", "executions / request"):
        table.add_column(col)
    for arm, s in summary.items():
        table.add_row(arm, f"{s['p50_ms']:.1f}", f"{s['p99_ms']:.1f}", f"{s['max_ms']:.0f}",
                      f"{s['executions_per_request']:.3f}")
    console.print(table)
    date = dt.date.today().isoformat()
    out = ROOT / "benchmarks" / "results" / f"router_tied_{date}.json"
    out.write_text(json.dumps({"date": date, "command": " ".join(sys.argv), "args": args, "note": note,
                               "machine": {"cpu": platform.processor() or platform.machine(),
                                           "cores": os.cpu_count(), "loadavg": os.getloadavg()},
                               "runs": runs, "summary": summary}, indent=2))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
