"""Issue-2 serving benchmark, throughput side: MLPerf Offline (every query sent at t=0) against minilm with
dynamic batching, with max_batch_size 1, and the plain FastAPI + transformers server, in one run.

    .venv/bin/python benchmarks/serving/run_offline_throughput.py [--queries 600] [--repeats 3]

Offline throughput is what the server can do at all; `run_serving_bench.py` measures the rate it can do
within a p99 SLO. Results: benchmarks/results/serving_offline_<date>.json (medians of the repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_serving_bench import HEADROOM, PY, ROOT, free_port, minilm_repo, wait_ready


def offline(url: str, queries: int, out: Path) -> float:
    cmd = [*HEADROOM, "bench", "run", url, "--model", "minilm", "--protocol", "openai-embeddings",
           "--scenario", "offline", "--num-queries", str(queries), "--timeout-s", "600", "--quiet",
           "--json", str(out)]
    subprocess.run(cmd, check=True)
    result = json.loads(out.read_text())
    return float(result["throughput"]["ok_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="headroom-offline-"))
    runs: dict[str, list[float]] = {}
    servers: list[tuple[str, list[str], str]] = []
    for name, repo in (("headroom_dynamic", minilm_repo(tmp, 32)), ("headroom_batch1", minilm_repo(tmp, 1))):
        port = free_port()
        servers.append((name, [*HEADROOM, "serve", "--model-repository", str(repo), "--http-port", str(port),
                               "--grpc-port", "-1", "--no-access-log"], f"http://127.0.0.1:{port}"))
    port = free_port()
    servers.append(("fastapi_transformers", [PY, str(ROOT / "benchmarks" / "serving" / "fastapi_baseline.py"),
                                             "--port", str(port)], f"http://127.0.0.1:{port}"))
    for name, cmd, url in servers:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            if name.startswith("headroom"):
                wait_ready(url + "/v2/health/ready", proc)
            else:
                deadline = time.monotonic() + 300
                while True:
                    try:
                        httpx.post(url + "/v1/embeddings", json={"input": "warm"}, timeout=5)
                        break
                    except httpx.HTTPError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.5)
            runs[name] = [offline(url, args.queries, tmp / f"{name}-{i}.json") for i in range(args.repeats)]
            print(name, runs[name], flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    med = {k: statistics.median(v) for k, v in runs.items()}
    doc = {
        "benchmark": "serving_minilm_offline_throughput",
        "command": " ".join([Path(PY).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"node": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_end": os.getloadavg(),
                    "note": "server and load generator share the machine's cores"},
        "queries": args.queries, "repeats": args.repeats,
        "throughput_ok_per_s_runs": runs, "throughput_ok_per_s_median": med,
        "ratios": {"dynamic_over_batch1": med["headroom_dynamic"] / med["headroom_batch1"],
                   "dynamic_over_fastapi": med["headroom_dynamic"] / med["fastapi_transformers"]},
    }
    out = ROOT / "benchmarks" / "results" / f"serving_offline_{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(doc, indent=2))
    print(json.dumps({"median": med, "ratios": doc["ratios"]}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
