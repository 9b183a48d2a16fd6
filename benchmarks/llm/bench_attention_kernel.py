"""Decode-step time with the C paged-attention kernel vs the torch attention path, interleaved A/B.

    .venv/bin/python benchmarks/llm/bench_attention_kernel.py --threads 2,1 --batch 1,32 --repeats 3 \\
        --weight-dtype fp32 --out benchmarks/results/llm_attention_kernel_2026-11-30.json

Each (repeat, threads, backend) runs `profile_step.py` in a fresh process (backends alternate, so slow drift of
the machine's load hits both alike) and records its median decode-step time per batch size and `uptime`.
The JSON holds every run and the medians over repeats.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.progress import Progress

PROFILE = Path(__file__).with_name("profile_step.py")
LINE = re.compile(r"batch (\d+): decode step median ([\d.]+) ms .* CPU time ([\d.]+) ms")


def run_once(backend: str, threads: int, batch: str, weight_dtype: str, steps: int) -> dict[str, object]:
    """One profile_step.py process; returns its per-batch medians (ms) and the load average before it."""
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    cmd = [sys.executable, str(PROFILE), "--batch", batch, "--num-threads", str(threads), "--steps", str(steps)]
    cmd += ["--attention-backend", backend] + (["--weight-dtype", weight_dtype] if weight_dtype else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    steps_ms = {m[1]: float(m[2]) for m in LINE.finditer(proc.stdout)}
    cpu_ms = {m[1]: float(m[3]) for m in LINE.finditer(proc.stdout)}
    return {"backend": backend, "threads": threads, "uptime": uptime, "step_ms": steps_ms, "cpu_ms": cpu_ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="2,1", help="comma-separated torch thread counts")
    ap.add_argument("--batch", default="1,32", help="comma-separated batch sizes")
    ap.add_argument("--repeats", type=int, default=3, help="runs per (threads, backend)")
    ap.add_argument("--steps", type=int, default=10, help="decode steps timed per run (median kept)")
    ap.add_argument("--weight-dtype", default="fp32", help="EngineConfig.weight_dtype (the kernel serves fp32 mode)")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here (default: print it)")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    runs: list[dict[str, object]] = []
    jobs = [(r, t, b) for r in range(args.repeats) for t in threads for b in ("kernel", "torch")]
    with Progress() as progress:
        task = progress.add_task("profile_step runs", total=len(jobs))
        for _, t, backend in jobs:
            runs.append(run_once(backend, t, args.batch, args.weight_dtype, args.steps))
            progress.advance(task)
    medians: dict[str, dict[str, float]] = {}
    for t in threads:
        for backend in ("kernel", "torch"):
            mine = [r for r in runs if r["threads"] == t and r["backend"] == backend]
            per_batch: dict[str, float] = {}
            for b in args.batch.split(","):
                values = [float(r["step_ms"][b]) for r in mine]  # type: ignore[index]
                per_batch[b] = round(statistics.median(values), 2)
            medians[f"threads={t} backend={backend}"] = per_batch
    result = {
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "what": "median decode-step ms (profile_step.py) per batch size, C paged-attention kernel vs torch path",
        "median_step_ms": medians,
        "runs": runs,
    }
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(json.dumps(medians, indent=2))


if __name__ == "__main__":
    main()
