"""Router benchmarks: routing policies against one slow replica, and prefix-aware routing's cache hit rate.

    python -m headroom.router.bench sim    # fake-clock queueing simulation of the pure policies (seconds)
    python -m headroom.router.bench live   # real processes on 127.0.0.1: synthetic replicas + this router

Latency in `live` is measured from each request's intended (Poisson) send time, so a stalled router cannot
hide its queueing (coordinated omission).
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import random
import sys
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from headroom.router.fake_replica import serve_asgi
from headroom.router.policies import choose
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.replicas import CommandFactory, LocalReplicaManager, ReplicaManagerConfig
from headroom.router.snapshot import ReplicaSnapshot, RouterState, peak_ewma_update

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False)


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """One policy's outcome on one workload."""

    policy: str  # routing policy
    slow_share: float  # fraction of requests the slow replica (the last one) received
    p50_ms: float  # median latency
    p99_ms: float  # 99th percentile latency
    errors: int = 0  # non-200 answers (live runs)


def simulate_fleet(policy: str, service_s: Sequence[float], rate_per_s: float, n_requests: int,
                   seed: int = 0) -> PolicyResult:
    """Poisson arrivals into single-server FIFO replicas with the given service times (fake clock)."""
    rng = random.Random(seed)
    ids = [f"r{i}" for i in range(len(service_s))]
    outstanding, ewma = dict.fromkeys(ids, 0), dict.fromkeys(ids, 0.0)
    updated, free_at = dict.fromkeys(ids, 0.0), dict.fromkeys(ids, 0.0)
    done: list[tuple[float, str, float]] = []
    state, now, counts, latencies = RouterState(), 0.0, Counter[str](), []
    for _ in range(n_requests):
        now += rng.expovariate(rate_per_s)
        while done and done[0][0] <= now:
            t, rid, lat = heapq.heappop(done)
            outstanding[rid] -= 1
            ewma[rid], updated[rid] = peak_ewma_update(ewma[rid], lat, t - updated[rid]), t
        snaps = [ReplicaSnapshot(r, outstanding=outstanding[r], ewma_latency_s=ewma[r]) for r in ids]
        decision, state = choose(policy, snaps, None, state, now, rng)
        rid = decision.replica_id or ids[0]
        start = max(now, free_at[rid])
        free_at[rid] = start + service_s[ids.index(rid)]
        outstanding[rid] += 1
        counts[rid] += 1
        latencies.append(free_at[rid] - now)
        heapq.heappush(done, (free_at[rid], rid, free_at[rid] - now))
    p50, p99 = np.percentile(latencies, [50, 99])
    return PolicyResult(policy, counts[ids[-1]] / n_requests, float(p50) * 1e3, float(p99) * 1e3)


def simulate_prefix_cache(policy: str, n_replicas: int, cache_entries: int, n_prefixes: int, n_requests: int,
                          zipf_s: float = 1.1, seed: int = 0) -> float:
    """Prefix-cache hit rate: each replica keeps an LRU of `cache_entries` prompt prefixes (system prompts,
    few-shot headers) drawn Zipf-distributed from `n_prefixes`; load is light, so routing is by key only."""
    rng = random.Random(seed)
    weights = [1.0 / (k + 1) ** zipf_s for k in range(n_prefixes)]
    caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n_replicas)]
    snaps = [ReplicaSnapshot(f"r{i}") for i in range(n_replicas)]
    state, hits = RouterState(), 0
    for _ in range(n_requests):
        prefix = rng.choices(range(n_prefixes), weights)[0]
        prompt = f"<system prompt #{prefix}>" * 20 + f" question {rng.random()}"  # prefix > 256 chars
        view = snaps if policy != "cache_aware" else [  # cache_aware: what each replica's LRU holds, exactly
            dataclasses.replace(s, prefix_match_blocks=int(prefix in caches[i])) for i, s in enumerate(snaps)]
        key = prompt[:256] if policy == "cache_aware" else prompt  # cache_aware places misses by the first blocks
        decision, state = choose(policy, view, key, state, 0.0, rng)
        cache = caches[int((decision.replica_id or "r0")[1:])]
        if prefix in cache:
            hits += 1
            cache.move_to_end(prefix)
        else:
            cache[prefix] = None
            if len(cache) > cache_entries:
                cache.popitem(last=False)
    return hits / n_requests


@app.command()
def sim(requests: int = typer.Option(20_000, help="Requests per policy."),
        seed: int = typer.Option(0, help="RNG seed.")) -> None:
    """Fake-clock comparison: RR vs least-outstanding vs P2C vs peak-EWMA with one 5x slower replica (of 4,
    at 55% load), and prefix-cache hit rates for cache-aware and prefix-aware routing vs P2C vs round robin."""
    console = Console()
    table = Table("policy", "slow replica share", "p50 ms", "p99 ms", title="3 replicas at 10 ms + 1 at 50 ms")
    for policy in ("round_robin", "least_outstanding", "p2c", "peak_ewma"):
        r = simulate_fleet(policy, (0.01, 0.01, 0.01, 0.05), 175.0, requests, seed)
        table.add_row(policy, f"{r.slow_share:.1%}", f"{r.p50_ms:.1f}", f"{r.p99_ms:.1f}")
    console.print(table)
    table = Table("policy", "prefix-cache hit rate", title="4 replicas x LRU of 8 prefixes, 64 prefixes, Zipf")
    for policy in ("cache_aware", "prefix", "p2c", "round_robin"):
        table.add_row(policy, f"{simulate_prefix_cache(policy, 4, 8, 64, requests, seed=seed):.1%}")
    console.print(table)


async def measure_live(policy: str, delay_ms: float, slow_factor: float, rate_per_s: float, n_requests: int,
                       seed: int = 0) -> PolicyResult:
    """Router in this process, 3 + 1 slow synthetic replicas as processes, open-loop Poisson load."""
    def command(delay: float) -> CommandFactory:
        return lambda port, _grpc_port: [sys.executable, "-m", "headroom.router.fake_replica", "--port", str(port),
                             "--delay-ms", str(delay), "--concurrency", "1"]

    router = Router([], ProxyConfig(policy=policy, shedding=False, check_interval_s=0.2), rng=random.Random(seed))
    fast = LocalReplicaManager(command(delay_ms), ReplicaManagerConfig(id_prefix="fast"))
    slow = LocalReplicaManager(command(delay_ms * slow_factor), ReplicaManagerConfig(id_prefix="slow"))

    def update(_: object) -> None:
        router.set_upstreams(fast.serving() + slow.serving())

    fast.on_change = slow.on_change = update
    try:
        await asyncio.gather(fast.scale_to(3, 0), slow.scale_to(1, 0))
        slow_id = slow.serving()[0].replica_id
        async with serve_asgi(router.app, lifespan="on") as url, httpx.AsyncClient(base_url=url,
                                                                                   timeout=30.0) as client:
            for _ in range(600):
                if sum(s.ready for s in router.snapshots()) == 4:
                    break
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError(f"the router never saw 4 ready replicas: {router.snapshots()}")
            rng = np.random.default_rng(seed)
            sends = np.cumsum(rng.exponential(1.0 / rate_per_s, n_requests))
            t0 = time.monotonic()

            async def one(at_s: float) -> tuple[float, str, int]:
                await asyncio.sleep(max(0.0, t0 + at_s - time.monotonic()))
                r = await client.post("/v2/models/m/infer", content=b"{}")
                return time.monotonic() - (t0 + at_s), r.headers.get("x-headroom-replica", ""), r.status_code

            results = await asyncio.gather(*(one(float(s)) for s in sends))
    finally:
        await asyncio.gather(fast.close(), slow.close())
    lat = [r[0] for r in results]
    p50, p99 = np.percentile(lat, [50, 99])
    share = sum(1 for r in results if r[1] == slow_id) / n_requests
    return PolicyResult(policy, share, float(p50) * 1e3, float(p99) * 1e3, sum(r[2] != 200 for r in results))


@app.command()
def live(requests: int = typer.Option(600, help="Requests per policy."),
         rate: float = typer.Option(40.0, help="Offered load, requests per second (Poisson)."),
         delay_ms: float = typer.Option(20.0, help="Fast replicas' service time (one request at a time)."),
         slow_factor: float = typer.Option(5.0, help="How much slower the fourth replica is.")) -> None:
    """Real sockets and processes: p50/p99 and the slow replica's share for RR, P2C and peak-EWMA."""
    console = Console()
    table = Table("policy", "slow replica share", "p50 ms", "p99 ms", "errors",
                  title=f"3 replicas at {delay_ms:g} ms + 1 at {delay_ms * slow_factor:g} ms, {rate:g} req/s")
    for policy in ("round_robin", "p2c", "peak_ewma"):
        with console.status(f"{policy}: {requests} requests..."):
            r = asyncio.run(measure_live(policy, delay_ms, slow_factor, rate, requests))
        table.add_row(policy, f"{r.slow_share:.1%}", f"{r.p50_ms:.1f}", f"{r.p99_ms:.1f}", str(r.errors))
    console.print(table)


async def measure_scale(replicas: int, concurrency: int, duration_s: float, model: str,
                        model_repository: Path) -> tuple[float, float]:
    """(requests/s, p99 ms) through the router to `replicas` real `headroom serve` processes (closed loop)."""
    from headroom.router.cli import serve_command

    router = Router([], ProxyConfig(policy="p2c", shedding=False, check_interval_s=0.2))
    manager = LocalReplicaManager(serve_command(model_repository, [model], 5.0), on_change=router.set_upstreams)
    body = b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}'
    latencies: list[float] = []
    try:
        await manager.scale_to(replicas, 0)
        async with serve_asgi(router.app, lifespan="on") as url, httpx.AsyncClient(base_url=url,
                                                                                   timeout=30.0) as client:
            while sum(s.ready for s in router.snapshots()) < replicas:
                await asyncio.sleep(0.05)
            stop_at = time.monotonic() + duration_s

            async def worker() -> None:
                while time.monotonic() < stop_at:
                    t0 = time.monotonic()
                    r = await client.post(f"/v2/models/{model}/infer", content=body)
                    if r.status_code == 200:
                        latencies.append(time.monotonic() - t0)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await manager.close()
    return len(latencies) / duration_s, float(np.percentile(latencies, 99)) * 1e3


@app.command()
def scale(max_replicas: int = typer.Option(3, help="Measure 1..max_replicas replicas."),
          concurrency: int = typer.Option(16, help="Closed-loop clients."),
          duration_s: float = typer.Option(10.0, help="Seconds of load per replica count."),
          model: str = typer.Option("noop", help="Model with a 1-D FP32 input named `input`."),
          model_repository: Path = typer.Option(Path("benchmarks/models"), help="Its repository (the noop "
                                                "overhead probe lives in benchmarks/models).")) -> None:
    """Throughput and p99 through the router with 1, 2, ... real replicas (mind the machine's core count)."""
    console = Console()
    table = Table("replicas", "requests/s", "p99 ms", title=f"{model}, {concurrency} closed-loop clients")
    for n in range(1, max_replicas + 1):
        with console.status(f"{n} replica(s): starting and loading..."):
            rps, p99 = asyncio.run(measure_scale(n, concurrency, duration_s, model, model_repository))
        table.add_row(str(n), f"{rps:.0f}", f"{p99:.1f}")
    console.print(table)


if __name__ == "__main__":
    app()
