"""Issue-2 serving benchmark, throughput side: MLPerf Offline (every query sent at t=0) against minilm with
dynamic batching, with max_batch_size 1, and the plain FastAPI + transformers server, in one run.

    .venv/bin/python benchmarks/serving/run_offline_throughput.py [--queries 600] [--repeats 3]
    # also try onnxruntime settings (each adds a dynamic + a batch-1 target, measured in the same rounds):
    .venv/bin/python benchmarks/serving/run_offline_throughput.py --ort intra=2,spin=off --ort intra=1,spin=off

Every target is started once; the repeats are interleaved (round 1: every target, round 2: every target, ...)
so slow drift in the machine's load hits all targets alike. Each run also records the server process's CPU
time per answered request (/proc): on a machine shared with other work, throughput measures the share of the
cores the server got as much as the server, while CPU per request is its cost. Offline throughput is what the
server can do at all; `run_serving_bench.py` measures the rate it can do within a p99 SLO. Results:
benchmarks/results/serving_offline_<date>[_<tag>].json (every run, medians, ratios, machine load).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_serving_bench import (
    HEADROOM,
    PY,
    ROOT,
    free_port,
    machine,
    minilm_repo,
    parse_ort,
    shipped_max_batch_size,
    stopped,
    wait_fastapi,
    wait_ready,
)

from headroom.sim.calibrate import process_cpu_s


def offline(url: str, queries: int, out: Path, pid: int, http_client: str = "aiohttp") -> tuple[float, float]:
    """(ok responses per second, server CPU milliseconds per ok response) for one offline run."""
    cmd = [*HEADROOM, "bench", "run", url, "--model", "minilm", "--protocol", "openai-embeddings",
           "--scenario", "offline", "--num-queries", str(queries), "--timeout-s", "600", "--quiet",
           "--http-client", http_client, "--json", str(out)]
    before = process_cpu_s(pid)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    used_s = process_cpu_s(pid) - before
    result = json.loads(out.read_text())
    ok = max(1, int(result["counts"]["ok"]))
    return float(result["throughput"]["ok_per_s"]), 1e3 * used_s / ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ort", action="append", default=[], metavar="intra=N,spin=on|off",
                        help="extra onnxruntime settings to measure (repeatable); the shipped config always runs")
    parser.add_argument("--tag", default="", help="suffix of the results file name")
    parser.add_argument("--http-client", choices=("aiohttp", "httpx"), default="aiohttp",
                        help="the load generator's HTTP library (the same for every target)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="headroom-offline-"))
    settings: list[tuple[str, dict[str, object]]] = [("", {})] + [(f" [{s}]", parse_ort(s)) for s in args.ort]
    targets: list[tuple[str, list[str], str]] = []
    for suffix, overrides in settings:
        for kind, batch in (("headroom_dynamic", shipped_max_batch_size()), ("headroom_batch1", 1)):
            port = free_port()
            repo = minilm_repo(tmp / f"{kind}{len(targets)}", batch, overrides=overrides)
            targets.append((kind + suffix, [*HEADROOM, "serve", "--model-repository", str(repo), "--http-port",
                                            str(port), "--grpc-port", "-1", "--no-access-log"],
                            f"http://127.0.0.1:{port}"))
    port = free_port()
    targets.append(("fastapi_transformers", [PY, str(ROOT / "benchmarks" / "serving" / "fastapi_baseline.py"),
                                             "--port", str(port)], f"http://127.0.0.1:{port}"))
    start_machine = machine()
    procs: list[subprocess.Popen[bytes]] = []
    runs: dict[str, list[float]] = {name: [] for name, _, _ in targets}
    cpu_ms: dict[str, list[float]] = {name: [] for name, _, _ in targets}
    try:
        for name, cmd, url in targets:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(proc)
            if name.startswith("headroom"):
                wait_ready(url + "/v2/health/ready", proc)
            else:
                wait_fastapi(url, proc)
        for i in range(args.repeats):
            for (name, _, url), proc in zip(targets, procs, strict=True):
                rate, cost = offline(url, args.queries, tmp / f"{name}-{i}.json", proc.pid, args.http_client)
                runs[name].append(rate)
                cpu_ms[name].append(cost)
                print(f"round {i + 1}: {name} {rate:.1f} ok/s, server CPU {cost:.2f} ms per request "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        stopped(procs, timeout_s=60.0)
    med = {k: statistics.median(v) for k, v in runs.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpu_ms.items()}
    ratios: dict[str, float] = {}
    for suffix, _ in settings:
        ratios["dynamic_over_batch1" + suffix] = med["headroom_dynamic" + suffix] / med["headroom_batch1" + suffix]
        ratios["dynamic_over_fastapi" + suffix] = med["headroom_dynamic" + suffix] / med["fastapi_transformers"]
        # the same ratios in server CPU per request (less sensitive to other processes on a shared machine)
        ratios["cpu_batch1_over_dynamic" + suffix] = (cpu_med["headroom_batch1" + suffix]
                                                      / cpu_med["headroom_dynamic" + suffix])
        ratios["cpu_fastapi_over_dynamic" + suffix] = (cpu_med["fastapi_transformers"]
                                                       / cpu_med["headroom_dynamic" + suffix])
    doc = {
        "benchmark": "serving_minilm_offline_throughput",
        "command": " ".join([Path(PY).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {**start_machine, "load_average_end": os.getloadavg(),
                    "note": "server and load generator share the machine's cores; rounds interleave targets"},
        "queries": args.queries, "repeats": args.repeats, "http_client": args.http_client,
        "ort_settings": {s or "shipped config": o for s, o in settings},
        "throughput_ok_per_s_runs": runs, "throughput_ok_per_s_median": med,
        "server_cpu_ms_per_request_runs": cpu_ms, "server_cpu_ms_per_request_median": cpu_med,
        "ratios": ratios,
    }
    stamp = time.strftime("%Y-%m-%d")
    out = ROOT / "benchmarks" / "results" / f"serving_offline_{stamp}{'_' + args.tag if args.tag else ''}.json"
    out.write_text(json.dumps(doc, indent=2))
    print(json.dumps({"median": med, "server_cpu_ms_per_request_median": cpu_med, "ratios": ratios}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
