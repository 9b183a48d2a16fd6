"""TTFT under cache-aware, 256-character prefix-hash and P2C routing: the real LLM engine (smollm2), the router.

    .venv/bin/python benchmarks/router/prefix_routing_ttft.py            # ~20 min on 2 busy cores
    .venv/bin/python benchmarks/router/prefix_routing_ttft.py --repeats 1 --requests 20   # quick look

Two `headroom serve` replicas of smollm2 (each with a small KV pool, so one replica cannot keep every
group's system prompt cached), one router in this process, and a shared-prefix chat workload: `--groups`
"conversation groups", each with its own long system prompt, and a short distinct user question per request.
Each run sends the same open-loop Poisson schedule with `headroom bench run --protocol openai-chat` through
the router, once per policy of `--policies`, interleaved, `--repeats` times, each run on two freshly started
replicas with the repeat's prompt texts (so every policy of a repeat sees the same schedule, groups and texts
from cold caches): `cache_aware` (the longest
prefix of the prompt's KV blocks the replicas publish, the router tokenizing with smollm2's tokenizer), `prefix`
(rendezvous hash of the first 256 prompt characters, spill when overloaded) and `p2c`. Every run uses fresh
system prompts per repeat (a new seed).

Reported per run: TTFT p50 / p99 (from the load generator, measured from each request's intended send time),
and the replicas' prefix-cache hit rate over the run = delta of `headroom_llm_prefix_cache_hits_total` /
delta of `headroom_llm_prefix_cache_queries_total`, summed over both replicas (prompt tokens). Medians over
the repeats go to the summary. Results: benchmarks/results/router_prefix_<date>_<time>.json.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import typer
import yaml
from rich.console import Console
from rich.table import Table

from headroom.router.cli import serve_command
from headroom.router.fake_replica import serve_asgi
from headroom.router.policies import POLICIES
from headroom.router.prefix_index import PrefixIndexConfig
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.replicas import LocalReplicaManager, ReplicaManagerConfig

ROOT = Path(__file__).resolve().parents[2]
WORDS_TEXT = ("the a model server batch queue latency request token cache every small fast slow quiet bright river "
         "mountain engineer reads writes measures waits answers many few network memory core thread stream user "
         "system prefers keeps grows falls under over beside within after before simple careful honest tail mean "
         "percentile budget load traffic peak valley morning evening green orange red blue city garden window")
WORDS = WORDS_TEXT.split()
app = typer.Typer(add_completion=False, help=__doc__)


def make_repository(root: Path, kv_cache_memory_mb: float) -> Path:
    """A model repository with smollm2 as in ./models, but with a smaller KV pool (and one CPU thread)."""
    cfg = yaml.safe_load((ROOT / "models" / "smollm2" / "config.yaml").read_text())
    cfg["parameters"]["kv_cache_memory_mb"] = kv_cache_memory_mb
    cfg["parameters"]["num_threads"] = 1
    (root / "smollm2").mkdir(parents=True)
    (root / "smollm2" / "config.yaml").write_text(yaml.safe_dump(cfg))
    return root


def make_workload(path: Path, seed: int, prompt_seed: int, groups: int, prefix_words: int, requests: int,
                  max_tokens: int) -> None:
    """JSONL of chat bodies: a system prompt per group (distinct from its first words; its text drawn from
    `prompt_seed`) and a distinct question; which group each request belongs to is drawn from `seed`."""
    prompt_rng = random.Random(prompt_seed)
    systems = [f"You are assistant number {g} of prompt set {prompt_seed}. "
               + " ".join(prompt_rng.choices(WORDS, k=prefix_words)) for g in range(groups)]
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(requests):
            g = rng.randrange(groups)
            question = f"Question {i}: " + " ".join(rng.choices(WORDS, k=12)) + "?"
            body = {"messages": [{"role": "system", "content": systems[g]}, {"role": "user", "content": question}],
                    "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
            f.write(json.dumps({"body": body}) + "\n")


async def prefix_counters(client: httpx.AsyncClient, urls: list[str]) -> tuple[float, float]:
    """(hits, queries) of the prefix cache, summed over the replicas' /metrics."""
    hits = queries = 0.0
    for url in urls:
        text = (await client.get(url + "/metrics")).text
        for line in text.splitlines():
            if line.startswith("headroom_llm_prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("headroom_llm_prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


async def one_run(manager: LocalReplicaManager, policy: str, workload: Path, rate: float, requests: int,
                  seed: int, out_json: Path, repo: Path) -> dict[str, Any]:
    index = PrefixIndexConfig(tokenizers_from=str(repo))  # only cache_aware reads it
    router = Router([], ProxyConfig(policy=policy, shedding=False, check_interval_s=0.2, hedging=False,
                                    prefix_index=index), rng=random.Random(seed))
    manager.on_change = router.set_upstreams
    router.set_upstreams(manager.serving())
    urls = [u.base_url for u in manager.serving()]
    async with serve_asgi(router.app, lifespan="on") as url, httpx.AsyncClient(timeout=10.0) as client:
        for _ in range(1200):  # ready, and (cache_aware) the tokenizer loaded and the replicas' tenant known
            if sum(s.ready for s in router.snapshots()) == len(urls) and (
                    router.prefix is None or (router.prefix.hasher is not None and router.prefix.tenant is not None)):
                break
            await asyncio.sleep(0.05)
        before = await prefix_counters(client, urls)
        argv = [sys.executable, "-m", "headroom.cli.main", "bench", "run", url, "--model", "smollm2",
                "--protocol", "openai-chat", "--workload", "jsonl", "--dataset-path", str(workload),
                "--rate", str(rate), "--duration", str(requests / rate), "--seed", str(seed), "--warmup", "0",
                "--metrics-url", "none", "--timeout-s", "120", "--json", str(out_json), "--label", policy]
        proc = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, err = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"headroom bench failed ({proc.returncode}):\n{err.decode()[-2000:]}")
        after = await prefix_counters(client, urls)
        counters = dict(router.counters)
        per_replica = {s.replica_id: s.outstanding for s in router.snapshots()}  # in flight at the end (0)
        per_replica_requests = {rid: rt.requests for rid, rt in router.replicas.items()}
        cache_aware = ({"routed": dict(router.prefix.routed), "polls_failed": router.prefix.polls_failed}
                       if router.prefix is not None else None)
    result = json.loads(out_json.read_text())
    ttft, latency = result["ttft_ms"], result["latency_ms"]
    hits, queries = after[0] - before[0], after[1] - before[1]
    return {"policy": policy, "seed": seed, "ttft_p50_ms": ttft["p50_ms"], "ttft_p99_ms": ttft["p99_ms"],
            "latency_p50_ms": latency["p50_ms"], "latency_p99_ms": latency["p99_ms"],
            "prefix_hit_rate": hits / queries if queries else 0.0, "prefix_hit_tokens": hits,
            "prefix_query_tokens": queries, "completed": result["counts"]["completed"],
            "errors": result["counts"]["errors"], "late_sends": result["generator"]["late_sends"],
            "router_counters": counters, "requests_per_replica": per_replica_requests, "cache_aware": cache_aware,
            "outstanding_at_end": per_replica}


async def main_async(repeats: int, requests: int, rate: float, groups: int, prefix_words: int, max_tokens: int,
                     kv_cache_memory_mb: float, console: Console,
                     policies: tuple[str, ...] = ("cache_aware", "prefix", "p2c")) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="headroom-prefix-bench-"))
    repo = make_repository(work / "repo", kv_cache_memory_mb)
    runs: list[dict[str, Any]] = []
    cold_starts: list[float] = []
    for rep in range(repeats):
        seed = 1000 + rep  # every policy of a repeat gets the same schedule, groups and prompt texts...
        workload = work / f"repeat_{rep}.jsonl"
        make_workload(workload, seed, seed * 10, groups, prefix_words, requests, max_tokens)
        for policy in policies:  # ...on 2 fresh replicas each (cold caches: nothing carries over between runs)
            manager = LocalReplicaManager(serve_command(repo, ["smollm2"], 5.0),
                                          ReplicaManagerConfig(capacity=8, start_timeout_s=600.0))
            try:
                with console.status(f"repeat {rep + 1}/{repeats}: starting 2 smollm2 replicas for {policy}..."):
                    await manager.scale_to(2, 0)
                cold_starts += [c.ready_s for c in manager.cold_starts]
                with console.status(f"repeat {rep + 1}/{repeats}: {policy}, {requests} requests at {rate:g}/s..."):
                    run = await one_run(manager, policy, workload, rate, requests, seed,
                                        work / f"{policy}_{rep}.json", repo)
            finally:
                await manager.close()
            console.print(f"  {policy:11s} TTFT p50 {run['ttft_p50_ms']:.0f} ms, p99 {run['ttft_p99_ms']:.0f} ms,"
                          f" prefix hit rate {run['prefix_hit_rate']:.1%}")
            runs.append(run)
    summary = {}
    for policy in policies:
        mine = [r for r in runs if r["policy"] == policy]
        summary[policy] = {k: statistics.median(r[k] for r in mine)
                           for k in ("ttft_p50_ms", "ttft_p99_ms", "prefix_hit_rate")}
    return {"runs": runs, "median": summary, "cold_start_ready_s": cold_starts}


@app.command()
def main(repeats: int = typer.Option(3, help="Interleaved rounds of every policy (quote medians)."),
         requests: int = typer.Option(30, help="Requests per run."),
         rate: float = typer.Option(0.4, help="Offered load, requests/s (Poisson); keep it under what 2 replicas "
                                                "serve without prefix hits, or queueing swamps TTFT."),
         groups: int = typer.Option(6, help="Conversation groups (distinct system prompts) per run."),
         prefix_words: int = typer.Option(120, help="Words per system prompt (about 1.2 tokens each)."),
         max_tokens: int = typer.Option(4, help="Generated tokens per request (ignore_eos)."),
         kv_cache_memory_mb: float = typer.Option(32.0, help="KV pool per replica (~0.7 MiB per 16-token block): room "
                                                              "for about 5 system prompts of 120 words."),
         out: Path = typer.Option(None, help="Result JSON (default benchmarks/results/router_prefix_<now>.json)."),
         policies: str = typer.Option("cache_aware,prefix,p2c", help="Routing policies compared, in run order."),
         ) -> None:
    """Measure TTFT p50/p99 and prefix-cache hit rate per routing policy, 2 smollm2 replicas."""
    console = Console()
    load_before = os.getloadavg()
    started = dt.datetime.now(dt.UTC)
    chosen = tuple(p.strip() for p in policies.split(",") if p.strip())
    unknown = [p for p in chosen if p not in POLICIES]
    if unknown or not chosen:
        raise typer.BadParameter(f"--policies: unknown {unknown}; choose from {', '.join(POLICIES)}")
    result = asyncio.run(main_async(repeats, requests, rate, groups, prefix_words, max_tokens, kv_cache_memory_mb,
                                    console, chosen))
    result["config"] = {"repeats": repeats, "requests": requests, "rate_per_s": rate, "groups": groups,
                        "prefix_words": prefix_words, "max_tokens": max_tokens,
                        "kv_cache_memory_mb": kv_cache_memory_mb, "replicas": 2, "model": "smollm2",
                        "policies": list(chosen),
                        "command": " ".join(sys.argv)}
    result["machine"] = {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                         "started_utc": started.isoformat()}
    path = out or ROOT / "benchmarks" / "results" / f"router_prefix_{started:%Y-%m-%d_%H%M}.json"
    path.write_text(json.dumps(result, indent=2))
    table = Table("policy", "TTFT p50 ms", "TTFT p99 ms", "prefix-cache hit rate",
                  title=f"median of {repeats} runs, 2 smollm2 replicas, {groups} system prompts")
    for policy, m in result["median"].items():
        table.add_row(policy, f"{m['ttft_p50_ms']:.0f}", f"{m['ttft_p99_ms']:.0f}", f"{m['prefix_hit_rate']:.1%}")
    console.print(table)
    console.print(f"written to {path}")


if __name__ == "__main__":
    app()
