"""Benchmark the LLM engine on SmolLM2-135M: output tokens/s and TTFT/TPOT at 1/8/32 concurrent streams,
against HF transformers one request at a time and padded static batching; prefix-cache TTFT; cold start.

    .venv/bin/python benchmarks/llm/bench_engine.py                       # everything (several minutes)
    .venv/bin/python benchmarks/llm/bench_engine.py --streams 1,8 --max-tokens 32 --skip-hf
    .venv/bin/python benchmarks/llm/bench_engine.py --weight-dtype native,fp32 --repeats 3 --num-threads 2

With several `--weight-dtype` values the engine is measured for each, and the greedy outputs of the later
ones are compared token by token with the first (`agreement`: streams identical, mean common prefix).

Results go to benchmarks/results/llm_engine_<UTC timestamp>.json with the machine and date. The numbers are
measured, never asserted. On a shared machine, record the load average next to them (done automatically).
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
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from headroom.llm.config import EngineConfig
from headroom.llm.engine import LLMEngine
from headroom.llm.offline import DEFAULT_MODEL, load_engine
from headroom.llm.request import SamplingParams, SequenceOutput
from headroom.llm.weights import load_checkpoint

TOPICS = [
    "the water cycle", "how vaccines work", "the history of the printing press", "black holes",
    "photosynthesis", "the French revolution", "machine learning", "plate tectonics",
]  # fmt: skip


def chat_prompts(engine: LLMEngine, n: int, target_tokens: int = 100, run: int = 0) -> list[list[int]]:
    """n distinct chat prompts of about `target_tokens` tokens each; `run` makes every run's prompts new, so
    a repeat never reuses an earlier run's prompt blocks from the prefix cache (only the chat template's
    system prefix is shared, as it would be in real traffic)."""
    tok = engine.tokenizer
    if tok is None:
        raise SystemExit("the model has no tokenizer")
    out = []
    for i in range(n):
        words = f"Run {run} request {i}. Please explain {TOPICS[i % len(TOPICS)]} to a curious student. " * 8
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": words}]), add_special_tokens=False)
        while len(ids) > target_tokens:
            words = words[: int(len(words) * 0.9)]
            ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": words}]), add_special_tokens=False)
        out.append(ids)
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def run_engine(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    """All prompts at once (one concurrent stream each); greedy, ignore EOS so every stream makes max_tokens."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.monotonic()
    for i, p in enumerate(prompts):
        engine.add_request(f"b{time.monotonic_ns()}-{i}", p, params)
    done: list[SequenceOutput] = []
    while engine.has_unfinished:
        done.extend(o for o in engine.step() if o.finished)
    wall = time.monotonic() - start
    ttft = [o.first_token_s - o.arrival_s for o in done if o.first_token_s is not None]
    tpot = [
        (o.finished_s - o.first_token_s) / (len(o.token_ids) - 1)
        for o in done
        if o.first_token_s is not None and o.finished_s is not None and len(o.token_ids) > 1
    ]
    gen = sum(len(o.token_ids) for o in done)
    order = sorted(done, key=lambda o: int(o.request_id.rsplit("-", 1)[1]))
    return {
        "token_ids": [list(o.token_ids) for o in order],
        "output_tokens_per_s": gen / wall,
        "wall_s": wall,
        "ttft_p50_s": pct(ttft, 0.5),
        "ttft_p99_s": pct(ttft, 0.99),
        "tpot_p50_s": pct(tpot, 0.5),
        "tpot_p99_s": pct(tpot, 0.99),
    }


def hf_model(model_spec: str) -> Any:
    """HF LlamaForCausalLM on the same (dequantised fp32) weights the engine loads."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    ckpt = load_checkpoint(model_spec)
    c = ckpt.config
    cfg = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,  # type: ignore[call-arg]
        tie_word_embeddings=c.tie_word_embeddings,
        bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    with torch.device("meta"):
        hf = LlamaForCausalLM(cfg)
    sd = dict(ckpt.state_dict)
    hf.load_state_dict(sd, assign=True, strict=False)
    hf.tie_weights()
    hf.model.rotary_emb = LlamaRotaryEmbedding(config=cfg)
    return hf.eval()  # type: ignore[no-untyped-call]


def run_hf(hf: Any, prompts: list[list[int]], max_tokens: int, batched: bool) -> dict[str, Any]:
    """(a) one request at a time, or (b) one padded static batch (left padding)."""
    start = time.monotonic()
    gen = 0
    with torch.inference_mode():
        if not batched:
            for p in prompts:
                out = hf.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
                gen += out.shape[1] - len(p)
        else:
            width = max(len(p) for p in prompts)
            ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            out = hf.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
            gen = (out.shape[1] - width) * len(prompts)
    wall = time.monotonic() - start
    return {"output_tokens_per_s": gen / wall, "wall_s": wall}


def prefix_cache_ttft(model: str, system_tokens: int = 512, trials: int = 3) -> dict[str, Any]:
    """TTFT of a request with a ~512-token shared system prompt, prefix caching on (warm) vs off."""
    result: dict[str, Any] = {}
    for enabled in (False, True):
        engine, _ = load_engine(model, EngineConfig(enable_prefix_caching=enabled, kv_cache_memory_mb=256))
        tok = engine.tokenizer
        assert tok is not None
        system = "You are a meticulous assistant. Follow the house style guide carefully. " * 60
        base = tok.encode(system)[:system_tokens]
        ttfts = []
        for i in range(trials + 1):
            q = tok.encode(f" Question {i}: what is {i} plus {i}?")
            params = SamplingParams(temperature=0.0, max_tokens=1)
            engine.add_request(f"p{i}", base + q, params)
            outs: list[SequenceOutput] = []
            while engine.has_unfinished:
                outs.extend(engine.step())
            first = outs[0]
            if i > 0:  # the first request warms the cache (and the allocator) in both modes
                assert first.first_token_s is not None
                ttfts.append(first.first_token_s - first.arrival_s)
        result["with_prefix_cache_s" if enabled else "without_prefix_cache_s"] = statistics.median(ttfts)
    result["ratio"] = result["with_prefix_cache_s"] / result["without_prefix_cache_s"]
    return result


def cold_start(model: str, weight_dtype: str, num_threads: int) -> dict[str, Any]:
    """Time to ready in a fresh process with the converted cache present (load + one warmup token)."""
    code = (
        "import time; t=time.monotonic()\n"
        "from headroom.llm.config import EngineConfig\n"
        "from headroom.llm.offline import load_engine\n"
        "from headroom.llm.request import SamplingParams\n"
        f"e, r = load_engine({model!r}, EngineConfig(weight_dtype={weight_dtype!r}, num_threads={num_threads}))\n"
        "e.add_request('w', e.tokenizer.encode('Hello'), SamplingParams(temperature=0, max_tokens=1))\n"
        "while e.has_unfinished: e.step()\n"
        "import json; print(json.dumps({'ready_s': time.monotonic()-t, 'stages_s': dict(r.stages_s)}))\n"
    )
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    res["process_wall_s"] = time.monotonic() - start
    return res


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median tokens/s, plus every run's tokens/s."""
    ranked = sorted(runs, key=lambda r: float(r["output_tokens_per_s"]))
    best = {k: v for k, v in ranked[len(ranked) // 2].items() if k != "token_ids"}
    best["output_tokens_per_s_runs"] = [r["output_tokens_per_s"] for r in runs]
    return best


def agreement(ref: list[list[int]], got: list[list[int]]) -> dict[str, float]:
    """How far greedy outputs agree: streams identical, and the mean length of the common prefix."""
    prefix = []
    for a, b in zip(ref, got, strict=True):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        prefix.append(n)
    return {
        "identical_streams": sum(a == b for a, b in zip(ref, got, strict=True)) / len(ref),
        "mean_common_prefix_tokens": statistics.mean(prefix),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="GGUF file, HF directory or package:NAME/FILE")
    ap.add_argument("--streams", default="1,8,32", help="comma-separated concurrent stream counts")
    ap.add_argument("--max-tokens", type=int, default=64, help="output tokens per request")
    ap.add_argument("--prompt-tokens", type=int, default=100, help="approximate prompt length")
    ap.add_argument("--skip-hf", action="store_true", help="skip the transformers baselines")
    ap.add_argument("--skip-extras", action="store_true", help="skip prefix-cache and cold-start measurements")
    ap.add_argument("--num-threads", type=int, default=0, help="torch CPU threads (0 = default)")
    ap.add_argument(
        "--weight-dtype", default="auto", help="comma-separated weight_dtype values: auto (native on CPU), native, fp32"
    )
    ap.add_argument("--repeats", type=int, default=1, help="runs per measurement; the median is reported")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="directory for the JSON result")
    args = ap.parse_args()
    console = Console()
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    streams = [int(s) for s in args.streams.split(",")]
    wdtypes = [w.strip() for w in args.weight_dtype.split(",") if w.strip()]
    engines = {
        wd: load_engine(
            args.model,
            EngineConfig(
                max_num_seqs=max(streams), kv_cache_memory_mb=512, weight_dtype=wd, num_threads=args.num_threads
            ),
        )[0]
        for wd in wdtypes
    }
    runs_needed = 1 + len(streams) * args.repeats
    prompt_sets = [chat_prompts(engines[wdtypes[0]], max(streams), args.prompt_tokens, r) for r in range(runs_needed)]
    prompts_all = prompt_sets[0]
    results: dict[str, Any] = {
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "load_average_start": os.getloadavg(),
        },
        "config": {
            "model": args.model,
            "max_tokens": args.max_tokens,
            "prompt_tokens_mean": statistics.mean(len(p) for p in prompts_all),
            "repeats": args.repeats,
        },
        "engine": {wd: {} for wd in wdtypes},
        "agreement_with_" + wdtypes[0]: {wd: {} for wd in wdtypes[1:]},
        "hf_one_at_a_time": {},
        "hf_static_batch": {},
    }
    hf = None if args.skip_hf else hf_model(args.model)
    per_n = len(wdtypes) + (0 if args.skip_hf else 2)
    with Progress(console=console) as progress:
        task = progress.add_task("benchmarking", total=len(streams) * per_n * args.repeats)
        for k, n in enumerate(streams):
            ref_ids: list[list[int]] = []
            for wd, engine in engines.items():
                run_engine(engine, prompts_all[:1], 2)  # warm (prompt set 0 is used for nothing else)
                runs = []
                for r in range(args.repeats):
                    fresh = prompt_sets[1 + k * args.repeats + r]  # same prompts for every weight dtype
                    runs.append(run_engine(engine, fresh[:n], args.max_tokens))
                    progress.advance(task)
                if not ref_ids:
                    ref_ids = runs[0]["token_ids"]
                else:
                    results["agreement_with_" + wdtypes[0]][wd][n] = agreement(ref_ids, runs[0]["token_ids"])
                results["engine"][wd][n] = median_run(runs)
            if hf is not None:
                one, static = [], []
                for r in range(args.repeats):
                    fresh = prompt_sets[1 + k * args.repeats + r]
                    if k == 0:  # one request at a time does not depend on the stream count: measure it once
                        one.append(run_hf(hf, fresh[:2], args.max_tokens, batched=False))
                    progress.advance(task)
                    static.append(run_hf(hf, fresh[:n], args.max_tokens, batched=True))
                    progress.advance(task)
                results["hf_one_at_a_time"][n] = median_run(one) if one else results["hf_one_at_a_time"][streams[0]]
                results["hf_static_batch"][n] = median_run(static)
    if not args.skip_extras:
        results["prefix_cache_ttft"] = prefix_cache_ttft(args.model)
        results["cold_start"] = {wd: cold_start(args.model, wd, args.num_threads) for wd in wdtypes}
    results["machine"]["load_average_end"] = os.getloadavg()
    table = Table(title="SmolLM2-135M, greedy, output tokens/s (median of runs)")
    for col in ("weights", "streams", "engine tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "HF 1-at-a-time"):
        table.add_column(col)
    table.add_column("HF static batch")
    for wd in wdtypes:
        for n in streams:
            e = results["engine"][wd][n]
            a = results["hf_one_at_a_time"].get(n, {}).get("output_tokens_per_s", float("nan"))
            b = results["hf_static_batch"].get(n, {}).get("output_tokens_per_s", float("nan"))
            table.add_row(
                wd,
                str(n),
                f"{e['output_tokens_per_s']:.1f}",
                f"{e['ttft_p50_s'] * 1e3:.0f}/{e['ttft_p99_s'] * 1e3:.0f}",
                f"{e['tpot_p50_s'] * 1e3:.1f}/{e['tpot_p99_s'] * 1e3:.1f}",
                f"{a:.1f}",
                f"{b:.1f}",
            )
    console.print(table)
    if "cold_start" in results:
        for wd, c in results["cold_start"].items():
            console.print(f"cold start ({wd}): ready in {c['ready_s']:.2f} s (process {c['process_wall_s']:.2f} s)")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = args.out / f"llm_engine_{stamp}.json"
    path.write_text(json.dumps(results, indent=1))
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
