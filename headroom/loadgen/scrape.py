"""Scrape the server's Prometheus `/metrics` periodically and keep the series that explain latency.

By default a series is kept when its name mentions queue, batch, kv, cache, running, waiting, in_flight or
inflight (headroom, vLLM, TGI, llama.cpp and Triton all name theirs that way). Histogram buckets are dropped;
their `_sum` and `_count` are kept so a mean (e.g. batch size) can be derived between scrapes.
"""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass, field

import httpx

from headroom.core.clock import Clock
from headroom.core.tasks import cancel_and_wait

DEFAULT_PATTERNS: tuple[str, ...] = ("queue", "batch", "kv", "cache", "running", "waiting", "in_flight", "inflight")

_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{[^}]*\})?\s+(?P<value>\S+)")


def parse_prometheus_text(text: str, patterns: tuple[str, ...] = DEFAULT_PATTERNS) -> dict[str, float]:
    """`{series: value}` for samples whose metric name contains one of `patterns` (case-insensitive).

    The series key is the name plus its label set as written (`vllm:num_requests_waiting{model_name="m"}`).
    `_bucket` and `_created` series and non-finite values are skipped.
    """
    lowered = tuple(p.lower() for p in patterns)
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line.strip())
        if match is None:
            continue
        name = match.group("name")
        if name.endswith(("_bucket", "_created")) or not any(p in name.lower() for p in lowered):
            continue
        try:
            value = float(match.group("value"))
        except ValueError:
            continue
        if math.isfinite(value):
            out[name + (match.group("labels") or "")] = value
    return out


@dataclass(slots=True)
class ScrapeLog:
    """Scrapes over time (mutable; owned by one `MetricsScraper`)."""

    times_s: list[float] = field(default_factory=list)  # offset of each scrape from the run's start
    series: dict[str, list[float | None]] = field(default_factory=dict)  # value per scrape (None: missing)
    errors: int = 0  # scrapes that failed (connection refused, non-200, ...)

    def add(self, t_s: float, values: dict[str, float]) -> None:
        index = len(self.times_s)
        self.times_s.append(t_s)
        for key in values.keys() - self.series.keys():
            self.series[key] = [None] * index
        for key, column in self.series.items():
            column.append(values.get(key))

    def window_means(self) -> dict[str, float]:
        """Mean per observation over the run for every `X_sum`/`X_count` pair (e.g. the mean batch size)."""
        out: dict[str, float] = {}
        for key, sums in self.series.items():
            name, brace, labels = key.partition("{")
            if not name.endswith("_sum"):
                continue
            counts = self.series.get(name[: -len("_sum")] + "_count" + brace + labels)
            pairs = [(s, c) for s, c in zip(sums, counts or [], strict=False) if s is not None and c is not None]
            if len(pairs) >= 2 and pairs[-1][1] > pairs[0][1]:
                out[name[: -len("_sum")] + brace + labels] = (pairs[-1][0] - pairs[0][0]) / (pairs[-1][1] - pairs[0][1])
        return out

    def to_json(self) -> dict[str, object]:
        return {"t_s": self.times_s, "series": self.series, "window_means": self.window_means(), "errors": self.errors}


class MetricsScraper:
    """Polls `url` every `interval_s` in an owned background task; `stop()` cancels it."""

    def __init__(
        self,
        url: str,
        clock: Clock,
        interval_s: float = 1.0,
        patterns: tuple[str, ...] = DEFAULT_PATTERNS,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self._url = url
        self._clock = clock
        self._interval_s = interval_s
        self._patterns = patterns
        self._task: asyncio.Task[None] | None = None
        self._t0_s = 0.0
        self.log = ScrapeLog()

    async def scrape_once(self, http: httpx.AsyncClient) -> None:
        t_s = self._clock.now_s() - self._t0_s
        try:
            resp = await http.get(self._url)
        except httpx.HTTPError:
            self.log.errors += 1
            return
        if resp.status_code != 200:
            self.log.errors += 1
            return
        self.log.add(t_s, parse_prometheus_text(resp.text, self._patterns))

    async def _loop(self) -> None:
        # A scrape slower than the interval (a busy server) only delays the next one: give it time to answer.
        async with httpx.AsyncClient(timeout=httpx.Timeout(max(self._interval_s, 5.0))) as http:
            while True:
                await self.scrape_once(http)
                await asyncio.sleep(self._interval_s)

    def start(self, t0_s: float) -> None:
        """Begin polling; scrape times are offsets from `t0_s` (the run's start on the same clock)."""
        if self._task is not None:
            raise RuntimeError("scraper already started")
        self._t0_s = t0_s
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="metrics-scraper")

    async def stop(self) -> None:
        """Cancel the polling task, wait for it to end, then take one last scrape: the window always reaches
        the end of the run (however few of the periodic scrapes a busy server answered)."""
        if self._task is None:
            return
        await cancel_and_wait(self._task)
        self._task = None
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as http:
            await self.scrape_once(http)
