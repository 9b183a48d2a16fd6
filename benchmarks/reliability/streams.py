"""Abandoned LLM streams: 16 clients start a long generation, read the first token, and hang up. How soon
do /metrics show no running request and the KV cache back at its idle usage?

A poller with a warm keep-alive connection reads /metrics (only the series it needs, `?name[]=`) every 5 ms
from before the first stream opens, so a figure is the arrival of the first idle sample after the last client
closed (an upper bound on the server's own delay, not the cost of opening a connection afterwards). Once the
last stream of the step in flight is gone, that step is cancelled at its next layer boundary (`steps_cancelled`,
from the same /metrics); the mean time per engine step while the streams ran (`engine_step_mean_ms`) is reported
next to the delay, and so is the mean time a /metrics page took to arrive (`metrics_poll_mean_ms`, the
resolution).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.reliability.common import headroom

RUNNING = "headroom_llm_num_requests_running"
KV_USAGE = "headroom_llm_kv_cache_usage_perc"
STEPS = "headroom_llm_iteration_tokens_total_count"  # one observation per engine step
CANCELLED = "headroom_llm_steps_cancelled_total"  # steps stopped early: all their requests aborted


def gauges(text: str) -> dict[str, float]:
    """The sum over labels of every sample in a /metrics page."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


@dataclass(frozen=True, slots=True)
class Sample:
    received_s: float  # time.monotonic() when the page arrived
    values: dict[str, float]


async def _poll(client: httpx.AsyncClient, samples: list[Sample], stop: asyncio.Event) -> None:
    while not stop.is_set():  # only the 3 series read here: a page of ~0.5 kB instead of ~70 kB (finer resolution)
        text = (await client.get("/metrics", params={"name[]": [RUNNING, KV_USAGE, STEPS, CANCELLED]})).text
        samples.append(Sample(time.monotonic(), gauges(text)))
        await asyncio.sleep(0.005)


async def _abandon(url: str, n: int) -> float:
    """Open `n` streams, read one token from each, close them all; returns time.monotonic() of the last close."""
    body = {"model": "smollm2", "prompt": "Write a long story about a lighthouse keeper.", "max_tokens": 1500,
            "temperature": 0, "ignore_eos": True, "stream": True}
    closed: list[float] = []
    async with httpx.AsyncClient(timeout=120.0) as client:
        async def one() -> None:
            async with client.stream("POST", url + "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        break
            closed.append(time.monotonic())  # leaving the block closed the connection mid-stream

        await asyncio.gather(*(one() for _ in range(n)))
    return max(closed)


async def _measure(url: str, streams: int, idle_kv: float, timeout_s: float) -> dict[str, Any]:
    samples: list[Sample] = []
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as client:
        poller = asyncio.create_task(_poll(client, samples, stop))
        try:
            last_close_s = await _abandon(url, streams)
            end_s = last_close_s + timeout_s
            while time.monotonic() < end_s and not _idle_after(samples, last_close_s, idle_kv):
                if poller.done():
                    poller.result()  # a failed poll surfaces here
                await asyncio.sleep(0.01)
        finally:
            stop.set()
            await poller
    after = [s for s in samples if s.received_s >= last_close_s]
    first_zero = next((s for s in after if s.values.get(RUNNING, 1.0) == 0), None)
    first_idle = next((s for s in after if s.values.get(KV_USAGE, 1.0) <= idle_kv), None)
    at_100ms = next((s for s in after if s.received_s - last_close_s >= 0.1), None)
    before = next((s for s in reversed(samples) if s.received_s < last_close_s), None)
    step_ms = None
    if before is not None:
        steps = before.values.get(STEPS, 0.0) - samples[0].values.get(STEPS, 0.0)
        step_ms = (before.received_s - samples[0].received_s) / steps * 1e3 if steps > 0 else None
    gaps = [b.received_s - a.received_s for a, b in itertools.pairwise(samples)]
    return {"running_zero_after_ms": None if first_zero is None else (first_zero.received_s - last_close_s) * 1e3,
            "kv_idle_after_ms": None if first_idle is None else (first_idle.received_s - last_close_s) * 1e3,
            "at_100ms": None if at_100ms is None else {"running": at_100ms.values.get(RUNNING, -1.0),
                                                       "kv_usage": at_100ms.values.get(KV_USAGE, -1.0)},
            "engine_step_mean_ms": step_ms, "metrics_samples": len(samples),
            "steps_cancelled": samples[-1].values.get(CANCELLED, 0.0) - samples[0].values.get(CANCELLED, 0.0),
            "metrics_poll_mean_ms": sum(gaps) / len(gaps) * 1e3 if gaps else None}


def _idle_after(samples: list[Sample], since_s: float, idle_kv: float) -> bool:
    return any(s.received_s >= since_s and s.values.get(RUNNING, 1.0) == 0 and s.values.get(KV_USAGE, 1.0) <= idle_kv
               for s in samples[-50:])


def run(log_dir: Path, streams: int = 16, timeout_s: float = 10.0) -> dict[str, Any]:
    with headroom("serve", ["--model-repository", "models", "--model", "smollm2", "--no-access-log"], log_dir) as srv:
        idle_kv = gauges(httpx.get(srv.url + "/metrics").text).get(KV_USAGE, 0.0)
        result = asyncio.run(_measure(srv.url, streams, idle_kv, timeout_s))
    return {"streams": streams, "idle_kv_usage": idle_kv, "timeout_s": timeout_s, **result}
