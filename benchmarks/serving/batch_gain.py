"""How much can batching gain for minilm on this machine? The model's own batch gain, against the CPU's matmul peak.

    .venv/bin/python benchmarks/serving/batch_gain.py [--batch-sizes 1,8,32] [--repeats 3]

Issue 2 asks dynamic batching for >= 2.5x the valid QPS of batch size 1, assuming the model does ~110
sentences/s at batch 1 and ~350/s at batch 32 (3.2x). This script measures what the premise rests on:

1. `headroom profile minilm --batch-size ...` (the served config: onnxruntime, its thread settings, the model's
   warm-up sentence), `--repeats` times: sentences/s per batch size, and the gain over batch 1 (median);
2. the encoder's arithmetic: FLOPs per token of its linear layers (2 x (4 H^2 + 2 H I) per layer, from the
   model's config.json) times the warm-up sentence's tokens -> GFLOP/s reached at each batch size;
3. the CPU's practical peak for those shapes: torch fp32 matmuls of [tokens of a batch of 32, H] x [H, I],
   on 1 and on all CPUs -> the fraction of peak batch 1 already runs at, and the most perfect batching could add.

Writes benchmarks/results/minilm_batch_gain_<timestamp>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
HEADROOM = str(Path(sys.executable).with_name("headroom"))


def profile(batch_sizes: list[int]) -> dict[int, float]:
    """Sentences/s per batch size from `headroom profile minilm` (one run)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "profile.json"
        cmd = [HEADROOM, "profile", "minilm", "--model-repository", str(ROOT / "models"), "--output", str(out)]
        for b in batch_sizes:
            cmd += ["--batch-size", str(b)]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        data = json.loads(out.read_text())
    return {int(k): float(v) for k, v in data["meta"]["throughput_items_per_s"].items()}


def sgemm_gflops(m: int, k: int, n: int, threads: int, seconds: float = 1.0) -> float:
    """fp32 matmul rate for [m, k] x [k, n] on `threads` torch threads."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(10):
        a @ b
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    elapsed = time.perf_counter() - start
    torch.set_num_threads(old)
    return 2 * m * k * n * count / elapsed / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", default="1,8,32", help="comma-separated batch sizes (1 must be among them)")
    ap.add_argument("--repeats", type=int, default=3, help="profile runs (medians are reported)")
    args = ap.parse_args()
    sizes = sorted({int(b) for b in args.batch_sizes.split(",")})
    if 1 not in sizes:
        raise SystemExit("--batch-sizes must include 1 (the gain is over batch size 1)")
    from headroom.models.builtin.minilm import DEFAULT_MAX_SEQ_LENGTH, WARMUP_TEXT, load_tokenizer, weights_directory

    weights = weights_directory({}, ROOT / "models" / "minilm" / "1", "minilm")
    cfg = json.loads((weights / "config.json").read_text())
    hidden, inter, layers = int(cfg["hidden_size"]), int(cfg["intermediate_size"]), int(cfg["num_hidden_layers"])
    tokens = len(load_tokenizer(weights, DEFAULT_MAX_SEQ_LENGTH, "minilm").encode(WARMUP_TEXT).ids)  # unpadded
    gflop_per_sentence = 2 * layers * (4 * hidden * hidden + 2 * hidden * inter) * tokens / 1e9
    runs = [profile(sizes) for _ in range(args.repeats)]
    rate = {b: statistics.median(r[b] for r in runs) for b in sizes}
    cpus = os.cpu_count() or 1
    peak = {t: sgemm_gflops(32 * tokens, hidden, inter, t) for t in sorted({1, cpus})}
    reached = {b: rate[b] * gflop_per_sentence for b in sizes}
    result = {
        "kind": "minilm_batch_gain",
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "machine": {"node": platform.node(), "cpus": cpus, "load_average": os.getloadavg()},
        "warmup_sentence_tokens": tokens,
        "gflop_per_sentence_linears": gflop_per_sentence,
        "sentences_per_s": {"median": rate, "runs": runs},
        "gain_over_batch1": {b: rate[b] / rate[1] for b in sizes},
        "gflops_reached": reached,
        "sgemm_peak_gflops_by_threads": peak,
        "fraction_of_peak_at_batch1": reached[1] / peak[cpus],
        "most_perfect_batching_could_gain": peak[cpus] / reached[1],
    }
    out = ROOT / "benchmarks" / "results" / f"minilm_batch_gain_{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("sentences_per_s", "gain_over_batch1", "fraction_of_peak_at_batch1",
                                             "most_perfect_batching_could_gain")}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
