"""GPU check of the LLM engine (run by benchmarks/gpu_check.sh on a CUDA machine; never run in CI).

1. correctness: SmolLM2 greedy on CUDA/bf16 vs CPU/fp32 on a few chat prompts; prints how many leading
   tokens agree (bf16 rounding may flip a late near-tie) and fails if the factual answer is lost or the
   first tokens disagree;
2. throughput: decode output tokens/s at 1, 32 and 128 concurrent streams (64 greedy tokens each).
Writes benchmarks/results/llm_gpu_check_<timestamp>.json.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import sys
import time
from pathlib import Path

import torch

from headroom.llm.config import EngineConfig
from headroom.llm.engine import LLMEngine
from headroom.llm.offline import load_engine
from headroom.llm.request import SamplingParams, SequenceOutput

CHATS = ["What is the capital of France?", "Name three primary colours.", "What is 12 times 12?"]


def greedy(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"g{time.monotonic_ns()}-{i}", p, params)
    done: dict[str, SequenceOutput] = {}
    while engine.has_unfinished:
        done.update({o.request_id: o for o in engine.step() if o.finished})
    return [list(o.token_ids) for o in sorted(done.values(), key=lambda o: int(o.request_id.rsplit("-", 1)[1]))]


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device visible to torch; this check needs a GPU", file=sys.stderr)
        return 2
    gpu, _ = load_engine(config=EngineConfig(device="cuda", kv_cache_memory_mb=4096, max_num_seqs=128))
    cpu, _ = load_engine(config=EngineConfig(device="cpu", kv_cache_memory_mb=128))
    tok = gpu.tokenizer
    assert tok is not None
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": c}])) for c in CHATS]
    a, b = greedy(gpu, prompts, 24), greedy(cpu, prompts, 24)
    agree = []
    for p, q in zip(a, b, strict=True):
        agree.append(next((i for i, (x, y) in enumerate(zip(p, q, strict=True)) if x != y), len(p)))
    ok = "Paris" in tok.decode(a[0]) and min(agree) >= 4
    result: dict[str, object] = {
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "agreeing_leading_tokens_bf16_vs_fp32": agree,
        "gpu_answer_0": tok.decode(a[0]),
        "correct": ok,
        "decode": {},
    }
    filler = tok.encode("Tell me about the history of mathematics in detail. " * 6)
    for n in (1, 32, 128):
        greedy(gpu, [filler], 4)  # warm
        torch.cuda.synchronize()
        start = time.monotonic()
        outs = greedy(gpu, [filler[: 60 + i % 20] for i in range(n)], 64)
        torch.cuda.synchronize()
        wall = time.monotonic() - start
        result["decode"][n] = {"output_tokens_per_s": sum(map(len, outs)) / wall, "wall_s": wall}  # type: ignore[index]
        print(f"{n:4d} streams: {sum(map(len, outs)) / wall:8.1f} output tok/s")
    out = Path("benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"llm_gpu_check_{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
