"""CPU node tuning: the effect of CPU affinity and intra-op thread counts on p99 under a fixed open-loop load.

    .venv/bin/python benchmarks/lifecycle/cpu_tuning.py [--model minilm] [--rate 15] [--duration 20] [--repeats 3]

For each combination of (server CPUs, generator CPUs, intra_op_threads) a `headroom serve --cpus ...` is
started on a copy of the model whose config sets `runtime: {intra_op_threads: N}`, then
`headroom bench run --cpus ... --scenario server --arrival poisson --rate R` drives it and the p50/p99 are
read from the bench JSON. Combinations are interleaved (repeat 1 of every combination, then repeat 2, ...)
so a change in the machine's background load hits every combination alike; medians over the repeats are
reported, with `uptime`'s load average recorded before every run. Results:
benchmarks/results/lifecycle/cpu_tuning-<UTC time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "lifecycle"
HEADROOM = [sys.executable, "-m", "headroom.cli.main"]

#: (label, server --cpus, generator --cpus, intra_op_threads); "" = not pinned (all CPUs)
COMBOS: tuple[tuple[str, str, str, int], ...] = (
    ("shared cores, 2 threads", "", "", 2),
    ("shared cores, 1 thread", "", "", 1),
    ("server cpu 1, generator cpu 0, 1 thread", "1", "0", 1),
    ("server cpu 1, generator cpu 0, 2 threads (oversubscribed)", "1", "0", 2),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def make_repository(model: str, threads: int, into: Path) -> Path:
    """A one-model repository: the project's model, its config with runtime.intra_op_threads = threads."""
    source = ROOT / "models" / model
    raw: dict[str, Any] = yaml.safe_load((source / "config.yaml").read_text())
    params = dict(raw.get("parameters") or {})
    for key in ("intra_op_threads", "num_threads"):
        params.pop(key, None)
    raw["parameters"] = params
    raw["runtime"] = {**(raw.get("runtime") or {}), "intra_op_threads": threads}
    root = into / f"{model}-t{threads}"
    (root / model).mkdir(parents=True, exist_ok=True)
    (root / model / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    version = root / model / "1"
    if not version.exists():
        version.symlink_to(source / "1", target_is_directory=True)
    return root


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


def one_run(model: str, repo: Path, server_cpus: str, gen_cpus: str, args: argparse.Namespace,
            out: Path) -> dict[str, Any]:
    port = free_port()
    cmd = [*HEADROOM, "serve", "--model-repository", str(repo), "--model", model, "--http-port", str(port),
           "--grpc-port", "-1", "--no-access-log", "--log-level", "warning"]
    if server_cpus:
        cmd += ["--cpus", server_cpus]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url + "/v2/health/ready", server)
        load = load_average()
        bench = [*HEADROOM, "bench", "run", url, "--model", model, "--protocol", "v2-http", "--scenario", "server",
                 "--arrival", "poisson", "--rate", str(args.rate), "--duration", str(args.duration),
                 "--seed", "0", "--confidence", "0", "--quiet", "--metrics-url", "none", "--json", str(out),
                 "--workload", "sentences" if model == "minilm" else "digits"]
        if gen_cpus:
            bench += ["--cpus", gen_cpus]
        subprocess.run(bench, check=True, stdout=subprocess.DEVNULL)
    finally:
        server.terminate()
        server.wait(timeout=60)
    result = json.loads(out.read_text())
    lat = result["latency_ms"]
    return {"p50_ms": lat["p50_ms"], "p99_ms": lat["p99_ms"], "ok": result["counts"]["ok"],
            "completed": result["counts"]["completed"], "load_average_before": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm", help="Model in models/ (default minilm: threads matter).")
    parser.add_argument("--rate", type=float, default=15.0, help="Open-loop Poisson rate (requests/s).")
    parser.add_argument("--duration", type=float, default=20.0, help="Seconds of load per run.")
    parser.add_argument("--repeats", type=int, default=3, help="Runs per combination (interleaved).")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs at least 2 CPUs to pin the server and the generator apart")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, *_ in COMBOS}
    with tempfile.TemporaryDirectory(prefix="cpu_tuning_") as tmp:
        tmp_path = Path(tmp)
        for repeat in range(args.repeats):
            for label, server_cpus, gen_cpus, threads in COMBOS:
                repo = make_repository(args.model, threads, tmp_path)
                row = one_run(args.model, repo, server_cpus, gen_cpus, args, tmp_path / "bench.json")
                runs[label].append(row)
                print(f"[{repeat + 1}/{args.repeats}] {label}: p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms "
                      f"({row['ok']}/{row['completed']} ok, load {row['load_average_before']})", flush=True)
    summary = {
        label: {
            "server_cpus": server_cpus or "all", "generator_cpus": gen_cpus or "all", "intra_op_threads": threads,
            "median_p50_ms": round(statistics.median(r["p50_ms"] for r in runs[label]), 3),
            "median_p99_ms": round(statistics.median(r["p99_ms"] for r in runs[label]), 3),
            "p99_ms_runs": [round(r["p99_ms"], 3) for r in runs[label]],
        }
        for label, server_cpus, gen_cpus, threads in COMBOS
    }
    doc = {
        "benchmark": "cpu_tuning",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": stamp,
        "machine": {"node": platform.node(), "cpus": sorted(os.sched_getaffinity(0)),
                    "python": platform.python_version(), "uptime_after": shutil.which("uptime") and
                    subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()},
        "model": args.model, "rate_per_s": args.rate, "duration_s": args.duration, "repeats": args.repeats,
        "summary": summary,
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"cpu_tuning-{stamp}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    for label, row in summary.items():
        print(f"{label:60s} median p50 {row['median_p50_ms']:8.2f} ms  median p99 {row['median_p99_ms']:8.2f} ms")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
