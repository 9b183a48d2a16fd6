"""Abandoned LLM streams: 16 clients start a long generation, read the first token, and hang up. How soon
do /metrics show no running request and the KV cache back at its idle usage?"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.reliability.common import headroom

RUNNING = "headroom_llm_num_requests_running"
KV_USAGE = "headroom_llm_kv_cache_usage_perc"


def gauges(text: str) -> dict[str, float]:
    """The sum over labels of every gauge sample in a /metrics page."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


async def _abandon(url: str, n: int) -> float:
    """Open `n` streams, read one token from each, close them all; returns time.monotonic() of the last close."""
    body = {"model": "smollm2", "prompt": "Write a long story about a lighthouse keeper.", "max_tokens": 1500,
            "temperature": 0, "ignore_eos": True, "stream": True}
    async with httpx.AsyncClient(timeout=120.0) as client:
        async def one() -> None:
            async with client.stream("POST", url + "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        return  # leaving the block closes the connection mid-stream

        await asyncio.gather(*(one() for _ in range(n)))
    return time.monotonic()


async def _until_idle(url: str, closed_s: float, idle_kv: float, timeout_s: float) -> dict[str, Any]:
    first_zero: float | None = None
    first_idle: float | None = None
    at_100ms: dict[str, float] | None = None
    async with httpx.AsyncClient(timeout=5.0) as client:
        while time.monotonic() - closed_s < timeout_s and (first_zero is None or first_idle is None):
            g = gauges((await client.get(url + "/metrics")).text)
            since = time.monotonic() - closed_s
            if at_100ms is None and since >= 0.1:
                at_100ms = {"running": g.get(RUNNING, -1.0), "kv_usage": g.get(KV_USAGE, -1.0)}
            if first_zero is None and g.get(RUNNING, 1.0) == 0:
                first_zero = since
            if first_idle is None and g.get(KV_USAGE, 1.0) <= idle_kv:
                first_idle = since
            await asyncio.sleep(0.005)
    return {"running_zero_after_ms": None if first_zero is None else first_zero * 1e3,
            "kv_idle_after_ms": None if first_idle is None else first_idle * 1e3, "at_100ms": at_100ms}


def run(log_dir: Path, streams: int = 16, timeout_s: float = 10.0) -> dict[str, Any]:
    with headroom("serve", ["--model-repository", "models", "--model", "smollm2", "--no-access-log"], log_dir) as srv:
        idle_kv = gauges(httpx.get(srv.url + "/metrics").text).get(KV_USAGE, 0.0)
        closed_s = asyncio.run(_abandon(srv.url, streams))
        result = asyncio.run(_until_idle(srv.url, closed_s, idle_kv, timeout_s))
    return {"streams": streams, "idle_kv_usage": idle_kv, "timeout_s": timeout_s, **result}
