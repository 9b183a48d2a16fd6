"""Knob sweeps: start the server once per knob value, benchmark it, stop it; then draw the Pareto frontier.

The server is any command line with `{value}` where the knob goes, e.g.
`headroom serve --http-port 8000 --max-queue-delay-ms {value}`. It is started as a child process (its own
process group, so it is stopped with everything it spawned), polled on `ready_url` until it answers 200,
benchmarked, and terminated before the next value starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shlex
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from headroom.core.clock import Clock, MonotonicClock
from headroom.loadgen.runner import BenchConfig, RunOutcome, run_bench
from headroom.loadgen.sweep import ParetoPoint, pareto_frontier


@dataclass(frozen=True, slots=True)
class KnobSweepConfig:
    """Which knob, which values, and how to run the server for each."""

    knob: str  # knob name for labels, e.g. "max_queue_delay_ms"
    values: tuple[str, ...]  # values to try, in order
    server_cmd: str  # command line with "{value}" where the knob goes
    ready_url: str  # polled until it answers 200 (e.g. http://127.0.0.1:8000/v2/health/ready)
    ready_timeout_s: float = 120.0  # give up on a server that is not ready in this long
    stop_timeout_s: float = 20.0  # SIGTERM, then SIGKILL after this long
    cwd: str = ""  # directory the server starts in ("" = the current one)
    server_cpus: str = ""  # taskset CPU list for the server (e.g. "0"); "" = inherit the generator's affinity

    def __post_init__(self) -> None:
        if "{value}" not in self.server_cmd:
            raise ValueError("--server-cmd must contain {value} where the knob's value goes")
        if not self.values:
            raise ValueError("--values needs at least one value, e.g. --values 0,2,5,10")


async def wait_ready(url: str, timeout_s: float, clock: Clock, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll `url` until it answers 200; raise ValueError (with the reason) on timeout or if `proc` exits."""
    deadline_s = clock.now_s() + timeout_s
    async with httpx.AsyncClient(timeout=httpx.Timeout(2.0)) as http:
        while True:
            if proc is not None and proc.poll() is not None:
                raise ValueError(f"the server exited with status {proc.returncode} before it was ready")
            try:
                if (await http.get(url)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if clock.now_s() > deadline_s:
                raise ValueError(f"{url} did not answer 200 within {timeout_s:g} s")
            await asyncio.sleep(0.25)


def _stop(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def run_knob_sweep(
    base: BenchConfig,
    knob: KnobSweepConfig,
    on_result: Callable[[str, RunOutcome], None] | None = None,
    clock: Clock | None = None,
) -> tuple[list[ParetoPoint], list[dict[str, Any]]]:
    """One run per knob value against a freshly started server; returns the marked frontier and the results."""
    clock = clock or MonotonicClock()
    results: list[dict[str, Any]] = []
    points: list[ParetoPoint] = []
    for value in knob.values:
        argv: Sequence[str] = shlex.split(knob.server_cmd.replace("{value}", value))
        if knob.server_cpus:
            argv = ["taskset", "-c", knob.server_cpus, *argv]
        proc = subprocess.Popen(
            argv,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=knob.cwd or None,
        )
        try:
            await wait_ready(knob.ready_url, knob.ready_timeout_s, clock, proc)
            label = f"{knob.knob}={value}"
            config = dataclasses.replace(base, label=label)
            outcome = await run_bench(config, clock=clock)
        finally:
            _stop(proc, knob.stop_timeout_s)
        result = outcome.result | {"knob": {"name": knob.knob, "value": value}}
        results.append(result)
        points.append(point_from_result(result, label))
        if on_result is not None:
            on_result(value, outcome)
    return pareto_frontier(points), results


def point_from_result(result: dict[str, Any], label: str = "") -> ParetoPoint:
    """A result's position on the latency-throughput plane (goodput when an SLO was set, else ok/s)."""
    slo = result["config"]["slo"]
    has_slo = any(slo.get(k) for k in ("p99_ms", "e2e_ms", "ttft_ms", "tpot_ms"))
    throughput = result["goodput"]["requests_per_s"] if has_slo else result["throughput"]["ok_per_s"]
    return ParetoPoint(
        label=label or result.get("label") or "run",
        throughput_per_s=float(throughput),
        p99_ms=float(result["latency_ms"]["p99_ms"]),
    )
