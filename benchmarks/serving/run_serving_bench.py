"""Issue-2 serving benchmark: minilm valid QPS (p99 <= SLO) with dynamic batching vs. batch size 1 vs. a plain
FastAPI + transformers server, plus headroom's own overhead on a no-op Python model. All in one run.

    .venv/bin/python benchmarks/serving/run_serving_bench.py            # full run (~15 min)
    .venv/bin/python benchmarks/serving/run_serving_bench.py --quick    # shorter probes, for a smoke check

Every target is started on 127.0.0.1, measured with `headroom bench sweep` (open-loop Poisson, bisection on
the rate, a probe is VALID when p99 <= --slo-p99-ms over >= 459 samples, so the lowest rate probed is
480 / probe duration), then stopped. Results go to
benchmarks/results/serving_<date>.json; `scripts/make_benchmarks_md.py` folds them into BENCHMARKS.md.
The load generator and the server share this machine's cores: the report says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
#: 0 = VALID when the measured p99 over >= 459 samples is within the SLO (a point estimate). MLPerf's 99%
#: confidence bound is stricter; on this shared 2-core machine a handful of scheduler hiccups fail it at every
#: rate, so the stricter setting measures the machine's noise rather than the servers (the JSON records it).
CONFIDENCE = 0.0
PY = sys.executable
HEADROOM = [PY, "-m", "headroom.cli.main"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout_s}s")


def minilm_repo(tmp: Path, max_batch_size: int, mode: str = "dynamic", slo_ms: float = 100.0) -> Path:
    """A repository holding only minilm, with max_batch_size (1 = no batching) and batching mode overridden."""
    repo = tmp / f"repo_b{max_batch_size}_{mode}"
    src = ROOT / "models" / "minilm"
    (repo / "minilm").mkdir(parents=True)
    shutil.copytree(src / "1", repo / "minilm" / "1")
    cfg = yaml.safe_load((src / "config.yaml").read_text())
    cfg["max_batch_size"] = max_batch_size
    cfg["dynamic_batching"]["mode"] = mode
    if mode == "adaptive":
        cfg["dynamic_batching"]["slo_p99_ms"] = slo_ms
    if max_batch_size == 1:
        cfg["dynamic_batching"].pop("preferred_batch_sizes", None)
        cfg["warmup"] = {"batch_sizes": [1]}
    (repo / "minilm" / "config.yaml").write_text(yaml.safe_dump(cfg))
    return repo


def sweep(url: str, protocol: str, model: str, slo_ms: float, duration_s: float, high: float, out: Path,
          extra: list[str]) -> dict[str, object]:
    cmd = [*HEADROOM, "bench", "sweep", url, "--model", model, "--protocol", protocol, "--slo-p99-ms", str(slo_ms),
           "--duration", str(duration_s), "--low-rate", str(max(4.0, 480.0 / duration_s)), "--high-rate", str(high),
           "--tolerance", "0.15", "--max-probes", "6", "--seed", "7", "--confidence", str(CONFIDENCE),
           "--json", str(out), *extra]
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)
    return dict(json.loads(out.read_text()))


def peak_rate(result: dict[str, object]) -> float:
    for key in ("peak_rate_per_s", "best_valid_rate_per_s", "valid_rate_per_s", "peak_rate"):
        if key in result:
            return float(result[key])  # type: ignore[arg-type]
    raise KeyError(f"no peak rate in sweep result keys {sorted(result)}")


def with_server(cmd: list[str], ready_url: str, work: callable) -> dict[str, object]:  # type: ignore[valid-type]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(ready_url, proc)
        return work()  # type: ignore[no-any-return]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slo-p99-ms", type=float, default=100.0)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per probe")
    parser.add_argument("--quick", action="store_true",
                        help="20 s probes (results marked quick; a p99 claim needs >= 459 samples, so probes below "
                             "24 req/s cannot be VALID)")
    args = parser.parse_args()
    duration = 20.0 if args.quick else args.duration
    stamp = time.strftime("%Y-%m-%d")
    results_dir = ROOT / "benchmarks" / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="headroom-bench-"))
    rows: dict[str, dict[str, object]] = {}
    targets = [("headroom_dynamic", minilm_repo(tmp, 32)), ("headroom_batch1", minilm_repo(tmp, 1)),
               ("headroom_adaptive", minilm_repo(tmp, 32, "adaptive", args.slo_p99_ms))]
    for name, repo in targets:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [*HEADROOM, "serve", "--model-repository", str(repo), "--http-port", str(port), "--grpc-port", "-1",
               "--no-access-log"]
        out = tmp / f"{name}.json"
        res = with_server(cmd, url + "/v2/health/ready",
                          lambda url=url, out=out: sweep(url, "openai-embeddings", "minilm", args.slo_p99_ms,
                                                         duration, 64, out, []))
        rows[name] = {"valid_qps": peak_rate(res), "sweep": res}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [PY, str(ROOT / "benchmarks" / "serving" / "fastapi_baseline.py"), "--port", str(port)]
    out = tmp / "fastapi.json"

    def fastapi_ready_sweep() -> dict[str, object]:
        return sweep(url, "openai-embeddings", "minilm", args.slo_p99_ms, duration, 32, out, [])

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                httpx.post(url + "/v1/embeddings", json={"input": "warm"}, timeout=5)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("FastAPI baseline did not start") from None
                time.sleep(0.5)
        res = fastapi_ready_sweep()
        rows["fastapi_transformers"] = {"valid_qps": peak_rate(res), "sweep": res}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)

    # Overhead: a no-op Python model; single-stream p50 and the highest valid rate.
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    noop_cmd = [*HEADROOM, "serve", "--model-repository", str(ROOT / "models"), "--model", "noop",
                "--http-port", str(port), "--grpc-port", "-1", "--no-access-log"]
    single = tmp / "noop_single.json"
    dataset = tmp / "noop.jsonl"
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}]}
    dataset.write_text(json.dumps({"body": body}) + "\n")
    noop_args = ["--workload", "jsonl", "--dataset-path", str(dataset)]

    def overhead() -> dict[str, object]:
        subprocess.run([*HEADROOM, "bench", "run", url, "--model", "noop", "--protocol", "v2-http",
                        "--scenario", "single-stream", "--duration", "10", *noop_args,
                        "--json", str(single)], check=True)
        peak = sweep(url, "v2-http", "noop", 20.0, duration, 500, tmp / "noop_sweep.json", noop_args)
        return {"single_stream": json.loads(single.read_text()), "sweep": peak}

    rows["noop_overhead"] = with_server(noop_cmd, url + "/v2/health/ready", overhead)
    dyn, b1, fa = (rows[k]["valid_qps"] for k in ("headroom_dynamic", "headroom_batch1", "fastapi_transformers"))
    doc = {
        "benchmark": "serving_minilm_batching",
        "command": " ".join([Path(PY).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"node": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "note": "server and load generator share the machine's cores"},
        "slo_p99_ms": args.slo_p99_ms, "probe_duration_s": duration, "quick": args.quick,
        "confidence": CONFIDENCE,
        "valid_qps": {k: v["valid_qps"] for k, v in rows.items() if "valid_qps" in v},
        "ratios": {"dynamic_over_batch1": float(dyn) / max(float(b1), 1e-9),  # type: ignore[arg-type]
                   "dynamic_over_fastapi": float(dyn) / max(float(fa), 1e-9),  # type: ignore[arg-type]
                   "adaptive_over_dynamic": float(rows["headroom_adaptive"]["valid_qps"])  # type: ignore[arg-type]
                   / max(float(dyn), 1e-9)},  # type: ignore[arg-type]
        "details": rows,
    }
    out_path = results_dir / f"serving_{stamp}{'_quick' if args.quick else ''}.json"
    out_path.write_text(json.dumps(doc, indent=2, default=str))
    print(json.dumps({"valid_qps": doc["valid_qps"], "ratios": doc["ratios"]}, indent=2))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
