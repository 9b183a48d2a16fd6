"""Time (and optionally profile) one engine decode step at a given batch size on SmolLM2.

    .venv/bin/python benchmarks/llm/profile_step.py --batch 1,32 --num-threads 1 [--profile] [--weight-dtype fp32]
        [--torch-attention]

Prompts of ~100 tokens are prefilled first; then `--steps` decode steps are timed (median reported), in
wall time and in this process's CPU time (steadier than wall time on a shared, oversubscribed machine).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from headroom.llm.config import EngineConfig
from headroom.llm.offline import DEFAULT_MODEL, load_engine
from headroom.llm.request import SamplingParams
from headroom.llm.runner import TorchRunner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="GGUF file, HF directory or package:NAME/FILE")
    ap.add_argument("--batch", default="1,32", help="comma-separated batch sizes (concurrent sequences)")
    ap.add_argument("--num-threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--steps", type=int, default=10, help="decode steps timed per batch size")
    ap.add_argument("--weight-dtype", default="", help="EngineConfig.weight_dtype (native or fp32); empty = default")
    ap.add_argument(
        "--torch-attention",
        action="store_true",
        help="fp32 mode: time torch ops instead of the C paged-attention kernel (an A/B of the kernel)",
    )
    ap.add_argument("--profile", action="store_true", help="print a torch.profiler table of one step")
    args = ap.parse_args()
    kw: dict[str, object] = {
        "num_threads": args.num_threads,
        "max_num_seqs": 64,
        "kv_cache_memory_mb": 512,
    }
    if args.weight_dtype:
        kw["weight_dtype"] = args.weight_dtype
    engine, _ = load_engine(args.model, EngineConfig(**kw))  # type: ignore[arg-type]
    if args.torch_attention:
        if not isinstance(engine.runner, TorchRunner):
            raise SystemExit("--torch-attention: the model runs on the native step (use --weight-dtype fp32)")
        engine.runner.attention_kernel = None
    tok = engine.tokenizer
    if tok is None:
        raise SystemExit("no tokenizer")
    for b in (int(x) for x in args.batch.split(",")):
        params = SamplingParams(temperature=0.0, max_tokens=args.steps + 40, ignore_eos=True)
        for i in range(b):
            ids = tok.encode(f"Request {i}. Please explain the water cycle to a curious student. " * 6)[:100]
            engine.add_request(f"r{b}-{i}", ids, params)
        while any(r.num_output_tokens == 0 for r in engine.scheduler.requests.values()):
            engine.step()
        for _ in range(3):
            engine.step()
        times, cpu = [], []
        for _ in range(args.steps):
            t, c = time.perf_counter(), time.process_time()
            engine.step()
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        med, med_cpu = statistics.median(times), statistics.median(cpu)
        print(
            f"batch {b}: decode step median {med * 1e3:.1f} ms (min {min(times) * 1e3:.1f}) -> {b / med:.1f} tok/s; "
            f"CPU time {med_cpu * 1e3:.1f} ms -> {b / med_cpu:.1f} tok/s per busy core"
        )
        if args.profile:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                engine.step()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
        for rid in engine.request_ids():
            engine.abort(rid)


if __name__ == "__main__":
    main()
