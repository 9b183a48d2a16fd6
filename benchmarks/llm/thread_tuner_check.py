"""Which thread count the per-step tuner (`num_threads: 0`, headroom.llm.threads) picks for one sequence's decode.

    .venv/bin/python benchmarks/llm/thread_tuner_check.py                  # the native default, 400 steps
    .venv/bin/python benchmarks/llm/thread_tuner_check.py --weight-dtype auto --steps 200

Runs one greedy sequence through the engine in this process and prints how many steps ran on each thread
count, the median step time of each, and the tuner's running means (ms per token per step-size bucket). On a
quiet 2-core machine most steps should run on 2 threads; with another process on the second core, on 1.
Measured, never asserted.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

from headroom.llm.config import EngineConfig
from headroom.llm.offline import DEFAULT_MODEL, load_engine
from headroom.llm.request import SamplingParams
from headroom.llm.runner import TorchRunner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--weight-dtype", default="auto")
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args()
    cfg = EngineConfig(num_threads=0, kv_cache_memory_mb=256, weight_dtype=args.weight_dtype)
    engine, _ = load_engine(args.model, cfg)
    if engine.tokenizer is None:
        raise SystemExit("no tokenizer")
    runner = engine.runner
    if not isinstance(runner, TorchRunner):
        raise SystemExit("the engine does not run a TorchRunner")
    ids = engine.tokenizer.encode("Tell me a story about a dragon.")
    engine.add_request("check", ids, SamplingParams(temperature=0.0, max_tokens=args.steps, ignore_eos=True))
    counts: collections.Counter[int] = collections.Counter()
    times: dict[int, list[float]] = collections.defaultdict(list)
    while engine.has_unfinished:
        start = time.monotonic()
        engine.step()
        threads = runner.threads_now
        counts[threads] += 1
        times[threads].append(time.monotonic() - start)
    for threads in sorted(counts):
        print(f"{threads} thread(s): {counts[threads]} steps, median {statistics.median(times[threads]) * 1e3:.1f} ms")
    means = {f"bucket {b}, {t} thr": round(v * 1e3, 2) for (b, t), v in runner.tuner_means().items()}
    print("tuner running means (ms per token):", means)


if __name__ == "__main__":
    main()
