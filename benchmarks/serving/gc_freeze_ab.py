"""A/B of the server's start-up heap freeze (`headroom serve` vs `headroom serve --no-gc-freeze`) on minilm.

    .venv/bin/python benchmarks/serving/gc_freeze_ab.py --rate 95 --duration 30 --pairs 6

Both servers run side by side; each pair benches them one after the other (order alternating) with the same
open-loop Poisson load through `headroom bench run`. Per run: p50 / p99 latency, the server's CPU per request
(/proc), and the full (generation-2) garbage collections the server did meanwhile with their summed pause
(`headroom_gc_pause_seconds{generation="2"}` from /metrics). Writes benchmarks/results/gc_freeze_ab_<date>.json.
Full collections come every minute or few under load, so use runs long enough to see some (pairs x duration
of several minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from headroom.loadgen.scrape import parse_prometheus_text
from headroom.sim.calibrate import process_cpu_s, real_server

ROOT = Path(__file__).resolve().parents[2]


def full_gcs(url: str) -> tuple[float, float]:
    """(count, summed seconds) of the server's generation-2 collections so far."""
    m = parse_prometheus_text(httpx.get(url + "/metrics", timeout=5).text, ("headroom_gc_pause_seconds",))
    return (m.get('headroom_gc_pause_seconds_count{generation="2"}', 0.0),
            m.get('headroom_gc_pause_seconds_sum{generation="2"}', 0.0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=95.0, help="open-loop Poisson rate (req/s)")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds per run")
    ap.add_argument("--pairs", type=int, default=6, help="runs per server (order alternates)")
    ap.add_argument("--start-no-freeze-first", action="store_true",
                    help="start the --no-gc-freeze server first (checks that start order is not what differs)")
    ap.add_argument("--aa", action="store_true",
                    help="A/A control: two identical default servers (`a`, `b`): the spread the A/B must beat")
    args = ap.parse_args()
    flags: dict[str, list[str]] = {"freeze": [], "no_freeze": ["--no-gc-freeze"]}
    names = ["no_freeze", "freeze"] if args.start_no_freeze_first else ["freeze", "no_freeze"]
    if args.aa:
        flags, names = {"a": [], "b": []}, ["a", "b"]
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in names}
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(real_server("minilm", ROOT / "models", 180.0, Path(tmp) / f"{name}.log",
                                                         extra_args=tuple(flags[name])))
                   for name in names}
        for i in range(args.pairs):
            order = list(servers) if i % 2 == 0 else list(servers)[::-1]
            for name in order:
                server = servers[name]
                out = Path(tmp) / f"{name}_{i}.json"
                cpu0, (n0, s0) = process_cpu_s(server.pid), full_gcs(server.url)
                subprocess.run([sys.executable, "-m", "headroom.cli.main", "bench", "run", server.url, "-m", "minilm",
                                "-p", "openai-embeddings", "-r", str(args.rate), "-d", str(args.duration),
                                "--json", str(out), "--quiet"], cwd=ROOT, check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                cpu, (n1, s1) = process_cpu_s(server.pid) - cpu0, full_gcs(server.url)
                res = json.loads(out.read_text())
                done = max(1, int(res["counts"]["completed"]))
                row = {"p50_ms": res["latency_ms"]["p50_ms"], "p99_ms": res["latency_ms"]["p99_ms"],
                       "cpu_ms_per_request": cpu / done * 1e3, "full_gcs": n1 - n0,
                       "full_gc_pause_ms": (s1 - s0) * 1e3}
                runs[name].append(row)
                print(f"pair {i + 1} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    medians = {name: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for name, rows in runs.items()}
    doc = {"benchmark": "gc_freeze_ab", "command": " ".join([Path(sys.executable).name, *sys.argv]),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "load_average_start": load_start, "load_average_end": os.getloadavg()},
           "rate_per_s": args.rate, "duration_s": args.duration, "start_order": names, "runs": runs,
           "medians": medians}
    suffix = "_aa" if args.aa else "_no_freeze_started_first" if args.start_no_freeze_first else ""
    path = ROOT / "benchmarks" / "results" / f"gc_freeze_ab_{time.strftime('%Y-%m-%d')}{suffix}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(medians, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
