"""CPU the server's garbage-collection monitor adds to each collection (`GcMonitor`'s `gc.callbacks` entry).

    .venv/bin/python benchmarks/serving/gc_callback_cost.py

Calls the callback's start/stop pair directly, 50,000 times per round, 5 rounds, and prints the median
microseconds per collection (young collections run hundreds of times a second under load).
"""

from __future__ import annotations

import statistics
import time

from prometheus_client import CollectorRegistry

from headroom.server.gc_monitor import GcMonitor


def per_collection_us(monitor: GcMonitor, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        monitor._callback("start", {})  # the callback gc runs, timed directly
        monitor._callback("stop", {"generation": 0})
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    monitor = GcMonitor(CollectorRegistry())
    rounds = [per_collection_us(monitor, 50_000) for _ in range(5)]
    print(f"{statistics.median(rounds):.2f} us per collection (rounds: {', '.join(f'{r:.2f}' for r in rounds)})")


if __name__ == "__main__":
    main()
